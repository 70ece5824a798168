"""
Reading what a model sends in a tool call, whatever it sends: the tool name and the arguments, as a dict or as JSON
text. Nothing a model sends may escape as a raw exception, wedge a thread or crash the process:

- :func:`resolve_tool` and :func:`read_arguments` turn every hostile or malformed call into a ``ToolNotFoundError``
  or ``ToolArgumentsError`` naming the tool and the parameter, which the runner answers with an error tool result:
  a tool name that is not a string, JSON text that is not valid, not an object, nested thousands of levels deep,
  with numbers Python cannot convert, ``NaN``/``Infinity``, text that is not valid UTF-8 or holds lone surrogates or
  NUL characters, values that are not JSON, arguments larger than :data:`MAX_ARGUMENT_CHARS`;
- :func:`safe_tool_calls` makes a model reply storable before it is written to the state: a call whose name or
  arguments could not be stored (or sent back to the model's provider) keeps its id, gets a printable name, and
  its arguments are replaced by ``{INVALID_ARGUMENTS: "<why>"}``, which :func:`read_arguments` answers with that
  reason as an error tool result.

Every check is a single pass over the arguments, without recursion.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from haystack import logging
from haystack.dataclasses import ChatMessage, ReasoningContent, TextContent, ToolCall

from haystack_state._text import replace_surrogates, surrogate_at
from haystack_state.errors import ToolArgumentsError, ToolNotFoundError
from haystack_state.tools.spec import ToolSpec

__all__ = [
    "INVALID_ARGUMENTS",
    "MAX_ARGUMENT_CHARS",
    "MAX_ARGUMENT_DEPTH",
    "read_arguments",
    "resolve_tool",
    "safe_tool_call",
    "safe_tool_calls",
    "shown",
]

#: The most levels of arrays and objects an argument value may nest.
MAX_ARGUMENT_DEPTH = 100
#: The most characters a call's arguments may hold (the JSON text's length, or the length of the strings in them plus
#: one for every other value).
MAX_ARGUMENT_CHARS = 2_000_000
#: The key of the arguments that :func:`safe_tool_calls` puts in place of arguments it could not keep.
INVALID_ARGUMENTS = "__invalid_arguments__"

logger = logging.getLogger(__name__)

#: Integers longer than this (about 4,200 digits) cannot be converted to and from text by Python, hence not stored.
_MAX_INT_BITS = 14_000
_MAX_NAME_CHARS = 256


class _Hostile(Exception):
    """Arguments that cannot be used or stored. ``reason`` names the parameter when one is at fault."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _NonStandardConstant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in JSON text."""


def shown(value: object, limit: int = 80) -> str:
    """
    A tool name, parameter name or value as it can be put in a message: a string (the ``repr`` of anything else),
    at most ``limit`` characters, with unprintable characters (NUL, lone surrogates, line breaks) escaped.

    :param value: What to show.
    :param limit: The most characters kept.
    :returns: Printable text.
    """
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text


def _clean(text: str) -> bool:
    """Whether a string can be stored and sent as it is: no NUL character, valid UTF-8 (no lone surrogate)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_problem(text: str) -> str:
    if "\x00" in text:
        return "holds a NUL character (\\u0000), which tool arguments may not contain"
    return "holds text that is not valid Unicode (a lone surrogate), which tool arguments may not contain"


def _check_value(value: object, where: str, budget: int) -> int:
    """
    Check one argument value (``where`` names it), iteratively. Returns what is left of the size budget.

    :raises _Hostile: Naming ``where`` and the problem.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        budget -= 1
        if isinstance(item, str):
            budget -= len(item)
            if not _clean(item):
                raise _Hostile(f"parameter {where} {_text_problem(item)}")
        elif item is None or isinstance(item, bool):
            pass
        elif isinstance(item, int):
            if item.bit_length() > _MAX_INT_BITS:
                raise _Hostile(f"parameter {where} holds a number with more than 4,000 digits")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _Hostile(f"parameter {where} holds {item!r}, which is not a JSON number")
        elif isinstance(item, Mapping):
            if depth >= MAX_ARGUMENT_DEPTH:
                raise _Hostile(f"parameter {where} is nested more than {MAX_ARGUMENT_DEPTH} levels deep")
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise _Hostile(f"parameter {where} has a key that is not a string ({shown(key)})")
                budget -= len(key)
                if not _clean(key):
                    raise _Hostile(f"parameter {where} has a key that {_text_problem(key)}")
                stack.append((sub, depth + 1))
        elif isinstance(item, list | tuple):
            if depth >= MAX_ARGUMENT_DEPTH:
                raise _Hostile(f"parameter {where} is nested more than {MAX_ARGUMENT_DEPTH} levels deep")
            stack.extend((sub, depth + 1) for sub in item)
        else:
            raise _Hostile(f"parameter {where} holds a value of type {type(item).__name__}, which is not a JSON value")
        if budget < 0:
            raise _Hostile(
                f"the arguments are larger than {MAX_ARGUMENT_CHARS:,} characters (at parameter {where}), "
                "or contain themselves"
            )
    return budget


