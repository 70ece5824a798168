"""
A served run's job and record from a request: :func:`new_run` makes the queue's record of a new run, and
:func:`job_from_kwargs` rebuilds what the run does (a :class:`~haystack_state.server._executor.RunJob`) from the
kwargs the runs router stored with it, in whichever process executes it.
"""

from __future__ import annotations

from typing import Any

from haystack_state.server._assistants import Assistant
from haystack_state.server._executor import RunJob
from haystack_state.server._records import MultitaskStrategy, RunRecord, now_text
from haystack_state.server._wire import values_from_wire

__all__ = ["job_from_kwargs", "new_run"]


def job_from_kwargs(
    run_id: str, assistant: Assistant, thread_id: str | None, kwargs: dict[str, Any], *, attempt: int = 1
) -> RunJob:
    """Build a job from a run's kwargs (as stored by the runs router)."""
    values = values_from_wire(kwargs.get("input"))
    messages = values.pop("messages", [])
    return RunJob(
        run_id=run_id,
        assistant=assistant,
        thread_id=thread_id,
        messages=messages,
        inputs=values,
        decisions=kwargs.get("decisions"),
        answers=kwargs.get("answers"),
        checkpoint_id=kwargs.get("checkpoint_id"),
        stream_modes=tuple(kwargs.get("stream_mode") or ()),
        attempt=attempt,
        on_unfinished_calls=kwargs.get("on_unfinished_calls"),
    )


def new_run(
    run_id: str,
    thread_id: str,
    assistant: Assistant,
    owner: str,
    kwargs: dict[str, Any],
    *,
    metadata: dict[str, Any] | None,
    multitask_strategy: MultitaskStrategy,
) -> RunRecord:
    """A new run record (its status is decided by the queue)."""
    at = now_text()
    return RunRecord(
        run_id=run_id,
        thread_id=thread_id,
        assistant_id=assistant.assistant_id,
        owner=owner,
        status="pending",
        multitask_strategy=multitask_strategy,
        kwargs=kwargs,
        metadata=dict(metadata or {}),
        error=None,
        worker=None,
        created_at=at,
        updated_at=at,
    )
