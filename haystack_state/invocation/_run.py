"""
Running one batch of a model's tool calls against a State, shared by ``ToolInvoker`` and ``Agent``. The batch's
control flow is written once (:func:`~haystack_state.invocation._batch.batch_flow`, over the books of a
:class:`~haystack_state.invocation._batch.ToolBatch`); the two runners here only execute its operations:
:func:`run_tool_batch` in daemon worker threads (:class:`ThreadRunner`), :func:`run_tool_batch_async` as tasks
(:class:`TaskRunner`). Calls start when the calls they depend on are merged, and are merged into the State strictly
in the order the model listed them, each call all or nothing. A call that stops at ``interrupt()``, a held call and
the calls depending on either produce no result and merge nothing; the outcome lists them (:mod:`._outcome`).
:func:`run_tool_calls` and :func:`run_tool_calls_async` return just the messages.

The options of a run (``raise_on_failure``, ``max_workers``, ``tool_timeout``, ...) come in one frozen
:class:`~haystack_state.invocation._settings.ToolRunSettings`, documented there.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import sysconfig
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.tracing.tracer import Span

from haystack_state._driver import run_flow, run_flow_async
from haystack_state.errors import ToolTimeoutError
from haystack_state.invocation._batch import (
    EmitChunk,
    Finished,
    Proceed,
    RetryCall,
    Startable,
    ToolBatch,
    batch_flow,
)
from haystack_state.invocation._calls import PlannedCall, plan_calls
from haystack_state.invocation._outcome import BatchOutcome, CallEventCallback
from haystack_state.invocation._scope import invoke_call, invoke_call_async
from haystack_state.invocation._settings import DEFAULT_TOOL_RUN_SETTINGS, ToolRunSettings
from haystack_state.invocation._spans import batch_parent
from haystack_state.invocation._timeouts import CANCEL_GRACE, Deadlines, call_timeout
from haystack_state.invocation._workers import WORKERS
from haystack_state.runtime import RunContext
from haystack_state.state import StagedState, State
from haystack_state.tools.spec import ToolSpec

__all__ = [
    "TaskRunner",
    "ThreadRunner",
    "run_tool_batch",
    "run_tool_batch_async",
    "run_tool_calls",
    "run_tool_calls_async",
]

_Running = tuple[PlannedCall, "StagedState | None"]

# How long a wait for the calls may block at most. On Python's free-threaded build, a Ctrl-C that another thread
# receives does not wake the main thread's wait: that build only sees it when its wait times out (measured on
# 3.13t: 2 of 8 runs hung). The GIL build is woken at once and waits as long as it must.
_MAX_WAIT: float | None = 0.2 if sysconfig.get_config_var("Py_GIL_DISABLED") else None


def _capped(limit: float | None) -> float | None:
    """A wait's timeout, at most :data:`_MAX_WAIT`."""
    if _MAX_WAIT is None or (limit is not None and limit <= _MAX_WAIT):
        return limit
    return _MAX_WAIT


