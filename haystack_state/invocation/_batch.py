"""
One batch of a model's tool calls, with no I/O, written once for the sync and the async runner (:mod:`._run`):

- :class:`ToolBatch` keeps the books: which calls may start (the calls they depend on are merged), their retries, and
  merging finished calls into the State strictly in the order the model listed them, each call all or nothing;
- :func:`batch_flow` is the batch's control flow, a generator (see :mod:`haystack_state._driver`) that yields the
  operations the runners execute: :class:`Proceed` (start calls, wait for some to end), :class:`RetryCall` and
  :class:`EmitChunk`. The sync runner executes them with daemon worker threads, the async one with tasks; the
  order of starts, merges, retries and streamed chunks is the flow's, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from haystack import logging
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT

from haystack_state._driver import Flow, Op
from haystack_state.errors import ToolInvocationError
from haystack_state.interrupts import ToolInterrupt
from haystack_state.invocation._calls import (
    PlannedCall,
    call_arguments,
    cause_of,
    conversion_error,
    error_message,
    execution_error,
    merge_error,
    result_message,
    state_writes,
)
from haystack_state.invocation._outcome import (
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
from haystack_state.invocation._settings import ToolRunSettings
from haystack_state.retry import error_text
from haystack_state.runtime import RunContext
from haystack_state.state import StagedState, State

__all__ = [
    "EmitChunk",
    "Finished",
    "Proceed",
    "RetryCall",
    "Startable",
    "ToolBatch",
    "batch_flow",
    "final_chunk",
]

logger = logging.getLogger(__name__)

_by_index = operator.attrgetter("index")

#: A call ready to start: the call, its keyword arguments, and the staged State view it writes through (if any).
Startable = tuple[PlannedCall, dict[str, Any], "StagedState | None"]


class ToolBatch:
    """
    The bookkeeping of one batch of tool calls, with no I/O: which calls may start (their dependencies are merged),
    and merging finished calls into the state strictly in the order the model listed them, each call all or
    nothing. The sync and async runners only execute what it hands out.

    :param calls: The planned calls.
    :param state: The shared State.
    :param settings: How the batch runs (``raise_on_failure``, ``passthrough``, ``convert_result_to_json_string``,
        ``on_interrupt``, ``retry_policy``; see :class:`~haystack_state.invocation._settings.ToolRunSettings`).
    :param streaming_callback: Receives each tool result as a ``StreamingChunk`` as soon as it is merged.
    :param context: The run's ``RunContext``, passed to the tools' ``RunContext`` parameters
        (``RunContext(deps=None)`` if None).
    :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in order.
    :param hold: The ids of calls that must not run (they and the calls that depend on them are pending).
    :param on_call: Told when a call starts, is merged, or stops at ``interrupt()`` (see
        :data:`~haystack_state.invocation._outcome.CallEventCallback`).
    """

    def __init__(
        self,
        calls: list[PlannedCall],
        state: State,
        settings: ToolRunSettings,
        *,
        streaming_callback: StreamingCallbackT | None,
        context: RunContext[Any] | None,
        answers: Mapping[str, Sequence[object]] | None,
        hold: Collection[str],
        on_call: CallEventCallback | None,
    ) -> None:
        self.calls = calls
        self.state = state
        self.settings = settings
        self.streaming_callback = streaming_callback
        self.context = context if context is not None else RunContext(deps=None)
        self.answers = answers or {}
        self.on_call = on_call
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
        self._outcomes: dict[int, tuple[bool, object, StagedState | None]] = {}
        self._blocked: dict[int, PendingReason] = blocked_calls(calls, hold)
        #: Per call, how long it ran (noted only when someone listens, ``on_call``).
        self.durations: dict[int, float] = {}
        if settings.raise_on_failure:
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

    def startable(self) -> list[Startable]:
        """
        The calls that may start now, each with its keyword arguments and, for tools that receive the State, the
        staged view they write through. Marks them started.

        :returns: ``(call, kwargs, staged)`` for each call to start.
        """
        merged = self._merged
        while self._release_below < merged:  # the calls whose last dependency is merged now may start
            self._released.extend(self._waiting.pop(self._release_below, ()))
            self._release_below += 1
        released, self._released = self._released, []
        if len(released) > 1:
            released.sort(key=_by_index)
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
                    call, staged or self.state, self.streaming_callback, self.settings.passthrough, self.context
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
        policy = self.settings.retry_policy
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
            kwargs = call_arguments(
                call, staged or self.state, self.streaming_callback, self.settings.passthrough, self.context
            )
        except ToolInvocationError as exc:
            self.finish(call, False, exc, None)
            return None
        return kwargs, staged

    def finish(self, call: PlannedCall, ok: bool, outcome: object, staged: StagedState | None) -> None:
        """
        Record a finished call.

        :param call: The call.
        :param ok: Whether it returned (True) or raised (False).
        :param outcome: Its result, or the exception it raised.
        :param staged: Its staged State view, if it had one.
        """
        self._outcomes[call.index] = (ok, outcome, staged)

    def merge_ready(self) -> list[ChatMessage]:
        """
        Merge, in call order, every call that has finished and whose predecessors are merged.

        :returns: The tool result messages produced now.
        :raises ToolInvocationError: With ``raise_on_failure``, at the first failed call (later calls are not
            merged; earlier ones stay merged).
        """
        produced = []
        calls = self.calls
        while self._merged < len(calls):  # (not ``self.done``: a property call per turn, in a hot loop)
            call = calls[self._merged]
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
                failures = self._failures.pop(call.index, ())  # (a list when the call failed before)
                if ok and type(outcome) is InterruptedCall:
                    if self.settings.on_interrupt == "pend":
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
                "duration_s": self.durations.pop(call.index, 0.0),
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
            self.on_call("interrupted", {**data, "duration_s": self.durations.pop(call.index, 0.0)})

    def _merge(
        self, call: PlannedCall, ok: bool, outcome: object, staged: StagedState | None, attempts: int = 1
    ) -> ChatMessage:
        spec = call.spec
        assert spec is not None
        error: ToolInvocationError
        if ok:
            # Render first: a call whose result cannot be rendered (an outputs_to_string handler raises) fails, and a
            # failed call merges nothing.
            try:
                message = result_message(spec, call.tool_call, outcome, self.settings.convert_result_to_json_string)
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
            assert isinstance(outcome, BaseException)
            error = execution_error(spec.name, outcome, attempts)
        if self.settings.raise_on_failure:
            raise error
        logger.warning("{error}", error=str(error))
        return error_message(call.tool_call, error)

    def pop_chunks(self) -> list[StreamingChunk]:
        """The streaming chunks produced since the last call, to hand to the callback."""
        chunks, self.chunks = self.chunks, []
        return chunks


@dataclasses.dataclass(slots=True)
class RetryCall(Op[None]):
    """Make a failed call again after ``delay`` seconds (its arguments and staged view from :meth:`ToolBatch.again`)."""

    call: PlannedCall
    delay: float


@dataclasses.dataclass(slots=True)
class EmitChunk(Op[None]):
    """Hand a streaming chunk to the run's streaming callback."""

    chunk: StreamingChunk


