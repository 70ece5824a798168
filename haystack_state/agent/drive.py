"""
Executing the effects of the agent loop (:mod:`haystack_state.agent.loop`): calling the chat generator, running the
tool calls and the hooks, synchronously (:func:`drive`) or awaiting them (:func:`drive_async`).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from haystack_state.agent.loop import CallModel, Commit, Effect, HoldThread, RunTools
from haystack_state.invocation.run import run_tool_calls, run_tool_calls_async
from haystack_state.tools.spec import ToolSpec

__all__ = [
    "Effects",
    "Finished",
    "accepts",
    "call_hook_sync",
    "drive",
    "drive_async",
    "execute",
    "execute_async",
    "next_effect",
    "wait",
]

Hook = Callable[..., Any]


def accepts(method: Callable[..., Any], name: str) -> bool:
    """
    Whether a callable takes a parameter of this name (or ``**kwargs``).

    :param method: The callable.
    :param name: The parameter name.
    :returns: True if ``method(name=...)`` is accepted; False if its signature cannot be read.
    """
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def wait(awaitable: Awaitable[Any]) -> Any:
    """
    Run an awaitable (an async hook's) to completion from synchronous code.

    :param awaitable: The awaitable.
    :returns: Its result.
    """

    async def waiter() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: run it on a fresh one
        return asyncio.run(waiter())
    # An event loop runs in this thread (``run`` called from a notebook cell or a coroutine): it cannot be
    # re-entered, so the awaitable runs on a loop of its own in a helper thread.
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="haystack-state-hook") as helper:
        return helper.submit(context.run, asyncio.run, waiter()).result()


def call_hook_sync(hook: Hook, state: Any) -> Any:
    """
    Call a hook with the state; an async hook is run to completion.

    :param hook: The hook.
    :param state: The live State.
    :returns: What the hook returned.
    """
    returned = hook(state)
    return wait(returned) if inspect.isawaitable(returned) else returned


@dataclasses.dataclass(frozen=True)
class Effects:
    """
    What executing the loop's effects needs from the Agent.

    :param chat_generator: The chat generator.
    :param specs: The tools' specs by name.
    :param raise_on_failure: Raise on a failed tool call instead of reporting it to the model.
    :param max_workers: How many tool calls may run at once.
    """

    chat_generator: Any
    specs: dict[str, ToolSpec]
    raise_on_failure: bool
    max_workers: int


@dataclasses.dataclass(frozen=True)
class Finished:
    """The loop has returned its outputs."""

    outputs: dict[str, Any]


def next_effect(
    flow: Generator[Effect, Any, dict[str, Any]], value: Any, error: BaseException | None
) -> Effect | Finished:
    """
    Resume the loop with the last effect's result (or throw its exception into it) and take its next effect.

    :param flow: The loop.
    :param value: What the last effect produced.
    :param error: What the last effect raised, if anything.
    :returns: The next effect, or the loop's outputs.
    """
    try:
        return flow.throw(error) if error is not None else flow.send(value)
    except StopIteration as stop:
        return Finished(stop.value)


def execute(effect: Effect, effects: Effects) -> Any:
    """
    Execute one effect synchronously.

    :param effect: What the loop asks for.
    :param effects: What executes it.
    :returns: Its result.
    """
    if isinstance(effect, CallModel):
        return effects.chat_generator.run(**effect.inputs)
    if isinstance(effect, HoldThread):
        return effect.session.hold()
    if isinstance(effect, Commit):
        return effect.session.commit(
            effect.state, effect.source, tool_names=effect.tool_names, metadata=effect.metadata, step=effect.step
        )
    if isinstance(effect, RunTools):
        return run_tool_calls(
            effect.messages,
            effect.state,
            effects.specs,
            raise_on_failure=effects.raise_on_failure,
            max_workers=effects.max_workers,
            streaming_callback=effect.streaming_callback,  # type: ignore[arg-type]  # sync-selected
        )
    return [call_hook_sync(hook, effect.state) for hook in effect.hooks]


async def execute_async(effect: Effect, effects: Effects) -> Any:
    """
    Execute one effect, awaiting it: the chat generator's ``run_async`` when it has one (else ``run`` in a worker
    thread), async tools and hooks.

    :param effect: What the loop asks for.
    :param effects: What executes it.
    :returns: Its result.
    """
    if isinstance(effect, CallModel):
        run_async = getattr(effects.chat_generator, "run_async", None)
        if run_async is not None:
            return await run_async(**effect.inputs)
        return await asyncio.to_thread(effects.chat_generator.run, **effect.inputs)
    if isinstance(effect, HoldThread):
        return await effect.session.hold_async()
    if isinstance(effect, Commit):
        return await effect.session.commit_async(
            effect.state, effect.source, tool_names=effect.tool_names, metadata=effect.metadata, step=effect.step
        )
    if isinstance(effect, RunTools):
        return await run_tool_calls_async(
            effect.messages,
            effect.state,
            effects.specs,
            raise_on_failure=effects.raise_on_failure,
            max_workers=effects.max_workers,
            streaming_callback=effect.streaming_callback,
        )
    results = []
    for hook in effect.hooks:
        returned = hook(effect.state)
        results.append(await returned if inspect.isawaitable(returned) else returned)
    return results


def drive(flow: Generator[Effect, Any, dict[str, Any]], effects: Effects) -> dict[str, Any]:
    """
    Run the loop, executing its effects synchronously; an effect's exception is thrown back into the loop.

    :param flow: The loop (see :func:`haystack_state.agent.loop.agent_loop`).
    :param effects: What executes the effects.
    :returns: The loop's outputs.
    """
    value: Any = None
    error: BaseException | None = None
    while not isinstance(effect := next_effect(flow, value, error), Finished):
        value, error = None, None
        try:
            value = execute(effect, effects)
        except Exception as exc:
            error = exc
    return effect.outputs


async def drive_async(flow: Generator[Effect, Any, dict[str, Any]], effects: Effects) -> dict[str, Any]:
    """
    Run the loop, awaiting its effects (see :func:`execute_async`).

    :param flow: The loop (see :func:`haystack_state.agent.loop.agent_loop`).
    :param effects: What executes the effects.
    :returns: The loop's outputs.
    """
    value: Any = None
    error: BaseException | None = None
    while not isinstance(effect := next_effect(flow, value, error), Finished):
        value, error = None, None
        try:
            value = await execute_async(effect, effects)
        except Exception as exc:
            error = exc
    return effect.outputs
