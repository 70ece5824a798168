"""
Running one batch of a model's tool calls against a State, shared by ``ToolInvoker`` and ``Agent``: calls start when
the calls they depend on are merged, run in daemon worker threads (:func:`run_tool_batch`) or as tasks
(:func:`run_tool_batch_async`), and are merged into the state strictly in the order the model listed them, each call
all or nothing (:class:`ToolBatch`). A call that stops at ``interrupt()``, a held call and the calls depending on
either produce no result and merge nothing; the outcome lists them (:mod:`.outcome`). :func:`run_tool_calls` and
:func:`run_tool_calls_async` return just the messages.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from typing import Any, Literal

from haystack import logging
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.tracing.tracer import Span

from haystack_state.errors import ToolInvocationError, ToolTimeoutError
from haystack_state.interrupts import ToolInterrupt, interrupt_scope
from haystack_state.invocation.calls import (
    PlannedCall,
    call_arguments,
    cause_of,
    conversion_error,
    error_message,
    execution_error,
    merge_error,
    plan_calls,
    result_message,
    state_writes,
)
from haystack_state.invocation.outcome import (
    BatchOutcome,
    CallEventCallback,
    InterruptedCall,
    PendingCall,
    PendingReason,
    block_dependents,
    blocked_calls,
    interrupted_error,
    model_arguments,
    pending_call,
    waits_for,
)
from haystack_state.invocation.spans import batch_parent, traced_call, traced_call_async
from haystack_state.invocation.timeouts import CANCEL_GRACE, Deadlines, call_timeout, with_timeout
from haystack_state.invocation.workers import WORKERS
from haystack_state.retry import RetryPolicy, error_text
from haystack_state.runtime import RunContext
from haystack_state.state import StagedState, State
from haystack_state.tools.spec import ToolSpec

__all__ = ["ToolBatch", "run_tool_batch", "run_tool_batch_async", "run_tool_calls", "run_tool_calls_async"]

logger = logging.getLogger(__name__)


class ToolBatch:
    """
    The bookkeeping of one batch of tool calls, with no I/O: which calls may start (their dependencies are merged),
    and merging finished calls into the state strictly in the order the model listed them, each call all or
    nothing. The sync and async runners only execute what it hands out.

    :param calls: The planned calls.
    :param state: The shared State.
    :param raise_on_failure: Raise a ``ToolInvocationError`` on the first failure instead of reporting it to the
        model as an error tool result.
    :param streaming_callback: Receives each tool result as a ``StreamingChunk`` as soon as it is merged.
    :param passthrough: Pass the streaming callback to tools that take a ``streaming_callback`` parameter.
    :param convert_result_to_json_string: How results are rendered for the model: None for haystack-ai's Agent's
        rule (strings as they are, other values as JSON), True for ``json.dumps``, False for ``str()`` (see
        :func:`~haystack_state.invocation.calls.result_to_string`).
    :param context: The run's ``RunContext``, passed to the tools' ``RunContext`` parameters.
    :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in order.
    :param hold: The ids of calls that must not run (they and the calls that depend on them are pending).
    :param on_call: Told when a call starts, is merged, or stops at ``interrupt()`` (see
        :data:`~haystack_state.invocation.outcome.CallEventCallback`).
    :param on_interrupt: What a call that stops at ``interrupt()`` becomes: ``"pend"``, a pending call (its
        dependents are held too); ``"fail"``, a failed call (a ``ToolInterruptedError``).
    :param retry_policy: How a call whose tool raised (or overran its timeout) is retried (see :meth:`retry_after`);
        never if None.
    """

    def __init__(
        self,
        calls: list[PlannedCall],
        state: State,
        *,
        raise_on_failure: bool,
        streaming_callback: StreamingCallbackT | None = None,
        passthrough: bool = False,
        convert_result_to_json_string: bool | None = None,
        context: RunContext[Any] | None = None,
        answers: Mapping[str, Sequence[Any]] | None = None,
        hold: Collection[str] = (),
        on_call: CallEventCallback | None = None,
        on_interrupt: Literal["pend", "fail"] = "pend",
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.calls = calls
        self.state = state
        self.raise_on_failure = raise_on_failure
        self.streaming_callback = streaming_callback
        self.passthrough = passthrough
        self.convert_result_to_json_string = convert_result_to_json_string
        self.context = context if context is not None else RunContext(deps=None)
        self.answers = answers or {}
        self.on_call = on_call
        self.on_interrupt = on_interrupt
        self.retry_policy = retry_policy
        #: The retried calls, as merged: ``{kind, tool_name, call_id, attempts, succeeded, errors}`` each.
        self.retries: list[dict[str, Any]] = []
        self._failures: dict[int, list[str]] = {}  # per call: its failed attempts' errors (with a retry policy)
        self.messages: list[ChatMessage] = []
        self.pending: list[PendingCall] = []
        self.chunks: list[StreamingChunk] = []
        self._merged = 0  # calls merged (or found pending), in call order
        self._started: set[int] = set()
        # The calls not started yet, by the last call they wait for (-1: none): released once it is merged.
        self._waiting: dict[int, list[PlannedCall]] = {}
        for call in calls:
            self._waiting.setdefault(max(call.after, default=-1), []).append(call)
        self._released: list[PlannedCall] = []
        self._release_below = -1
        self._outcomes: dict[int, tuple[bool, Any, StagedState | None]] = {}
        self._blocked: dict[int, PendingReason] = blocked_calls(calls, hold)
        self._durations: dict[int, float] = {}
        if raise_on_failure:
            for call in calls:
                if call.error is not None and call.index not in self._blocked:
                    raise call.error

    @property
    def done(self) -> bool:
        """Whether every call has been merged (or found pending)."""
        return self._merged == len(self.calls)

    def outcome(self) -> BatchOutcome:
        """The result messages and the pending calls so far."""
        return BatchOutcome(self.messages, self.pending, self.retries)

    def startable(self) -> list[tuple[PlannedCall, dict[str, Any], StagedState | None]]:
        """
        The calls that may start now, each with its keyword arguments and, for tools that receive the State, the
        staged view they write through. Marks them started.

        :returns: ``(call, kwargs, staged)`` for each call to start.
        """
        merged = self._merged
        while self._release_below < merged:  # the calls whose last dependency is merged now may start
            self._released.extend(self._waiting.pop(self._release_below, ()))
            self._release_below += 1
        released, self._released = sorted(self._released, key=lambda c: c.index), []
        ready = []
        for call in released:
            if call.index in self._started or call.error is not None or call.index in self._blocked:
                continue
            assert call.spec is not None
            staged = self.state.stage() if call.spec.state_params else None
            self._started.add(call.index)
            if self.on_call is not None:
                self.on_call("started", self._describe(call))
            try:
                kwargs = call_arguments(
                    call, staged or self.state, self.streaming_callback, self.passthrough, self.context
                )
            except ToolInvocationError as exc:  # it cannot be called (an empty state key): it fails without running
                self.finish(call, False, exc, None)
                continue
            ready.append((call, kwargs, staged))
        return ready

    def retry_after(self, call: PlannedCall, error: BaseException) -> float | None:
        """
        An attempt of a call failed: how long to wait before its next attempt, or None if it is not retried (no
        retry policy, an error ``retry_on`` does not match, or the call's budget is spent: then :meth:`finish` it).
        The error ``retry_on`` is given is the one the tool raised (not haystack's ``ToolInvocationError``
        wrapper), or a ``ToolTimeoutError``. A retried call merges only what its last attempt wrote: each attempt
        gets a fresh staged view (:meth:`again`).

        :param call: The call.
        :param error: What its attempt raised.
        :returns: Seconds, or None.
        """
        policy = self.retry_policy
        if policy is None or not isinstance(error, Exception):
            return None
        cause = cause_of(error)
        failures = self._failures.setdefault(call.index, [])
        failures.append(error_text(cause))
        attempt = len(failures)
        delay = policy.next_delay(attempt, cause)
        if delay is None:
            return None
        logger.warning(
            "Tool '{tool}' failed (attempt {attempt} of {attempts}): {error}; retrying in {delay:.3g} s.",
            tool=call.tool_call.tool_name,
            attempt=attempt,
            attempts=policy.max_attempts,
            error=failures[-1],
            delay=delay,
        )
        if self.on_call is not None:
            self.on_call(
                "retrying",
                {
                    **self._describe(call),
                    "attempt": attempt,
                    "max_attempts": policy.max_attempts,
                    "delay": delay,
                    "error": failures[-1],
                    "error_type": type(cause).__name__,
                },
            )
        return delay

    def again(self, call: PlannedCall) -> tuple[dict[str, Any], StagedState | None] | None:
        """
        The keyword arguments and the fresh staged State view of a call's next attempt (what the failed attempt
        wrote is dropped), or None if it cannot be called any more (it is finished as failed).

        :param call: The call, after :meth:`retry_after` gave a delay.
        :returns: ``(kwargs, staged)``, or None.
        """
        assert call.spec is not None
        staged = self.state.stage() if call.spec.state_params else None
        try:
            kwargs = call_arguments(call, staged or self.state, self.streaming_callback, self.passthrough, self.context)
        except ToolInvocationError as exc:
            self.finish(call, False, exc, None)
            return None
        return kwargs, staged

    def finish(self, call: PlannedCall, ok: bool, outcome: Any, staged: StagedState | None) -> None:
        """
        Record a finished call.

        :param call: The call.
        :param ok: Whether it returned (True) or raised (False).
        :param outcome: Its result, or the exception it raised.
        :param staged: Its staged State view, if it had one.
        """
        self._outcomes[call.index] = (ok, outcome, staged)

    def invoke(
        self,
        call: PlannedCall,
        kwargs: dict[str, Any],
        timeout: float | None = None,
        traced: bool = False,
        parent: Span | None = None,
    ) -> Any:
        """
        Call a tool synchronously, in its own interrupt scope (in whatever thread runs it), inside its span when
        tracing is on.

        :param call: The call, as handed out by :meth:`startable`.
        :param kwargs: Its keyword arguments.
        :param timeout: For an async tool: cancel it after this many seconds.
        :param traced: Whether tracing is on.
        :param parent: The span the call's span goes under.
        :returns: The tool's result, or :class:`~haystack_state.invocation.outcome.InterruptedCall` if it stopped at
            ``interrupt()``.
        """
        spec = call.spec
        assert spec is not None
        with self._scope(call) as outcome:
            if traced:
                outcome.value = traced_call(_invoke_sync, spec, call.tool_call, parent, spec, kwargs, timeout)
            else:
                outcome.value = _invoke_sync(spec, kwargs, timeout)
        return outcome.value

    async def invoke_async(
        self,
        call: PlannedCall,
        kwargs: dict[str, Any],
        timeout: float | None = None,
        traced: bool = False,
        parent: Span | None = None,
    ) -> Any:
        """
        Await a tool (a sync one runs in a worker thread), in its own interrupt scope. See :meth:`invoke`. A call over
        ``timeout`` is cancelled (a sync tool with a timeout runs in a daemon worker thread, which is abandoned).

        :param call: The call, as handed out by :meth:`startable`.
        :param kwargs: Its keyword arguments.
        :param timeout: Seconds before the call is given up (``ToolTimeoutError``), or None.
        :param traced: Whether tracing is on.
        :param parent: The span the call's span goes under.
        :returns: The tool's result, or ``InterruptedCall``.
        """
        spec = call.spec
        assert spec is not None
        with self._scope(call) as outcome:
            work: Awaitable[Any]
            if timeout is not None and not spec.is_async:  # a sync tool: in a daemon thread, abandoned if late
                worker_context = contextvars.copy_context()
                work = asyncio.wrap_future(WORKERS.submit(worker_context.run, _invoke_sync, spec, kwargs))
            else:
                work = spec.tool.invoke_async(**kwargs)
            if traced:
                work = traced_call_async(work, spec, call.tool_call, parent)
            outcome.value = await with_timeout(work, spec, timeout)
        return outcome.value

    def _scope(self, call: PlannedCall) -> _CallScope:
        """
        Around one call (sync or async): its interrupt scope, its duration (when someone listens), and a call that
        stops at ``interrupt()`` turned into an ``InterruptedCall`` outcome.
        """
        assert call.spec is not None
        call_id = call.tool_call.id
        answers = self.answers.get(call_id, ()) if call_id is not None else ()
        return _CallScope(self, call.index, interrupt_scope(call_id, call.spec.name, answers))

    def merge_ready(self) -> list[ChatMessage]:
        """
        Merge, in call order, every call that has finished and whose predecessors are merged.

        :returns: The tool result messages produced now.
        :raises ToolInvocationError: With ``raise_on_failure``, at the first failed call (later calls are not
            merged; earlier ones stay merged).
        """
        produced = []
        while not self.done:
            call = self.calls[self._merged]
            reason = self._blocked.get(call.index)
            if reason is not None:
                self.pending.append(pending_call(call, reason, waits_for=waits_for(call, self.calls, self._blocked)))
                self._merged += 1
                continue
            if call.error is not None:
                logger.warning("{error}", error=str(call.error))
                message = error_message(call.tool_call, call.error)
            elif call.index in self._outcomes:
                ok, outcome, staged = self._outcomes.pop(call.index)
                failures = self._failures.pop(call.index, [])
                if ok and type(outcome) is InterruptedCall:
                    if self.on_interrupt == "pend":
                        self._pend(call, outcome.stop)
                        continue
                    ok, outcome = False, interrupted_error(call, outcome.stop)
                attempts = len(failures) + 1 if ok else max(1, len(failures))
                message = self._merge(call, ok, outcome, staged, attempts)
                if attempts > 1:
                    self.retries.append(
                        {
                            "kind": "tool",
                            "tool_name": call.tool_call.tool_name,
                            "call_id": call.tool_call.id,
                            "attempts": attempts,
                            "succeeded": not message.tool_call_results[0].error,
                            "errors": failures,
                        }
                    )
            else:
                break
            if call.dropped:
                logger.warning(
                    "Tool '{tool}': ignored values the model sent for hidden parameters {params}.",
                    tool=call.tool_call.tool_name,
                    params=", ".join(call.dropped),
                )
            self._merged += 1
            self.messages.append(message)
            produced.append(message)
            if self.on_call is not None:
                self._finished(call, message)
            if self.streaming_callback is not None:
                result = message.tool_call_results[0]
                self.chunks.append(
                    StreamingChunk(
                        content="",
                        index=len(self.messages) - 1,
                        tool_call_result=result,
                        start=True,
                        meta={"tool_result": result.result, "tool_call": call.tool_call},
                    )
                )
        return produced

    def _describe(self, call: PlannedCall) -> dict[str, Any]:
        return {"call_id": call.tool_call.id, "tool_name": call.tool_call.tool_name, "arguments": model_arguments(call)}

    def _finished(self, call: PlannedCall, message: ChatMessage) -> None:
        assert self.on_call is not None
        result = message.tool_call_results[0]
        self.on_call(
            "finished",
            {
                **self._describe(call),
                "message": message,
                "result": result.result,
                "error": result.error,
                "duration_s": self._durations.pop(call.index, 0.0),
            },
        )

    def _pend(self, call: PlannedCall, stop: ToolInterrupt) -> None:
        """A call stopped at ``interrupt()``: it merges nothing (its staged writes are dropped), nor do its dependents
        (they do not run)."""
        self._blocked[call.index] = "interrupt"
        block_dependents(self.calls, self._blocked, after=call.index)
        self.pending.append(pending_call(call, "interrupt", stop))
        self._merged += 1
        if self.on_call is not None:
            data = {**self._describe(call), "value": stop.value, "index": stop.index}
            self.on_call("interrupted", {**data, "duration_s": self._durations.pop(call.index, 0.0)})

    def _merge(
        self, call: PlannedCall, ok: bool, outcome: Any, staged: StagedState | None, attempts: int = 1
    ) -> ChatMessage:
        spec = call.spec
        assert spec is not None
        error: ToolInvocationError
        if ok:
            # Render first: a call whose result cannot be rendered (an outputs_to_string handler raises) fails, and a
            # failed call merges nothing.
            try:
                message = result_message(spec, call.tool_call, outcome, self.convert_result_to_json_string)
            except Exception as exc:
                error = conversion_error(spec.name, exc)
            else:
                writes = (staged.writes if staged is not None else []) + state_writes(spec, outcome)
                try:
                    if len(writes) == 1:  # one write is atomic by itself, and set has fast paths
                        self.state.set(*writes[0])
                    elif writes:
                        self.state.apply(writes)
                except Exception as exc:
                    error = merge_error(spec.name, exc)
                else:
                    return message
        elif isinstance(outcome, ToolInvocationError):
            error = outcome
            if attempts > 1:
                error.args = (f"{error} (Gave up after {attempts} attempts.)",)
        else:
            error = execution_error(spec.name, outcome, attempts)
        if self.raise_on_failure:
            raise error
        logger.warning("{error}", error=str(error))
        return error_message(call.tool_call, error)

    def pop_chunks(self) -> list[StreamingChunk]:
        """The streaming chunks produced since the last call, to hand to the callback."""
        chunks, self.chunks = self.chunks, []
        return chunks


class _CallResult:
    """What a call returned (or ``InterruptedCall``), set inside :meth:`ToolBatch._scope`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None