class ThreadRunner:
    """
    Executes the operations of a batch's flow synchronously: calls that can overlap run in daemon worker threads
    (at most ``max_workers`` at a time, each abandoned when it overruns its timeout); a lone call without a timeout
    runs in the calling thread; a retried call waits out its backoff without holding a worker.

    :param batch: The batch.
    :param streaming_callback: The run's streaming callback, if any.
    :param parent_span: The tracing span the calls' spans go under; the current span if None.
    """

    __slots__ = ("batch", "callback", "deadlines", "parent", "running", "sleeping", "traced", "waiting")

    def __init__(
        self,
        batch: ToolBatch,
        streaming_callback: Callable[[StreamingChunk], object] | None,
        parent_span: Span | None,
    ) -> None:
        self.batch = batch
        self.callback = streaming_callback
        self.traced, self.parent = batch_parent(parent_span)
        self.running: dict[Future[object], _Running] = {}
        self.waiting: list[Startable] = []
        self.sleeping: list[tuple[float, PlannedCall]] = []  # retried calls waiting out their backoff: (when, call)
        self.deadlines = Deadlines()

    def run(self) -> BatchOutcome:
        """
        Run the batch to its end.

        :returns: Its outcome.
        """
        try:
            return run_flow(batch_flow(self.batch), self.step)
        except Exception:
            # A failure is raised: the results still to come would be discarded, so the calls that have not started
            # do not run. Those already running finish first (or overrun their timeouts).
            self._settle()
            raise
        except BaseException:
            # The run is interrupted (Ctrl-C): it stops now. The running calls are abandoned in their daemon threads.
            for future in self.running:
                future.cancel()
            raise

    def step(self, op: object) -> object:
        """Execute one operation of the flow."""
        if isinstance(op, Proceed):
            if op.ready:
                self.waiting.extend(op.ready)
            return self._next_finished()
        if isinstance(op, RetryCall):
            self.sleeping.append((time.monotonic() + op.delay, op.call))
        elif isinstance(op, EmitChunk):
            if self.callback is not None:
                self.callback(op.chunk)
        else:  # pragma: no cover - the flow yields nothing else
            raise TypeError(f"Unknown tool batch operation: {op!r}")
        return None

    def _next_finished(self) -> list[Finished]:
        batch, waiting, running, sleeping = self.batch, self.waiting, self.running, self.sleeping
        if sleeping:
            waiting.extend(self._woken())
        if not waiting and not running:  # the calls that could start failed before running: merge them
            if sleeping:  # or only retries wait, for their backoff
                time.sleep(self._wait_time() or 0.0)
            return []
        tool_timeout = batch.settings.tool_timeout
        if len(waiting) == 1 and not running and not sleeping:  # nothing to overlap with: run it here
            call, kwargs, staged = waiting[0]
            assert call.spec is not None
            if call_timeout(call.spec, tool_timeout) is None:  # (a call with one runs in an abandonable worker)
                waiting.clear()
                try:
                    value = invoke_call(batch, call, kwargs, self.traced, self.parent)
                except Exception as exc:
                    return [(call, None, None, exc)]
                return [(call, staged, value, None)]
        workers = max(1, batch.settings.max_workers)
        while waiting and len(running) < workers:
            call, kwargs, staged = waiting.pop(0)
            spec = call.spec
            assert spec is not None
            timeout = call_timeout(spec, tool_timeout)
            worker_context = contextvars.copy_context()
            future = WORKERS.submit(worker_context.run, invoke_call, batch, call, kwargs, self.traced, self.parent)
            running[future] = (call, staged)
            self.deadlines.start(future, timeout, 0.0 if spec.supports_sync else CANCEL_GRACE)
        finished, _ = wait(running, timeout=self._wait_time(), return_when=FIRST_COMPLETED)
        ended: list[Finished] = []
        for future in finished:
            call, staged = running.pop(future)
            self.deadlines.discard(future)
            raised = future.exception()
            if raised is None:
                ended.append((call, staged, future.result(), None))
            else:
                ended.append((call, None, None, raised))
        for key, timeout in self.deadlines.expired():  # over time: abandoned, its staged writes discarded
            call, _ = running.pop(key)  # type: ignore[call-overload]
            assert call.spec is not None
            ended.append((call, None, None, ToolTimeoutError(call.spec.name, timeout)))
        return ended

    def _woken(self) -> list[Startable]:
        """The retried calls whose backoff is over (taken out of ``sleeping``), ready for their next attempt."""
        now = time.monotonic()
        due = [call for when, call in self.sleeping if when <= now]
        self.sleeping[:] = [(when, call) for when, call in self.sleeping if when > now]
        ready = []
        for call in due:
            attempt = self.batch.again(call)
            if attempt is not None:
                ready.append((call, *attempt))
        return ready

    def _wait_time(self) -> float | None:
        """How long the runner may wait: until the first deadline or the end of the first backoff (None: no limit)."""
        limit = self.deadlines.wait_time()
        if self.sleeping:
            wake = max(0.0, min(when for when, _ in self.sleeping) - time.monotonic())
            limit = wake if limit is None else min(limit, wake)
        return _capped(limit)

    def _settle(self) -> None:
        """Wait for the running calls to finish or overrun their deadlines (those not started are cancelled)."""
        running = self.running
        for future in list(running):
            if future.cancel():
                running.pop(future)
        while running:
            finished, _ = wait(running, timeout=_capped(self.deadlines.wait_time()), return_when=FIRST_COMPLETED)
            for future in finished:
                running.pop(future)
                self.deadlines.discard(future)
            for key, _ in self.deadlines.expired():
                running.pop(key, None)  # type: ignore[call-overload]


