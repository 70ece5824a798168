"""
Executing the effects of the agent loop (:mod:`haystack_state.agent.loop`): calling the chat generator, running the
tool calls and the hooks, synchronously (:func:`drive`) or awaiting them (:func:`drive_async`).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from haystack_state.agent.hooks import call_hook, call_hook_async
from haystack_state.agent.loop import (
    Backoff,
    CallModel,
    Commit,
    Effect,
    HoldThread,
    HookInterrupt,
    LoadField,
    RunControl,
    RunHooks,
    RunTools,
)
from haystack_state.interrupts import ToolInterrupt, interrupt_scope
from haystack_state.invocation.run import run_tool_batch, run_tool_batch_async
from haystack_state.retry import RetryPolicy

__all__ = [
    "Effects",
    "Finished",
    "RunCancelled",
    "accepts",
    "drive",
    "drive_async",
    "execute",
    "execute_async",
    "next_effect",
]


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


@dataclasses.dataclass(frozen=True)
class Effects:
    """
    What executing the loop's effects needs from the Agent.

    :param chat_generator: The chat generator.
    :param raise_on_failure: Raise on a failed tool call instead of reporting it to the model.
    :param max_workers: How many tool calls may run at once.
    :param passthrough: Pass the streaming callback to tools that take a ``streaming_callback`` parameter.
    :param control: Checked before each effect: a cancelled run stops there (:class:`RunCancelled`).
    :param tool_timeout: The timeout of tool calls whose tool has none of its own; None for no timeout.
    :param max_tool_calls: The most tool calls of one model reply that run; None for no limit.
    :param tool_retry: How a failed tool call is retried; never if None.
    """

    chat_generator: Any
    raise_on_failure: bool
    max_workers: int
    passthrough: bool = False
    control: RunControl | None = None
    tool_timeout: float | None = None
    max_tool_calls: int | None = 64
    tool_retry: RetryPolicy | None = None


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


def _run_coroutine(awaitable: Any) -> Any:
    """Run an awaitable from sync code, on an event loop of its own in a worker thread (a loop may be running here)."""

    async def wait() -> Any:
        return await awaitable

    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="haystack-state-loader") as helper:
        return helper.submit(context.run, asyncio.run, wait()).result()


def _batch_options(effect: RunTools, effects: Effects) -> dict[str, Any]:
    """The tool runner's options for a ``RunTools`` effect (the sync and the async runner take the same)."""
    return {
        "raise_on_failure": effects.raise_on_failure,
        "max_workers": effects.max_workers,
        "passthrough": effects.passthrough,
        "streaming_callback": effect.streaming_callback,  # (selected for the runner: sync or async)
        "tool_timeout": effects.tool_timeout,
        "max_tool_calls": effects.max_tool_calls,
        "context": effect.context,
        "answers": effect.answers,
        "hold": effect.hold,
        "on_call": effect.on_call,
        "retry_policy": effects.tool_retry,
    }


def execute(effect: Effect, effects: Effects) -> Any:
    """
    Execute one effect synchronously.

    :param effect: What the loop asks for.
    :param effects: What executes it.
    :returns: Its result.
    """
    if isinstance(effect, RunHooks) and effect.answers is None:  # the most frequent effect first
        return [call_hook(hook, effect.point, effect.state) for hook in effect.hooks]
    if isinstance(effect, CallModel):
        return (effect.generator or effects.chat_generator).run(**effect.inputs)
    if isinstance(effect, RunTools):
        return run_tool_batch(effect.messages, effect.state, effect.specs, **_batch_options(effect, effects))
    if isinstance(effect, Commit):
        return effect.session.commit(
            effect.state, effect.source, tool_names=effect.tool_names, metadata=effect.metadata, step=effect.step
        )
    if isinstance(effect, HoldThread):
        return effect.session.hold()
    if isinstance(effect, LoadField):
        value = effect.loader(effect.context, effect.state)
        return _run_coroutine(value) if inspect.isawaitable(value) else value
    if isinstance(effect, Backoff):
        if effects.control is not None:
            effects.control.sleep(effect.seconds)  # a cancel ends the wait (and the run, before its next effect)
        else:
            time.sleep(effect.seconds)
        return None
    if effect.answers is not None:  # before_tool hooks, where interrupt() works
        try:
            with interrupt_scope(None, "before_tool", effect.answers, source="hook"):
                return [call_hook(hook, effect.point, effect.state) for hook in effect.hooks]
        except ToolInterrupt as stop:
            return HookInterrupt(stop.value, stop.index)
    return [call_hook(hook, effect.point, effect.state) for hook in effect.hooks]


