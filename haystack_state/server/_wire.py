"""
What travels over HTTP: haystack ``ChatMessage`` <-> LangChain-style message dicts, and state values <-> JSON.

A message becomes ``{"type": "human" | "ai" | "tool" | "system", "content": ..., "id": ..., "name": ...}``; an AI
message adds ``tool_calls`` (``[{"name", "args", "id", "type": "tool_call"}]``), a tool message ``tool_call_id``,
``name`` (the tool) and ``status`` (``"success"`` or ``"error"``). ``content`` is a string when the message holds one
text, and a list of content blocks otherwise (``{"type": "text", "text"}``, ``{"type": "image" | "file",
"source_type": "base64", "data", "mime_type"}``, ``{"type": "reasoning", "reasoning"}``). The message's ``meta``
travels as ``response_metadata`` (through the codec), except ``meta["id"]``, which is the message ``id``. What
LangChain has no field for is kept in ``additional_kwargs`` (a tool result's full originating call), so text, tool
calls and tool results convert both ways without loss.

A thread's ``messages`` on the wire are its conversation (:func:`conversation_to_wire`): every message has an id (one
stored before ids existed gets one from its thread and position, the same on every read), and the Agent's own system
prompt is configuration, left out unless the server is asked to send it (``create_app(wire_system_prompt=True)``).

Every other state key travels as the codec's JSON (:func:`haystack_state.persistence.codec.encode` / ``decode``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from haystack.dataclasses import (
    ChatMessage,
    ChatRole,
    FileContent,
    ImageContent,
    ReasoningContent,
    TextContent,
    ToolCall,
    ToolCallResult,
)

from haystack_state.agent._message_ids import is_system_prompt, stored_id
from haystack_state.errors import CodecError, StateTypeError, UnknownStateKeyError
from haystack_state.persistence.codec import decode, encode

__all__ = [
    "WireError",
    "conversation_to_wire",
    "keys_named",
    "message_from_wire",
    "message_to_wire",
    "messages_from_wire",
    "messages_to_wire",
    "values_from_wire",
    "values_to_wire",
]

MESSAGES = "messages"
_ROLES = {
    "human": ChatRole.USER,
    "user": ChatRole.USER,
    "ai": ChatRole.ASSISTANT,
    "assistant": ChatRole.ASSISTANT,
    "system": ChatRole.SYSTEM,
    "tool": ChatRole.TOOL,
}
_TYPES = {ChatRole.USER: "human", ChatRole.ASSISTANT: "ai", ChatRole.SYSTEM: "system", ChatRole.TOOL: "tool"}


class WireError(ValueError):
    """
    A value sent over HTTP cannot be converted. Names the field at fault, as a dotted path (``input.messages.0.type``).

    :param field: The field's path.
    :param message: What is wrong with it.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}")


@contextmanager
def keys_named(field: str) -> Iterator[None]:
    """Turn a state key's type or name error into a :class:`WireError` naming ``field.key``."""
    try:
        yield
    except (StateTypeError, UnknownStateKeyError) as error:
        raise WireError(f"{field}.{error.key}", str(error)) from None


# --- to the wire ---------------------------------------------------------------------------------------------------


def message_to_wire(message: ChatMessage) -> dict[str, Any]:
    """
    Convert a ChatMessage to a LangChain-style message dict (JSON data).

    :param message: The message.
    :returns: The dict.
    """
    meta = dict(message.meta)
    message_id = meta.pop("id") if isinstance(meta.get("id"), str) else None
    out: dict[str, Any] = {
        "type": _TYPES[message.role],
        "content": "",
        "id": message_id,
        "name": message.name,
        "additional_kwargs": {},
        "response_metadata": encode(meta, where="message meta") if meta else {},
    }
    if message.role == ChatRole.TOOL and len(message._content) == 1 and message.tool_call_result is not None:
        result = message.tool_call_result
        out["content"] = result.result if isinstance(result.result, str) else [_block(p) for p in result.result]
        out["tool_call_id"] = result.origin.id
        out["status"] = "error" if result.error else "success"
        out["additional_kwargs"]["tool_call"] = _tool_call_to_wire(result.origin)
        if message.name is not None:
            out["additional_kwargs"]["name"] = message.name
        out["name"] = result.origin.tool_name
        return out
    parts = [part for part in message._content if not isinstance(part, ToolCall)]
    if message.role == ChatRole.ASSISTANT:
        out["tool_calls"] = [_tool_call_to_wire(call) for call in message.tool_calls]
        single_text = len(parts) == 1 and isinstance(parts[0], TextContent) and parts[0].text != ""
        out["content"] = parts[0].text if single_text else ([_block(p) for p in parts] if parts else "")  # type: ignore[union-attr]
    elif len(parts) == 1 and isinstance(parts[0], TextContent):
        out["content"] = parts[0].text
    else:
        out["content"] = [_block(part) for part in parts]
    return out