class TaskRunner:
    """
    Executes the operations of a batch's flow as tasks of the running event loop: async tools are awaited, sync
    tools run in worker threads, at most ``max_workers`` calls at a time; a retried call waits out its backoff in its
    task, holding no worker slot.

    :param batch: The batch.
    :param streaming_callback: The run's streaming callback (sync, or async and awaited), if any.
    :param parent_span: The tracing span the calls' spans go under; the current span if None.
    """

    __slots__ = ("batch", "callback", "limit", "parent", "running", "traced")

    def __init__(self, batch: ToolBatch, streaming_callback: StreamingCallbackT | None, parent_span: Span | None):
        self.batch = batch
        self.callback = streaming_callback
        self.traced, self.parent = batch_parent(parent_span)
        self.limit = asyncio.Semaphore(max(1, batch.settings.max_workers))
        self.running: dict[asyncio.Task[object], _Running] = {}

    async def run(self) -> BatchOutcome:
        """
        Run the batch to its end.

        :returns: Its outcome.
        """
        running = self.running
        try:
            return await run_flow_async(batch_flow(self.batch), self.step)
        except BaseException:
            # A failure is raised, or this run is cancelled: the calls still running are cancelled too (their results
            # would be discarded), and awaited below.
            for task in running:
                task.cancel()
            raise
        finally:
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def step(self, op: object) -> object:
        """Execute one operation of the flow."""
        if isinstance(op, Proceed):
            for call, kwargs, staged in op.ready:
                self._start(call, kwargs, staged)
            return await self._next_finished()
        if isinstance(op, RetryCall):
            attempt = self.batch.again(op.call)
            if attempt is not None:
                self._start(op.call, *attempt, delay=op.delay)
        elif isinstance(op, EmitChunk):
            if self.callback is not None:
                result = self.callback(op.chunk)
                if asyncio.iscoroutine(result):
                    await result
        else:  # pragma: no cover - the flow yields nothing else
            raise TypeError(f"Unknown tool batch operation: {op!r}")
        return None

    def _start(self, call: PlannedCall, kwargs: dict[str, Any], staged: StagedState | None, delay: float = 0.0) -> None:
        self.running[asyncio.ensure_future(self._invoke(call, kwargs, delay))] = (call, staged)

    async def _invoke(self, call: PlannedCall, kwargs: dict[str, Any], delay: float) -> object:
        if delay > 0:  # a retry waits out its backoff (cancellable, and holding no worker slot)
            await asyncio.sleep(delay)
        async with self.limit:
            return await invoke_call_async(self.batch, call, kwargs, self.traced, self.parent)

    async def _next_finished(self) -> list[Finished]:
        running = self.running
        if not running:  # the calls that could start failed before running: merge them
            return []
        finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        ended: list[Finished] = []
        for task in finished:
            call, staged = running.pop(task)
            if task.cancelled():  # the tool cancelled itself
                ended.append((call, staged, None, asyncio.CancelledError("the tool call was cancelled")))
                continue
            raised = task.exception()
            ended.append((call, staged, task.result() if raised is None else None, raised))
        return ended


def _batch(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    settings: ToolRunSettings,
    streaming_callback: StreamingCallbackT | None,
    context: RunContext[Any] | None,
    answers: Mapping[str, Sequence[object]] | None,
    hold: Collection[str] = (),
    on_call: CallEventCallback | None = None,
) -> ToolBatch:
    return ToolBatch(
        plan_calls(messages, specs, settings.max_tool_calls),
        state,
        settings,
        streaming_callback=streaming_callback,
        context=context,
        answers=answers,
        hold=hold,
        on_call=on_call,
    )


def _failing(settings: ToolRunSettings) -> ToolRunSettings:
    """The settings with ``on_interrupt="fail"``: no human can answer an ``interrupt()``."""
    return settings if settings.on_interrupt == "fail" else dataclasses.replace(settings, on_interrupt="fail")