class _CallScope:
    """The context manager of :meth:`ToolBatch._scope` (a class: one is opened per tool call)."""

    __slots__ = ("batch", "index", "interrupts", "outcome", "start")

    def __init__(self, batch: ToolBatch, index: int, interrupts: AbstractContextManager[Any]) -> None:
        self.batch = batch
        self.index = index
        self.interrupts = interrupts
        self.outcome = _CallResult()
        self.start = 0.0

    def __enter__(self) -> _CallResult:
        if self.batch.on_call is not None:
            self.start = time.perf_counter()
        self.interrupts.__enter__()
        return self.outcome

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        try:
            self.interrupts.__exit__(exc_type, exc, tb)
        finally:
            if self.batch.on_call is not None:
                self.batch._durations[self.index] = time.perf_counter() - self.start
        if isinstance(exc, ToolInterrupt):
            self.outcome.value = InterruptedCall(exc)
            return True
        return False


def _invoke_sync(spec: ToolSpec, kwargs: dict[str, Any], timeout: float | None = None) -> Any:
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


def _settle(running: dict[Future[Any], Any], deadlines: Deadlines) -> None:
    """Wait for the running calls to finish or overrun their deadlines (those not started are cancelled)."""
    for future in list(running):
        if future.cancel():
            running.pop(future)
    while running:
        finished, _ = wait(running, timeout=deadlines.wait_time(), return_when=FIRST_COMPLETED)
        for future in finished:
            running.pop(future)
            deadlines.discard(future)
        for key, _ in deadlines.expired():
            running.pop(key, None)  # type: ignore[call-overload]


