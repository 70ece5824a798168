"""
Fast paths of the codec for haystack's ``ChatMessage`` and its usual content parts (``TextContent``, ``ToolCall``,
``ToolCallResult`` with a text result).

A long thread is mostly chat messages, and going through ``ChatMessage.to_dict``/``from_dict`` (``dataclasses.asdict``
and keyword construction through haystack's mutation tracking) was most of the cost of encoding a commit and of
decoding a cold read. These functions give exactly what the general path gives (the same encoded data; messages equal
to ``ChatMessage.from_dict``'s, the same classes with the same fields) for the shapes ``to_dict`` produces, and return
``None`` for anything else, which then takes the general path (and its error messages).

Decoding can build the messages *frozen* (read-only containers inside, the shape
:func:`haystack_state.values.freeze` gives), so that a state read into the head cache is not decoded and then copied.

Checkpoints store the usual messages in a *compact* form (:func:`encode_chat_message_compact`): the same fields as a
JSON array instead of ``to_dict``'s nested objects, ``[role, name, meta, parts]``, a part being a text (a string), a
tool call ``["c", tool_name, arguments, id, extra]`` or a tool result ``["r", result, [tool_name, arguments, id,
extra], error]``. A long thread is mostly messages, and a cold read parses and builds every one of them: the array
form parses in about 60% of the time and builds in about half. :func:`decode_chat_message` reads both forms (data
written before the compact form existed stays readable); events and other JSON forms meant to be read by people keep
``to_dict``'s shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from haystack.dataclasses import ChatMessage, ChatRole, TextContent, ToolCall, ToolCallResult

from haystack_state.values import FrozenDict, FrozenList, FrozenListWithObjects

__all__ = ["decode_chat_message", "encode_chat_message", "encode_chat_message_compact"]

_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})
_PLAIN_DICTS = frozenset({dict, FrozenDict})
_PLAIN_LISTS = frozenset({list, FrozenList})
_CONTENT_LISTS = frozenset({list, FrozenList, FrozenListWithObjects})  # a State's messages hold the last one
_ROLES = {role.value: role for role in ChatRole}
_TOOL_CALL_KEYS = frozenset({"tool_name", "arguments", "id", "extra"})
_new = object.__new__


def _plain(value: Any) -> bool:
    """Whether a value is plain JSON data (``dataclasses.asdict`` leaves it as it is, the codec tags nothing)."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if kind in _PLAIN_DICTS:
        return "__type__" not in value and all(type(key) is str for key in value) and all(map(_plain, value.values()))
    if kind in _PLAIN_LISTS:
        return all(map(_plain, value))
    return False


def _tool_call_data(call: Any) -> dict[str, Any] | None:
    fields = call.__dict__
    if not _TOOL_CALL_KEYS.issubset(fields):
        return None
    arguments, extra = fields.get("arguments"), fields.get("extra")
    if not (_plain(arguments) and _plain(extra) and _plain(fields.get("tool_name")) and _plain(fields.get("id"))):
        return None
    return {
        "tool_name": fields["tool_name"],
        "arguments": _plain_copy(arguments),
        "id": fields["id"],
        "extra": _plain_copy(extra),
    }


def _plain_copy(value: Any) -> Any:
    """A copy of plain JSON data with plain containers (what encoding it gives)."""
    kind = type(value)
    if kind in _PLAIN_DICTS:
        return {key: item if type(item) in _PLAIN_SCALARS else _plain_copy(item) for key, item in value.items()}
    if kind in _PLAIN_LISTS:
        return [item if type(item) in _PLAIN_SCALARS else _plain_copy(item) for item in value]
    return value