def run_tool_batch(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    settings: ToolRunSettings = DEFAULT_TOOL_RUN_SETTINGS,
    streaming_callback: Callable[[StreamingChunk], None] | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[object]] | None = None,
    hold: Collection[str] = (),
    on_call: CallEventCallback | None = None,
    parent_span: Span | None = None,
) -> BatchOutcome:
    """
    Run every tool call of ``messages`` against ``state`` (see ``ToolInvoker.run``). Calls that can overlap run in
    daemon worker threads; a lone call without a timeout runs in the calling thread. An async tool runs on an event
    loop of its own. Ctrl-C (``KeyboardInterrupt``) stops the run at once: calls still running are abandoned and
    merge nothing; with ``raise_on_failure``, the calls not started yet do not run.

    A call that stops at ``interrupt()`` produces no result and merges nothing (its State writes are dropped); the
    calls of the batch that depend on it (they read what it writes) do not run; every other call runs and is merged
    in call order. The calls in ``hold`` are treated alike, without running. The outcome lists them all.

    :param messages: Messages whose tool calls to run.
    :param state: The State the tools read and write.
    :param specs: The available tools, by name (see ``tool_specs``).
    :param settings: How the calls run (see :class:`~haystack_state.invocation._settings.ToolRunSettings`).
    :param streaming_callback: Receives each tool result as it is merged, then a final ``tool_call_results`` chunk.
    :param context: The run's ``RunContext``, passed as it is to the tools' ``RunContext`` parameters (a
        ``RunContext(deps=None)`` if None). Check it first with :func:`~haystack_state.runtime.check_tool_deps`.
    :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in the order it asks.
    :param hold: The ids of calls that must not run (an Agent's ``interrupt_before``); pending with ``"held"``.
    :param on_call: Told ``("started", ...)``, ``("finished", ...)``, ``("interrupted", ...)`` and ``("retrying",
        ...)`` for each call, in the calling thread (see :data:`~haystack_state.invocation._outcome.CallEventCallback`).
    :param parent_span: The tracing span the calls' spans go under; the current span if None.
    :returns: The result messages (in call order) and the pending calls.
    :raises ToolInvocationError: With ``raise_on_failure``, when a call fails.
    :raises ValueError: If ``hold`` names a call id that is not in ``messages``.
    """
    batch = _batch(messages, state, specs, settings, streaming_callback, context, answers, hold, on_call)
    return ThreadRunner(batch, streaming_callback, parent_span).run()


async def run_tool_batch_async(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    settings: ToolRunSettings = DEFAULT_TOOL_RUN_SETTINGS,
    streaming_callback: StreamingCallbackT | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[object]] | None = None,
    hold: Collection[str] = (),
    on_call: CallEventCallback | None = None,
    parent_span: Span | None = None,
) -> BatchOutcome:
    """
    :func:`run_tool_batch`, as tasks of the running event loop (see ``ToolInvoker.run_async``): async tools are
    awaited, sync tools run in worker threads. With ``raise_on_failure``, a failure cancels the calls still running;
    so does cancelling this run. The streaming callback may be async (it is awaited); ``on_call`` is told from the
    event loop's thread. The parameters, results and errors are :func:`run_tool_batch`'s.
    """
    batch = _batch(messages, state, specs, settings, streaming_callback, context, answers, hold, on_call)
    return await TaskRunner(batch, streaming_callback, parent_span).run()


def run_tool_calls(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    settings: ToolRunSettings = DEFAULT_TOOL_RUN_SETTINGS,
    streaming_callback: Callable[[StreamingChunk], None] | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[object]] | None = None,
    parent_span: Span | None = None,
) -> list[ChatMessage]:
    """
    Run every tool call of ``messages`` against ``state`` and return one result per call (see
    :func:`run_tool_batch`, whose parameters these are). No human can answer here: a call that stops at
    ``interrupt()`` without an answer in ``answers`` fails with a ``ToolInterruptedError`` (raised with
    ``raise_on_failure``, else an error result), whatever ``settings.on_interrupt`` says.

    :returns: The tool result messages, in call order.
    :raises ToolInvocationError: With ``raise_on_failure``, when a call fails.
    """
    batch = _batch(messages, state, specs, _failing(settings), streaming_callback, context, answers)
    return ThreadRunner(batch, streaming_callback, parent_span).run().messages


async def run_tool_calls_async(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    settings: ToolRunSettings = DEFAULT_TOOL_RUN_SETTINGS,
    streaming_callback: StreamingCallbackT | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[object]] | None = None,
    parent_span: Span | None = None,
) -> list[ChatMessage]:
    """
    :func:`run_tool_calls`, as tasks of the running event loop (see :func:`run_tool_batch_async`).

    :returns: The tool result messages, in call order.
    :raises ToolInvocationError: With ``raise_on_failure``, when a call fails.
    """
    batch = _batch(messages, state, specs, _failing(settings), streaming_callback, context, answers)
    return (await TaskRunner(batch, streaming_callback, parent_span).run()).messages
