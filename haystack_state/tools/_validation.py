"""
Checking the state mappings and output options of a tool definition, collecting every problem.

- ``inputs_from_state``: ``{"state_key": "param_name"}`` (its parameters are checked in
  :mod:`haystack_state.tools._parameters`, where the parameters are known);
- ``outputs_to_state``: ``{"state_key": {"source": "output_key", "handler": fn}}``, both keys optional: without
  ``source`` the whole result goes to the state key; without ``handler`` the state key's own merge handler is used.
  A handler is called as ``handler(current, new)``;
- ``outputs_to_string``: haystack-ai's format, either ``{"source": ..., "handler": ..., "raw_result": ...}`` or
  ``{"name": {"source": ..., "handler": ...}, ...}``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Collection

__all__ = [
    "TOOL_NAME_PATTERN",
    "check_outputs_to_state",
    "check_outputs_to_string",
    "check_tool_name",
    "describe_callable",
]

#: The names LLM providers accept for a tool (OpenAI's rule, the strictest common one).
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_OUTPUT_KEYS = frozenset({"source", "handler"})
_SINGLE_STRING_KEYS = frozenset({"source", "handler", "raw_result"})


def describe_callable(obj: object) -> str:
    """
    Name a callable for a message.

    :param obj: The object.
    :returns: Its qualified name when it has one, its ``repr`` otherwise.
    """
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj))


def check_tool_name(name: object) -> list[str]:
    """
    Check that a tool name is one every LLM provider accepts.

    :param name: The tool name.
    :returns: The problems (none when the name is fine).
    """
    if isinstance(name, str) and TOOL_NAME_PATTERN.match(name):
        return []
    return [
        f"Tool '{name}': the name must be 1 to 64 letters, digits, '_' or '-' (what LLM providers accept); "
        "pass name=... to choose one."
    ]


def check_outputs_to_state(
    tool_name: str, outputs_to_state: object, valid_sources: Collection[str] | None = None
) -> list[str]:
    """
    Check an ``outputs_to_state`` mapping.

    :param tool_name: The tool's name, used in the messages.
    :param outputs_to_state: The mapping to check (``None`` is fine).
    :param valid_sources: The output keys the tool is known to produce (a component's output sockets), or ``None``
        when they are unknown (a function's result).
    :returns: The problems, one sentence each naming the tool and the state key.
    """
    if outputs_to_state is None:
        return []
    if not isinstance(outputs_to_state, dict):
        return [f"Tool '{tool_name}': outputs_to_state must be a dict of state key -> {{'source', 'handler'}}."]
    problems: list[str] = []
    for state_key, config in outputs_to_state.items():
        where = f"Tool '{tool_name}': outputs_to_state entry '{state_key}'"
        if not isinstance(state_key, str):
            problems.append(f"Tool '{tool_name}': outputs_to_state key {state_key!r} must be a state key (str).")
            continue
        if not isinstance(config, dict):
            problems.append(
                f"{where} must be a dict with optional keys 'source' and 'handler', got {type(config).__name__}."
            )
            continue
        unknown = sorted(str(key) for key in config if key not in _OUTPUT_KEYS)
        if unknown:
            problems.append(f"{where} has unknown key(s) {unknown}; only 'source' and 'handler' are allowed.")
        if "source" in config:
            problems.extend(_check_source(where, config["source"], valid_sources))
        if "handler" in config:
            problems.extend(_check_handler(where, config["handler"], arity=2))
    return problems


def check_outputs_to_string(
    tool_name: str, outputs_to_string: object, valid_sources: Collection[str] | None = None
) -> list[str]:
    """
    Check an ``outputs_to_string`` configuration (haystack-ai's format).

    :param tool_name: The tool's name, used in the messages.
    :param outputs_to_string: The configuration to check (``None`` is fine).
    :param valid_sources: The output keys the tool is known to produce, or ``None`` when unknown.
    :returns: The problems, one sentence each naming the tool and the key.
    """
    if outputs_to_string is None:
        return []
    if not isinstance(outputs_to_string, dict):
        return [f"Tool '{tool_name}': outputs_to_string must be a dict."]
    where = f"Tool '{tool_name}': outputs_to_string"
    if _SINGLE_STRING_KEYS & outputs_to_string.keys():
        problems: list[str] = []
        unknown = sorted(str(key) for key in outputs_to_string if key not in _SINGLE_STRING_KEYS)
        if unknown:
            problems.append(
                f"{where} mixes 'source'/'handler'/'raw_result' with other keys {unknown}; use either the single "
                "format or one dict per output."
            )
        if "source" in outputs_to_string:
            problems.extend(_check_source(where, outputs_to_string["source"], valid_sources))
        if "handler" in outputs_to_string:
            problems.extend(_check_handler(where, outputs_to_string["handler"], arity=1))
        if "raw_result" in outputs_to_string and not isinstance(outputs_to_string["raw_result"], bool):
            problems.append(f"{where} 'raw_result' must be a bool.")
        return problems
    problems = []
    for key, config in outputs_to_string.items():
        entry = f"{where} entry '{key}'"
        if not isinstance(config, dict):
            problems.append(f"{entry} must be a dict with 'source' and optional 'handler'.")
            continue
        unknown = sorted(str(k) for k in config if k not in _OUTPUT_KEYS)
        if unknown:
            problems.append(f"{entry} has unknown key(s) {unknown}; only 'source' and 'handler' are allowed.")
        if "source" not in config:
            problems.append(f"{entry} needs a 'source'.")
        else:
            problems.extend(_check_source(entry, config["source"], valid_sources))
        if "handler" in config:
            problems.extend(_check_handler(entry, config["handler"], arity=1))
    return problems


def _check_source(where: str, source: object, valid_sources: Collection[str] | None) -> list[str]:
    if not isinstance(source, str) or not source:
        return [f"{where} has source {source!r}; a source must be a non-empty string (an output key)."]
    if valid_sources is not None and source not in valid_sources:
        known = ", ".join(sorted(valid_sources)) or "none"
        return [f"{where} has source '{source}', which is not an output of the tool (outputs: {known})."]
    return []


def _check_handler(where: str, handler: object, arity: int) -> list[str]:
    if not callable(handler):
        return [f"{where} has a handler that is not callable ({handler!r})."]
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # builtins without a signature: nothing more to check
        return []
    try:
        signature.bind(*([None] * arity))
    except TypeError:
        expected = "(current, new)" if arity == 2 else "(value)"
        return [f"{where} has a handler '{describe_callable(handler)}' that cannot be called as handler{expected}."]
    return []