def _woken(
    batch: ToolBatch, sleeping: list[tuple[float, PlannedCall]]
) -> list[tuple[PlannedCall, dict[str, Any], StagedState | None]]:
    """The retried calls whose backoff is over (taken out of ``sleeping``), ready for their next attempt."""
    now = time.monotonic()
    due = [call for when, call in sleeping if when <= now]
    sleeping[:] = [(when, call) for when, call in sleeping if when > now]
    ready = []
    for call in due:
        attempt = batch.again(call)
        if attempt is not None:
            ready.append((call, *attempt))
    return ready


def _wait_time(deadlines: Deadlines, sleeping: list[tuple[float, PlannedCall]]) -> float | None:
    """How long the sync runner may wait: until the first deadline or the end of the first backoff (None: no limit)."""
    limit = deadlines.wait_time()
    if sleeping:
        wake = max(0.0, min(when for when, _ in sleeping) - time.monotonic())
        limit = wake if limit is None else min(limit, wake)
    return limit


def _final_chunk() -> StreamingChunk:
    return StreamingChunk(content="", finish_reason="tool_call_results", meta={"finish_reason": "tool_call_results"})


def run_tool_batch(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    raise_on_failure: bool = True,
    max_workers: int = 4,
    streaming_callback: Callable[[StreamingChunk], None] | None = None,
    passthrough: bool = False,
    convert_result_to_json_string: bool | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[Any]] | None = None,
    hold: Collection[str] = (),
    on_call: CallEventCallback | None = None,
    on_interrupt: Literal["pend", "fail"] = "pend",
    max_tool_calls: int | None = 64,
    tool_timeout: float | None = None,
    parent_span: Span | None = None,
    retry_policy: RetryPolicy | None = None,
) -> BatchOutcome:
    """
    Run every tool call of ``messages`` against ``state`` (see ``ToolInvoker.run``). Calls that can overlap run in
    daemon worker threads; a lone call without a timeout runs in the calling thread. An async tool runs on an event
    loop of its own. Ctrl-C (``KeyboardInterrupt``) stops the run at once: calls still running are abandoned and
    merge nothing.

    A call that stops at ``interrupt()`` produces no result and merges nothing (its State writes are dropped); the
    calls of the batch that depend on it (they read what it writes) do not run; every other call runs and is merged
    in call order. The calls in ``hold`` are treated alike, without running. The outcome lists them all.

    :param messages: Messages whose tool calls to run.
    :param state: The State the tools read and write.
    :param specs: The available tools, by name (see ``tool_specs``).
    :param raise_on_failure: Raise a ``ToolInvocationError`` at the first failed call (in call order) instead of
        returning an error tool result. The calls before it stay merged; calls not started yet do not run.
    :param max_workers: How many calls may run at once.
    :param streaming_callback: Receives each tool result as it is merged, then a final ``tool_call_results`` chunk.
    :param passthrough: Pass ``streaming_callback`` to tools that take a ``streaming_callback`` parameter.
    :param convert_result_to_json_string: How results are rendered for the model (see :class:`ToolBatch`).
    :param context: The run's ``RunContext``, passed as it is to the tools' ``RunContext`` parameters (a
        ``RunContext(deps=None)`` if None). Check it first with :func:`~haystack_state.runtime.check_tool_deps`.
    :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in the order it asks.
    :param hold: The ids of calls that must not run (an Agent's ``interrupt_before``); pending with ``"held"``.
    :param on_call: Told ``("started", ...)``, ``("finished", ...)`` and ``("interrupted", ...)`` for each call, in
        the calling thread (see :data:`~haystack_state.invocation.outcome.CallEventCallback`).
    :param on_interrupt: ``"pend"`` (the default): a call that stops at ``interrupt()`` is pending; ``"fail"``: it
        fails with a ``ToolInterruptedError`` like any failed call, and its dependents run.
    :param max_tool_calls: The most calls of one batch that run; the others are answered with a
        ``ToolCallLimitError``. No limit if None.
    :param tool_timeout: The timeout, in seconds, of calls whose tool has none of its own; None for no timeout. A call
        over time is answered with a ``ToolTimeoutError`` and merges nothing (its worker thread is abandoned).
    :param parent_span: The tracing span the calls' spans go under; the current span if None.
    :param retry_policy: How a call whose tool raised (or overran its timeout) is called again: each attempt gets the
        timeout, the backoff waits between them do not count; only the last attempt's State writes are merged. A
        call whose budget is spent fails as it would have without retries, its message saying how many attempts
        were made. Never retried if None.
    :returns: The result messages (in call order) and the pending calls.
    :raises ToolInvocationError: With ``raise_on_failure``, when a call fails.
    :raises ValueError: If ``hold`` names a call id that is not in ``messages``.
    """
    batch = ToolBatch(
        plan_calls(messages, specs, max_tool_calls),
        state,
        raise_on_failure=raise_on_failure,
        streaming_callback=streaming_callback,
        passthrough=passthrough,
        convert_result_to_json_string=convert_result_to_json_string,
        context=context,
        answers=answers,
        hold=hold,
        on_call=on_call,
        on_interrupt=on_interrupt,
        retry_policy=retry_policy,
    )
    traced, parent = batch_parent(parent_span)
    running: dict[Future[Any], tuple[PlannedCall, StagedState | None]] = {}
    waiting: list[tuple[PlannedCall, dict[str, Any], StagedState | None]] = []
    sleeping: list[tuple[float, PlannedCall]] = []  # retried calls waiting out their backoff: (when, call)
    deadlines = Deadlines()

    def failed(call: PlannedCall, error: BaseException) -> None:
        """An attempt failed: the call waits for its next attempt, or is finished as failed."""
        delay = batch.retry_after(call, error)
        if delay is None:
            batch.finish(call, False, error, None)
        else:
            sleeping.append((time.monotonic() + delay, call))

    try:
        while True:
            try:
                batch.merge_ready()
            finally:  # results merged before a failure is raised are still delivered
                for chunk in batch.pop_chunks():
                    if streaming_callback is not None:
                        streaming_callback(chunk)
            if batch.done:
                break
            waiting.extend(batch.startable())
            if sleeping:
                waiting.extend(_woken(batch, sleeping))
            if not waiting and not running:  # the calls that could start failed before running: merge them
                if sleeping:  # or only retries wait, for their backoff
                    time.sleep(_wait_time(deadlines, sleeping) or 0.0)
                continue
            if len(waiting) == 1 and not running and not sleeping:  # nothing to overlap with: run it here
                call, kwargs, staged = waiting[0]
                assert call.spec is not None
                timeout = call_timeout(call.spec, tool_timeout)
                if timeout is None:  # (a call with a timeout runs in a worker, which can be abandoned)
                    waiting.clear()
                    try:
                        outcome = batch.invoke(call, kwargs, None, traced, parent)
                    except Exception as exc:
                        failed(call, exc)
                    else:
                        batch.finish(call, True, outcome, staged)
                    continue
            while waiting and len(running) < max(1, max_workers):
                call, kwargs, staged = waiting.pop(0)
                assert call.spec is not None
                timeout = call_timeout(call.spec, tool_timeout)
                worker_context = contextvars.copy_context()
                future = WORKERS.submit(worker_context.run, batch.invoke, call, kwargs, timeout, traced, parent)
                running[future] = (call, staged)
                deadlines.start(future, timeout, 0.0 if call.spec.supports_sync else CANCEL_GRACE)
            finished, _ = wait(running, timeout=_wait_time(deadlines, sleeping), return_when=FIRST_COMPLETED)
            for future in finished:
                call, staged = running.pop(future)
                deadlines.discard(future)
                raised = future.exception()
                if raised is None:
                    batch.finish(call, True, future.result(), staged)
                else:
                    failed(call, raised)
            for key, timeout in deadlines.expired():  # over time: abandoned, its staged writes discarded
                call, staged = running.pop(key)  # type: ignore[call-overload]
                assert call.spec is not None
                failed(call, ToolTimeoutError(call.spec.name, timeout))
    except Exception:
        # A failure is raised: the results still to come would be discarded, so the calls that have not started do not
        # run. Those already running finish first (or overrun their timeouts).
        _settle(running, deadlines)
        raise
    except BaseException:
        # The run is interrupted (Ctrl-C): it stops now. The running calls are abandoned in their daemon threads.
        for future in running:
            future.cancel()
        raise
    if batch.messages and streaming_callback is not None:
        streaming_callback(_final_chunk())
    return batch.outcome()