def _check_arguments(arguments: Mapping[str, Any]) -> None:
    """
    Check every parameter name and value of a call's arguments.

    :raises _Hostile: For the first problem, naming the parameter.
    """
    budget = MAX_ARGUMENT_CHARS
    for name, value in arguments.items():
        if not isinstance(name, str):
            raise _Hostile(f"a parameter name must be a string, got {type(name).__name__} ({shown(name)})")
        if not _clean(name) or len(name) > _MAX_NAME_CHARS:
            raise _Hostile(f"the parameter name '{shown(name)}' is not a usable name")
        cls = type(value)
        if cls is str and len(value) < 4096 and value.isascii() and "\x00" not in value:
            budget -= len(value) + len(name) + 1  # the common case, without the general walk
            if budget < 0:
                raise _Hostile(f"the arguments are larger than {MAX_ARGUMENT_CHARS:,} characters")
        elif cls is bool or value is None or (cls is int and value.bit_length() <= 64):
            budget -= len(name) + 1
        else:
            budget = _check_value(value, f"'{name}'", budget - len(name))


def _reject_constant(name: str) -> Any:
    raise _NonStandardConstant(name)


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _parse(text: str | bytes | bytearray) -> Any:
    """
    Parse JSON text sent as a call's arguments.

    :raises _Hostile: If the text cannot be parsed safely (too large, too deep, huge numbers, NaN, not UTF-8).
    :raises json.JSONDecodeError: If it is not valid JSON.
    """
    if len(text) > MAX_ARGUMENT_CHARS:
        raise _Hostile(
            f"the arguments are {len(text):,} characters of JSON text; at most {MAX_ARGUMENT_CHARS:,} are accepted"
        )
    if not isinstance(text, str):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Hostile(f"the arguments are not valid UTF-8 (at byte {exc.start})") from None
    if not text.strip():
        return {}
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise _Hostile(f"the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep") from None
    except _NonStandardConstant as exc:
        raise _Hostile(f"the arguments hold {exc}, which is not a JSON number") from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer too long to convert ("Exceeds the limit ... for integer string conversion")
        raise _Hostile("the arguments hold a number with more than 4,000 digits") from None


def _marker(arguments: object) -> str | None:
    """The reason left by :func:`safe_tool_call` in place of arguments it could not keep, if that is what these are."""
    if type(arguments) is dict and len(arguments) == 1:
        reason = arguments.get(INVALID_ARGUMENTS)
        if isinstance(reason, str):
            return reason
    return None


def _name(tool_call: ToolCall) -> str:
    name = tool_call.tool_name
    return name if isinstance(name, str) and len(name) <= _MAX_NAME_CHARS and _clean(name) else shown(name)


def resolve_tool(tool_call: ToolCall, specs: Mapping[str, ToolSpec]) -> ToolSpec:
    """
    The tool a call names.

    :param tool_call: The model's call.
    :param specs: The available tools, by name.
    :returns: The tool's spec.
    :raises ToolNotFoundError: If the name is not a string or names no available tool; the message lists the tools.
    """
    name = tool_call.tool_name
    if isinstance(name, str):
        spec = specs.get(name)
        if spec is not None:
            return spec
    available = ", ".join(sorted(specs)) or "none"
    reason = _marker(tool_call.arguments)
    if reason is not None:
        message = f"{reason} Available tools: {available}."
    elif not isinstance(name, str):
        message = f"The tool name must be a string, got {type(name).__name__} ({shown(name)}). Available tools: " + (
            f"{available}."
        )
    else:
        message = f"Tool '{_name(tool_call)}' not found. Available tools: {available}."
    raise ToolNotFoundError(_name(tool_call), message)


def read_arguments(tool_call: ToolCall) -> dict[str, Any]:
    """
    The arguments of a call as a dict: given as a dict, as JSON text (some providers hand that over), or None.

    :param tool_call: The model's call.
    :returns: A new dict of the arguments.
    :raises ToolArgumentsError: Naming the tool (and the parameter, when one is at fault), if the arguments are not
        a JSON object, not valid JSON, or hostile (see the module docstring).
    """
    raw: Any = tool_call.arguments
    if raw is None:
        return {}
    try:
        if type(raw) is not dict:
            if isinstance(raw, str | bytes | bytearray):
                try:
                    raw = _parse(raw)
                except json.JSONDecodeError as exc:
                    name = _name(tool_call)
                    raise ToolArgumentsError(
                        name, f"Tool '{name}': the arguments are not valid JSON ({exc.msg} at position {exc.pos})."
                    ) from None
            if not isinstance(raw, Mapping):
                name = _name(tool_call)
                raise ToolArgumentsError(
                    name, f"Tool '{name}': the arguments must be a JSON object, got {type(raw).__name__}."
                )
        elif len(raw) == 1 and (reason := _marker(raw)) is not None:
            raise ToolArgumentsError(_name(tool_call), reason)
        _check_arguments(raw)
    except _Hostile as exc:
        name = _name(tool_call)
        raise ToolArgumentsError(name, f"Tool '{name}': {exc.reason}.") from None
    return dict(raw)


