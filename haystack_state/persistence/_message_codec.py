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
        if "__type__" in value:
            return False
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _PLAIN_SCALARS and not _plain(item)):
                return False
        return True
    if kind in _PLAIN_LISTS:
        for item in value:  # noqa: SIM110 - a loop: all() would build a generator per list, at every commit
            if type(item) not in _PLAIN_SCALARS and not _plain(item):
                return False
        return True
    return False


def _tool_call_data(call: object) -> dict[str, Any] | None:
    """A tool call's ``to_dict`` data (its values in the compact form's row order), or None if not plain JSON."""
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


def _encode_parts(content: Any, compact: bool) -> list[Any] | None:
    """
    A message's content parts as stored: ``to_dict``'s objects, or the compact form (see the module docstring).
    None if a part is one the fast paths do not cover.
    """
    parts: list[Any] = []
    for part in content:
        kind = type(part)
        if kind is TextContent:
            text = part.__dict__.get("text")
            if type(text) is not str:
                return None
            parts.append(text if compact else {"text": text})
        elif kind is ToolCall:
            call = _tool_call_data(part)
            if call is None:
                return None
            parts.append(["c", *call.values()] if compact else {"tool_call": call})
        elif kind is ToolCallResult:
            result = part.__dict__
            origin, error = result.get("origin"), result.get("error")
            if type(result.get("result")) is not str or type(origin) is not ToolCall or type(error) is not bool:
                return None
            call = _tool_call_data(origin)
            if call is None:
                return None
            if compact:
                parts.append(["r", result["result"], list(call.values()), error])
            else:
                parts.append({"tool_call_result": {"result": result["result"], "origin": call, "error": error}})
        else:
            return None
    return parts


def _encode_message(message: object, encode: Callable[[Any], Any], compact: bool) -> Any:
    fields = message.__dict__
    role = fields.get("_role")
    if type(role) is not ChatRole or type(fields.get("_content")) not in _CONTENT_LISTS:
        return None
    parts = _encode_parts(fields["_content"], compact)
    if parts is None:
        return None
    name, meta = encode(fields.get("_name")), encode(fields.get("_meta"))
    if compact:
        return [role.value, name, meta, parts]
    return {"role": role.value, "meta": meta, "name": name, "content": parts}


def encode_chat_message(message: object, encode: Callable[[Any], Any]) -> dict[str, Any] | None:
    """
    The encoded data of ``message.to_dict()``, built without ``dataclasses.asdict``.

    :param message: A ``ChatMessage`` (exactly).
    :param encode: The codec's encoder, for the message's ``meta`` and ``name``.
    :returns: The data, or None if the message holds something the fast path does not cover.
    """
    data: dict[str, Any] | None = _encode_message(message, encode, compact=False)
    return data


def encode_chat_message_compact(message: object, encode: Callable[[Any], Any]) -> list[Any] | None:
    """
    The compact stored form of a message (see the module docstring): ``[role, name, meta, parts]``.

    :param message: A ``ChatMessage`` (exactly).
    :param encode: The codec's encoder, for the message's ``meta`` and ``name``.
    :returns: The data, or None if the message holds something the compact form does not cover (it is then stored as
        ``to_dict`` gives it).
    """
    data: list[Any] | None = _encode_message(message, encode, compact=True)
    return data


def _call_row(data: object) -> list[Any] | None:
    """A tool call stored as ``to_dict`` gives it, as the compact form's row (None if it is not one)."""
    if type(data) is not dict or "tool_name" not in data or "arguments" not in data:
        return None
    if not _TOOL_CALL_KEYS.issuperset(data):
        return None
    return [data["tool_name"], data["arguments"], data.get("id"), data.get("extra")]


def _decode_call(row: Any, decode: Callable[[Any], Any]) -> ToolCall | None:
    """A tool call from its row, ``[tool_name, arguments, id, extra]`` (None if it is not one)."""
    if type(row) is not list or len(row) != 4:
        return None
    tool_name, arguments, call_id, extra = row
    call = _new(ToolCall)
    call.__dict__.update(  # strings and None are what they decode to: no call for them
        tool_name=tool_name if type(tool_name) is str else decode(tool_name),
        arguments=decode(arguments),
        id=call_id if call_id is None or type(call_id) is str else decode(call_id),
        extra=None if extra is None else decode(extra),
    )
    return call


def _text_part(text: str) -> TextContent:
    item = _new(TextContent)
    item.__dict__["text"] = text
    return item


def _result_part(result: str, origin: ToolCall | None, error: bool) -> ToolCallResult | None:
    if origin is None:
        return None
    item = _new(ToolCallResult)
    item.__dict__.update(result=result, origin=origin, error=error)
    return item


def _compact_part(part: Any, decode: Callable[[Any], Any]) -> Any:
    kind = type(part)
    if kind is str:
        return _text_part(part)
    if kind is list and len(part) == 5 and part[0] == "c":
        return _decode_call(part[1:], decode)
    if kind is list and len(part) == 4 and part[0] == "r" and type(part[1]) is str and type(part[3]) is bool:
        return _result_part(part[1], _decode_call(part[2], decode), part[3])
    return None


def _dict_part(part: object, decode: Callable[[Any], Any]) -> Any:
    if type(part) is not dict or len(part) != 1:
        return None
    if "text" in part:
        return _text_part(part["text"]) if type(part["text"]) is str else None
    if "tool_call" in part:
        return _decode_call(_call_row(part["tool_call"]), decode)
    if "tool_call_result" in part:
        result = part["tool_call_result"]
        if type(result) is not dict or len(result) != 3:
            return None
        text, error = result.get("result"), result.get("error")
        if type(text) is not str or type(error) is not bool:
            return None
        return _result_part(text, _decode_call(_call_row(result.get("origin")), decode), error)
    return None


def decode_chat_message(data: object, decode: Callable[[Any], Any], frozen: bool) -> Any:
    """
    Build a ``ChatMessage`` from its stored data (``to_dict`` output, encoded, or the compact form), as
    ``ChatMessage.from_dict`` would.

    :param data: The stored data (parsed JSON).
    :param decode: The codec's decoder for nested values (frozen ones when ``frozen``).
    :param frozen: Build the message read-only inside (for the head cache), as ``haystack_state.values.freeze``
        would give it.
    :returns: The message, or None if the data has a shape the fast path does not cover.
    """
    if type(data) is list:  # the compact form: [role, name, meta, parts]
        if len(data) != 4:
            return None
        role, name, meta, parts = data
        read_part = _compact_part
    elif type(data) is dict and len(data) == 4 and "meta" in data and "name" in data:
        role, name, meta, parts = data.get("role"), data["name"], data["meta"], data.get("content")
        read_part = _dict_part
    else:
        return None
    role = _ROLES.get(role) if type(role) is str else None
    if role is None or type(parts) is not list:
        return None
    content: list[Any] = []
    for part in parts:
        item = read_part(part, decode)
        if item is None:
            return None
        content.append(item)
    message = _new(ChatMessage)
    message.__dict__.update(
        _role=role,
        _content=(FrozenListWithObjects(content) if content else FrozenList()) if frozen else content,
        _name=name if name is None or type(name) is str else decode(name),
        _meta=decode(meta) or ({} if not frozen else FrozenDict()),
    )
    return message
