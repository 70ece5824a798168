"""
The Agent's tools: which ones a run offers the model and how they run.

Tools are given as haystack ``Tool``s, ``ComponentTool``s and ``Toolset``s. A ``Toolset`` may load its tools only
when it is warmed up (haystack's pattern for MCP), so the tools an agent has are known for sure only after
``warm_up``: names in ``exit_conditions`` and ``interrupt_before`` that no tool has yet are checked then. A run may
also offer a subset of the tools, by name, or tools of its own (``run(tools=...)``). Toolsets are spawned per run
(``Toolset.spawn()``), so that a toolset with run-scoped state (such as haystack's ``SearchableToolset``) does not
share it between concurrent runs, and re-read at every step, so that the tools such a toolset discovers during a
run are offered at the next step.

Specs (:class:`~haystack_state.tools.spec.ToolSpec`) are computed once per tool object and cached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset
from haystack.tools.utils import flatten_tools_or_toolsets

from haystack_state._schema import FieldSpec
from haystack_state.errors import ToolDefinitionError
from haystack_state.tools.spec import ToolsArg, ToolSpec, tool_spec

__all__ = ["ToolsOfRun", "Toolbox", "check_names", "model_tool", "unknown_names"]


def model_tool(spec: ToolSpec) -> Tool:
    """
    A tool as the model sees it: the tool itself, or, for a hand-built ``Tool`` whose schema lists a parameter filled
    from state (or the State itself), a plain ``Tool`` with the reduced schema.

    :param spec: The tool's spec.
    :returns: The haystack ``Tool`` to give the chat generator.
    """
    tool = spec.tool
    if spec.parameters == tool.parameters:
        return tool
    return Tool(
        name=spec.name,
        description=spec.description,
        parameters=spec.parameters,
        function=tool.function,
        async_function=tool.async_function,
    )


@dataclasses.dataclass(frozen=True)
class ToolsOfRun:
    """
    The tools of one run at one step.

    :param specs: The specs by tool name.
    :param model_tools: The tools as given to the model, in order.
    :param tools: The flat list of tool objects (what hooks see as ``state.data["tools"]``).
    """

    specs: dict[str, ToolSpec]
    model_tools: list[Tool]
    tools: list[Tool]


def _items(tools: ToolsArg | None) -> list[Tool | Toolset]:
    if tools is None:
        return []
    return [tools] if isinstance(tools, Toolset) else list(tools)


class Toolbox:
    """
    The tools of an Agent.

    :param tools: The agent's tools.
    :param schema: The agent's state schema, to check the tools' state mappings against.
    :param extra: Tools the agent adds to the given ones (a context policy's, such as ``read_tool_result``).
    """

    def __init__(self, tools: ToolsArg | None, schema: Mapping[str, FieldSpec], *, extra: Sequence[Tool] = ()) -> None:
        self.items = _items(tools) + list(extra)
        self.schema = schema
        self._cache: weakref.WeakKeyDictionary[Tool, tuple[ToolSpec, Tool]] = weakref.WeakKeyDictionary()
        self.has_toolsets = any(isinstance(item, Toolset) for item in self.items)

    # --- specs ---------------------------------------------------------------------------------------------------

    def check_mappings(self, specs: Iterable[ToolSpec]) -> None:
        """
        Check that the tools' ``inputs_from_state`` and ``outputs_to_state`` name declared state keys.

        :raises ToolDefinitionError: Naming the tool and the undeclared key(s).
        """
        problems = [
            (
                spec.name,
                f"Tool '{spec.name}': {field} names state key '{key}', which state_schema does not declare "
                f"(keys: {', '.join(self.schema)}).",
            )
            for spec in specs
            for field, keys in (
                ("inputs_from_state", spec.inputs_from_state),
                ("outputs_to_state", spec.outputs_to_state),
            )
            for key in keys
            if key not in self.schema
        ]
        if problems:
            raise ToolDefinitionError(problems[0][0], [problem for _, problem in problems])

    def resolve(self, items: Sequence[Tool | Toolset]) -> ToolsOfRun:
        """
        The specs of these tools and toolsets, as they are now. A tool's spec and the tool as the model sees it are
        computed once per tool object; its state mappings are checked then.

        :raises ToolDefinitionError: For two tools with one name, or mappings to undeclared keys (all of them).
        """
        flat = flatten_tools_or_toolsets(list(items))
        entries: dict[str, tuple[ToolSpec, Tool] | None] = {}
        for tool in flat:
            if tool.name in entries:
                raise ToolDefinitionError(
                    tool.name,
                    [
                        f"Tool '{tool.name}': Duplicate tool names found (two tools have this name); tool names "
                        "must be unique."
                    ],
                )
            try:
                entries[tool.name] = self._cache[tool]
            except (KeyError, TypeError):
                entries[tool.name] = None
        new = {tool.name: tool_spec(tool) for tool in flat if entries[tool.name] is None}
        if new:
            self.check_mappings(new.values())
            for tool in flat:
                if tool.name in new:
                    spec = new[tool.name]
                    entries[tool.name] = entry = (spec, model_tool(spec))
                    with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced is not cached
                        self._cache[tool] = entry
        specs = {name: entry[0] for name, entry in entries.items() if entry is not None}
        return ToolsOfRun(specs, [entry[1] for entry in entries.values() if entry is not None], flat)

    def known(self) -> ToolsOfRun:
        """The agent's tools as they are now (a lazy toolset offers its tools only once warmed up)."""
        return self.resolve(self.items)

    # --- per run -------------------------------------------------------------------------------------------------

    def for_run(self, selection: ToolsArg | list[str] | None) -> list[Tool | Toolset]:
        """
        The tools a run offers: the agent's (toolsets spawned for the run), a subset of them by name, or tools given
        to the run (which the caller has warmed up).

        :param selection: ``run(tools=...)``: None, a list of tool names, or tools and toolsets.
        :returns: The run's tools and toolsets.
        :raises ValueError: For a name that is not one of the agent's tools.
        :raises TypeError: For anything else.
        """
        if selection is None:
            return [item.spawn() if isinstance(item, Toolset) else item for item in self.items]
        if isinstance(selection, Toolset):
            return [selection.spawn()]
        if not isinstance(selection, list):
            raise TypeError(
                "run(tools=...): tools must be a list of Tool and/or Toolset objects, a Toolset, or a list of tool "
                f"names (strings). Got {type(selection).__name__}."
            )
        if selection and all(isinstance(entry, str) for entry in selection):
            return self._by_name(selection)  # type: ignore[arg-type]
        if not all(isinstance(entry, Tool | Toolset) for entry in selection):
            raise TypeError(
                "run(tools=...): tools must be a list of Tool and/or Toolset objects, a Toolset, or a list of tool "
                f"names (strings). Got a mix: {[type(entry).__name__ for entry in selection]}."
            )
        return [item.spawn() if isinstance(item, Toolset) else item for item in selection if not isinstance(item, str)]

    def _by_name(self, names: list[str]) -> list[Tool | Toolset]:
        requested = set(names)
        offered: list[tuple[Tool | Toolset, list[Tool]]] = [
            (item, item.get_selectable_tools() if isinstance(item, Toolset) else [item]) for item in self.items
        ]
        valid = [tool.name for _, tools in offered for tool in tools]
        if not valid:
            raise ValueError(
                f"run(tools=...) names {sorted(requested)}: No tools were configured for the Agent at initialization."
            )
        unknown = sorted(requested - set(valid))
        if unknown:
            raise ValueError(
                f"run(tools=...): The following tool names are not valid: {unknown}. Valid tool names are: "
                f"{', '.join(valid)}."
            )
        selected: list[Tool | Toolset] = []
        for item, tools in offered:
            matched = requested & {tool.name for tool in tools}
            if not matched:
                continue
            spawned = item.spawn(selected_tool_names=matched) if isinstance(item, Toolset) else item
            if isinstance(item, Toolset) and spawned is not item:
                selected.append(spawned)  # a toolset with run-scoped state applies the selection itself
            else:
                selected.extend(tool for tool in tools if tool.name in matched)
        return selected


def unknown_names(names: Iterable[str], specs: Mapping[str, Any], allowed: Sequence[str] = ()) -> list[str]:
    """
    The names that name none of the agent's tools (nor an ``allowed`` value), in the order given.

    :param names: The names given.
    :param specs: The agent's tools by name.
    :param allowed: Other accepted values.
    :returns: The unknown names.
    """
    return [name for name in names if name not in specs and name not in allowed]


def check_names(what: str, names: Iterable[str], specs: Mapping[str, Any], allowed: Sequence[str] = ()) -> None:
    """
    Check that tool names given to the Agent (``exit_conditions``, ``interrupt_before``) name its tools.

    :param what: The argument, for the message.
    :param names: The names given.
    :param specs: The agent's tools by name.
    :param allowed: Other accepted values (``"text"`` for ``exit_conditions``).
    :raises ValueError: Naming the unknown names and the tools.
    """
    unknown = unknown_names(names, specs, allowed)
    if unknown:
        choices = ", ".join([*allowed, *specs]) or "none"
        raise ValueError(f"{what} {unknown} name no tool of this agent. Use one of: {choices}.")