#: An attempt of a call that ended: ``(call, staged, value, error)``, its result or what it raised (a plain tuple:
#: one is made per call).
Finished = tuple[PlannedCall, "StagedState | None", object, "BaseException | None"]


@dataclasses.dataclass(slots=True)
class Proceed(Op[list[Finished]]):
    """
    Start the calls of ``ready``, in this order (the runner may queue them until a worker is free), then wait until
    some call ends (not at all if none runs) and return the attempts that ended. One operation, not two: it is
    yielded at every turn of the batch's loop.
    """

    ready: list[Startable]


def final_chunk() -> StreamingChunk:
    """The chunk that ends a batch's streamed results."""
    return StreamingChunk(content="", finish_reason="tool_call_results", meta={"finish_reason": "tool_call_results"})


def batch_flow(batch: ToolBatch) -> Flow[BatchOutcome]:
    """
    The control flow of one batch: merge what is ready (streaming the results), start what may start, wait for
    calls to end, and retry or finish them, until every call is merged or pending.

    :param batch: The batch.
    :returns: Its outcome (the flow's return value).
    :raises ToolInvocationError: With ``raise_on_failure``, at the first failed call.
    """
    streaming = batch.streaming_callback is not None
    while True:
        try:
            batch.merge_ready()
        finally:  # results merged before a failure is raised are still delivered
            if streaming:
                for chunk in batch.pop_chunks():
                    yield EmitChunk(chunk)
        if batch.done:
            break
        # (``yield`` rather than ``yield from perform(...)``: one generator less per turn, in a hot loop)
        finished: list[Finished] = yield Proceed(batch.startable())
        for call, staged, value, error in finished:
            if error is None:
                batch.finish(call, True, value, staged)
                continue
            delay = batch.retry_after(call, error)
            if delay is None:
                batch.finish(call, False, error, staged)
            else:
                yield RetryCall(call, delay)
    if batch.messages and streaming:
        yield EmitChunk(final_chunk())
    return batch.outcome()
