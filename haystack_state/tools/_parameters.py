"""
Sorting a tool's parameters into the ones the model fills and the ones the tool runner injects.

A parameter is, in this order:

- **filled from state** when ``inputs_from_state`` maps a state key to it;
- **the State** when it is annotated ``State``, ``State | None``, ``Optional[State]`` or ``Annotated[State, ...]``
  (either State class, see :mod:`haystack_state.tools._annotations`);
- **the run's context** when it is annotated ``RunContext[T]`` or a bare ``RunContext`` (also inside ``Optional``
  or ``Annotated``): it receives the run's :class:`~haystack_state.runtime.RunContext`;
- **the streaming callback** when it is named ``streaming_callback`` (it must have a default: the callback is
  passed only when streaming is on);
- otherwise **visible**: it appears in the JSON schema the model sees. A parameter whose type cannot be described
  in a JSON schema (a callable, an arbitrary class) is hidden instead when it has a default (the default is used),
  and is a problem when it is required, since nobody could supply it.

Every problem found is collected (never raised one by one) so the caller can report them all at once.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from haystack_state.tools._annotations import (
    annotation_description,
    contains_callable,
    context_deps_type,
    is_state_annotation,
    resolve_annotations,
)
from haystack_state.tools._json_schema import (
    REQUIRED,
    SchemaField,
    SchemaStyle,
    build_parameters_schema,
    is_required_default,
    schema_failure,
)

__all__ = [
    "STREAMING_CALLBACK",
    "EMPTY",
    "ParameterLayout",
    "ToolParameter",
    "function_parameters",
    "layout_parameters",
]

#: The name of the parameter that receives the streaming callback.
STREAMING_CALLBACK = "streaming_callback"
#: The marker of "no annotation" and "no default" (``inspect.Parameter.empty``).
EMPTY: Final = inspect.Parameter.empty


@dataclass(frozen=True)
class ToolParameter:
    """
    One named parameter of a tool's function (or one input socket of a component).

    :param name: The parameter name.
    :param annotation: Its resolved type annotation, or :data:`EMPTY`.
    :param default: Its default value (a pydantic ``Field(...)`` included), or :data:`EMPTY` when it has none.
    :param description: What the schema says about it: for a function, the description written in
        ``Annotated[T, "text"]``; for a component's input, the ``run`` docstring's.
    :param positional_only: Whether it cannot be passed by name.
    :param unresolved: Why its (string) annotation could not be resolved, if it could not.
    """

    name: str
    annotation: Any = EMPTY
    default: Any = EMPTY
    description: str | None = None
    positional_only: bool = False
    unresolved: str | None = None

    @property
    def required(self) -> bool:
        """Whether the parameter has no default (``Field(...)`` without a default counts as none)."""
        return self.default is EMPTY or is_required_default(self.default)


@dataclass(frozen=True)
class ParameterLayout:
    """
    Where each parameter of a tool gets its value from.

    :param schema: The JSON schema of the visible parameters (what the model sees).
    :param visible: The names of the parameters the model fills, in signature order.
    :param state_params: The names of the parameters that receive the State object.
    :param context_params: The parameters that receive the run's ``RunContext``, each with the ``T`` of its
        ``RunContext[T]`` annotation (``Any`` for a bare ``RunContext``).
    :param hidden: Every parameter the model must not supply (all the named parameters that are not visible).
    :param streaming_callback: Whether the function takes a ``streaming_callback`` parameter.
    :param problems: The problems found, one sentence each, naming the tool and the parameter.
    """

    schema: dict[str, Any]
    visible: tuple[str, ...] = ()
    state_params: tuple[str, ...] = ()
    context_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    hidden: frozenset[str] = frozenset()
    streaming_callback: bool = False
    problems: tuple[str, ...] = ()


def function_parameters(function: Callable[..., Any]) -> list[ToolParameter]:
    """
    Read the named parameters of a function, with their descriptions.

    As in haystack-ai, a parameter's description is the text written in ``Annotated[T, "text"]``; the docstring
    describes the tool as a whole (its ``:param:`` lines are part of the tool's description, not copied into the
    parameters). ``*args`` and ``**kwargs`` are not named parameters and are left out.

    :param function: A function, method, or other callable with a signature.
    :returns: One :class:`ToolParameter` per named parameter, in signature order.
    :raises ValueError: If the callable has no inspectable signature.
    :raises TypeError: If the object is not callable.
    """
    signature = inspect.signature(function)
    annotations, unresolved = resolve_annotations(function)
    result: list[ToolParameter] = []
    for name, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = annotations.get(name, param.annotation)
        result.append(
            ToolParameter(
                name=name,
                annotation=annotation,
                default=param.default,
                description=annotation_description(annotation),
                positional_only=param.kind is param.POSITIONAL_ONLY,
                unresolved=unresolved.get(name),
            )
        )
    return result


def layout_parameters(
    parameters: Sequence[ToolParameter],
    *,
    tool_name: str,
    inputs_from_state: Mapping[Any, Any] | None = None,
    style: SchemaStyle = "function",
) -> ParameterLayout:
    """
    Decide, for each parameter, whether the model fills it or the tool runner injects it; build the model's schema.

    Usage example:

    .. code-block:: python

        from haystack_state.state import State

        def search(query: str, state: State, top_k: int = 5, user: str = "") -> list[str]: ...

        layout = layout_parameters(
            function_parameters(search), tool_name="search", inputs_from_state={"user_id": "user"}
        )
        assert layout.visible == ("query", "top_k")
        assert layout.hidden == {"state", "user"}

    :param parameters: The named parameters (see :func:`function_parameters`).
    :param tool_name: The tool's name, used in problem messages.
    :param inputs_from_state: The tool's ``{"state_key": "param_name"}`` mapping. Its shape is checked here
        against the parameters (unknown parameters, a parameter filled twice, a State parameter filled from state).
    :param style: How the schema describes the parameters: ``"function"`` or ``"component"`` (see
        :func:`~haystack_state.tools._json_schema.build_parameters_schema`).
    :returns: The layout. Its ``problems`` are empty when the tool is usable.
    """
    problems: list[str] = []
    by_name = {param.name: param for param in parameters}
    mapped = _mapped_parameters(inputs_from_state or {}, by_name, tool_name, problems)

    state_params: list[str] = []
    context_params: dict[str, Any] = {}
    candidates: list[ToolParameter] = []
    has_callback = False
    for param in parameters:
        where = f"Tool '{tool_name}': parameter '{param.name}'"
        expects = context_deps_type(param.annotation) if param.unresolved is None else None
        if param.name in mapped:
            if param.unresolved is None and param.annotation is not EMPTY and is_state_annotation(param.annotation):
                problems.append(f"{where} receives the State object, so inputs_from_state cannot fill it.")
            elif expects is not None:
                problems.append(f"{where} receives the run's RunContext, so inputs_from_state cannot fill it.")
        elif param.unresolved is None and is_state_annotation(param.annotation):
            state_params.append(param.name)
        elif expects is not None:
            context_params[param.name] = expects
        elif param.name == STREAMING_CALLBACK:
            has_callback = True
            if param.required:
                problems.append(
                    f"{where} must have a default (e.g. None): the callback is passed only when streaming is on."
                )
        elif param.positional_only:
            if param.required:
                problems.append(f"{where} is positional-only; tools are called with keyword arguments.")
        elif param.unresolved is not None:
            problems.append(f"{where} has an annotation that cannot be resolved ({param.unresolved}).")
        elif param.annotation is EMPTY:
            problems.append(
                f"{where} has no type annotation; annotate it so the model knows what to send, "
                "or fill it from state with inputs_from_state."
            )
        elif contains_callable(param.annotation):
            if param.required:
                problems.append(
                    f"{where} is a callable, which the model cannot send and nothing injects; "
                    "give it a default or fill it from state with inputs_from_state."
                )
        else:
            candidates.append(param)

    visible, schema = _visible_schema(candidates, tool_name, problems, style)
    return ParameterLayout(
        schema=schema,
        visible=tuple(param.name for param in visible),
        state_params=tuple(state_params),
        context_params=context_params,
        hidden=frozenset(set(by_name) - {param.name for param in visible}),
        streaming_callback=has_callback,
        problems=tuple(problems),
    )


def _mapped_parameters(
    inputs_from_state: Mapping[Any, Any], by_name: Mapping[str, ToolParameter], tool_name: str, problems: list[str]
) -> set[str]:
    """Check ``inputs_from_state`` against the parameters; return the names it fills."""
    mapped: set[str] = set()
    filled_by: dict[str, str] = {}
    for state_key, param_name in inputs_from_state.items():
        if not isinstance(state_key, str) or not isinstance(param_name, str):
            problems.append(
                f"Tool '{tool_name}': inputs_from_state entry {state_key!r}: {param_name!r} must map a state key "
                "(str) to a parameter name (str)."
            )
            continue
        if param_name not in by_name:
            known = ", ".join(by_name) or "none"
            problems.append(
                f"Tool '{tool_name}': inputs_from_state maps state key '{state_key}' to parameter '{param_name}', "
                f"which the tool does not have (parameters: {known})."
            )
            continue
        if param_name in filled_by:
            problems.append(
                f"Tool '{tool_name}': parameter '{param_name}' is filled from two state keys, "
                f"'{filled_by[param_name]}' and '{state_key}'."
            )
            continue
        filled_by[param_name] = state_key
        mapped.add(param_name)
    return mapped


def _visible_schema(
    candidates: list[ToolParameter], tool_name: str, problems: list[str], style: SchemaStyle
) -> tuple[list[ToolParameter], dict[str, Any]]:
    """
    Build the model's schema, sorting out the parameters whose type has no JSON schema.

    A required one is a problem; an optional one is left out of the schema (its default is used).
    """
    try:
        return candidates, build_parameters_schema(_fields(candidates), style=style)
    except Exception:  # some type has no JSON schema: find which, below
        pass
    visible: list[ToolParameter] = []
    for param in candidates:
        reason = schema_failure(param.annotation, _default(param), style)
        if reason is None:
            visible.append(param)
        elif param.required:
            problems.append(
                f"Tool '{tool_name}': parameter '{param.name}' has a type the model cannot be told about in a JSON "
                f"schema ({reason}); use a JSON-friendly type, give it a default, or fill it from state with "
                "inputs_from_state."
            )
    try:
        return visible, build_parameters_schema(_fields(visible), style=style)
    except Exception as error:  # the types only fail together (rare): report it rather than guess
        problems.append(f"Tool '{tool_name}': its parameters cannot be described in a JSON schema ({error}).")
        return visible, {"type": "object", "properties": {}}


def _default(param: ToolParameter) -> Any:
    return REQUIRED if param.default is EMPTY else param.default


def _fields(params: list[ToolParameter]) -> dict[str, SchemaField]:
    return {
        param.name: SchemaField(annotation=param.annotation, default=_default(param), description=param.description)
        for param in params
    }
