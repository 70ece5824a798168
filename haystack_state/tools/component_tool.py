"""
``ComponentTool``: a Haystack component as a tool, with its ``state`` socket (and any input socket annotated
``RunContext[T]``) injected and hidden from the model.

It subclasses haystack-ai's ``ComponentTool``, so it keeps its invocation (``run``/``run_async``, with the model's
JSON converted to the socket types), its warm-up and close hooks and its ``to_dict``/``from_dict``; and haystack's
own ``Agent`` still injects its State into it. What changes:

- the schema hides every input socket annotated with either State class (``State``, ``State | None``, ...), not only
  haystack-ai's, as well as the sockets filled from state and the sockets annotated ``RunContext[T]`` (they receive
  the run's context; give such a socket a default, ``ctx: RunContext[T] | None = None``, if the component is also
  used in a Pipeline, where nothing fills it);
- the definition is checked up front and every problem is reported at once in a ``ToolDefinitionError``.

The schema and the description are haystack-ai's: each input is described by the ``run`` docstring's ``:param:``
line (for a ``SuperComponent``, by the lines of the pipeline components its inputs are mapped to), or as
``"Input 'name' for the component."``; dataclass inputs become ``$defs`` whose fields are described too (see
:mod:`haystack_state.tools._component_types`); the tool's description defaults to the component's docstring.
"""

from __future__ import annotations

from typing import Any

from haystack.core.component import Component, InputSocket, OutputSocket
from haystack.core.pipeline.base import PipelineBase
from haystack.tools.component_tool import ComponentTool as HaystackComponentTool

from haystack_state.errors import ToolDefinitionError
from haystack_state.tools._annotations import context_deps_type, is_state_annotation
from haystack_state.tools._coercion import binary_strings_to_bytes
from haystack_state.tools._docstrings import parse_docstring
from haystack_state.tools._parameters import EMPTY, ToolParameter, layout_parameters
from haystack_state.tools._validation import check_outputs_to_state, check_outputs_to_string, check_tool_name

__all__ = [
    "ComponentTool",
    "component_param_descriptions",
    "component_parameters",
    "component_tool_name",
    "input_sockets",
    "output_sockets",
]


def input_sockets(component: object) -> dict[str, InputSocket]:
    """
    Return a component's input sockets.

    :param component: A Haystack component instance.
    :returns: The sockets by name, in declaration order (empty for an object that is not a component).
    """
    holder = getattr(component, "__haystack_input__", None)
    sockets: dict[str, Any] = vars(holder) if holder is not None else {}
    return {name: socket for name, socket in sockets.items() if isinstance(socket, InputSocket)}


def output_sockets(component: object) -> dict[str, OutputSocket]:
    """
    Return a component's output sockets.

    :param component: A Haystack component instance.
    :returns: The sockets by name (empty for an object that is not a component).
    """
    holder = getattr(component, "__haystack_output__", None)
    sockets: dict[str, Any] = vars(holder) if holder is not None else {}
    return {name: socket for name, socket in sockets.items() if isinstance(socket, OutputSocket)}


def component_param_descriptions(component: object) -> dict[str, str]:
    """
    Describe a component's inputs from docstrings, as haystack-ai's ``ComponentTool`` does.

    The ``:param:`` lines of the component's ``run`` docstring (Google, reST or NumPy style) describe its inputs. For a
    ``SuperComponent`` (or a ``@super_component`` class), an input mapped to pipeline components is described by
    their ``run`` docstrings instead: ``"Provided to the 'retriever' component as: 'The query.'"``, joined with
    ``", and "`` when it feeds several.

    :param component: A Haystack component instance.
    :returns: The description of each documented input, by name.
    """
    run = getattr(component, "run", None)
    descriptions = dict(parse_docstring(run).params) if run is not None else {}
    pipeline = getattr(component, "pipeline", None)
    input_mapping = getattr(component, "input_mapping", None)
    # a SuperComponent: both classes (SuperComponent, and the base that @super_component uses) wrap a pipeline so
    if not isinstance(pipeline, PipelineBase) or not isinstance(input_mapping, dict):
        return descriptions
    for name, paths in input_mapping.items():
        found = []
        for path in paths:
            component_name, _, socket_name = str(path).partition(".")
            try:
                inner = pipeline.get_component(component_name)
            except Exception:  # a mapping the SuperComponent itself would reject: no description from it
                continue
            text = parse_docstring(inner.run).params.get(socket_name) if socket_name else None
            if text:
                found.append(f"Provided to the '{component_name}' component as: '{text}'")
        if found:
            descriptions[name] = ", and ".join(found) + "."
    return descriptions


