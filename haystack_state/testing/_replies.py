"""
The replies a ``ScriptedChatGenerator`` can be scripted with, and how they are read.
"""

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from haystack.dataclasses import ChatMessage
from haystack.tools.tool import Tool

from haystack_state.errors import HaystackStateError

__all__ = ["Policy", "Reply", "ScriptError", "ScriptReply", "ToolCallSpec", "parse_reply"]

ToolCallSpec = tuple[str, dict[str, Any]]
"""One scripted tool call: ``(tool_name, arguments)``. A two-item list ``[tool_name, arguments]`` is accepted too."""

ScriptReply = str | ChatMessage | ToolCallSpec | Sequence[ToolCallSpec | list[Any]] | dict[str, Any]
"""One scripted reply: a text, a ready ``ChatMessage``, tool calls, or ``{"text": ..., "tool_calls": [...]}``."""

Policy = Callable[[list[ChatMessage], list[Tool]], ScriptReply]
"""A callable that decides the reply from the messages and the tools of a call."""


class ScriptError(HaystackStateError, RuntimeError):
    """A ``ScriptedChatGenerator`` cannot produce the reply it was asked for (script exhausted, unknown tool)."""


@dataclass(frozen=True)
class Reply:
    """One reply, read from any scripted form: a text and tool calls, or a ready ChatMessage."""

    text: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    message: ChatMessage | None = None

    def to_serializable(self) -> Any:
        """
        The reply in the form ``to_dict`` stores: a text, ``[[name, args], ...]``, or a dict.

        :returns: The serializable form.
        """
        if self.message is not None:
            return {"chat_message": self.message.to_dict()}
        calls = [[name, copy.deepcopy(args)] for name, args in self.tool_calls]
        if not calls:
            return self.text
        return calls if self.text is None else {"text": self.text, "tool_calls": calls}


def _parse_tool_call(value: object, where: str) -> ToolCallSpec:
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
        return value[0], dict(value[1])
    raise TypeError(f"{where}: a tool call must be a (tool_name, arguments_dict) pair, got {value!r}.")


def parse_reply(value: object, where: str) -> Reply:
    """Normalize one scripted (or policy) reply into a ``_Reply``."""
    if isinstance(value, ChatMessage):
        return Reply(message=value)
    if isinstance(value, str):
        return Reply(text=value)
    if isinstance(value, dict):
        if "chat_message" in value and len(value) == 1:
            return Reply(message=ChatMessage.from_dict(value["chat_message"]))
        unknown = set(value) - {"text", "tool_calls"}
        text = value.get("text")
        if unknown or not (text is None or isinstance(text, str)):
            raise TypeError(f"{where}: a dict reply takes 'text' (str) and 'tool_calls' only, got {value!r}.")
        calls = tuple(_parse_tool_call(c, where) for c in value.get("tool_calls") or [])
        return Reply(text=text, tool_calls=calls)
    if isinstance(value, tuple | list):
        if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
            return Reply(tool_calls=(_parse_tool_call(value, where),))  # a single (name, args) call
        return Reply(tool_calls=tuple(_parse_tool_call(c, where) for c in value))
    raise TypeError(
        f"{where}: a reply must be a str, a ChatMessage, a list of (tool_name, arguments) pairs or a dict with "
        f"'text' and/or 'tool_calls', got {type(value).__name__}."
    )
