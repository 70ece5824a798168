"""
The Agent's durable-thread inspection and editing methods (``get_state``, ``get_history``, ``update_state`` and
their async twins), as functions of the Agent that its methods are (``Agent.get_state = get_state``), and the
opening of a run's thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from haystack.dataclasses import ChatMessage

from haystack_state.agent._history import CheckpointHistory
from haystack_state.agent._message_ids import merge_by_id, message_id, with_ids
from haystack_state.agent._session import ThreadSession, ThreadSnapshot
from haystack_state.errors import ThreadNotFoundError
from haystack_state.handlers import merge_lists, replace_values
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointMeta, check_thread_id
from haystack_state.state import State

if TYPE_CHECKING:
    from haystack_state.agent._component import Agent

__all__ = [
    "agent_checkpointer",
    "cancel",
    "cancel_async",
    "edit_messages",
    "existing_session",
    "existing_session_async",
    "get_history",
    "get_history_async",
    "get_state",
    "get_state_async",
    "open_session",
    "open_session_async",
    "update_state",
]

MESSAGES = "messages"


def edit_messages(state: State, thread_id: str | None, values: Mapping[str, object]) -> dict[str, object]:
    """
    ``values`` for an edit of ``state``, with ids for the new messages; if a message names one of the state's messages
    by id (and ``messages`` appends, as it does by default), ``messages`` becomes the whole edited list, written as a
    ``replace`` (see :func:`haystack_state.agent._message_ids.merge_by_id`).

    :param state: The thread's state.
    :param thread_id: The thread.
    :param values: key -> value, as given.
    :returns: key -> value to write.
    """
    given = values.get(MESSAGES)
    listed: list[object] = given if isinstance(given, list) else [given]
    messages = [item for item in listed if isinstance(item, ChatMessage)]
    if given is None or len(messages) != len(listed):
        return dict(values)  # nothing to do, or a type error the state reports
    named = any(message_id(message) is not None for message in messages)
    items = with_ids(messages)
    spec = state.specs.get(MESSAGES)
    if named and spec is not None and spec.handler is merge_lists:
        edited = merge_by_id(state.view(MESSAGES) or [], items, thread_id)
        if edited is not None:
            state.set(MESSAGES, edited, handler_override=replace_values)
            return {key: value for key, value in values.items() if key != MESSAGES}
    return {**values, MESSAGES: items if isinstance(given, list) else items[0]}


def _session(agent: Agent, thread_id: str | None, checkpoint_id: str | None) -> ThreadSession | None:
    """A run's thread, not opened yet, or None without a ``thread_id``."""
    if thread_id is None:
        if checkpoint_id is not None:
            raise ValueError("checkpoint_id needs a thread_id.")
        return None
    return ThreadSession(agent_checkpointer(agent, thread_id), thread_id, agent.setup.specs)


def open_session(agent: Agent, thread_id: str | None, checkpoint_id: str | None) -> ThreadSession | None:
    """
    Open a run's thread under its lease (close the session when the run ends), or None without a ``thread_id``.

    :raises ValueError: For a ``checkpoint_id`` without ``thread_id``, or a ``thread_id`` without checkpointer.
    :raises ThreadBusyError: If another run holds the thread.
    """
    session = _session(agent, thread_id, checkpoint_id)
    return session.open(checkpoint_id) if session is not None else None


async def open_session_async(agent: Agent, thread_id: str | None, checkpoint_id: str | None) -> ThreadSession | None:
    """:func:`open_session`, awaiting the checkpointer."""
    session = _session(agent, thread_id, checkpoint_id)
    return (await session.open_async(checkpoint_id)) if session is not None else None


def existing_session(
    agent: Agent, thread_id: str, checkpoint_id: str | None = None, *, lease: bool = False
) -> ThreadSession:
    """Open a thread that must exist (``ThreadNotFoundError`` otherwise)."""
    session = ThreadSession(agent_checkpointer(agent, thread_id), thread_id, agent.setup.specs)
    if session.open(checkpoint_id, lease=lease).is_new:
        session.close()
        raise ThreadNotFoundError(thread_id)
    return session


async def existing_session_async(
    agent: Agent, thread_id: str, checkpoint_id: str | None = None, *, lease: bool = False
) -> ThreadSession:
    """:func:`existing_session`, awaiting the checkpointer."""
    session = ThreadSession(agent_checkpointer(agent, thread_id), thread_id, agent.setup.specs)
    if (await session.open_async(checkpoint_id, lease=lease)).is_new:
        await session.aclose()
        raise ThreadNotFoundError(thread_id)
    return session