def component_parameters(component: object) -> list[ToolParameter]:
    """
    Describe a component's input sockets as tool parameters.

    :param component: A Haystack component instance.
    :returns: One :class:`ToolParameter` per input socket, described by :func:`component_param_descriptions` or,
        for an undocumented input, as ``"Input 'name' for the component."``; the sockets a component names in its
        ``hidden_from_tools`` attribute (an Agent's ``thread_id`` and ``checkpoint_id``) are left out.
    """
    docs = component_param_descriptions(component)
    hidden = frozenset(getattr(component, "hidden_from_tools", ()))
    return [
        ToolParameter(
            name=name,
            annotation=socket.type,
            default=EMPTY if socket.is_mandatory else socket.default_value,
            description=docs.get(name, f"Input '{name}' for the component."),
        )
        for name, socket in input_sockets(component).items()
        if name not in hidden
    ]


def component_tool_name(component: object) -> str:
    """
    Derive a tool name from a component's class name, the way haystack-ai does (``WebSearch`` -> ``web_search``).

    :param component: A Haystack component instance.
    :returns: The snake_case name.
    """
    class_name = type(component).__name__
    return "".join(
        "_" + char.lower() if char.isupper() and i > 0 and not class_name[i - 1].isupper() else char.lower()
        for i, char in enumerate(class_name)
    ).lstrip("_")