def messages_to_wire(messages: Sequence[ChatMessage], *, system_prompt: bool = True) -> list[dict[str, Any]]:
    """
    Convert ChatMessages to LangChain-style message dicts.

    :param messages: The messages.
    :param system_prompt: Whether to keep the Agent's own system prompt (known by its id); a system message a client
        sent is always kept.
    """
    if system_prompt:
        return [message_to_wire(message) for message in messages]
    return [message_to_wire(message) for message in messages if not is_system_prompt(message)]


def conversation_to_wire(
    messages: Sequence[ChatMessage], thread_id: str | None, *, system_prompt: bool = False
) -> list[dict[str, Any]]:
    """
    A thread's stored ``messages`` as the conversation a client draws: each with its id (a message stored before ids
    existed gets one from the thread and its position, see :func:`haystack_state.agent._message_ids.stored_id`), the
    Agent's own system prompt left out unless ``system_prompt``.

    :param messages: The thread's messages, in order.
    :param thread_id: The thread.
    :param system_prompt: Whether to keep the Agent's own system prompt.
    :returns: LangChain-style message dicts.
    """
    out = []
    for index, message in enumerate(messages):
        if not system_prompt and is_system_prompt(message, index):
            continue
        wire = message_to_wire(message)
        if not wire["id"]:
            wire["id"] = stored_id(message, thread_id, index)
        out.append(wire)
    return out


def _tool_call_to_wire(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"name": call.tool_name, "args": dict(call.arguments), "id": call.id, "type": "tool_call"}
    if call.extra:
        out["extra"] = encode(dict(call.extra), where="tool call extra")
    return out


def _block(part: object) -> dict[str, Any]:
    if isinstance(part, TextContent):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImageContent):
        block = {"type": "image", "source_type": "base64", "data": part.base64_image, "mime_type": part.mime_type}
        return _completed(block, "detail", part.detail, "metadata", part.meta, "image meta")
    if isinstance(part, FileContent):
        block = {"type": "file", "source_type": "base64", "data": part.base64_data, "mime_type": part.mime_type}
        return _completed(block, "filename", part.filename, "metadata", part.extra, "file extra")
    if isinstance(part, ReasoningContent):
        block = {"type": "reasoning", "reasoning": part.reasoning_text}
        return _completed(block, None, None, "extra", part.extra, "reasoning extra")
    if isinstance(part, ToolCallResult):
        return {"type": "tool_result", "value": encode(part, where="tool result")}
    return {"type": "non_standard", "value": encode(part, where="message content")}


def _completed(
    block: dict[str, Any],
    key: str | None,
    value: str | None,
    meta_key: str,
    meta: Mapping[str, Any] | None,
    where: str,
) -> dict[str, Any]:
    """A content block with its optional ``key`` (when its value is set) and its metadata (when not empty)."""
    if key is not None and value is not None:
        block[key] = value
    if meta:
        block[meta_key] = encode(dict(meta), where=where)
    return block


