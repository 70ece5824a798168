"""
What the threads and runs routers share: finding a user's thread (another user's thread is not found: 404, never
403), its agent and its head, and seeding a thread that has no checkpoint yet.

Seeding works around a missing Agent API: a thread starts with a run, so ``Agent.update_state`` refuses a thread
without checkpoints. The server writes the first checkpoint itself through the checkpointer's ``commit`` (the values
checked by a State of the agent's schema first, exactly as ``update_state`` would).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException

from haystack_state.agent import Agent
from haystack_state.agent._session import ThreadSnapshot
from haystack_state.agent._thread_methods import edit_messages
from haystack_state.errors import ThreadNotFoundError
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.delta import replace
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.server._assistants import Assistant
from haystack_state.server._context import Server
from haystack_state.server._records import ThreadRecord
from haystack_state.state import State

__all__ = [
    "agent_of",
    "assistant_of",
    "copy_values",
    "head",
    "head_async",
    "not_found",
    "owned_thread",
    "owned_thread_async",
    "seed_thread",
]


def not_found(thread_id: str) -> HTTPException:
    """The 404 for a thread that does not exist, or that belongs to another user."""
    return HTTPException(404, f"Thread '{thread_id}' not found.")


def owned_thread(server: Server, thread_id: str, user: str) -> ThreadRecord:
    """
    The user's thread record, from a worker thread (a sync route).

    :raises HTTPException: 404 if there is none (or it is another user's).
    """
    return _owned(thread_id, server.storage.get_thread(thread_id, user).result())


async def owned_thread_async(server: Server, thread_id: str, user: str) -> ThreadRecord:
    """:func:`owned_thread`, on the event loop."""
    return _owned(thread_id, await server.storage.get_thread(thread_id, user))


def _owned(thread_id: str, record: ThreadRecord | None) -> ThreadRecord:
    if record is None:
        raise not_found(thread_id)
    return record


def assistant_of(server: Server, record: ThreadRecord) -> Assistant:
    """The assistant of the thread's last run (the first assistant for a thread that has not run)."""
    if record.assistant_id is not None:
        assistant = server.assistants.resolve(record.assistant_id)
        if assistant is not None:
            return assistant
    return server.assistants.default


def agent_of(server: Server, record: ThreadRecord) -> Agent:
    """The Agent of the thread's assistant."""
    return assistant_of(server, record).agent


def head(server: Server, record: ThreadRecord) -> ThreadSnapshot | None:
    """The thread's head, or None before its first checkpoint."""
    try:
        return agent_of(server, record).get_state(record.thread_id)
    except ThreadNotFoundError:
        return None


async def head_async(server: Server, record: ThreadRecord) -> ThreadSnapshot | None:
    """:func:`head`, awaiting the checkpointer (its short reads run inline on the event loop)."""
    try:
        return await agent_of(server, record).get_state_async(record.thread_id)
    except ThreadNotFoundError:
        return None


def seed_thread(
    agent: Agent, thread_id: str, values: Mapping[str, Any], *, metadata: dict[str, Any] | None = None
) -> CheckpointMeta:
    """
    Write the first checkpoint of a thread: ``values`` written through their keys' handlers into an empty state of
    the agent's schema (as ``Agent.update_state`` writes into a thread's state).

    :raises StateTypeError: If a value does not fit its key (nothing is written).
    :raises UnknownStateKeyError: If a key is not in the schema (nothing is written).
    :raises ThreadConflictError: If the thread got a checkpoint meanwhile.
    """
    state = State(agent.state_schema)
    state.update(edit_messages(state, thread_id, values))
    return _checkpointer(agent).commit(
        thread_id,
        parent_id=None,
        expected_head=None,
        delta=state.peek_changes(),
        step=0,
        source="update",
        metadata=metadata,
    )


def copy_values(agent: Agent, thread_id: str, snapshot: ThreadSnapshot) -> CheckpointMeta:
    """
    Write a new thread whose first checkpoint holds another thread's state at ``snapshot`` (values as they are, its
    run metadata too, so an interrupted thread's copy is interrupted as well).
    """
    source = snapshot.checkpoint
    return _checkpointer(agent).commit(
        thread_id,
        parent_id=None,
        expected_head=None,
        delta={key: replace(value) for key, value in snapshot.values.items()},
        step=source.step,
        source="update",
        metadata={
            **source.metadata,
            "copied_from": {"thread_id": source.thread_id, "checkpoint_id": source.checkpoint_id},
        },
    )


def _checkpointer(agent: Agent) -> Checkpointer:
    assert agent.checkpointer is not None  # every served agent has one (checked by Assistants)
    return agent.checkpointer
