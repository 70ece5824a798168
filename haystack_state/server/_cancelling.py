"""
What cancelling a run does to its thread: :func:`close_cancelled_run` marks the run as over (so the thread takes new
messages), :func:`rollback_thread` restores the values the thread had where the run started (``action="rollback"``).
Both run in the process that executed the run, after it stopped.
"""

from __future__ import annotations

import contextlib
from typing import Any

from haystack_state.agent import Agent
from haystack_state.agent._session import RUN_METADATA
from haystack_state.errors import ThreadNotFoundError
from haystack_state.persistence.delta import delete, replace

__all__ = ["CANCEL_ACTIONS", "close_cancelled_run", "rollback_thread"]

CANCEL_ACTIONS = ("interrupt", "rollback")


def close_cancelled_run(agent: Agent, thread_id: str, run_id: str) -> None:
    """
    Mark a cancelled run as over on its thread: its head (which the run committed meaning to go on) gets a child
    checkpoint with the same values, marked ``cancelled``, that does not continue it. A run cancelled after the model
    asked for tools leaves those calls pending: new messages then follow the Agent's ``on_unfinished_calls`` policy,
    which by default answers them with error results after a cancel (the user did not want them made); a run with
    no new messages runs them.

    :param agent: The thread's Agent.
    :param thread_id: The thread.
    :param run_id: The cancelled run (recorded in the new checkpoint's metadata).
    """
    try:
        snapshot = agent.get_state(thread_id)
    except ThreadNotFoundError:
        return
    meta = snapshot.checkpoint
    if not (snapshot.pending_tool_calls or meta.metadata.get("continues")) or snapshot.interrupts:
        return
    # With calls pending, the run can still be finished (agent.run([], thread_id=...)): what it counted goes along.
    carried = (
        {key: meta.metadata[key] for key in RUN_METADATA if key in meta.metadata and key != "continues"}
        if snapshot.pending_tool_calls
        else {}
    )
    checkpointer = agent.checkpointer
    assert checkpointer is not None  # (it read the thread)
    checkpointer.commit(
        thread_id,
        parent_id=meta.checkpoint_id,
        expected_head=meta.checkpoint_id,
        delta={},
        step=meta.step,
        source="update",
        metadata={**carried, "cancelled": {"run_id": run_id}},
    )


def rollback_thread(agent: Agent, thread_id: str, checkpoint_id: str | None, run_id: str) -> None:
    """
    Restore a thread to the values it had at ``checkpoint_id`` (a cancelled run's starting point) with a new
    checkpoint on top of its head; with no checkpoint (the run was the thread's first), delete its checkpoints.

    :param agent: The thread's Agent.
    :param thread_id: The thread.
    :param checkpoint_id: Where the run started.
    :param run_id: The cancelled run (recorded in the new checkpoint's metadata).
    """
    checkpointer = agent.checkpointer
    assert checkpointer is not None, "a thread's Agent has a checkpointer"
    if checkpoint_id is None:
        with contextlib.suppress(KeyError):
            checkpointer.delete_thread(thread_id)
        return
    head = checkpointer.head(thread_id)
    if head is None or head == checkpoint_id:
        return
    start = agent.get_state(thread_id, checkpoint_id)
    now = agent.get_state(thread_id)
    delta: dict[str, Any] = {key: replace(value) for key, value in start.values.items()}
    delta.update({key: delete() for key in now.values if key not in start.values})
    checkpointer.commit(
        thread_id,
        parent_id=head,
        expected_head=head,
        delta=delta,
        step=start.checkpoint.step,
        source="update",
        metadata={**start.checkpoint.metadata, "rolled_back": {"run_id": run_id, "to": checkpoint_id}},
    )
