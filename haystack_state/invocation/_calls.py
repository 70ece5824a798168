"""
What a tool call does, as plain functions with no I/O: resolve the tool, validate the model's arguments, plan the
order of the calls, inject state, turn results into state writes and into tool result messages. ``ToolInvoker`` and
``Agent`` only execute what these functions decide (see ``haystack_state.invocation._invoker``).
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Mapping
from typing import Any

from haystack import logging
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.tracing.utils import _serializable_value
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from haystack_state._state_store import Write
from haystack_state._text import replace_surrogates, surrogate_at
from haystack_state.errors import (
    ToolArgumentsError,
    ToolCallLimitError,
    ToolExecutionError,
    ToolInvocationError,
    ToolMergeError,
)
from haystack_state.invocation.arguments import read_arguments, resolve_tool, safe_tool_call, shown
from haystack_state.runtime import STORE_PARAM, RunContext
from haystack_state.state import State
from haystack_state.tools.spec import ToolSpec
from haystack_state.values import to_jsonable

__all__ = [
    "ALL_KEYS",
    "PlannedCall",
    "ResultConversionError",
    "call_arguments",
    "cause_of",
    "conversion_error",
    "error_message",
    "execution_error",
    "merge_error",
    "plan_calls",
    "result_message",
    "result_to_string",
    "state_writes",
]

logger = logging.getLogger(__name__)

#: Stands for "every key": a call with an injected State may read or write any key.
ALL_KEYS: frozenset[str] = frozenset({"*"})


@dataclasses.dataclass
class PlannedCall:
    """
    One tool call, resolved and validated, with what it reads and writes in the state.

    :param index: Its position among the calls of the batch (the order the model listed them in).
    :param tool_call: The model's call.
    :param spec: The tool, or None if it could not be resolved.
    :param arguments: The model's arguments, validated, without values for hidden parameters.
    :param error: Why the call cannot run (unknown tool, bad arguments), or None.
    :param reads: The state keys it reads (``ALL_KEYS`` with an injected State).
    :param writes: The state keys it writes (``ALL_KEYS`` with an injected State).
    :param after: The indexes of earlier calls whose writes it must see before it starts: directly, or through a
        call that writes every key (a tool that receives the State), which itself waits for every earlier writer.
    :param dropped: Hidden parameters the model sent values for (ignored).
    """

    index: int
    tool_call: ToolCall
    spec: ToolSpec | None
    arguments: dict[str, Any]
    error: ToolInvocationError | None = None
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    after: frozenset[int] = frozenset()
    dropped: tuple[str, ...] = ()


def _overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    if not a or not b:
        return False
    return a is ALL_KEYS or b is ALL_KEYS or not a.isdisjoint(b)


#: JSON schema types whose check is one isinstance test, with the Python types a JSON argument of that type has.
_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}
#: Keys of a property schema that do not constrain the value.
_ANNOTATIONS = frozenset({"type", "description", "title", "default", "examples"})
#: Keys of an object schema that the quick check understands.
_QUICK_OBJECT_KEYS = frozenset({"type", "properties", "required", "additionalProperties", "description", "title"})


@dataclasses.dataclass(frozen=True)
class _Checker:
    """
    How to validate a tool's arguments: the jsonschema validator, and for the common flat schemas (each property one
    plain ``type``) a quick check that accepts only what the validator accepts. A call the quick check passes needs no
    validator; any other goes to the validator, which decides and explains.
    """

    validator: Draft202012Validator
    required: tuple[str, ...] = ()
    types: Mapping[str, tuple[type, ...]] | None = None  # None: no quick check for this schema
    closed: bool = False  # additionalProperties is false

    def quick(self, arguments: Mapping[str, Any]) -> bool:
        types = self.types
        if types is None:
            return False
        for name in self.required:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            expected = types.get(name)
            if expected is None:
                if self.closed:
                    return False
            elif not isinstance(value, expected) or (type(value) is bool and bool not in expected):
                return False
        return True


def _quick_types(schema: Mapping[str, Any]) -> dict[str, tuple[type, ...]] | None:
    """The plain type of each property if the schema is a flat object schema the quick check handles, else None."""
    if schema.get("type") != "object" or not _QUICK_OBJECT_KEYS.issuperset(schema):
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if (
        not isinstance(properties, dict)
        or not isinstance(required, list)
        or not all(isinstance(name, str) for name in required)
    ):
        return None
    if not isinstance(schema.get("additionalProperties", True), bool):
        return None
    types = {}
    for name, sub in properties.items():
        if not isinstance(sub, dict) or not _ANNOTATIONS.issuperset(sub):
            return None
        kind = sub.get("type")
        expected = _PLAIN_TYPES.get(kind) if isinstance(kind, str) else None
        if expected is None:
            return None
        types[name] = expected
    return types


def _checker(spec: ToolSpec) -> _Checker:
    """
    The argument checker of a tool, built once per spec. The cache holds the spec weakly, so specs built per run
    (``tools=`` at run time) do not pile up in it.
    """
    key = id(spec)
    cached = _CHECKERS.get(key)
    if cached is not None and cached[0]() is spec:
        return cached[1]
    schema = spec.parameters
    types = _quick_types(schema)
    checker = _Checker(
        Draft202012Validator(schema),
        required=tuple(schema.get("required", [])) if types is not None else (),
        types=types,
        closed=schema.get("additionalProperties") is False,
    )
    _CHECKERS[key] = (weakref.ref(spec, lambda _: _CHECKERS.pop(key, None)), checker)
    return checker


_CHECKERS: dict[int, tuple[weakref.ref[ToolSpec], _Checker]] = {}


def _validate(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    properties = spec.parameters.get("properties", {})
    extra = [name for name in arguments if name not in properties]
    if extra and spec.parameters.get("additionalProperties") is not True and not spec.accepts_any_keyword:
        expected = ", ".join(sorted(properties)) or "none"
        raise ToolArgumentsError(
            spec.name,
            f"Tool '{spec.name}': unexpected argument(s) {', '.join(repr(shown(e)) for e in sorted(extra)[:20])}; "
            f"the parameters are: {expected}.",
        )
    checker = _checker(spec)
    if checker.quick(arguments):
        return arguments
    try:
        error = best_match(checker.validator.iter_errors(arguments))
    except Exception as exc:  # the tool's schema itself is broken: that is not the model's fault
        logger.warning(
            "Tool '{tool}': its parameter schema cannot be used to validate arguments ({error}); "
            "the arguments are passed unchecked.",
            tool=spec.name,
            error=f"{type(exc).__name__}: {exc}",
        )
        error = None
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path)
        subject = f"invalid parameter '{where}'" if where else "invalid arguments"
        raise ToolArgumentsError(spec.name, f"Tool '{spec.name}': {shown(subject, 200)}: {shown(error.message, 300)}.")
    return arguments


def check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> None:
    """
    Check arguments against a tool's parameters (as a model's call is checked before it runs).

    :param spec: The tool.
    :param arguments: The arguments.
    :raises ToolArgumentsError: Naming the tool and the parameter at fault.
    """
    _validate(spec, arguments)


def plan_calls(
    messages: list[ChatMessage], specs: Mapping[str, ToolSpec], max_calls: int | None = None
) -> list[PlannedCall]:
    """
    Resolve and validate every tool call of ``messages``, in order, and work out which calls must wait for which:
    a call that reads a key runs after the earlier calls that write it. Nothing the model sent raises here: a call
    that cannot run (unknown tool, bad or hostile arguments, past ``max_calls``) carries its error.

    :param messages: Messages; the tool calls of assistant messages are planned.
    :param specs: The available tools, by name.
    :param max_calls: The most calls that may run; the calls past it get a ``ToolCallLimitError``. No limit if None.
    :returns: One planned call per tool call; a call that cannot run carries its ``error``.
    """
    planned: list[PlannedCall] = []
    calls = [call for message in messages for call in message.tool_calls]
    # The last call that writes every key (it waits, directly or not, for every earlier writer), and the writers of
    # named keys since: a call waits for those of them whose writes it reads (linear in the calls, not quadratic).
    last_all: int | None = None
    since: list[PlannedCall] = []
    for tool_call in calls:
        index = len(planned)
        if max_calls is not None and index >= max_calls:
            error: ToolInvocationError = ToolCallLimitError(
                shown(tool_call.tool_name),
                f"Tool '{shown(tool_call.tool_name)}' was not called: the reply asks for {len(calls)} tool calls and "
                f"at most {max_calls} run per reply (max_tool_calls). Ask for fewer calls at once.",
            )
            planned.append(PlannedCall(index, safe_tool_call(tool_call), None, {}, error=error))
            continue
        try:
            spec = resolve_tool(tool_call, specs)
        except ToolInvocationError as exc:
            planned.append(PlannedCall(index, safe_tool_call(tool_call), None, {}, error=exc))
            continue
        try:
            arguments = read_arguments(tool_call)
        except ToolArgumentsError as exc:
            planned.append(PlannedCall(index, safe_tool_call(tool_call), spec, {}, error=exc))
            continue
        hidden = spec.hidden_params
        dropped: tuple[str, ...] = ()
        if hidden and not hidden.isdisjoint(arguments):
            dropped = tuple(sorted(name for name in arguments if name in hidden))
            arguments = {name: value for name, value in arguments.items() if name not in hidden}
        try:
            _validate(spec, arguments)
        except ToolArgumentsError as exc:
            planned.append(PlannedCall(index, tool_call, spec, arguments, error=exc, dropped=dropped))
            continue
        injected = bool(spec.state_params)
        reads = ALL_KEYS if injected else frozenset(spec.inputs_from_state)
        writes = ALL_KEYS if injected else frozenset(spec.outputs_to_state)
        waits = [earlier.index for earlier in since if _overlap(earlier.writes, reads)]
        if last_all is not None and reads:
            waits.append(last_all)
        call = PlannedCall(index, tool_call, spec, arguments, None, reads, writes, frozenset(waits), dropped)
        planned.append(call)
        if writes is ALL_KEYS:
            last_all, since = index, []
        elif writes:
            since.append(call)
    return planned


def call_arguments(
    call: PlannedCall,
    state: State,
    streaming_callback: StreamingCallbackT | None = None,
    passthrough: bool = False,
    context: RunContext[Any] | None = None,
) -> dict[str, Any]:
    """
    The keyword arguments to call the tool with: the model's, the ``inputs_from_state`` values, the State and the
    run's context.

    :param call: A planned call without error.
    :param state: The State the tool sees (a staged view for tools that receive the State).
    :param streaming_callback: The callback to pass through, if any.
    :param passthrough: Whether to pass the callback to tools that take a ``streaming_callback`` parameter.
    :param context: The run's ``RunContext``, passed as it is to the tool's ``RunContext`` parameters.
    :returns: The keyword arguments.
    :raises ToolArgumentsError: If a required parameter comes from a state key that holds no value.
    """
    spec = call.spec
    assert spec is not None
    kwargs = dict(call.arguments)
    for key, param in spec.inputs_from_state.items():
        if state.has(key):
            kwargs[param] = state.get(key)
        elif param in spec.required_params:
            raise ToolArgumentsError(
                spec.name,
                f"Tool '{spec.name}': parameter '{param}' comes from state key '{key}', which holds no value; "
                f"set '{key}' before the tool runs.",
            )
    for param in spec.state_params:
        kwargs[param] = state
    for param, expected in spec.context_params.items():
        kwargs[param] = (context.store if context is not None else None) if expected is STORE_PARAM else context
    if passthrough and streaming_callback is not None and spec.streaming_callback:
        kwargs["streaming_callback"] = streaming_callback
    return kwargs


def state_writes(spec: ToolSpec, result: object) -> list[Write]:
    """
    The state writes of a tool's ``outputs_to_state``: ``(key, value, handler_override)`` for each mapping.

    A mapping without ``source`` writes the whole result; one with a ``source`` writes that entry of a dict result,
    and nothing if the result has no such entry (as haystack-ai does).

    :param spec: The tool.
    :param result: What the tool returned.
    :returns: The writes, in mapping order.
    """
    writes: list[Write] = []
    for key, config in spec.outputs_to_state.items():
        source = config.get("source")
        if source is None:
            writes.append((key, result, config.get("handler")))
        elif isinstance(result, Mapping) and source in result:
            writes.append((key, result[source], config.get("handler")))
    return writes


def result_to_string(result: object, convert_result_to_json_string: bool | None = None) -> str:
    """
    Render a tool result for the model.

    By default (``convert_result_to_json_string=None``, haystack-ai's Agent's rule) strings are kept as they are and
    other values are rendered as JSON. ``True`` renders every result with ``json.dumps``, a string too (quoted);
    ``False`` renders it with ``str()``, objects with ``to_dict`` (haystack's dataclasses) converted to dicts first,
    as haystack-ai's ``ToolInvoker`` does. A result JSON cannot encode falls back to ``str()``, with a warning.

    :param result: The tool's result.
    :param convert_result_to_json_string: None for the default rule, True for ``json.dumps``, False for ``str()``.
    :returns: The text of the tool result message.
    """
    if convert_result_to_json_string is False:
        return str(_serializable_value(result))
    if isinstance(result, str) and convert_result_to_json_string is None:
        return result
    try:  # one pass: json encodes plain data itself and asks _json_default for the rest
        return _RESULT_ENCODER.encode(result)
    except Exception:
        pass
    try:  # e.g. keys json does not take (tuples): converted by to_jsonable
        return json.dumps(to_jsonable(result), ensure_ascii=False)
    except Exception as error:  # not JSON (or a to_dict that fails, or a cycle): the string form will do
        logger.warning(
            "Tool result is not JSON serializable. Falling back to str conversion. Result type: {result_type}. "
            "Error: {error}",
            result_type=type(result).__name__,
            error=error,
        )
        return str(result)


def _json_default(value: object) -> Any:
    """What ``json.dumps`` encodes for a value it cannot encode itself (as ``to_jsonable`` converts it)."""
    converted = to_jsonable(value)
    if converted is value:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return converted


# One encoder for every result (``json.dumps`` with options builds a new one per call).
_RESULT_ENCODER = json.JSONEncoder(ensure_ascii=False, default=_json_default)


class ResultConversionError(Exception):
    """
    An ``outputs_to_string`` handler raised while rendering a tool result (see :func:`conversion_error`).

    :param handler: The handler's name.
    :param cause: What it raised.
    """

    def __init__(self, handler: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.handler = handler
        self.cause = cause


def _render(config: Mapping[str, Any], result: object, convert: bool | None) -> Any:
    source = config.get("source")
    value = result.get(source) if source is not None and isinstance(result, Mapping) else result
    handler = config.get("handler")
    if handler is not None:
        try:
            return handler(value)
        except Exception as exc:
            name = str(getattr(handler, "__name__", None) or type(handler).__name__)
            raise ResultConversionError(name, exc) from exc
    return value if config.get("raw_result") else result_to_string(value, convert)


def result_message(
    spec: ToolSpec, tool_call: ToolCall, result: object, convert_result_to_json_string: bool | None = None
) -> ChatMessage:
    """
    The tool result message for a successful call, honouring ``outputs_to_string`` as haystack-ai defines it: one
    ``{"source", "handler", "raw_result"}`` config, or a dict of such configs (one entry per output, then JSON).

    :param spec: The tool.
    :param tool_call: The model's call.
    :param result: What the tool returned.
    :param convert_result_to_json_string: How a result without a handler is rendered (see
        :func:`result_to_string`).
    :returns: The tool message.
    :raises ResultConversionError: If an ``outputs_to_string`` handler raises.
    """
    convert = convert_result_to_json_string
    config = spec.outputs_to_string or {}
    if not config or any(k in config for k in ("source", "handler", "raw_result")):
        return ChatMessage.from_tool(
            tool_result=_storable(tool_call, _render(config, result, convert)), origin=tool_call
        )
    rendered = {name: _render({**sub, "raw_result": False}, result, convert) for name, sub in config.items()}
    return ChatMessage.from_tool(
        tool_result=_storable(tool_call, result_to_string(rendered, convert)), origin=tool_call
    )


def _storable(tool_call: ToolCall, text: object) -> Any:
    """A result's text with lone surrogates (which no checkpoint can store) replaced by U+FFFD, with a warning."""
    if not isinstance(text, str) or surrogate_at(text) < 0:
        return text
    logger.warning(
        "Tool '{tool_name}': its result holds text that is not valid Unicode (lone surrogates); they are replaced "
        "by U+FFFD, so that the result can be stored and sent to the model.",
        tool_name=shown(tool_call.tool_name),
    )
    return replace_surrogates(text)


def error_message(tool_call: ToolCall, error: BaseException) -> ChatMessage:
    """
    The tool result message of a failed call (``error=True``), telling the model what went wrong.

    :param tool_call: The model's call.
    :param error: The failure.
    :returns: The tool message.
    """
    return ChatMessage.from_tool(tool_result=replace_surrogates(str(error)), origin=tool_call, error=True)


def cause_of(exc: BaseException) -> BaseException:
    """
    The exception a tool raised, inside haystack-ai's ``ToolInvocationError`` wrapper (``Tool.invoke`` wraps what
    the function raises).

    :param exc: What the call raised.
    :returns: The tool's own exception (``exc`` itself if it is not wrapped).
    """
    while exc.__cause__ is not None and type(exc).__name__ == "ToolInvocationError":
        exc = exc.__cause__
    return exc


def execution_error(tool_name: str, exc: BaseException, attempts: int = 1) -> ToolExecutionError:
    """
    The error for a tool that raised.

    :param tool_name: The tool.
    :param exc: What it raised (on its last attempt).
    :param attempts: How many attempts were made (a retry policy's); the message says so when more than one.
    :returns: The error, naming the tool and the cause, chained to it.
    """
    cause = cause_of(exc)
    after = f" after {attempts} attempts" if attempts > 1 else ""
    error = ToolExecutionError(
        tool_name, f"Failed to invoke tool '{tool_name}'{after}: {type(cause).__name__}: {cause}"
    )
    error.__cause__ = cause
    return error


def conversion_error(tool_name: str, exc: BaseException) -> ToolExecutionError:
    """
    The error for a result that could not be rendered for the model (an ``outputs_to_string`` handler raised).

    :param tool_name: The tool.
    :param exc: The handler's error (a :class:`ResultConversionError`), or what else failed while rendering.
    :returns: The error, naming the tool and the handler, chained to the cause.
    """
    if isinstance(exc, ResultConversionError):
        cause, using = exc.cause, f" using '{exc.handler}'"
    else:
        cause, using = exc, ""
    error = ToolExecutionError(
        tool_name,
        f"Tool '{tool_name}': Failed to convert tool result from tool {tool_name}{using}: "
        f"{type(cause).__name__}: {cause}. The call merged nothing.",
    )
    error.__cause__ = cause
    return error


def merge_error(tool_name: str, exc: BaseException) -> ToolMergeError:
    """
    The error for a result that could not be merged into the state.

    :param tool_name: The tool.
    :param exc: The handler or type error.
    :returns: The error, naming the tool and the cause, chained to it.
    """
    error = ToolMergeError(
        tool_name,
        f"Tool '{tool_name}': Failed to merge tool outputs from tool {tool_name} into State (the state is unchanged): "
        f"{exc}",
    )
    error.__cause__ = exc
    return error
