"""
The shape of a conversation, as context policies see it, and the invariants they keep.

What a built-in policy sends is always ``head + notes + messages[cut:]``: the *head* (the leading system messages,
and the notes an earlier policy of a composition put after them), then a contiguous, recent part of the
conversation. The cut never falls on a tool result, so a tool call is sent with all its results and a result is
never sent without its call; it never falls after the latest user message or after the start of the current run.
Everything here walks from the end and touches only what is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haystack import logging
from haystack.dataclasses import ChatMessage, ChatRole

from haystack_state.agent.context._tokens import IdentityCache

__all__ = [
    "CONTEXT_META_KEY",
    "RunWarnings",
    "assemble",
    "call_key",
    "head_end",
    "is_context_note",
    "is_turn_start",
    "latest_user_index",
    "must_keep_from",
    "step_back_to_cut",
]

#: The ``meta`` key of the messages a policy makes (summary notes, previews): ``{"kind": ..., ...}``.
CONTEXT_META_KEY = "haystack_state.context"


def is_context_note(message: ChatMessage) -> bool:
    """
    Whether a message is a note a context policy made to stand for other messages (a summary note).

    :param message: The message.
    :returns: True for a note.
    """
    marker = message.meta.get(CONTEXT_META_KEY)
    return isinstance(marker, dict) and marker.get("kind") == "summary"


def is_turn_start(message: ChatMessage) -> bool:
    """
    Whether a message starts a turn: a user message that is not a policy's note.

    :param message: The message.
    :returns: True if it starts a turn.
    """
    return message.role is ChatRole.USER and not is_context_note(message)


def head_end(messages: Sequence[ChatMessage]) -> int:
    """
    The end of the head: the leading system messages and the notes that follow them.

    :param messages: The conversation.
    :returns: The index of the first message after the head.
    """
    end = 0
    while end < len(messages) and (messages[end].role is ChatRole.SYSTEM or is_context_note(messages[end])):
        end += 1
    return end


def latest_user_index(messages: Sequence[ChatMessage], floor: int = 0) -> int | None:
    """
    The index of the latest user message at or after ``floor``, found from the end.

    :param messages: The conversation.
    :param floor: Where to stop looking.
    :returns: The index, or None if there is none.
    """
    for index in range(len(messages) - 1, floor - 1, -1):
        if is_turn_start(messages[index]):
            return index
    return None


def step_back_to_cut(messages: Sequence[ChatMessage], index: int, floor: int) -> int:
    """
    Move a cut back until it does not fall on a tool result (which would part the result from its call).

    :param messages: The conversation.
    :param index: The proposed cut.
    :param floor: The lowest allowed cut.
    :returns: The cut.
    """
    while floor < index < len(messages) and messages[index].role is ChatRole.TOOL:
        index -= 1
    return index


def must_keep_from(messages: Sequence[ChatMessage], run_start: int, head: int) -> int:
    """
    Where the part every policy sends begins: the latest user message and the current run's own messages.

    :param messages: The conversation.
    :param run_start: The index of the current run's first message.
    :param head: The end of the head.
    :returns: The latest cut a policy may choose.
    """
    start = min(run_start, len(messages))
    latest = latest_user_index(messages, head)
    if latest is not None:
        start = min(start, latest)
    return step_back_to_cut(messages, max(start, head), head)


def call_key(call_id: str | None, tool_name: str) -> tuple[str | None, str]:
    """
    What pairs a tool result with its call: the call id, or the tool's name for a call without an id.

    :param call_id: The call id.
    :param tool_name: The tool's name.
    :returns: The key.
    """
    return (call_id, "") if call_id is not None else (None, tool_name)


def _paired(window: list[ChatMessage]) -> list[ChatMessage | None]:
    """
    The window, with None for each tool message none of whose results has its call earlier in the window (and a
    copy holding only the paired results where some have): possible only in hand-made histories.
    """
    calls: set[tuple[str | None, str]] = set()
    kept: list[ChatMessage | None] = []
    for message in window:
        results = message.tool_call_results if message.role is ChatRole.TOOL else []
        if not results:
            calls.update(call_key(call.id, call.tool_name) for call in message.tool_calls)
            kept.append(message)
            continue
        paired = [r for r in results if call_key(r.origin.id, r.origin.tool_name) in calls]
        if len(paired) == len(results):
            kept.append(message)
        elif paired:
            kept.append(ChatMessage(_role=ChatRole.TOOL, _content=paired, _meta=dict(message.meta)))
        else:
            kept.append(None)
    return kept


def assemble(
    messages: Sequence[ChatMessage], head: int, cut: int, run_start: int, notes: Sequence[ChatMessage] = ()
) -> tuple[list[ChatMessage], int]:
    """
    What to send: ``messages[:head] + notes + messages[cut:]``, without tool results whose call is not sent.

    :param messages: The conversation.
    :param head: The end of the head.
    :param cut: Where the sent part of the conversation begins (``head <= cut``).
    :param run_start: The index of the current run's first message.
    :param notes: Messages to put after the head.
    :returns: The messages, and where the current run begins in them.
    """
    window = _paired(list(messages[cut:]))
    offset = head + len(notes)
    if run_start < head:
        mapped = run_start
    else:
        mapped = offset + sum(1 for m in window[: max(run_start - cut, 0)] if m is not None)
    sent = [*messages[:head], *notes, *(m for m in window if m is not None)]
    return sent, mapped


logger = logging.getLogger(__name__)


class RunWarnings:
    """Warnings a policy logs at most once per run (a run is recognised by its first message's identity)."""

    def __init__(self) -> None:
        """Create the record of warnings given."""
        self._given: IdentityCache[set[str]] = IdentityCache()

    def warn(self, messages: Sequence[ChatMessage], run_start: int, kind: str, text: str, **values: Any) -> None:
        """
        Log a warning, unless a warning of this kind was already logged for this run.

        :param messages: The conversation.
        :param run_start: The index of the run's first message.
        :param kind: What the warning is about.
        :param text: The message, with ``{name}`` placeholders for ``values``.
        :param values: The values of the placeholders.
        """
        anchor: object | None = None
        if messages:
            anchor = messages[min(run_start, len(messages) - 1)]
        given = self._given.get(anchor) if anchor is not None else None
        if given is not None and kind in given:
            return
        if anchor is not None:
            if given is None:
                given = set()
                self._given.put(anchor, given)
            given.add(kind)
        logger.warning(text, **values)