class ComponentTool(HaystackComponentTool):
    """
    Wrap a Haystack component as a tool. Input sockets become the parameters the model fills, described by the
    ``run`` docstring (``:param x:`` lines), in the same schema haystack-ai's ``ComponentTool`` makes; a ``state``
    socket annotated with either State class is injected and hidden from the model, as are the sockets named in
    ``inputs_from_state``.

    Usage example:

    .. code-block:: python

        from haystack import component
        from haystack_state.state import State
        from haystack_state.tools import ComponentTool

        @component
        class Retriever:
            '''Find documents about a topic.'''

            @component.output_types(documents=list[str])
            def run(self, query: str, state: State, top_k: int = 3) -> dict[str, list[str]]:
                '''
                :param query: What to search for.
                :param top_k: How many documents to return.
                '''
                return {"documents": [query] * top_k}

        search = ComponentTool(Retriever(), outputs_to_state={"documents": {"source": "documents"}})
        assert set(search.parameters["properties"]) == {"query", "top_k"}
        # from_dict goes through haystack's deserialization allowlist: the component's module (and
        # haystack_state) must be on it, e.g. HAYSTACK_DESERIALIZATION_ALLOWLIST="haystack_state,my_module"
        restored = ComponentTool.from_dict(search.to_dict())
    """

    def __init__(
        self,
        component: Component,
        name: str | None = None,
        description: str | None = None,
        inputs_from_state: dict[str, str] | None = None,
        outputs_to_state: dict[str, dict[str, Any]] | None = None,
        outputs_to_string: dict[str, Any] | None = None,
        *,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """
        Create the tool.

        :param component: The component instance (not one already added to a pipeline).
        :param name: The tool's name; the component's class name in snake_case by default.
        :param description: The tool's description; the component's docstring as written (or the tool's name) by
            default, as in haystack-ai.
        :param inputs_from_state: ``{"state_key": "socket_name"}``: input sockets filled from state keys.
        :param outputs_to_state: ``{"state_key": {"source": "output_socket", "handler": fn}}``, both keys optional.
        :param outputs_to_string: How the result becomes the tool message, in haystack-ai's format.
        :param parameters: A JSON schema to show the model instead of the derived one (as in haystack-ai).
        :raises TypeError: If ``component`` is not a Haystack component.
        :raises ToolDefinitionError: Listing every problem of the definition at once.
        """
        if not isinstance(component, Component):
            raise TypeError(f"ComponentTool needs a Haystack component instance, got {type(component).__name__}.")
        tool_name = name or component_tool_name(component)
        problems = check_tool_name(tool_name)
        if getattr(component, "__haystack_added_to_pipeline__", None):
            problems.append(
                f"Tool '{tool_name}': the component has been added to a pipeline; wrap a fresh instance instead."
            )
        layout = layout_parameters(
            component_parameters(component),
            tool_name=tool_name,
            inputs_from_state=inputs_from_state,
            style="component",
        )
        problems.extend(layout.problems)
        outputs = set(output_sockets(component))
        problems.extend(check_outputs_to_state(tool_name, outputs_to_state, valid_sources=outputs))
        problems.extend(check_outputs_to_string(tool_name, outputs_to_string, valid_sources=outputs))
        if problems:
            raise ToolDefinitionError(tool_name, problems)

        self._derived_schema = layout.schema
        try:
            super().__init__(
                component=component,
                name=tool_name,
                description=description or component.__doc__ or tool_name,
                parameters=parameters,
                outputs_to_string=outputs_to_string,
                inputs_from_state=inputs_from_state,
                outputs_to_state=outputs_to_state,
            )
        except (TypeError, ValueError) as error:  # haystack's own checks, should ours have missed one
            raise ToolDefinitionError(tool_name, [f"Tool '{tool_name}': {error}"]) from error
        self._call_variadic_sockets_with_lists()

    @property
    def component(self) -> Component:
        """The wrapped component."""
        return self._component

    def _create_tool_parameters_schema(self, component: Component, inputs_from_state: dict[str, Any]) -> dict[str, Any]:
        # Called by haystack's __init__ when no explicit schema is given: use the one derived (and checked) above.
        return self._derived_schema

    def _convert_param(self, param_value: object, param_type: type) -> Any:
        # The injected State and RunContext are passed as they are; haystack converts every other argument to its
        # socket type, once the strings the model sent for bytes fields (ByteStream.data) are bytes.
        if is_state_annotation(param_type) or context_deps_type(param_type) is not None:
            return param_value
        return super()._convert_param(binary_strings_to_bytes(param_value, param_type), param_type)

    def _call_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Convert the arguments to their socket types; a variadic socket receives its value as its only input."""
        sockets = input_sockets(self._component)
        converted: dict[str, Any] = {}
        for name, value in arguments.items():
            socket = sockets[name]
            socket_type: Any = socket.type
            item = self._convert_param(value, socket_type)
            converted[name] = [item] if socket.is_variadic else item
        return converted

    def _call_variadic_sockets_with_lists(self) -> None:
        """
        Call the component so that a variadic socket (``Variadic[list[Document]]``, a joiner's input) gets a list of
        the one value the model sent. The schema shows such a socket with its item type (haystack-ai's schema); its
        own invoker passes the value unwrapped, and the component then fails on it.
        """
        component = self._component
        if not any(socket.is_variadic for socket in input_sockets(component).values()):
            return

        def invoke(**kwargs: Any) -> dict[str, Any]:
            return dict(component.run(**self._call_arguments(kwargs)))

        async def invoke_async(**kwargs: Any) -> dict[str, Any]:
            return dict(await component.run_async(**self._call_arguments(kwargs)))  # type: ignore[attr-defined]

        self.function = invoke
        if self.async_function is not None:
            self.async_function = invoke_async
