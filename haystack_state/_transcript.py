"""
A thread's conversation as a transcript, for ``haystack-state log`` (and ``show --key messages``): one entry per
message with its short id and role; tool calls with their arguments; tool results with their call, long ones cut,
errors marked ``FAILED``. :func:`transcript_json` gives the same, whole, as JSON.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

from haystack.dataclasses import ChatMessage, ToolCall, ToolCallResult

from haystack_state._cli_text import WIDTH, jsonable, plural, shorten
from haystack_state.agent._message_ids import message_id, stored_id

__all__ = ["is_conversation", "transcript_json", "transcript_lines"]

#: The characters of a tool result (or of reasoning) shown before it is cut.
RESULT_CHARS = 240
_ROLE_WIDTH = len("assistant")


def is_conversation(value: object) -> bool:
    """Whether a stored value is a conversation: a list of ``ChatMessage``."""
    return isinstance(value, list | tuple) and all(isinstance(message, ChatMessage) for message in value)


def transcript_lines(messages: Sequence[ChatMessage], width: int = WIDTH) -> list[str]:
    """
    The messages as transcript lines: ``<short id> <role> <content>``, the content wrapped under itself.

    :param messages: The conversation.
    :param width: The width to wrap at.
    :returns: The lines (``(no messages)`` for none).
    """
    ids = [message_id(message) for message in messages]
    shorts = shorten([i for i in ids if i is not None])
    id_width = max((len(short) for short in shorts.values()), default=1)
    indent = " " * (id_width + 1 + _ROLE_WIDTH + 2)
    lines: list[str] = []
    for message, found in zip(messages, ids, strict=True):
        short = shorts[found] if found is not None else "-"
        first = f"{short.ljust(id_width)} {message.role.value.ljust(_ROLE_WIDTH)}  "
        for number, part in enumerate(_parts(message) or ["(empty)"]):
            lines.extend(_wrap(part, first if number == 0 else indent, indent, width))
    return lines or ["(no messages)"]


def transcript_json(messages: Sequence[ChatMessage], thread_id: str) -> list[dict[str, Any]]:
    """
    The messages as JSON records: position, id (a message stored without one gets its thread-and-position id, as
    the server gives it), role, name, text, reasoning, tool calls and tool result, nothing cut.

    :param messages: The conversation.
    :param thread_id: Its thread.
    """
    records = []
    for index, message in enumerate(messages):
        result = message.tool_call_result
        reasoning = message.reasoning
        records.append(
            {
                "index": index,
                "id": stored_id(message, thread_id, index),
                "role": message.role.value,
                "name": message.name,
                "text": "\n".join(message.texts) if message.texts else None,
                "reasoning": reasoning.reasoning_text if reasoning is not None else None,
                "tool_calls": [_call_json(call) for call in message.tool_calls],
                "tool_result": _result_json(result) if result is not None else None,
            }
        )
    return records


# --- one message ---------------------------------------------------------------------------------------------------


def _parts(message: ChatMessage) -> list[str]:
    """What a message says, one part per text, call or result."""
    parts: list[str] = []
    reasoning = message.reasoning
    if reasoning is not None and reasoning.reasoning_text:
        parts.append(f"(reasoning) {_cut(reasoning.reasoning_text)}")
    parts.extend(message.texts)
    parts.extend(f"calls {_call_text(call)}" for call in message.tool_calls)
    for result in message.tool_call_results:
        verdict = "FAILED" if result.error else "returned"
        call = f" [{result.origin.id}]" if result.origin.id else ""
        parts.append(f"{result.origin.tool_name}{call} {verdict}: {_cut(_result_text(result))}")
    parts.extend(f"[image {image.mime_type or 'of unknown type'}]" for image in message.images)
    parts.extend(f"[file {file.filename or file.mime_type or 'without name'}]" for file in message.files)
    return parts


def _call_text(call: ToolCall) -> str:
    """``search(query="bees")  [call_1]``: the arguments as JSON values."""
    arguments = ", ".join(f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in call.arguments.items())
    return f"{call.tool_name}({arguments}){_call_id(call)}"


def _call_id(call: ToolCall) -> str:
    return f"  [{call.id}]" if call.id else ""


def _result_text(result: ToolCallResult) -> str:
    value = result.result
    if isinstance(value, str):
        return value
    return json.dumps(jsonable(value), ensure_ascii=False)


def _cut(text: str) -> str:
    """The text on one line, cut after :data:`RESULT_CHARS` characters, saying how many more there are."""
    flat = " ".join(text.split())
    if len(flat) <= RESULT_CHARS:
        return flat
    return f"{flat[:RESULT_CHARS]}... ({plural(len(flat) - RESULT_CHARS, 'more character')}; --json shows all)"


def _wrap(text: str, first: str, indent: str, width: int) -> list[str]:
    """Wrap a part's paragraphs under its first column; blank lines kept."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        prefix = first if not lines else indent
        wrapped = textwrap.wrap(paragraph, width, initial_indent=prefix, subsequent_indent=indent) or [prefix.rstrip()]
        lines.extend(line.rstrip() for line in wrapped)
    return lines


def _call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "tool_name": call.tool_name, "arguments": jsonable(call.arguments)}


def _result_json(result: ToolCallResult) -> dict[str, Any]:
    value = result.result
    return {
        "call_id": result.origin.id,
        "tool_name": result.origin.tool_name,
        "arguments": jsonable(result.origin.arguments),
        "result": value if isinstance(value, str) else jsonable(value),
        "error": bool(result.error),
    }