def encode_chat_message(message: Any, encode: Callable[[Any], Any]) -> dict[str, Any] | None:
    """
    The encoded data of ``message.to_dict()``, built without ``dataclasses.asdict``.

    :param message: A ``ChatMessage`` (exactly).
    :param encode: The codec's encoder, for the message's ``meta`` and ``name``.
    :returns: The data, or None if the message holds something the fast path does not cover.
    """
    fields = message.__dict__
    role = fields.get("_role")
    if type(role) is not ChatRole or type(fields.get("_content")) not in _CONTENT_LISTS:
        return None
    parts: list[dict[str, Any]] = []
    for part in fields["_content"]:
        kind = type(part)
        if kind is TextContent:
            text = part.__dict__.get("text")
            if type(text) is not str:
                return None
            parts.append({"text": text})
        elif kind is ToolCall:
            call = _tool_call_data(part)
            if call is None:
                return None
            parts.append({"tool_call": call})
        elif kind is ToolCallResult:
            result = part.__dict__
            origin, error = result.get("origin"), result.get("error")
            if type(result.get("result")) is not str or type(origin) is not ToolCall or type(error) is not bool:
                return None
            call = _tool_call_data(origin)
            if call is None:
                return None
            parts.append({"tool_call_result": {"result": result["result"], "origin": call, "error": error}})
        else:
            return None
    return {
        "role": role.value,
        "meta": encode(fields.get("_meta")),
        "name": encode(fields.get("_name")),
        "content": parts,
    }


def _call_row(call: Any) -> list[Any] | None:
    data = _tool_call_data(call)
    if data is None:
        return None
    return [data["tool_name"], data["arguments"], data["id"], data["extra"]]


def encode_chat_message_compact(message: Any, encode: Callable[[Any], Any]) -> list[Any] | None:
    """
    The compact stored form of a message (see the module docstring): ``[role, name, meta, parts]``.

    :param message: A ``ChatMessage`` (exactly).
    :param encode: The codec's encoder, for the message's ``meta`` and ``name``.
    :returns: The data, or None if the message holds something the compact form does not cover (it is then stored as
        ``to_dict`` gives it).
    """
    fields = message.__dict__
    role = fields.get("_role")
    if type(role) is not ChatRole or type(fields.get("_content")) not in _CONTENT_LISTS:
        return None
    parts: list[Any] = []
    for part in fields["_content"]:
        kind = type(part)
        if kind is TextContent:
            text = part.__dict__.get("text")
            if type(text) is not str:
                return None
            parts.append(text)
        elif kind is ToolCall:
            call = _call_row(part)
            if call is None:
                return None
            parts.append(["c", *call])
        elif kind is ToolCallResult:
            result = part.__dict__
            origin, error = result.get("origin"), result.get("error")
            if type(result.get("result")) is not str or type(origin) is not ToolCall or type(error) is not bool:
                return None
            call = _call_row(origin)
            if call is None:
                return None
            parts.append(["r", result["result"], call, error])
        else:
            return None
    return [role.value, encode(fields.get("_name")), encode(fields.get("_meta")), parts]


def _frozen_plain(value: Any) -> Any:
    """Plain JSON data (just parsed, owned by no one) made read-only in place of a copy, as ``freeze`` would."""
    kind = type(value)
    if kind is dict:
        if _PLAIN_SCALARS.issuperset(map(type, value.values())):
            return FrozenDict(value)
        return FrozenDict({key: _frozen_plain(item) for key, item in value.items()})
    if kind is list:
        return FrozenList([_frozen_plain(item) for item in value])
    return value


def _decode_tool_call(data: Any, decode: Callable[[Any], Any], frozen: bool) -> ToolCall | None:
    if type(data) is not dict or "tool_name" not in data or "arguments" not in data:
        return None
    if not _TOOL_CALL_KEYS.issuperset(data):
        return None
    call = _new(ToolCall)
    arguments, extra = data["arguments"], data.get("extra")
    if frozen and _plain(arguments) and _plain(extra):
        arguments, extra = _frozen_plain(arguments), _frozen_plain(extra)
    else:
        arguments, extra = decode(arguments), decode(extra)
    call.__dict__.update(
        tool_name=decode(data["tool_name"]), arguments=arguments, id=decode(data.get("id")), extra=extra
    )
    return call


