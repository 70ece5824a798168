"""
LangGraph's ``messages`` stream mode (not ``messages-tuple``), as LangGraph's platform sends it (pure: no I/O):

- ``messages/metadata``: once per message id, before its first piece, ``{message id: {"metadata": {...}}}`` (the
  ``langgraph_node``, ``langgraph_step``, ``run_id`` and ``thread_id`` the tuple mode pairs with each chunk);
- ``messages/partial``: the model's reply so far, as a list of one ``AIMessageChunk`` dict, after each chunk: its
  text accumulated, its tool-call pieces merged by index, and ``tool_calls`` parsed from the arguments so far;
- ``messages/complete``: a finished message, as a list of one message dict: the model's whole reply (after its
  partials, when it streamed) and each tool result.

Every event holds its own copy of the message: the stream keeps events until they are sent, so a later chunk must not
change an earlier partial.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MESSAGE_EVENTS", "MessageStream", "parse_partial_json"]

#: The SSE events of the ``messages`` mode.
MESSAGE_EVENTS = ("messages/metadata", "messages/partial", "messages/complete")

_CLOSERS = {"{": "}", "[": "]"}


def parse_partial_json(text: str) -> Any:
    """
    Parse JSON that may be cut short (a tool call's arguments as they stream): open strings, arrays and objects are
    closed, and a last member with no value yet is dropped.

    :param text: The JSON so far.
    :returns: The parsed value, or None if it cannot be read even so.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    closers: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in _CLOSERS:
            closers.append(_CLOSERS[char])
        elif char in "}]" and (not closers or closers.pop() != char):
            return None
    body = (text[:-1] if escaped else text) + ('"' if in_string else "")
    tail = "".join(reversed(closers))
    while body:  # drop what cannot stand yet (a key without its value, a dangling comma), from the end
        try:
            return json.loads(body + tail)
        except ValueError:
            body = body[:-1]
    return None


def _tool_calls(pieces: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tool calls (and the unreadable ones) of a partial reply's merged tool-call pieces."""
    calls: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    for piece in pieces:
        arguments = piece.get("args") or ""
        parsed = parse_partial_json(arguments) if arguments else {}
        if isinstance(parsed, dict):
            calls.append({"name": piece.get("name") or "", "args": parsed, "id": piece.get("id"), "type": "tool_call"})
        else:
            invalid.append(
                {
                    "name": piece.get("name"),
                    "args": arguments,
                    "id": piece.get("id"),
                    "error": None,
                    "type": "invalid_tool_call",
                }
            )
    return calls, invalid


class _Partial:
    """One reply's chunks so far."""

    def __init__(self, first: dict[str, Any]) -> None:
        self.base = first
        self.content = ""
        self.extra: dict[str, Any] = {}
        self.response: dict[str, Any] = {}
        self.pieces: list[dict[str, Any]] = []

    def add(self, chunk: dict[str, Any]) -> None:
        content = chunk.get("content")
        if isinstance(content, str):
            self.content += content
        for key, value in (chunk.get("additional_kwargs") or {}).items():
            before = self.extra.get(key)
            self.extra[key] = before + value if isinstance(before, str) and isinstance(value, str) else value
        self.response.update(chunk.get("response_metadata") or {})
        for delta in chunk.get("tool_call_chunks") or []:
            piece = next((p for p in self.pieces if p["index"] == delta.get("index")), None)
            if piece is None or delta.get("index") is None:
                self.pieces.append(dict(delta, args=delta.get("args") or ""))
                continue
            piece["args"] += delta.get("args") or ""
            piece["name"] = piece["name"] or delta.get("name")
            piece["id"] = piece["id"] or delta.get("id")

    def snapshot(self) -> dict[str, Any]:
        pieces = [dict(piece) for piece in self.pieces]
        calls, invalid = _tool_calls(pieces)
        return {
            **self.base,
            "content": self.content,
            "tool_calls": calls,
            "invalid_tool_calls": invalid,
            "tool_call_chunks": pieces,
            "additional_kwargs": dict(self.extra),
            "response_metadata": dict(self.response),
        }


class MessageStream:
    """
    Turns a run's message chunks and finished messages into the ``messages`` mode's events (see the module docstring).
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._partials: dict[str, _Partial] = {}

    def _metadata(self, message_id: str, metadata: dict[str, Any]) -> list[tuple[str, Any]]:
        if message_id in self._seen:
            return []
        self._seen.add(message_id)
        return [("messages/metadata", {message_id: {"metadata": metadata}})]

    def chunk(self, chunk: dict[str, Any], metadata: dict[str, Any]) -> list[tuple[str, Any]]:
        """
        The events of one chunk of a reply.

        :param chunk: The chunk, as an ``AIMessageChunk`` dict (with the reply's id).
        :param metadata: Its LangGraph metadata.
        """
        message_id = str(chunk["id"])
        out = self._metadata(message_id, metadata)
        partial = self._partials.get(message_id)
        if partial is None:
            partial = self._partials[message_id] = _Partial(chunk)
        partial.add(chunk)
        out.append(("messages/partial", [partial.snapshot()]))
        return out

    def complete(self, message: dict[str, Any], metadata: dict[str, Any]) -> list[tuple[str, Any]]:
        """
        The events of a finished message (a reply, whether it streamed or not, or a tool result).

        :param message: The message dict (with its id).
        :param metadata: Its LangGraph metadata.
        """
        message_id = str(message["id"])
        out = self._metadata(message_id, metadata)
        self._partials.pop(message_id, None)
        out.append(("messages/complete", [message]))
        return out
