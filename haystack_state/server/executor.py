"""
How a run is executed: a :class:`RunExecutor` runs one job and emits its stream events (``values``, ``updates``,
``messages``, ``custom``, ``events``, ``error``) as it goes. The run queue (:mod:`haystack_state.server.runs`) decides
when and where; the executor only runs.

:class:`AgentExecutor` follows the Agent's live event stream (``Agent.stream_async``) on the event loop (the model
calls are awaited, so many runs share one loop) and turns each event into the stream modes the client asked for
(:class:`~haystack_state.server.streams.StreamTranslator`). Until the checkpointers have async drivers, each
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
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio
from haystack.dataclasses import ChatMessage

from haystack_state.agent import Agent
from haystack_state.agent.events import AgentEvent, RunStarted
from haystack_state.errors import ThreadNotFoundError
from haystack_state.server.assistants import Assistant
from haystack_state.server.streams import StreamTranslator
from haystack_state.server.views import outcome_status, values_view
from haystack_state.server.wire import values_to_wire

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
    thread_status: str
    cancelled: bool = False
    started: bool = False
    started_from: str | None = None


def error_payload(error: BaseException) -> dict[str, str]:
    """The stream's (and ``runs/wait``'s) error shape for an exception."""
    return {"error": type(error).__name__, "message": str(error) or type(error).__name__}


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
        thread_id = job.thread_id if job.thread_id is not None else f"stateless-{job.run_id}"
        translator = StreamTranslator(job.stream_modes, run_id=job.run_id, thread_id=job.thread_id)
        cancelled = False
        try:
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
        values = values_view(snapshot)
        thread_status = outcome_status(snapshot)
        status: Literal["success", "interrupted"] = "interrupted" if cancelled or thread_status != "idle" else "success"
        return RunOutcome(status, values, None, thread_status, cancelled, translator.started, translator.started_from)

    @staticmethod
    async def _follow(
        job: RunJob, agent: Agent, thread_id: str, translator: StreamTranslator, emit: Emit, started: asyncio.Event
    ) -> None:
        """Run the job through the Agent's event stream, emitting what the translator makes of each event."""
        events: AsyncIterator[AgentEvent]
        if job.resuming:
            resume: dict[str, Any] = {}
            if job.decisions is not None:
                resume["decisions"] = job.decisions
            if job.answers is not None:
                resume["answers"] = job.answers
            events = agent.stream_async([], thread_id=thread_id, **resume)
        else:
            events = agent.stream_async(
                job.messages, thread_id=thread_id, checkpoint_id=job.checkpoint_id, **job.inputs
            )
        async for event in events:
            if isinstance(event, RunStarted) and translator.needs_start_values:
                start = event.checkpoint_id
                translator.start(
                    values_to_wire((await agent.get_state_async(thread_id, start)).values) if start else {}
                )
            for name, data in translator.translate(event):
                await emit(name, data)
            if translator.started:
                started.set()
