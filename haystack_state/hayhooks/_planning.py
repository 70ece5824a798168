"""
Where a Hayhooks request runs: the thread, the checkpoint to fork from and the new messages of one chat completion or
Responses API request (:class:`RunPlan`), read from the thread and the request by the rules of
:mod:`haystack_state.hayhooks._conversation`. :class:`~haystack_state.hayhooks._wrapper.AgentWrapper` plans each request
with these, then runs the plan.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fastapi import HTTPException
from haystack.dataclasses import ChatMessage

from haystack_state.agent import Agent
from haystack_state.agent._session import ThreadSnapshot
from haystack_state.errors import ThreadNotFoundError
from haystack_state.hayhooks._conversation import (
    ClientMessage,
    chat_thread_id,
    client_messages,
    explicit_thread_id,
    parse_response_id,
    plan_chat_turn,
    to_chat_messages,
)
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointMeta, check_thread_id
from haystack_state.values import thaw

__all__ = ["RunPlan", "checkpointer_of", "plan_chat", "plan_response"]


@dataclasses.dataclass
class RunPlan:
    """
    One run of a request: where, from which checkpoint, with what.

    :param thread_id: The thread.
    :param checkpoint_id: The checkpoint to fork from; None runs at the thread's head.
    :param messages: The run's new messages.
    :param inputs: State values to start with (a scratch thread's, copied from the checkpoint it continues).
    :param scratch: Whether the thread is deleted after the run (``store=false``).
    """

    thread_id: str
    checkpoint_id: str | None
    messages: list[ChatMessage]
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    scratch: bool = False


def _users(messages: Sequence[ChatMessage]) -> list[str]:
    return [message.text or "" for message in messages if message.is_from("user")]


def _snapshot(agent: Agent, thread_id: str, checkpoint_id: str | None = None) -> ThreadSnapshot | None:
    try:
        return agent.get_state(thread_id, checkpoint_id)
    except ThreadNotFoundError:
        if checkpoint_id is not None:
            raise
        return None


def _input_chain(agent: Agent, thread_id: str, head: CheckpointMeta) -> Iterator[tuple[CheckpointMeta, list[str]]]:
    """The thread's ``input`` checkpoints from the head back to its root, each with its user messages' texts."""
    records = {meta.checkpoint_id: meta for meta in agent.get_history(thread_id)}
    current: CheckpointMeta | None = head
    while current is not None:
        if current.source == "input":
            values = agent.get_state(thread_id, current.checkpoint_id).values
            yield current, _users(values.get("messages") or [])
        current = records.get(current.parent_id) if current.parent_id is not None else None


def _fork(
    agent: Agent, thread_id: str, head: CheckpointMeta, index: int, users: list[ClientMessage], *, again: bool
) -> RunPlan:
    """
    The run that starts the thread over from its user message ``index``: on a fork from the checkpoint before
    that message came in, with the client's user messages from there; or, to answer it ``again`` as it is, on a
    fork from the checkpoint it came in with (the run that answered it is run anew).
    """
    came_in: tuple[CheckpointMeta, list[str]] | None = None
    for meta, thread_users in _input_chain(agent, thread_id, head):
        if len(thread_users) <= index:
            break
        came_in = meta, thread_users
    if came_in is None:
        raise HTTPException(status_code=409, detail=f"Thread '{thread_id}' has no user message {index + 1}.")
    meta, thread_users = came_in
    if again and len(thread_users) == index + 1:
        return RunPlan(thread_id, meta.checkpoint_id, [])
    if meta.parent_id is None:
        raise HTTPException(
            status_code=409,
            detail=f"The conversation differs from thread '{thread_id}' from its first message: start a new "
            "conversation (another thread id) for it.",
        )
    before = agent.get_state(thread_id, meta.parent_id).values
    start = len(_users(before.get("messages") or []))
    end = index + 1 if again else len(users)
    return RunPlan(thread_id, meta.parent_id, to_chat_messages(users[start:end]))


def plan_chat(
    agent: Agent,
    messages: Sequence[Mapping[str, Any]],
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None,
    *,
    side_request_prefixes: tuple[str, ...] = (),
    client_system_messages: bool = False,
) -> RunPlan:
    """
    Where a chat completion runs and with which messages (see :mod:`haystack_state.hayhooks._conversation`).
    Reads the thread (blocking).

    :param messages: The request's messages.
    :param body: The request body.
    :param headers: The request's headers.
    :returns: The run's plan.
    """
    client = client_messages(messages)
    last = next((message.text for message in reversed(client) if message.role == "user"), "")
    if side_request_prefixes and last.lstrip().startswith(side_request_prefixes):
        scratch = f"scratch-{uuid.uuid4().hex}"
        return RunPlan(scratch, None, to_chat_messages(client, system=client_system_messages), scratch=True)
    thread_id, _ = chat_thread_id(body, headers, client)
    check_thread_id(thread_id)
    snapshot = _snapshot(agent, thread_id)
    thread_users = None if snapshot is None else _users(snapshot.values.get("messages") or [])
    plan = plan_chat_turn(thread_users, client)
    if plan.kind == "new":
        return RunPlan(thread_id, None, to_chat_messages(plan.messages, system=client_system_messages))
    if plan.kind == "append":
        return RunPlan(thread_id, None, to_chat_messages(plan.messages))
    assert snapshot is not None
    users = [message for message in client if message.role == "user"]
    return _fork(agent, thread_id, snapshot.checkpoint, plan.index, users, again=plan.kind == "regenerate")


def plan_response(
    agent: Agent,
    input_items: Sequence[Mapping[str, Any]],
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None,
    *,
    client_system_messages: bool = False,
) -> RunPlan:
    """
    Where a Responses API request runs: after ``previous_response_id``'s checkpoint (on its thread, forking when
    it is not the head), on the thread that ``conversation``, ``metadata.thread_id`` or ``X-Thread-Id`` names, or
    on a new thread; with ``store=false``, on a scratch thread that starts as the previous response's checkpoint.
    Reads the thread (blocking).

    :param input_items: The request's input items.
    :param body: The request body.
    :param headers: The request's headers.
    :returns: The run's plan.
    """
    client = client_messages(input_items)
    if not any(message.role == "user" for message in client):
        raise ValueError("The request has no user message in its input.")
    store = body.get("store") is not False
    new = to_chat_messages(client)
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and previous:
        named = parse_response_id(previous)
        if named is None:
            raise HTTPException(status_code=404, detail=f"Unknown response id '{previous}'.")
        checkpoint_id, thread_id = named
        snapshot = _snapshot(agent, thread_id, checkpoint_id)
        assert snapshot is not None
        if store:
            head = checkpointer_of(agent).head(thread_id)
            return RunPlan(thread_id, None if head == checkpoint_id else checkpoint_id, new)
        inputs = {
            key: thaw(value)
            for key, value in snapshot.values.items()
            if key != "messages" and key in snapshot.schema and snapshot.schema[key].scope == "thread"
        }
        history = list(snapshot.values.get("messages") or [])
        return RunPlan(f"scratch-{uuid.uuid4().hex}", None, history + new, inputs, scratch=True)
    first = to_chat_messages(client, system=client_system_messages)
    if not store:
        return RunPlan(f"scratch-{uuid.uuid4().hex}", None, first, scratch=True)
    conversation = body.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    if isinstance(conversation, str) and conversation:
        thread_id = conversation
    else:
        named_thread = explicit_thread_id(body, headers)
        thread_id = named_thread[0] if named_thread else f"resp-{uuid.uuid4().hex}"
    check_thread_id(thread_id)
    return RunPlan(thread_id, None, new if _snapshot(agent, thread_id) is not None else first)


def checkpointer_of(agent: Agent) -> Checkpointer:
    """The deployed Agent's checkpointer (``AgentWrapper.get_agent`` made sure it has one)."""
    checkpointer = agent.checkpointer
    assert checkpointer is not None  # AgentWrapper.get_agent checks it
    return checkpointer
