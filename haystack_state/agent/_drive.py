"""
Executing the effects of the agent loop (:mod:`haystack_state.agent._loop`, effects in
:mod:`haystack_state.agent._effects`): calling the chat generator, running the tool calls and the hooks, committing,
synchronously (:func:`drive`) or awaiting them (:func:`drive_async`). Both run the loop on the package's one flow
driver (:mod:`haystack_state._driver`).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from haystack_state._driver import Flow, run_flow, run_flow_async
from haystack_state.agent._effects import (
    Backoff,
    CallModel,
    Commit,
    Effect,
    HookInterrupt,
    LoadField,
    RunHooks,
    RunTools,
    TakeLease,
)
from haystack_state.agent._hooks import call_hook, call_hook_async
from haystack_state.agent._run_config import RunControl
from haystack_state.interrupts import ToolInterrupt, interrupt_scope
from haystack_state.invocation._run import run_tool_batch, run_tool_batch_async
from haystack_state.invocation._settings import DEFAULT_TOOL_RUN_SETTINGS, ToolRunSettings

__all__ = [
    "EffectRunner",
    "RunCancelled",
    "accepts",
    "cancel_check",
    "drive",
    "drive_async",
    "execute",
    "execute_async",
]

T = TypeVar("T")


def accepts(method: Callable[..., object], name: str) -> bool:
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
class EffectRunner:
    """
    What executing the loop's effects needs from the Agent.

    :param chat_generator: The chat generator.
    :param tool_settings: How tool calls run (the Agent's, with the run's ``passthrough``).
    :param control: Checked before each effect: a cancelled run stops there (:class:`RunCancelled`).
    """

    chat_generator: Any
    tool_settings: ToolRunSettings = DEFAULT_TOOL_RUN_SETTINGS
    control: RunControl | None = None


class RunCancelled(Exception):
    """The run was cancelled before an effect (its consumer stopped listening): nothing more was done or committed."""


def _run_coroutine(awaitable: Awaitable[T]) -> T:
    """Run an awaitable from sync code, on an event loop of its own in a worker thread (a loop may be running here)."""

    async def wait() -> T:
        return await awaitable

    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="haystack-state-loader") as helper:
        return helper.submit(context.run, asyncio.run, wait()).result()


def _batch_options(runner: EffectRunner, effect: RunTools) -> dict[str, Any]:
    """The keyword arguments of ``run_tool_batch`` and ``run_tool_batch_async`` for a tool batch."""
    return {
        "settings": runner.tool_settings,
        "streaming_callback": effect.streaming_callback,  # (the runner's kind, selected by the loop)
        "context": effect.context,
        "answers": effect.answers,
        "hold": effect.hold,
        "on_call": effect.on_call,
    }


def execute(runner: EffectRunner, effect: Effect) -> object:
    """
    Execute one effect synchronously.

    :param runner: What executes it.
    :param effect: What the loop asks for.
    :returns: Its result.
    """
    if isinstance(effect, RunHooks):  # the most frequent effect first
        return [call_hook(hook, effect.point, effect.state) for hook in effect.hooks]
    if isinstance(effect, CallModel):
        return (effect.generator or runner.chat_generator).run(**effect.inputs)
    if isinstance(effect, RunTools):
        return run_tool_batch(effect.messages, effect.state, effect.specs, **_batch_options(runner, effect))
    if isinstance(effect, Commit):
        return effect.session.commit(
            effect.state, effect.source, tool_names=effect.tool_names, metadata=effect.metadata, step=effect.step
        )
    if isinstance(effect, TakeLease):
        effect.session.hold()
        return None
    if isinstance(effect, LoadField):
        value = effect.loader(effect.context, effect.state)
        return _run_coroutine(value) if inspect.isawaitable(value) else value
    if isinstance(effect, Backoff):
        if runner.control is not None:
            runner.control.sleep(effect.seconds)  # a cancel ends the wait (and the run, before its next effect)
        else:
            time.sleep(effect.seconds)
        return None
    try:  # before_tool hooks, where interrupt() works
        with interrupt_scope(None, "before_tool", effect.answers, source="hook"):
            return [call_hook(hook, effect.point, effect.state) for hook in effect.hooks]
    except ToolInterrupt as stop:
        return HookInterrupt(stop.value, stop.index)


async def execute_async(runner: EffectRunner, effect: Effect) -> object:
    """
    Execute one effect, awaiting it: the chat generator's ``run_async`` when it has one (else ``run`` in a worker
    thread), async tools and hooks.

    :param runner: What executes it.
    :param effect: What the loop asks for.
    :returns: Its result.
    """
    if isinstance(effect, RunHooks):
        return [await call_hook_async(hook, effect.point, effect.state) for hook in effect.hooks]
    if isinstance(effect, CallModel):
        generator = effect.generator or runner.chat_generator
        run_async = getattr(generator, "run_async", None)
        if run_async is not None:
            return await run_async(**effect.inputs)
        return await asyncio.to_thread(generator.run, **effect.inputs)
    if isinstance(effect, RunTools):
        return await run_tool_batch_async(effect.messages, effect.state, effect.specs, **_batch_options(runner, effect))
    if isinstance(effect, Commit):
        return await effect.session.commit_async(
            effect.state, effect.source, tool_names=effect.tool_names, metadata=effect.metadata, step=effect.step
        )
    if isinstance(effect, TakeLease):
        await effect.session.hold_async()
        return None
    if isinstance(effect, LoadField):
        value = effect.loader(effect.context, effect.state)
        return (await value) if inspect.isawaitable(value) else value
    if isinstance(effect, Backoff):
        await asyncio.sleep(effect.seconds)
        return None
    try:  # before_tool hooks, where interrupt() works
        with interrupt_scope(None, "before_tool", effect.answers, source="hook"):
            return [await call_hook_async(hook, effect.point, effect.state) for hook in effect.hooks]
    except ToolInterrupt as stop:
        return HookInterrupt(stop.value, stop.index)


def cancel_check(runner: EffectRunner) -> Callable[[], None] | None:
    """
    What the driver checks before each effect: whether the run was cancelled; None for a run without control.

    :raises RunCancelled: (from the check) If the run was cancelled.
    """
    control = runner.control
    if control is None:
        return None

    def check() -> None:
        if control.cancelled:
            raise RunCancelled("The run was cancelled; its last committed checkpoint stands.")

    return check


def drive(flow: Flow[dict[str, Any]], runner: EffectRunner) -> dict[str, Any]:
    """
    Run the loop, executing its effects synchronously; an effect's exception is thrown back into the loop.

    :param flow: The loop (see :func:`haystack_state.agent._loop.agent_loop`).
    :param runner: What executes the effects.
    :returns: The loop's outputs.
    :raises RunCancelled: If the run's control was cancelled.
    """
    return run_flow(flow, partial(execute, runner), check=cancel_check(runner))


async def drive_async(flow: Flow[dict[str, Any]], runner: EffectRunner) -> dict[str, Any]:
    """
    Run the loop, awaiting its effects (see :func:`execute_async`). A cancelled task stops the loop where it is:
    what was committed stands.

    :param flow: The loop (see :func:`haystack_state.agent._loop.agent_loop`).
    :param runner: What executes the effects.
    :returns: The loop's outputs.
    :raises RunCancelled: If the run's control was cancelled.
    """
    return await run_flow_async(flow, partial(execute_async, runner), check=cancel_check(runner))