async def execute_async(effect: Effect, effects: Effects) -> Any:
    """
    Execute one effect, awaiting it: the chat generator's ``run_async`` when it has one (else ``run`` in a worker
    thread), async tools and hooks.

    :param effect: What the loop asks for.
    :param effects: What executes it.
    :returns: Its result.
    """
    if isinstance(effect, CallModel):
        generator = effect.generator or effects.chat_generator
        run_async = getattr(generator, "run_async", None)
        if run_async is not None:
            return await run_async(**effect.inputs)
        return await asyncio.to_thread(generator.run, **effect.inputs)
    if isinstance(effect, RunTools):
        return await run_tool_batch_async(
            effect.messages, effect.state, effect.specs, **_batch_options(effect, effects)
        )
    if isinstance(effect, Commit):
        return await effect.session.commit_async(
            effect.state, effect.source, tool_names=effect.tool_names, metadata=effect.metadata, step=effect.step
        )
    if isinstance(effect, HoldThread):
        return await effect.session.hold_async()
    if isinstance(effect, LoadField):
        value = effect.loader(effect.context, effect.state)
        return (await value) if inspect.isawaitable(value) else value
    if isinstance(effect, Backoff):
        await asyncio.sleep(effect.seconds)
        return None
    if effect.answers is not None:  # before_tool hooks, where interrupt() works
        try:
            with interrupt_scope(None, "before_tool", effect.answers, source="hook"):
                return [await call_hook_async(hook, effect.point, effect.state) for hook in effect.hooks]
        except ToolInterrupt as stop:
            return HookInterrupt(stop.value, stop.index)
    return [await call_hook_async(hook, effect.point, effect.state) for hook in effect.hooks]


class RunCancelled(Exception):
    """The run was cancelled before an effect (its consumer stopped listening): nothing more was done or committed."""


def _check(effects: Effects, flow: Generator[Effect, Any, dict[str, Any]]) -> None:
    control = effects.control
    if control is not None and control.gate is not None:
        control.gate()
    if control is not None and control.cancelled:
        flow.close()  # the loop's spans end; nothing more runs
        raise RunCancelled("The run was cancelled; its last committed checkpoint stands.")


def drive(flow: Generator[Effect, Any, dict[str, Any]], effects: Effects) -> dict[str, Any]:
    """
    Run the loop, executing its effects synchronously; an effect's exception is thrown back into the loop.

    :param flow: The loop (see :func:`haystack_state.agent.loop.agent_loop`).
    :param effects: What executes the effects.
    :returns: The loop's outputs.
    :raises RunCancelled: If the run's control was cancelled.
    """
    value: Any = None
    error: BaseException | None = None
    try:
        while not isinstance(effect := next_effect(flow, value, error), Finished):
            _check(effects, flow)
            value, error = None, None
            try:
                value = execute(effect, effects)
            except Exception as exc:
                error = exc
    except BaseException:
        flow.close()
        raise
    return effect.outputs


async def drive_async(flow: Generator[Effect, Any, dict[str, Any]], effects: Effects) -> dict[str, Any]:
    """
    Run the loop, awaiting its effects (see :func:`execute_async`). A cancelled task stops the loop where it is:
    what was committed stands.

    :param flow: The loop (see :func:`haystack_state.agent.loop.agent_loop`).
    :param effects: What executes the effects.
    :returns: The loop's outputs.
    :raises RunCancelled: If the run's control was cancelled.
    """
    value: Any = None
    error: BaseException | None = None
    try:
        while not isinstance(effect := next_effect(flow, value, error), Finished):
            _check(effects, flow)
            value, error = None, None
            try:
                value = await execute_async(effect, effects)
            except Exception as exc:
                error = exc
    except BaseException:
        flow.close()
        raise
    return effect.outputs