def _storable_problem(tool_call: ToolCall) -> str | None:
    """Why the call could not be stored or sent back to the model as it is, or None."""
    name = tool_call.tool_name
    if not isinstance(name, str):
        return f"The tool name must be a string, got {type(name).__name__} ({shown(name)})."
    if len(name) > _MAX_NAME_CHARS or not _clean(name):
        return f"The tool name '{shown(name)}' is not a usable name."
    raw: Any = tool_call.arguments
    try:
        if raw is None or _marker(raw) is not None:
            return None
        if isinstance(raw, str | bytes | bytearray):
            try:
                raw = _parse(raw)
            except json.JSONDecodeError:
                return (
                    None
                    if isinstance(raw, str) and _clean(raw)
                    else f"Tool '{name}': the arguments are not valid JSON."
                )
        if not isinstance(raw, Mapping):
            if isinstance(tool_call.arguments, str):
                return None  # the text is stored as it was; the call is answered with an error
            return f"Tool '{name}': the arguments must be a JSON object, got {type(raw).__name__}."
        _check_arguments(raw)
    except _Hostile as exc:
        return f"Tool '{name}': {exc.reason}."
    return None


def safe_tool_call(tool_call: ToolCall) -> ToolCall:
    """
    The call itself if it can be stored and sent back to the model as it is; otherwise a copy with a printable tool
    name and id, whose arguments are ``{INVALID_ARGUMENTS: "<why>"}`` (the call is then answered with that reason as
    an error tool result).

    :param tool_call: A model's call.
    :returns: The call, or its storable copy.
    """
    problem = _storable_problem(tool_call)
    call_id = tool_call.id
    clean_id = call_id is None or (isinstance(call_id, str) and len(call_id) <= _MAX_NAME_CHARS and _clean(call_id))
    if problem is None and clean_id:
        return tool_call
    return ToolCall(
        tool_name=_name(tool_call),
        arguments={INVALID_ARGUMENTS: problem} if problem is not None else tool_call.arguments,
        id=call_id if clean_id else shown(call_id),
        extra=tool_call.extra,
    )


def _storable_text(reply: ChatMessage) -> ChatMessage:
    """The reply, or a copy whose lone surrogates (which no checkpoint can store) are replaced by U+FFFD."""
    content = []
    for part in reply._content:
        if isinstance(part, TextContent) and surrogate_at(part.text) >= 0:
            part = TextContent(replace_surrogates(part.text))
        elif isinstance(part, ReasoningContent) and surrogate_at(part.reasoning_text) >= 0:
            part = dataclasses.replace(part, reasoning_text=replace_surrogates(part.reasoning_text))
        content.append(part)
    if all(new is old for new, old in zip(content, reply._content, strict=True)):
        return reply
    logger.warning(
        "The model's reply holds text that is not valid Unicode (lone surrogates); they are replaced by U+FFFD, so "
        "that the reply can be stored."
    )
    return dataclasses.replace(reply, _content=content)


def safe_tool_calls(reply: ChatMessage) -> ChatMessage:
    """
    A model reply that can be stored: its tool calls (see :func:`safe_tool_call`) and its texts (lone surrogates,
    which no checkpoint can store, become U+FFFD). The reply itself when it can, else a copy with the offending calls
    and texts replaced. Apply it to a model's reply before writing it to a State that is checkpointed, so that no
    model output can make a commit fail and wedge the thread.

    Usage example:

    .. code-block:: python

        from haystack.dataclasses import ChatMessage, ToolCall

        deep = "[" * 10_000 + "]" * 10_000
        reply = ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="search", arguments=deep, id="c1")])
        safe = safe_tool_calls(reply)
        assert INVALID_ARGUMENTS in safe.tool_calls[0].arguments

    :param reply: A chat generator's reply.
    :returns: The reply, or its storable copy (anything that is not a ``ChatMessage`` is returned as it is, for the
        State to refuse).
    """
    if not isinstance(reply, ChatMessage):
        return reply
    reply = _storable_text(reply)
    calls = reply.tool_calls
    if not calls:
        return reply
    safe = [safe_tool_call(call) for call in calls]
    if all(new is old for new, old in zip(safe, calls, strict=True)):
        return reply
    replacements = {id(old): new for old, new in zip(calls, safe, strict=True)}
    content = [replacements.get(id(part), part) for part in reply._content]
    return dataclasses.replace(reply, _content=content)