def _decode_call_row(row: Any, decode: Callable[[Any], Any], frozen: bool) -> ToolCall | None:
    if type(row) is not list or len(row) != 4:
        return None
    tool_name, arguments, call_id, extra = row
    call = _new(ToolCall)
    if frozen and _plain(arguments) and _plain(extra):
        arguments, extra = _frozen_plain(arguments), _frozen_plain(extra)
    else:
        arguments, extra = decode(arguments), decode(extra)
    call.__dict__.update(tool_name=decode(tool_name), arguments=arguments, id=decode(call_id), extra=extra)
    return call


def _decode_compact(data: list[Any], decode: Callable[[Any], Any], frozen: bool) -> Any:
    if len(data) != 4 or type(data[3]) is not list:
        return None
    role, name, meta, parts = data
    role = _ROLES.get(role) if type(role) is str else None
    if role is None:
        return None
    content: list[Any] = []
    for part in parts:
        kind = type(part)
        if kind is str:
            item: Any = _new(TextContent)
            item.__dict__["text"] = part
        elif kind is list and len(part) == 5 and part[0] == "c":
            item = _decode_call_row(part[1:], decode, frozen)
            if item is None:
                return None
        elif kind is list and len(part) == 4 and part[0] == "r":
            _, result, origin_row, error = part
            origin = _decode_call_row(origin_row, decode, frozen)
            if origin is None or type(result) is not str or type(error) is not bool:
                return None
            item = _new(ToolCallResult)
            item.__dict__.update(result=result, origin=origin, error=error)
        else:
            return None
        content.append(item)
    meta = decode(meta) or ({} if not frozen else FrozenDict())
    message = _new(ChatMessage)
    message.__dict__.update(
        _role=role,
        _content=(FrozenListWithObjects(content) if content else FrozenList()) if frozen else content,
        _name=decode(name),
        _meta=meta,
    )
    return message


def decode_chat_message(data: Any, decode: Callable[[Any], Any], frozen: bool) -> Any:
    """
    Build a ``ChatMessage`` from its stored data (``to_dict`` output, encoded, or the compact form), as
    ``ChatMessage.from_dict`` would.

    :param data: The stored data (parsed JSON).
    :param decode: The codec's decoder for nested values (frozen ones when ``frozen``).
    :param frozen: Build the message read-only inside (for the head cache), as ``haystack_state.values.freeze``
        would give it.
    :returns: The message, or None if the data has a shape the fast path does not cover.
    """
    if type(data) is list:
        return _decode_compact(data, decode, frozen)
    if type(data) is not dict or len(data) != 4 or type(data.get("content")) is not list:
        return None
    role = data.get("role")
    role = _ROLES.get(role) if type(role) is str else None
    if role is None or "meta" not in data or "name" not in data:
        return None
    content: list[Any] = []
    for part in data["content"]:
        if type(part) is not dict or len(part) != 1:
            return None
        if "text" in part:
            text = part["text"]
            if type(text) is not str:
                return None
            item: Any = _new(TextContent)
            item.__dict__["text"] = text
        elif "tool_call" in part:
            item = _decode_tool_call(part["tool_call"], decode, frozen)
            if item is None:
                return None
        elif "tool_call_result" in part:
            result = part["tool_call_result"]
            if type(result) is not dict or len(result) != 3 or type(result.get("result")) is not str:
                return None
            origin = _decode_tool_call(result.get("origin"), decode, frozen)
            if origin is None or type(result.get("error")) is not bool:
                return None
            item = _new(ToolCallResult)
            item.__dict__.update(result=result["result"], origin=origin, error=result["error"])
        else:
            return None
        content.append(item)
    meta = decode(data["meta"]) or ({} if not frozen else FrozenDict())
    message = _new(ChatMessage)
    message.__dict__.update(
        _role=role,
        _content=(FrozenListWithObjects(content) if content else FrozenList()) if frozen else content,
        _name=decode(data["name"]),
        _meta=meta,
    )
    return message