def agent_checkpointer(agent: Agent, thread_id: object) -> Checkpointer:
    check_thread_id(thread_id)
    if agent.checkpointer is None:
        raise ValueError(f"thread_id={thread_id!r} needs an Agent created with a checkpointer.")
    return agent.checkpointer


def cancel(agent: Agent, thread_id: str) -> bool:
    """
    Ask the run on a thread to stop, from any process: it stops at its next step boundary with
    ``exit_reason="cancelled"`` and leaves a checkpoint that ``run([], thread_id=...)`` continues. The run finds
    the request when it next renews its lease (every third of the checkpointer's ``lease_ttl``: 10 s by
    default), so a run in the middle of a long model or tool call finishes that call first.

    :param thread_id: The thread.
    :returns: Whether a run was holding the thread (False: no run is under way; nothing happens).
    :raises ValueError: Without a checkpointer, or for an invalid thread id.
    """
    return agent_checkpointer(agent, thread_id).request_stop(thread_id)


async def cancel_async(agent: Agent, thread_id: str) -> bool:
    """:meth:`cancel`, awaiting the checkpointer."""
    return await agent_checkpointer(agent, thread_id).arequest_stop(thread_id)


def get_state(agent: Agent, thread_id: str, checkpoint_id: str | None = None) -> ThreadSnapshot:
    """
    A thread's state at its head, or at an earlier checkpoint.

    :param thread_id: The thread.
    :param checkpoint_id: An earlier checkpoint of the thread; the head if None.
    :returns: The values, the checkpoint's record and any pending tool calls.
    :raises ValueError: If the agent has no checkpointer, or for an invalid thread id.
    :raises ThreadNotFoundError: If the thread has no checkpoint.
    :raises CheckpointNotFoundError: If the thread has no such checkpoint.
    """
    return existing_session(agent, thread_id, checkpoint_id).snapshot()


async def get_state_async(agent: Agent, thread_id: str, checkpoint_id: str | None = None) -> ThreadSnapshot:
    """:meth:`get_state`, awaiting the checkpointer (no database call blocks the event loop)."""
    return (await existing_session_async(agent, thread_id, checkpoint_id)).snapshot()


def get_history(agent: Agent, thread_id: str, limit: int | None = None, before: str | None = None) -> CheckpointHistory:
    """
    A thread's checkpoints (every branch), newest first, each with its id, parent id, step, source (input, model,
    tools or update), tool names, creation time and changed keys. Renders as a table in notebooks. Pages through
    a long thread without loading all of it: ``limit`` records at a time, ``before`` the last id of a page.

    :param thread_id: The thread.
    :param limit: At most this many records (None: all).
    :param before: Only the checkpoints committed before this one.
    :returns: The checkpoints.
    :raises ValueError: If the agent has no checkpointer, or for an invalid thread id or limit.
    :raises ThreadNotFoundError: If the thread has no checkpoint.
    :raises CheckpointNotFoundError: If ``before`` is not a checkpoint of the thread.
    """
    return CheckpointHistory(agent_checkpointer(agent, thread_id).history(thread_id, limit=limit, before=before))


async def get_history_async(
    agent: Agent, thread_id: str, limit: int | None = None, before: str | None = None
) -> CheckpointHistory:
    """:meth:`get_history`, awaiting the checkpointer."""
    return CheckpointHistory(await agent_checkpointer(agent, thread_id).ahistory(thread_id, limit=limit, before=before))


def update_state(agent: Agent, thread_id: str, values: dict[str, object]) -> CheckpointMeta:
    """
    A human edit of a thread's state: the values are written through their keys' handlers, all or nothing, and
    recorded as a checkpoint of its own (source ``"update"``). An interrupted run stays interrupted (and a crashed
    run can still be continued) unless the edit answers its pending tool calls. A thread a live run holds gets
    ``ThreadBusyError`` (its run is never taken over). New messages get ids; a message whose id names one of the
    thread's messages replaces it and keeps its id (as LangGraph's ``add_messages`` does).

    :param thread_id: The thread.
    :param values: key -> value.
    :returns: The new checkpoint's record.
    :raises ValueError: If the agent has no checkpointer.
    :raises ThreadNotFoundError: If the thread has no checkpoint (a thread starts with a run).
    :raises ThreadBusyError: If a live run holds the thread.
    :raises StateTypeError: If a value does not fit its key (nothing is written).
    :raises UnknownStateKeyError: If a key is not in the schema (nothing is written).
    :raises ThreadConflictError: If a run committed to the thread meanwhile.
    """
    session = existing_session(agent, thread_id)
    session.guard_commits()
    state = session.load_state()
    state.update(edit_messages(state, thread_id, values))
    return session.commit(state, "update", metadata=session.run_metadata())