def values_to_wire(
    values: Mapping[str, Any], *, thread_id: str | None = None, system_prompt: bool = False
) -> dict[str, Any]:
    """
    Convert a thread's state values to JSON data: ``messages`` as its conversation (:func:`conversation_to_wire`),
    every other key through the codec.

    :param values: key -> value.
    :param thread_id: The thread (old messages' ids are made from it).
    :param system_prompt: Whether ``messages`` keeps the Agent's own system prompt.
    :returns: key -> JSON data.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key == MESSAGES and isinstance(value, list):
            out[key] = conversation_to_wire(value, thread_id, system_prompt=system_prompt)
        else:
            out[key] = encode(value, key=key)
    return out


# --- from the wire -------------------------------------------------------------------------------------------------


def message_from_wire(
    data: object, *, field: str = "message", calls: Mapping[str, ToolCall] | None = None
) -> ChatMessage:
    """
    Convert a LangChain-style message dict (``type`` or ``role``) to a ChatMessage.

    :param data: The dict.
    :param field: Its path in the request, for errors.
    :param calls: Tool calls by id (from earlier AI messages), to complete a tool message that names only its
        call's id.
    :returns: The message.
    :raises WireError: Naming the field at fault.
    """
    if not isinstance(data, Mapping):
        raise WireError(field, f"a message must be an object, got {type(data).__name__}")
    kind = data.get("type", data.get("role"))
    role = _ROLES.get(kind) if isinstance(kind, str) else None
    if role is None:
        raise WireError(
            f"{field}.type", f"must be one of human, ai, tool, system (or role user, assistant), got {kind!r}"
        )
    name = _optional_str(data, "name", field)
    message_id = _optional_str(data, "id", field)
    meta = _decode_object(data.get("response_metadata"), f"{field}.response_metadata")
    if message_id is not None:
        meta["id"] = message_id
    extras = data.get("additional_kwargs") or {}
    if not isinstance(extras, Mapping):
        raise WireError(f"{field}.additional_kwargs", "must be an object")
    content = data.get("content", "")
    if role == ChatRole.TOOL:
        return _tool_from_wire(data, content, extras, meta, field, calls or {})
    parts = _parts(content, f"{field}.content", allow_empty_text=role != ChatRole.ASSISTANT)
    tool_calls: list[ToolCall] = []
    if role == ChatRole.ASSISTANT:
        raw_calls = data.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise WireError(f"{field}.tool_calls", "must be a list")
        tool_calls = [_tool_call_from_wire(c, f"{field}.tool_calls.{i}") for i, c in enumerate(raw_calls)]
    elif data.get("tool_calls"):
        raise WireError(f"{field}.tool_calls", f"only AI messages carry tool calls, not {kind} messages")
    if role == ChatRole.SYSTEM and any(not isinstance(p, TextContent) for p in parts):
        raise WireError(f"{field}.content", "a system message holds text only")
    return ChatMessage(_role=role, _content=[*parts, *tool_calls], _name=name, _meta=meta)


def messages_from_wire(items: object, *, field: str = "messages") -> list[ChatMessage]:
    """
    Convert a list of LangChain-style message dicts; a tool message finds its call among the AI messages before it.

    :raises WireError: Naming the field at fault.
    """
    if not isinstance(items, list):
        raise WireError(field, f"must be a list of messages, got {type(items).__name__}")
    calls: dict[str, ToolCall] = {}
    out = []
    for index, item in enumerate(items):
        message = message_from_wire(item, field=f"{field}.{index}", calls=calls)
        calls.update({call.id: call for call in message.tool_calls if call.id is not None})
        out.append(message)
    return out


def values_from_wire(data: object, *, field: str = "input") -> dict[str, Any]:
    """
    Convert JSON data to state values: ``messages`` from LangChain-style dicts, every other key through the codec.

    :raises WireError: Naming the field at fault.
    """
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise WireError(field, f"must be an object of state keys, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == MESSAGES:
            out[key] = messages_from_wire(value, field=f"{field}.{key}")
            continue
        try:
            out[key] = decode(value, key=key)
        except CodecError as error:
            raise WireError(f"{field}.{key}", str(error)) from None
    return out


def _tool_from_wire(
    data: Mapping[str, Any],
    content: object,
    extras: Mapping[str, Any],
    meta: dict[str, Any],
    field: str,
    calls: Mapping[str, ToolCall],
) -> ChatMessage:
    call_id = data.get("tool_call_id")
    status = data.get("status", "success")
    if status not in ("success", "error"):
        raise WireError(f"{field}.status", f"must be 'success' or 'error', got {status!r}")
    if "tool_call" in extras:  # the full originating call, as this server sends it
        origin = _tool_call_from_wire(extras["tool_call"], f"{field}.additional_kwargs.tool_call")
    elif not isinstance(call_id, str) or not call_id:
        raise WireError(f"{field}.tool_call_id", "a tool message needs the id of the call it answers")
    elif call_id in calls:
        origin = calls[call_id]
    else:
        tool_name = data.get("name")
        if not isinstance(tool_name, str) or not tool_name:
            raise WireError(f"{field}.name", f"names no tool, and no earlier AI message made call '{call_id}'")
        origin = ToolCall(tool_name=tool_name, arguments={}, id=call_id)
    result: str | list[Any]
    if isinstance(content, str):
        result = content
    else:
        result = _parts(content, f"{field}.content", allow_empty_text=True)
        if any(not isinstance(p, TextContent | ImageContent | FileContent) for p in result):
            raise WireError(f"{field}.content", "a tool result holds text, images and files only")
    name = extras.get("name")
    return ChatMessage(
        _role=ChatRole.TOOL,
        _content=[ToolCallResult(result=result, origin=origin, error=status == "error")],
        _name=name if isinstance(name, str) else None,
        _meta=meta,
    )


def _tool_call_from_wire(data: object, field: str) -> ToolCall:
    if not isinstance(data, Mapping):
        raise WireError(field, f"a tool call must be an object, got {type(data).__name__}")
    name, args, call_id = data.get("name"), data.get("args", {}), data.get("id")
    if not isinstance(name, str) or not name:
        raise WireError(f"{field}.name", "a tool call needs the tool's name")
    if not isinstance(args, dict):
        raise WireError(f"{field}.args", f"must be an object of arguments, got {type(args).__name__}")
    if call_id is not None and not isinstance(call_id, str):
        raise WireError(f"{field}.id", "must be a string")
    extra = _decode_object(data.get("extra"), f"{field}.extra") or None
    return ToolCall(tool_name=name, arguments=dict(args), id=call_id, extra=extra)


def _parts(content: object, field: str, *, allow_empty_text: bool) -> list[Any]:
    if isinstance(content, str):
        return [TextContent(content)] if content or allow_empty_text else []
    if not isinstance(content, list):
        raise WireError(field, f"must be a string or a list of content blocks, got {type(content).__name__}")
    return [_part(block, f"{field}.{i}") for i, block in enumerate(content)]


def _part(block: object, field: str) -> Any:
    if isinstance(block, str):
        return TextContent(block)
    if not isinstance(block, Mapping):
        raise WireError(field, f"a content block must be an object or a string, got {type(block).__name__}")
    kind = block.get("type")
    if kind == "text":
        return TextContent(_required_str(block, "text", field))
    if kind == "reasoning":
        reasoning = _required_str(block, "reasoning", field)
        return ReasoningContent(reasoning, extra=_decode_object(block.get("extra"), f"{field}.extra"))
    if kind in ("image", "file"):
        if block.get("source_type", "base64") != "base64" or not isinstance(block.get("data"), str):
            raise WireError(f"{field}.data", f"an {kind} block needs base64 'data' (source_type 'base64')")
        extra = _decode_object(block.get("metadata"), f"{field}.metadata")
        data, mime_type = block["data"], block.get("mime_type")
        try:
            if kind == "image":
                return ImageContent(data, mime_type, block.get("detail"), meta=extra, validation=False)
            return FileContent(data, mime_type, block.get("filename"), extra=extra, validation=False)
        except (TypeError, ValueError) as error:
            raise WireError(field, str(error)) from None
    if kind in ("tool_result", "non_standard"):
        try:
            return decode(block.get("value"), where=field)
        except CodecError as error:
            raise WireError(f"{field}.value", str(error)) from None
    raise WireError(f"{field}.type", f"must be text, image, file or reasoning, got {kind!r}")


def _required_str(data: Mapping[str, Any], key: str, field: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise WireError(f"{field}.{key}", "must be a string")
    return value


def _optional_str(data: Mapping[str, Any], key: str, field: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise WireError(f"{field}.{key}", f"must be a string, got {type(value).__name__}")
    return value


def _decode_object(value: object, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    try:
        decoded = decode(value, where=field)
    except CodecError as error:
        raise WireError(field, str(error)) from None
    if not isinstance(decoded, dict):
        raise WireError(field, "must be an object")
    return decoded
