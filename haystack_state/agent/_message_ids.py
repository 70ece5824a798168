"""
Message ids: every message gets one when it enters a thread (``meta["id"]``), so streams, states, history and edits
name it the same way.

The Agent gives ids to its system prompt, the run's input messages (a message that has an id keeps it), each model
reply (decided before the model is called, so streamed chunks carry it too) and each tool result. A message is never
changed in place: what gets an id is a copy. Messages stored before ids existed have none; :func:`stored_id` gives them
one from their thread and position, the same on every read.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence

from haystack.dataclasses import ChatMessage

__all__ = [
    "SYSTEM_PROMPT_ID_PREFIX",
    "is_system_prompt",
    "merge_by_id",
    "message_id",
    "new_message_id",
    "stored_id",
    "stored_ids",
    "with_id",
    "with_ids",
]

#: The ids of the Agent's own system prompt start with this (a system message a caller sent has another id).
SYSTEM_PROMPT_ID_PREFIX = "system-prompt-"


def _fresh_prefix() -> tuple[str, Iterator[int]]:
    """A random UUID's first 20 hex digits (version 4, RFC 4122 variant) and a counter from a random start."""
    h = os.urandom(10).hex()
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-", itertools.count(int.from_bytes(os.urandom(5)))


_prefix, _counter = _fresh_prefix()


def _after_fork() -> None:
    global _prefix, _counter
    _prefix, _counter = _fresh_prefix()


# A process's ids share 74 random bits that no other process has (a forked child draws its own); they differ in a
# counter. Not the application's ``random``: one that seeds it cannot make two processes hand out the same ids.
os.register_at_fork(after_in_child=_after_fork)


def new_message_id() -> str:
    """
    A fresh message id, shaped as a random UUID (version 4), as LangChain's are: the process's random prefix and a
    counter, at a fraction of ``uuid4()``'s cost (a model reply and a tool result get one at every step).
    """
    return f"{_prefix}{next(_counter):012x}"


_new = object.__new__


def message_id(message: ChatMessage) -> str | None:
    """The message's id (``meta["id"]``, a non-empty string), or None."""
    found = message.meta.get("id")
    return found if isinstance(found, str) and found else None


def with_id(message: ChatMessage, given: str | None = None) -> ChatMessage:
    """
    The message, if it has an id; else a copy of it with ``meta["id"]`` (the message itself is not changed).

    :param message: The message.
    :param given: The id to give it; a fresh one if None.
    :returns: A message with an id.
    """
    if not isinstance(message, ChatMessage):
        return message  # not a message: the state's type check names it
    fields = message.__dict__
    meta = fields["_meta"]
    found = meta.get("id")
    if type(found) is str and found:
        return message
    meta = dict(meta)
    meta["id"] = given if given is not None else new_message_id()
    # A field-by-field copy, as the State makes one (ChatMessage's init checks were met by the original).
    copy = _new(type(message))
    copied = fields.copy()
    copied["_meta"] = meta
    object.__setattr__(copy, "__dict__", copied)
    return copy


def with_ids(messages: Iterable[ChatMessage]) -> list[ChatMessage]:
    """The messages, each with an id (see :func:`with_id`)."""
    return [with_id(message) for message in messages]


def is_system_prompt(message: ChatMessage, index: int | None = None) -> bool:
    """
    Whether a message is the Agent's own system prompt: a system message whose id says so, or (stored before ids
    existed) a system message without id at the start of the conversation.

    :param message: The message.
    :param index: Its position in the thread's ``messages``; None if not known (then only its id tells).
    """
    if not message.is_from("system"):
        return False
    found = message.meta.get("id")
    if isinstance(found, str) and found:
        return found.startswith(SYSTEM_PROMPT_ID_PREFIX)
    return index == 0


def stored_id(message: ChatMessage, thread_id: str | None, index: int) -> str:
    """
    A stored message's id: its own, or, for a message stored without one, an id made from its thread and position
    (the same on every read of the thread, at any of its checkpoints).

    :param message: The message.
    :param thread_id: Its thread (None: a run without thread).
    :param index: Its position in the thread's ``messages``.
    """
    found = message.meta.get("id")
    if isinstance(found, str) and found:
        return found
    return f"{thread_id or 'run'}-m{index}"


def stored_ids(messages: Sequence[ChatMessage], thread_id: str | None) -> dict[str, int]:
    """The position of each stored message by its id (see :func:`stored_id`); the last one wins for a repeated id."""
    return {stored_id(message, thread_id, index): index for index, message in enumerate(messages)}


def merge_by_id(
    stored: Sequence[ChatMessage], given: Sequence[ChatMessage], thread_id: str | None
) -> list[ChatMessage] | None:
    """
    An edit of a thread's messages, as LangGraph's ``add_messages`` makes it: a given message whose id names a stored
    message takes its place (and keeps its id); the others are appended.

    :param stored: The thread's messages.
    :param given: The messages of the edit, each with an id (see :func:`with_ids`).
    :param thread_id: The thread (for the ids of messages stored without one).
    :returns: The whole new list, or None if no given message names a stored one (then they are only appended).
    """
    positions = stored_ids(stored, thread_id)
    if not any(message_id(message) in positions for message in given):
        return None
    edited = list(stored)
    for message in given:
        found = message_id(message)
        index = positions.get(found) if found is not None else None
        if index is None:
            edited.append(message)
        else:
            edited[index] = message
    return edited