def run_tool_calls(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    raise_on_failure: bool = True,
    max_workers: int = 4,
    streaming_callback: Callable[[StreamingChunk], None] | None = None,
    passthrough: bool = False,
    convert_result_to_json_string: bool | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[Any]] | None = None,
    max_tool_calls: int | None = 64,
    tool_timeout: float | None = None,
    parent_span: Span | None = None,
    retry_policy: RetryPolicy | None = None,
) -> list[ChatMessage]:
    """
    Run every tool call of ``messages`` against ``state`` and return one result per call (see
    :func:`run_tool_batch`). No human can answer here: a call that stops at ``interrupt()`` without an answer in
    ``answers`` fails with a ``ToolInterruptedError`` (raised with ``raise_on_failure``, else an error result).

    :param messages: Messages whose tool calls to run.
    :param state: The State the tools read and write.
    :param specs: The available tools, by name (see ``tool_specs``).
    :param raise_on_failure: Raise a ``ToolInvocationError`` at the first failed call (in call order) instead of
        returning an error tool result. The calls before it stay merged; calls not started yet do not run.
    :param max_workers: How many calls may run at once.
    :param streaming_callback: Receives each tool result as it is merged, then a final ``tool_call_results`` chunk.
    :param passthrough: Pass ``streaming_callback`` to tools that take a ``streaming_callback`` parameter.
    :param convert_result_to_json_string: How results are rendered for the model (see :class:`ToolBatch`).
    :param context: The run's ``RunContext``, passed as it is to the tools' ``RunContext`` parameters (a
        ``RunContext(deps=None)`` if None). Check it first with :func:`~haystack_state.runtime.check_tool_deps`.
    :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in the order it asks.
    :param max_tool_calls: The most calls of one batch that run (see :func:`run_tool_batch`).
    :param tool_timeout: The timeout of calls whose tool has none of its own (see :func:`run_tool_batch`).
    :param parent_span: The tracing span the calls' spans go under; the current span if None.
    :param retry_policy: How a call whose tool raised (or overran its timeout) is called again: each attempt gets the
        timeout, the backoff waits between them do not count; only the last attempt's State writes are merged. A
        call whose budget is spent fails as it would have without retries, its message saying how many attempts
        were made. Never retried if None.
    :returns: The tool result messages, in call order.
    :raises ToolInvocationError: With ``raise_on_failure``, when a call fails.
    """
    return run_tool_batch(
        messages,
        state,
        specs,
        raise_on_failure=raise_on_failure,
        max_workers=max_workers,
        streaming_callback=streaming_callback,
        passthrough=passthrough,
        convert_result_to_json_string=convert_result_to_json_string,
        context=context,
        answers=answers,
        on_interrupt="fail",
        max_tool_calls=max_tool_calls,
        tool_timeout=tool_timeout,
        parent_span=parent_span,
        retry_policy=retry_policy,
    ).messages


