"""
``tool_spec``: what a tool runner needs to know about a tool, for any haystack ``Tool``.

Works for the tools of this package (:func:`~haystack_state.tools.tool`, :class:`~haystack_state.tools.ComponentTool`)
and for plain haystack-ai tools: its ``@tool``/``create_tool_from_function``, ``Tool(...)`` built by hand, its
``ComponentTool``, and tools inside a ``Toolset``. Everything is derived from the Tool's fields (``parameters``,
``inputs_from_state``, ``outputs_to_state``, ``outputs_to_string``, ``function``/``async_function``) and from the
signature of its function (or, for a component tool, the component's input sockets).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from haystack.tools.component_tool import ComponentTool as HaystackComponentTool
from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset
from haystack.tools.utils import flatten_tools_or_toolsets

from haystack_state.errors import ToolDefinitionError
from haystack_state.tools._annotations import context_deps_type, is_state_annotation
from haystack_state.tools._parameters import STREAMING_CALLBACK, ToolParameter, function_parameters
from haystack_state.tools.component_tool import component_parameters

__all__ = ["ToolSpec", "ToolsArg", "tool_spec", "tool_specs"]

#: The tools an ``Agent``, a ``ToolInvoker`` or :func:`tool_specs` is given: Tools and Toolsets mixed in a list, or
#: one Toolset.
ToolsArg: TypeAlias = list[Tool | Toolset] | Toolset


@dataclass(frozen=True)
class ToolSpec:
    """
    What a tool runner needs to call a tool: the model-facing schema and where each other argument comes from.

    To run a call: validate the model's arguments against ``parameters`` (and reject any in ``hidden_params``);
    for each ``state_key -> param`` of ``inputs_from_state``, pass the state value as ``param``; pass the live State
    as every parameter of ``state_params`` and the run's ``RunContext`` as every parameter of ``context_params``;
    pass the streaming callback as ``streaming_callback`` when ``streaming_callback`` is true and there is one; call
    ``tool.invoke(**args)`` (or ``await tool.invoke_async(**args)``, the only way when ``supports_sync`` is false);
    merge the result into the state following ``outputs_to_state``; render it with ``outputs_to_string``. Compute the
    specs once per tool set.

    :param name: The tool's name.
    :param description: The tool's description.
    :param parameters: The JSON schema of the arguments the model supplies (the tool's ``parameters`` without any
        hidden parameter; for this package's tools and haystack-ai's, exactly the tool's ``parameters``).
    :param inputs_from_state: ``{"state_key": "param_name"}``: parameters filled from state keys.
    :param outputs_to_state: ``{"state_key": {"source": "output_key", "handler": fn}}`` (both keys optional; no
        ``source`` means the whole result).
    :param state_params: The parameters that receive the State object, in signature order.
    :param hidden_params: Every parameter the model must not supply: the ones filled from state, the State and
        RunContext ones, ``streaming_callback``, and any other named parameter missing from the model's schema.
    :param parameter_names: The named parameters the tool's callable accepts (the input sockets of a component).
    :param required_params: Those of them without a default.
    :param accepts_any_keyword: Whether the callable also takes ``**kwargs`` (or has no inspectable signature).
    :param is_async: Whether the tool has a native async callable (``tool.async_function``).
    :param supports_sync: Whether the tool can be called synchronously (``tool.function``; ``tool.invoke``).
    :param streaming_callback: Whether the callable takes a ``streaming_callback`` parameter.
    :param outputs_to_string: How the result becomes the tool message (haystack-ai's format), or ``None``.
    :param tool: The tool itself.
    :param timeout: The tool's own timeout in seconds (``@tool(timeout=...)``, or a ``timeout`` attribute of any
        ``Tool``), or None.
    :param context_params: The parameters that receive the run's ``RunContext``, each with the ``T`` of its
        ``RunContext[T]`` annotation (``Any`` for a bare ``RunContext``), in signature order (see
        :func:`~haystack_state.runtime.check_tool_deps`).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    inputs_from_state: dict[str, str]
    outputs_to_state: dict[str, dict[str, Any]]
    state_params: tuple[str, ...]
    hidden_params: frozenset[str]
    parameter_names: frozenset[str]
    required_params: frozenset[str]
    accepts_any_keyword: bool
    is_async: bool
    supports_sync: bool
    streaming_callback: bool
    outputs_to_string: dict[str, Any] | None
    tool: Tool
    timeout: float | None = None
    context_params: Mapping[str, Any] = field(default_factory=dict)


def tool_spec(tool: Tool) -> ToolSpec:
    """
    Describe a tool for a tool runner.

    Usage example:

    .. code-block:: python

        from haystack.components.agents.state import State  # haystack-ai's tools know only its own State
        from haystack.tools import tool as haystack_tool

        @haystack_tool(inputs_from_state={"user_id": "user"})
        def greet(name: str, user: str, state: State) -> str:
            '''Greet someone.'''
            return f"{user} greets {name}"

        spec = tool_spec(greet)
        assert spec.inputs_from_state == {"user_id": "user"}
        assert spec.state_params == ("state",)
        assert spec.hidden_params == {"user", "state"}

    :param tool: A haystack ``Tool`` of any kind (including ``ComponentTool`` and this package's tools).
    :returns: Its :class:`ToolSpec`.
    :raises TypeError: If ``tool`` is not a haystack ``Tool``.
    """
    if not isinstance(tool, Tool):
        raise TypeError(f"tool_spec needs a haystack Tool, got {type(tool).__name__}.")
    params, any_keyword = _callable_parameters(tool)
    names = [param.name for param in params]
    inputs_from_state = dict(tool.inputs_from_state or {})
    state_params = tuple(
        param.name
        for param in params
        if param.unresolved is None and is_state_annotation(param.annotation) and param.name not in inputs_from_state
    )
    context_params = {
        param.name: expects
        for param in params
        if param.unresolved is None
        and param.name not in inputs_from_state.values()
        and (expects := context_deps_type(param.annotation)) is not None
    }
    schema_properties = set(tool.parameters.get("properties", {}))
    hidden = {name for name in names if name not in schema_properties}
    hidden |= set(inputs_from_state.values()) | set(state_params) | set(context_params)
    if STREAMING_CALLBACK in names:
        hidden.add(STREAMING_CALLBACK)
    return ToolSpec(
        name=tool.name,
        description=tool.description,
        parameters=_without(tool.parameters, hidden),
        inputs_from_state=inputs_from_state,
        outputs_to_state={key: dict(config) for key, config in (tool.outputs_to_state or {}).items()},
        state_params=state_params,
        hidden_params=frozenset(hidden),
        parameter_names=frozenset(names),
        required_params=frozenset(param.name for param in params if param.required),
        accepts_any_keyword=any_keyword,
        is_async=tool.async_function is not None,
        supports_sync=tool.function is not None,
        streaming_callback=STREAMING_CALLBACK in names,
        outputs_to_string=dict(tool.outputs_to_string) if tool.outputs_to_string is not None else None,
        tool=tool,
        timeout=_timeout(tool),
        context_params=context_params,
    )


def tool_specs(tools: ToolsArg | None) -> dict[str, ToolSpec]:
    """
    Describe every tool of a tool list (tools and Toolsets mixed) or of a Toolset.

    Usage example:

    .. code-block:: python

        from haystack.tools import Toolset

        specs = tool_specs([Toolset([search_tool]), other_tool])
        assert set(specs) == {search_tool.name, other_tool.name}

    :param tools: What an Agent or ToolInvoker takes as ``tools``.
    :returns: The spec of each tool, by tool name, in order.
    :raises ToolDefinitionError: If two tools have the same name.
    :raises TypeError: If an item is neither a Tool nor a Toolset.
    """
    specs: dict[str, ToolSpec] = {}
    for item in flatten_tools_or_toolsets(tools):
        if item.name in specs:
            raise ToolDefinitionError(
                item.name,
                [
                    f"Tool '{item.name}': Duplicate tool names found (two tools have this name); tool names must "
                    "be unique."
                ],
            )
        specs[item.name] = tool_spec(item)
    return specs


def _callable_parameters(tool: Tool) -> tuple[list[ToolParameter], bool]:
    """The named parameters of what the tool calls, and whether it also takes ``**kwargs``."""
    if isinstance(tool, HaystackComponentTool):
        component = vars(tool).get("_component")  # haystack's ComponentTool has no public accessor
        return component_parameters(component), False
    target = tool.function if tool.function is not None else tool.async_function
    if target is None:
        return [], False
    try:
        signature = inspect.signature(target)
        params = function_parameters(target)
    except (TypeError, ValueError):  # no signature (some builtins): nothing is known
        return [], True
    any_keyword = any(param.kind is param.VAR_KEYWORD for param in signature.parameters.values())
    return params, any_keyword


def _without(schema: dict[str, Any], hidden: set[str]) -> dict[str, Any]:
    """A copy of an object schema without the given properties."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not hidden & properties.keys():
        return dict(schema)
    result = dict(schema)
    result["properties"] = {name: sub for name, sub in properties.items() if name not in hidden}
    if isinstance(schema.get("required"), list):
        result["required"] = [name for name in schema["required"] if name not in hidden]
    return result


def _timeout(tool: Tool) -> float | None:
    """A tool's own timeout: its ``timeout`` attribute, if that is a positive number of seconds."""
    timeout = getattr(tool, "timeout", None)
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        return float(timeout)
    return None
