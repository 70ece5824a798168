"""
The JSON shapes the server answers with (the spec's ``Thread``, ``ThreadState``, ``Run``, ``Assistant``), built from
the Agent's snapshots and the server's records. A snapshot's values go on the wire through :func:`snapshot_values`
alone: ``messages`` is the conversation, each message with its id, without the Agent's own system prompt unless
``system_prompt`` (``create_app(wire_system_prompt=True)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from haystack_state.agent._session import ThreadSnapshot
from haystack_state.persistence.codec import encode
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.server._interrupts import interrupts_of
from haystack_state.server._records import RunRecord, ThreadRecord, ThreadStatus
from haystack_state.server._wire import values_to_wire

__all__ = [
    "INTERRUPT_KEY",
    "checkpoint_ref",
    "outcome_status",
    "run_view",
    "select",
    "snapshot_values",
    "state_view",
    "thread_view",
    "values_view",
]

#: The key under which a run's final values carry the thread's interrupts (as LangGraph's platform sends them).
INTERRUPT_KEY = "__interrupt__"
TOOLS_TASK = "tools"


def checkpoint_ref(thread_id: str, checkpoint_id: str | None) -> dict[str, Any] | None:
    """The spec's checkpoint object, or None."""
    if checkpoint_id is None:
        return None
    return {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id, "checkpoint_map": None}


def outcome_status(snapshot: ThreadSnapshot | None) -> ThreadStatus:
    """A thread's status from its head: ``interrupted`` (it waits on an interrupt) or ``idle``."""
    return "interrupted" if snapshot is not None and interrupts_of(snapshot) else "idle"


def snapshot_values(snapshot: ThreadSnapshot, *, system_prompt: bool = False) -> dict[str, Any]:
    """
    A snapshot's values as JSON (see :func:`haystack_state.server._wire.conversation_to_wire` for ``messages``).

    :param snapshot: The thread at one checkpoint.
    :param system_prompt: Whether ``messages`` keeps the Agent's own system prompt.
    """
    return values_to_wire(snapshot.values, thread_id=snapshot.checkpoint.thread_id, system_prompt=system_prompt)


def values_view(snapshot: ThreadSnapshot, *, system_prompt: bool = False) -> dict[str, Any]:
    """A run's final values: the state as JSON, with ``__interrupt__`` when the thread waits on interrupts."""
    values = snapshot_values(snapshot, system_prompt=system_prompt)
    interrupts = interrupts_of(snapshot)
    if interrupts:
        values[INTERRUPT_KEY] = interrupts
    return values


def thread_view(
    record: ThreadRecord, snapshot: ThreadSnapshot | None, *, system_prompt: bool = False
) -> dict[str, Any]:
    """
    The spec's ``Thread``.

    :param record: The server's record.
    :param snapshot: The thread's head, or None before its first run.
    :param system_prompt: Whether ``values.messages`` keeps the Agent's own system prompt.
    """
    interrupts = interrupts_of(snapshot) if snapshot is not None else []
    return {
        "thread_id": record.thread_id,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "metadata": dict(record.metadata),
        "status": record.status,
        "values": snapshot_values(snapshot, system_prompt=system_prompt) if snapshot is not None else None,
        "interrupts": {snapshot.checkpoint.checkpoint_id: interrupts} if snapshot is not None and interrupts else {},
        "config": {},
        "error": None,
    }


def _checkpoint_metadata(meta: CheckpointMeta) -> dict[str, Any]:
    metadata = encode(dict(meta.metadata), where="checkpoint metadata") if meta.metadata else {}
    return {
        **metadata,
        "source": meta.source,
        "step": meta.step,
        "tool_names": list(meta.tool_names),
        "changed_keys": list(meta.changed_keys),
    }


def state_view(snapshot: ThreadSnapshot, *, with_values: bool = True, system_prompt: bool = False) -> dict[str, Any]:
    """
    The spec's ``ThreadState`` of one checkpoint.

    :param snapshot: The thread at that checkpoint.
    :param with_values: Whether to convert the values (a history page that selects no values skips them).
    :param system_prompt: Whether ``values.messages`` keeps the Agent's own system prompt.
    """
    meta = snapshot.checkpoint
    interrupts = interrupts_of(snapshot)
    pending = bool(snapshot.pending_tool_calls) or bool(interrupts)
    tasks = (
        [
            {
                "id": meta.checkpoint_id,
                "name": TOOLS_TASK,
                "error": None,
                "interrupts": interrupts,
                "checkpoint": None,
                "state": None,
                "result": None,
            }
        ]
        if pending
        else []
    )
    return {
        "values": snapshot_values(snapshot, system_prompt=system_prompt) if with_values else {},
        "next": [TOOLS_TASK] if pending else [],
        "tasks": tasks,
        "checkpoint": checkpoint_ref(meta.thread_id, meta.checkpoint_id),
        "metadata": _checkpoint_metadata(meta),
        "created_at": meta.created_at.isoformat(),
        "parent_checkpoint": checkpoint_ref(meta.thread_id, meta.parent_id),
        "interrupts": interrupts,
    }


def meta_view(meta: CheckpointMeta) -> dict[str, Any]:
    """A ``ThreadState`` without its values (for a history page that selects only records)."""
    return {
        "values": {},
        "next": [],
        "tasks": [],
        "checkpoint": checkpoint_ref(meta.thread_id, meta.checkpoint_id),
        "metadata": _checkpoint_metadata(meta),
        "created_at": meta.created_at.isoformat(),
        "parent_checkpoint": checkpoint_ref(meta.thread_id, meta.parent_id),
        "interrupts": [],
    }


def run_view(run: RunRecord) -> dict[str, Any]:
    """The spec's ``Run``."""
    return {
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "assistant_id": run.assistant_id,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "status": run.status,
        "metadata": dict(run.metadata),
        "kwargs": dict(run.kwargs),
        "multitask_strategy": run.multitask_strategy,
        "cancel_reason": None,
        "error": run.error,
    }


def select(item: Mapping[str, Any], fields: Iterable[str] | None) -> dict[str, Any]:
    """Keep the selected top-level fields of a response item (all of them if ``fields`` is None)."""
    if not fields:
        return dict(item)
    wanted = set(fields)
    return {key: value for key, value in item.items() if key in wanted}