async def run_tool_batch_async(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    raise_on_failure: bool = True,
    max_workers: int = 4,
    streaming_callback: StreamingCallbackT | None = None,
    passthrough: bool = False,
    convert_result_to_json_string: bool | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[Any]] | None = None,
    hold: Collection[str] = (),
    on_call: CallEventCallback | None = None,
    on_interrupt: Literal["pend", "fail"] = "pend",
    max_tool_calls: int | None = 64,
    tool_timeout: float | None = None,
    parent_span: Span | None = None,
    retry_policy: RetryPolicy | None = None,
) -> BatchOutcome:
    """
    Run every tool call of ``messages`` against ``state`` (see ``ToolInvoker.run_async``): async tools are awaited,
    sync tools run in worker threads, at most ``max_workers`` calls at a time. Interrupted, held and dependent calls
    are pending, as in :func:`run_tool_batch`.

    :param messages: Messages whose tool calls to run.
    :param state: The State the tools read and write.
    :param specs: The available tools, by name (see ``tool_specs``).
    :param raise_on_failure: Raise a ``ToolInvocationError`` at the first failed call (in call order) instead of
        returning an error tool result. The calls before it stay merged; the calls still running are cancelled.
    :param max_workers: How many calls may run at once.
    :param streaming_callback: Receives (sync) or is awaited with (async) each tool result as it is merged, then a
        final ``tool_call_results`` chunk.
    :param passthrough: Pass ``streaming_callback`` to tools that take a ``streaming_callback`` parameter.
    :param convert_result_to_json_string: How results are rendered for the model (see :class:`ToolBatch`).
    :param context: The run's ``RunContext``, passed as it is to the tools' ``RunContext`` parameters (a
        ``RunContext(deps=None)`` if None). Check it first with :func:`~haystack_state.runtime.check_tool_deps`.
    :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in the order it asks.
    :param hold: The ids of calls that must not run (an Agent's ``interrupt_before``); pending with ``"held"``.
    :param on_call: Told ``("started", ...)``, ``("finished", ...)`` and ``("interrupted", ...)`` for each call, from
        the event loop's thread (see :data:`~haystack_state.invocation.outcome.CallEventCallback`).
    :param on_interrupt: ``"pend"`` (the default) or ``"fail"``, as in :func:`run_tool_batch`.
    :param max_tool_calls: The most calls of one batch that run (see :func:`run_tool_batch`).
    :param tool_timeout: The timeout of calls whose tool has none of its own (see :func:`run_tool_batch`).
    :param parent_span: The tracing span the calls' spans go under; the current span if None.
    :param retry_policy: How a call whose tool raised (or overran its timeout) is called again: each attempt gets the
        timeout, the backoff waits between them do not count; only the last attempt's State writes are merged. A
        call whose budget is spent fails as it would have without retries, its message saying how many attempts
        were made. Never retried if None.
    :returns: The result messages (in call order) and the pending calls.
    :raises ToolInvocationError: With ``raise_on_failure``, when a call fails.
    :raises ValueError: If ``hold`` names a call id that is not in ``messages``.
    """
    batch = ToolBatch(
        plan_calls(messages, specs, max_tool_calls),
        state,
        raise_on_failure=raise_on_failure,
        streaming_callback=streaming_callback,
        passthrough=passthrough,
        convert_result_to_json_string=convert_result_to_json_string,
        context=context,
        answers=answers,
        hold=hold,
        on_call=on_call,
        on_interrupt=on_interrupt,
        retry_policy=retry_policy,
    )
    limit = asyncio.Semaphore(max(1, max_workers))
    traced, parent = batch_parent(parent_span)

    async def invoke(call: PlannedCall, kwargs: dict[str, Any], delay: float = 0.0) -> Any:
        spec = call.spec
        assert spec is not None
        if delay > 0:  # a retry waits out its backoff (cancellable, and holding no worker slot)
            await asyncio.sleep(delay)
        async with limit:
            return await batch.invoke_async(call, kwargs, call_timeout(spec, tool_timeout), traced, parent)

    running: dict[asyncio.Task[Any], tuple[PlannedCall, StagedState | None]] = {}
    try:
        while True:
            try:
                batch.merge_ready()
            finally:  # results merged before a failure is raised are still delivered
                for chunk in batch.pop_chunks():
                    if streaming_callback is not None:
                        await _emit(streaming_callback, chunk)
            if batch.done:
                break
            for call, kwargs, staged in batch.startable():
                assert call.spec is not None
                running[asyncio.ensure_future(invoke(call, kwargs))] = (call, staged)
            if not running:  # the calls that could start failed before running: merge them
                continue
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                call, staged = running.pop(task)
                if task.cancelled():  # the tool cancelled itself
                    batch.finish(call, False, asyncio.CancelledError("the tool call was cancelled"), staged)
                    continue
                raised = task.exception()
                if raised is None:
                    batch.finish(call, True, task.result(), staged)
                    continue
                delay = batch.retry_after(call, raised)
                if delay is None:
                    batch.finish(call, False, raised, staged)
                    continue
                attempt = batch.again(call)
                if attempt is not None:
                    kwargs, staged = attempt
                    running[asyncio.ensure_future(invoke(call, kwargs, delay))] = (call, staged)
    except BaseException:
        # A failure is raised, or this run is cancelled: the calls still running are cancelled too (their results
        # would be discarded), and awaited below.
        for task in running:
            task.cancel()
        raise
    finally:
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    if batch.messages and streaming_callback is not None:
        await _emit(streaming_callback, _final_chunk())
    return batch.outcome()


