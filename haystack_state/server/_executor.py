"""
How a run is executed: a :class:`RunExecutor` runs one job and emits its stream events (those of the stream modes
asked for, see :mod:`haystack_state.server._streams`, and ``error``) as it goes. The run queue
(:mod:`haystack_state.server._runs`) decides when and where; the executor only runs.

:class:`AgentExecutor` follows the Agent's live event stream (``Agent.stream_async``) on the event loop (the model
calls are awaited, so many runs share one loop) and turns each event into the stream modes the client asked for
(:class:`~haystack_state.server._streams.StreamTranslator`). Until the checkpointers have async drivers, each
checkpoint commit inside a run is a short synchronous call on the loop (about 0.3 ms on SQLite): running the agents in
worker threads instead made SQLite writers contend and was slower.

A run is cancelled through the ``stop`` event it is given: the executor stops following the Agent's stream, which
cancels the run before its next effect (a model call, a tool batch, a commit); what it committed stands, and it
reports a ``cancelled`` outcome with the thread's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio
from haystack.dataclasses import ChatMessage

from haystack_state.agent import Agent
from haystack_state.agent.events import AgentEvent, RunStarted
from haystack_state.errors import ThreadBusyError, ThreadNotFoundError
from haystack_state.server._assistants import Assistant
from haystack_state.server._listener import process_gone
from haystack_state.server._records import ThreadStatus
from haystack_state.server._streams import StreamTranslator
from haystack_state.server._views import outcome_status, snapshot_values, values_view

__all__ = [
    "AgentExecutor",
    "Emit",
    "RunExecutor",
    "RunJob",
    "RunOutcome",
    "error_payload",
    "takes_answers",
]

Emit = Callable[[str, Any], Awaitable[None]]
"""Sends one stream event: ``await emit("values", {...})``."""


@dataclasses.dataclass(frozen=True)
class RunJob:
    """
    What one run does.

    :param run_id: The run.
    :param assistant: The agent that runs it.
    :param thread_id: Its thread, or None for a stateless run.
    :param messages: The new messages.
    :param inputs: Values for other state keys.
    :param decisions: ``Agent.resume`` decisions, for a run that answers ``interrupt_before`` calls.
    :param answers: ``Agent.resume`` answers, for a run that answers in-tool interrupts.
    :param checkpoint_id: Fork from this checkpoint instead of the head.
    :param stream_modes: The stream modes to make (none for a run whose caller waits for its end only).
    :param attempt: Which attempt of the run this is (more than 1: its worker stopped before it ended, and this
        attempt resumes it from the thread's last checkpoint).
    :param on_unfinished_calls: The run's policy for new input on a thread whose last run stopped mid-tools
        (``Agent.run(on_unfinished_calls=...)``); the Agent's own if None.
    """

    run_id: str
    assistant: Assistant
    thread_id: str | None
    messages: list[ChatMessage]
    inputs: dict[str, Any]
    decisions: dict[str, Any] | None = None
    answers: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    stream_modes: tuple[str, ...] = ("values",)
    attempt: int = 1
    on_unfinished_calls: str | None = None

    @property
    def resuming(self) -> bool:
        """Whether the run answers an interrupt (``Agent.resume``)."""
        return self.decisions is not None or self.answers is not None


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """
    How a run ended.

    :param status: ``success``, ``interrupted`` (it stopped at an interrupt, or was cancelled) or ``error``.
    :param values: The thread's values (JSON) at the end, or None after an error.
    :param error: ``{"error": type, "message": ...}`` after an error.
    :param thread_status: The thread's status now: ``idle``, ``interrupted`` or ``error``.
    :param cancelled: Whether the run was cancelled.
    :param started: Whether the run started (took its thread and reported its starting checkpoint).
    :param started_from: The checkpoint it started from (None for a thread's first run).
    """

    status: Literal["success", "interrupted", "error"]
    values: dict[str, Any] | None
    error: dict[str, str] | None
    thread_status: ThreadStatus
    cancelled: bool = False
    started: bool = False
    started_from: str | None = None


def error_payload(error: BaseException) -> dict[str, str]:
    """The stream's (and ``runs/wait``'s) error shape for an exception."""
    return {"error": type(error).__name__, "message": str(error) or type(error).__name__}


async def _chain(first: AgentEvent, events: AsyncIterator[AgentEvent]) -> AsyncIterator[AgentEvent]:
    yield first
    async for event in events:
        yield event


async def _outlive(agent: Agent, thread_id: str, error: ThreadBusyError, *, wait: bool) -> bool:
    """
    Wait until the lease of a run that stopped no longer holds a thread: release it at once if its process (of this
    host) is gone; else, with ``wait``, sleep until it expires. Returns False if the lease is held still (a live run
    renewed it, or it is not for us to wait).
    """
    checkpointer = agent.checkpointer
    assert checkpointer is not None
    lease = await checkpointer.aread_lease(thread_id)
    if lease is None:
        return True
    if lease.owner != error.holder and error.holder is not None:
        return False
    if process_gone(lease.owner):
        await checkpointer.arelease_lease(lease)
        return True
    if not wait:
        return False
    seconds = (lease.expires_at - dt.datetime.now(dt.UTC)).total_seconds()
    if seconds > checkpointer.lease_ttl + 1:
        return False
    await asyncio.sleep(max(seconds, 0) + 0.05)
    again = await checkpointer.aread_lease(thread_id)
    return again is None or again.owner != lease.owner or again.expires_at <= lease.expires_at


async def _resumption(job: RunJob, agent: Agent) -> RunJob | None:
    """
    How a resumed run (a later attempt, after its worker stopped) goes on, judged by the thread's last checkpoint:

    - the run committed nothing yet (the head is not its own): it runs again from the start, as asked;
    - its last checkpoint says it meant to go on (its step in flight was lost): it continues from there, as
      ``agent.run([], thread_id=...)`` does, running the tool calls left pending;
    - its last checkpoint ended it (only the record of its end was lost): None, nothing runs again.
    """
    try:
        snapshot = await agent.get_state_async(str(job.thread_id))
    except ThreadNotFoundError:
        return job
    meta = snapshot.checkpoint.metadata
    if meta.get("run_id") != job.run_id:
        return job
    if snapshot.interrupts or not (snapshot.pending_tool_calls or meta.get("continues")):
        return None
    return dataclasses.replace(job, messages=[], inputs={}, decisions=None, answers=None, checkpoint_id=None)


def _parameters(method: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return set()


def takes_answers(agent: Agent) -> bool:
    """Whether ``agent.resume`` takes ``answers`` (in-tool interrupts)."""
    return "answers" in _parameters(agent.resume)


class RunExecutor(Protocol):
    """Runs one job, emitting its stream events; never raises for a failing run (it reports an error outcome)."""

    async def execute(self, job: RunJob, emit: Emit, stop: asyncio.Event) -> RunOutcome:
        """Run the job; ``emit`` every stream event; stop early when ``stop`` is set; return how it ended."""
        ...


class AgentExecutor:
    """
    Follows the Agent's live events and emits the stream modes of each job (see the module docstring).

    :param max_concurrent: How many runs may execute at once.
    """

    def __init__(self, max_concurrent: int) -> None:
        self._limiter = anyio.CapacityLimiter(max_concurrent)

    async def execute(self, job: RunJob, emit: Emit, stop: asyncio.Event) -> RunOutcome:
        """
        Run the job to its end (or until ``stop`` is set); emit its stream events, and ``error`` if it fails.

        :param job: The run.
        :param emit: Sends a stream event.
        :param stop: Set to cancel the run.
        :returns: How it ended.
        """
        agent = job.assistant.agent
        prompt = job.assistant.wire_system_prompt
        thread_id = job.thread_id if job.thread_id is not None else f"stateless-{job.run_id}"
        translator = StreamTranslator(
            job.stream_modes, run_id=job.run_id, thread_id=job.thread_id, system_prompt=prompt
        )
        cancelled = False
        try:
            if job.attempt > 1 and job.thread_id is not None:
                resumed = await _resumption(job, agent)
                if resumed is None:  # its last attempt had ended it; only the record of its end was lost
                    snapshot = await agent.get_state_async(thread_id)
                    values, thread_status = values_view(snapshot, system_prompt=prompt), outcome_status(snapshot)
                    status: Literal["success", "interrupted"] = "success" if thread_status == "idle" else "interrupted"
                    return RunOutcome(status, values, None, thread_status)
                job = resumed
            async with self._limiter:
                started = asyncio.Event()
                work = asyncio.ensure_future(self._follow(job, agent, thread_id, translator, emit, started))

                async def stopped() -> None:  # a cancel takes effect once the run told where it started
                    await stop.wait()
                    await started.wait()

                stopper = asyncio.ensure_future(stopped())
                try:
                    await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopper.cancel()
                    if not work.done():
                        cancelled = True
                        work.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await work
                    if cancelled and not work.cancelled() and work.exception() is None:
                        cancelled = False  # it ended on its own meanwhile
                if not cancelled:
                    work.result()  # the run's failure, if any
            snapshot = await agent.get_state_async(thread_id)
        except ThreadNotFoundError as error:
            if cancelled:  # before the thread's first checkpoint
                return RunOutcome("interrupted", {}, None, "idle", True, translator.started, translator.started_from)
            payload = error_payload(error)
            await emit("error", payload)
            return RunOutcome("error", None, payload, "error", False, translator.started, translator.started_from)
        except Exception as error:  # the model's or a tool's failure, a conflict: the run fails, the server goes on
            payload = error_payload(error)
            await emit("error", payload)
            return RunOutcome("error", None, payload, "error", False, translator.started, translator.started_from)
        finally:
            if job.thread_id is None and agent.checkpointer is not None:
                # A stateless run uses a thread of its own for its steps (and its interrupts), deleted at its end.
                with contextlib.suppress(KeyError):
                    await anyio.to_thread.run_sync(agent.checkpointer.delete_thread, thread_id)
        values = values_view(snapshot, system_prompt=prompt)
        thread_status = outcome_status(snapshot)
        status = "interrupted" if cancelled or thread_status != "idle" else "success"
        return RunOutcome(status, values, None, thread_status, cancelled, translator.started, translator.started_from)

    @staticmethod
    async def _follow(
        job: RunJob, agent: Agent, thread_id: str, translator: StreamTranslator, emit: Emit, started: asyncio.Event
    ) -> None:
        """Run the job through the Agent's event stream, emitting what the translator makes of each event."""
        options: dict[str, Any] = {"run_id": job.run_id}
        if job.on_unfinished_calls is not None:
            options["on_unfinished_calls"] = job.on_unfinished_calls
        if job.resuming:
            if job.decisions is not None:
                options["decisions"] = job.decisions
            if job.answers is not None:
                options["answers"] = job.answers
            messages: list[ChatMessage] = []
        else:
            options.update(job.inputs, checkpoint_id=job.checkpoint_id)
            messages = job.messages
        while True:
            try:
                events = agent.stream_async(messages, thread_id=thread_id, **options)
                first = await anext(aiter(events), None)
                break
            except ThreadBusyError as error:
                # The thread's lease is held by a run whose process stopped: take it back at once from a process of
                # this host that is gone; a resumed run also waits for a lease (of its stopped worker) to expire.
                if error.holder is None or not await _outlive(agent, thread_id, error, wait=job.attempt > 1):
                    raise
        if first is None:
            return
        async for event in _chain(first, events):
            if isinstance(event, RunStarted) and translator.needs_start_values:
                if event.checkpoint_id:
                    snapshot = await agent.get_state_async(thread_id, event.checkpoint_id)
                    values = snapshot_values(snapshot, system_prompt=translator.system_prompt)
                    translator.start(values, snapshot.checkpoint.step)
                else:
                    translator.start({})
            for name, data in translator.translate(event):
                await emit(name, data)
            if translator.started:
                started.set()
