"""
How a run is executed: a :class:`RunExecutor` runs one job and emits its stream events (``values``, ``error``, ...)
as it goes. The run queue (:mod:`haystack_state.server.runs`) decides when and where; the executor only runs.

The executor of this release, :class:`FinalValuesExecutor`, awaits ``Agent.run_async`` / ``Agent.resume_async`` on the
event loop (the model calls are awaited, so many runs share one loop) and emits the final values once. Until the
checkpointers have async drivers, each checkpoint commit inside a run is a short synchronous call on the loop
(about 0.3 ms on SQLite): running the agents in worker threads instead made SQLite writers contend and was slower.
An executor built on the Agent's live event stream replaces this one to emit every step (``updates``,
``messages``, ``custom``) and to stop a run at a step boundary on cancel.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio
from haystack.dataclasses import ChatMessage

from haystack_state.server.assistants import Assistant
from haystack_state.server.views import outcome_status, values_view

__all__ = ["Emit", "FinalValuesExecutor", "RunExecutor", "RunJob", "RunOutcome", "error_payload"]

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
    :param decisions: ``Agent.resume`` decisions, for a run that answers an interrupt.
    :param checkpoint_id: Fork from this checkpoint instead of the head.
    :param stream_modes: The stream modes the client asked for.
    """

    run_id: str
    assistant: Assistant
    thread_id: str | None
    messages: list[ChatMessage]
    inputs: dict[str, Any]
    decisions: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    stream_modes: tuple[str, ...] = ("values",)


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """
    How a run ended.

    :param status: ``success``, ``interrupted`` (it stopped at an interrupt) or ``error``.
    :param values: The final values (JSON), or None after an error.
    :param error: ``{"error": type, "message": ...}`` after an error.
    :param thread_status: The thread's status now: ``idle``, ``interrupted`` or ``error``.
    """

    status: Literal["success", "interrupted", "error"]
    values: dict[str, Any] | None
    error: dict[str, str] | None
    thread_status: str


def error_payload(error: BaseException) -> dict[str, str]:
    """The stream's (and ``runs/wait``'s) error shape for an exception."""
    return {"error": type(error).__name__, "message": str(error) or type(error).__name__}


class RunExecutor(Protocol):
    """Runs one job, emitting its stream events; never raises for a failing run (it reports an error outcome)."""

    async def execute(self, job: RunJob, emit: Emit) -> RunOutcome:
        """Run the job; ``emit`` every stream event; return how it ended."""
        ...

    async def cancel(self, run_id: str) -> bool:
        """Stop a running run at its next step boundary. Returns whether it can (the run then ends as cancelled)."""
        ...


class FinalValuesExecutor:
    """
    Awaits the Agent's run and emits the final values (``values``) or the failure (``error``).

    :param max_concurrent: How many runs may execute at once.
    """

    def __init__(self, max_concurrent: int) -> None:
        self._limiter = anyio.CapacityLimiter(max_concurrent)

    async def execute(self, job: RunJob, emit: Emit) -> RunOutcome:
        """Run the job to its end; emit ``values`` once, or ``error``."""
        try:
            async with self._limiter:
                values, interrupted = await self._run(job)
        except Exception as error:  # the model's or a tool's failure, a conflict: the run fails, the server goes on
            payload = error_payload(error)
            await emit("error", payload)
            return RunOutcome("error", None, payload, "error")
        await emit("values", values)
        status: Literal["success", "interrupted"] = "interrupted" if interrupted else "success"
        return RunOutcome(status, values, None, "interrupted" if interrupted else "idle")

    async def cancel(self, run_id: str) -> bool:
        """A running ``Agent.run`` cannot be stopped between steps yet (that needs ``Agent.cancel``)."""
        return False

    @staticmethod
    async def _run(job: RunJob) -> tuple[dict[str, Any], bool]:
        agent = job.assistant.agent
        thread_id = job.thread_id if job.thread_id is not None else f"stateless-{job.run_id}"
        try:
            if job.decisions is not None:
                await agent.resume_async(thread_id, decisions=job.decisions)
            else:
                await agent.run_async(job.messages, thread_id=thread_id, checkpoint_id=job.checkpoint_id, **job.inputs)
            snapshot = agent.get_state(thread_id)
            return values_view(snapshot), outcome_status(snapshot) == "interrupted"
        finally:
            if job.thread_id is None and agent.checkpointer is not None:
                # A stateless run uses a thread of its own for its steps (and its interrupts), deleted at its end.
                with contextlib.suppress(KeyError):
                    agent.checkpointer.delete_thread(thread_id)