async def run_tool_calls_async(
    messages: list[ChatMessage],
    state: State,
    specs: dict[str, ToolSpec],
    *,
    raise_on_failure: bool = True,
    max_workers: int = 4,
    streaming_callback: StreamingCallbackT | None = None,
    passthrough: bool = False,
    convert_result_to_json_string: bool | None = None,
    context: RunContext[Any] | None = None,
    answers: Mapping[str, Sequence[Any]] | None = None,
    max_tool_calls: int | None = 64,
    tool_timeout: float | None = None,
    parent_span: Span | None = None,
    retry_policy: RetryPolicy | None = None,
) -> list[ChatMessage]:
    """
    Run every tool call of ``messages`` against ``state`` asynchronously and return one result per call (see
    :func:`run_tool_batch_async` and :func:`run_tool_calls`).

    :param messages: Messages whose tool calls to run.
    :param state: The State the tools read and write.
    :param specs: The available tools, by name (see ``tool_specs``).
    :param raise_on_failure: Raise a ``ToolInvocationError`` at the first failed call (in call order) instead of
        returning an error tool result. The calls before it stay merged; the calls still running are cancelled.
    :param max_workers: How many calls may run at once.
    :param streaming_callback: Receives (sync) or is awaited with (async) each tool result as it is merged, then a
        final ``tool_call_results`` chunk.
    :param passthrough: Pass ``streaming_callback`` to tools that take a ``streaming_callback`` parameter.
    :param convert_result_to_json_string: How results are rendered for the model (see :class:`ToolBatch`).
    :param context: The run's ``RunContext``, passed as it is to the tools' ``RunContext`` parameters (a
        ``RunContext(deps=None)`` if None). Check it first with :func:`~haystack_state.runtime.check_tool_deps`.
    :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in the order it asks.
    :param max_tool_calls: The most calls of one batch that run (see :func:`run_tool_batch`).
    :param tool_timeout: The timeout of calls whose tool has none of its own (see :func:`run_tool_batch`).
    :param parent_span: The tracing span the calls' spans go under; the current span if None.
    :param retry_policy: How a call whose tool raised (or overran its timeout) is called again: each attempt gets the
        timeout, the backoff waits between them do not count; only the last attempt's State writes are merged. A
        call whose budget is spent fails as it would have without retries, its message saying how many attempts
        were made. Never retried if None.
    :returns: The tool result messages, in call order.
    :raises ToolInvocationError: With ``raise_on_failure``, when a call fails.
    """
    outcome = await run_tool_batch_async(
        messages,
        state,
        specs,
        raise_on_failure=raise_on_failure,
        max_workers=max_workers,
        streaming_callback=streaming_callback,
        passthrough=passthrough,
        convert_result_to_json_string=convert_result_to_json_string,
        context=context,
        answers=answers,
        on_interrupt="fail",
        max_tool_calls=max_tool_calls,
        tool_timeout=tool_timeout,
        parent_span=parent_span,
        retry_policy=retry_policy,
    )
    return outcome.messages


async def _emit(callback: StreamingCallbackT, chunk: StreamingChunk) -> None:
    result = callback(chunk)
    if asyncio.iscoroutine(result):
        await result
