"""
One tool call, for the sync and the async runner alike: its interrupt scope (the answers a resumed call gets), its
duration (timed only when someone listens, ``on_call``), its tracing span, its timeout, and a call that stops at
``interrupt()`` turned into an :class:`~haystack_state.invocation._outcome.InterruptedCall` outcome rather than an
error. :func:`invoke_call` runs a tool synchronously (in a worker thread, or in the calling one);
:func:`invoke_call_async` awaits it.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from haystack.tracing.tracer import Span

from haystack_state.interrupts import ToolInterrupt, interrupt_scope
from haystack_state.invocation._batch import ToolBatch
from haystack_state.invocation._calls import PlannedCall
from haystack_state.invocation._outcome import InterruptedCall
from haystack_state.invocation._spans import traced_call, traced_call_async
from haystack_state.invocation._timeouts import call_timeout, with_timeout
from haystack_state.invocation._workers import WORKERS
from haystack_state.tools.spec import ToolSpec

__all__ = ["CallScope", "invoke_call", "invoke_call_async", "invoke_tool"]


class CallScope:
    """
    The context manager around one call (a class, not a generator: one is opened per tool call): its interrupt
    scope and duration; a ``ToolInterrupt`` it raises becomes an ``InterruptedCall`` outcome.

    :param batch: The call's batch (its answers; its ``on_call`` and ``durations``).
    :param call: The call.
    """

    __slots__ = ("durations", "index", "interrupts", "start", "value")

    def __init__(self, batch: ToolBatch, call: PlannedCall) -> None:
        assert call.spec is not None
        call_id = call.tool_call.id
        answers = batch.answers.get(call_id, ()) if call_id is not None else ()
        self.durations = batch.durations if batch.on_call is not None else None
        self.index = call.index
        self.interrupts: AbstractContextManager[object] = interrupt_scope(call_id, call.spec.name, answers)
        self.value: object = None  # what the call returned (or ``InterruptedCall``), set inside the scope
        self.start = 0.0

    def __enter__(self) -> CallScope:
        if self.durations is not None:
            self.start = time.perf_counter()
        self.interrupts.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        try:
            self.interrupts.__exit__(exc_type, exc, tb)
        finally:
            if self.durations is not None:
                self.durations[self.index] = time.perf_counter() - self.start
        if isinstance(exc, ToolInterrupt):
            self.value = InterruptedCall(exc)
            return True
        return False


def invoke_call(
    batch: ToolBatch, call: PlannedCall, kwargs: dict[str, Any], traced: bool, parent: Span | None
) -> object:
    """
    Call a tool synchronously, in its own interrupt scope (in whatever thread runs it), inside its span when tracing
    is on. An async tool over the call's timeout (the tool's own, else the batch's ``tool_timeout``) is cancelled.

    :param batch: The call's batch.
    :param call: The call, as handed out by ``ToolBatch.startable``.
    :param kwargs: Its keyword arguments.
    :param traced: Whether tracing is on.
    :param parent: The span the call's span goes under.
    :returns: The tool's result, or ``InterruptedCall`` if it stopped at ``interrupt()``.
    """
    spec = call.spec
    assert spec is not None
    timeout = None if spec.supports_sync else call_timeout(spec, batch.settings.tool_timeout)  # (an async tool's)
    with CallScope(batch, call) as outcome:
        if traced:
            outcome.value = traced_call(invoke_tool, spec, call.tool_call, parent, spec, kwargs, timeout)
        else:
            outcome.value = invoke_tool(spec, kwargs, timeout)
    return outcome.value


async def invoke_call_async(
    batch: ToolBatch, call: PlannedCall, kwargs: dict[str, Any], traced: bool, parent: Span | None
) -> object:
    """
    Await a tool (a sync one runs in a worker thread), in its own interrupt scope; see :func:`invoke_call`. A call
    over its timeout is cancelled (a sync tool with a timeout runs in a daemon worker thread, which is abandoned).

    :returns: The tool's result, or ``InterruptedCall``.
    :raises ToolTimeoutError: If it overran its timeout.
    """
    spec = call.spec
    assert spec is not None
    timeout = call_timeout(spec, batch.settings.tool_timeout)
    with CallScope(batch, call) as outcome:
        work: Awaitable[object]
        if timeout is not None and not spec.is_async:  # a sync tool: in a daemon thread, abandoned if late
            worker_context = contextvars.copy_context()
            work = asyncio.wrap_future(WORKERS.submit(worker_context.run, invoke_tool, spec, kwargs))
        else:
            work = spec.tool.invoke_async(**kwargs)
        if traced:
            work = traced_call_async(work, spec, call.tool_call, parent)
        outcome.value = await with_timeout(work, spec, timeout)
    return outcome.value


def invoke_tool(spec: ToolSpec, kwargs: dict[str, Any], timeout: float | None = None) -> object:
    """
    Call a tool synchronously: a sync tool directly, an async one on an event loop of its own (cancelled after
    ``timeout`` seconds).

    :param spec: The tool.
    :param kwargs: Its keyword arguments.
    :param timeout: For an async tool, seconds before it is cancelled (``ToolTimeoutError``), or None.
    :returns: Its result.
    """
    if spec.supports_sync:
        return spec.tool.invoke(**kwargs)
    call = with_timeout(spec.tool.invoke_async(**kwargs), spec, timeout)  # an async tool over time is cancelled
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: run the coroutine on a fresh one
        return asyncio.run(call)
    # An event loop runs in this thread (e.g. ``run`` called from a notebook cell or a coroutine): it cannot be
    # re-entered, so the async tool runs on a loop of its own in a helper thread.
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="haystack-state-tool") as helper:
        return helper.submit(context.run, asyncio.run, call).result()
