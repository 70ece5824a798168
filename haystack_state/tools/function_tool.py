"""
``@tool``: turn a function (sync or ``async def``) into a haystack-ai ``Tool``, state mappings hidden from the model.

The result is a :class:`FunctionTool`, a subclass of ``haystack.tools.Tool``, so every haystack chat generator,
``ToolInvoker`` and ``Agent`` accepts it, and it serializes with haystack's ``to_dict``/``from_dict``.

Async functions: haystack-ai 3.4's ``Tool`` has an ``async_function`` field for coroutine functions (its
``function`` field rejects them). An ``async def`` tool therefore has ``function=None`` and
``async_function=<the function>``: ``invoke_async`` awaits it, while ``invoke`` raises haystack's
``ToolInvocationError`` (it cannot be run synchronously), exactly like haystack-ai's own ``@tool``.

Serialization is haystack's: ``to_dict`` stores the function by import path (so it must be a module-level
function), and ``from_dict`` goes through haystack's deserialization allowlist, on which ``haystack_state`` and
the function's module must be (``HAYSTACK_DESERIALIZATION_ALLOWLIST`` or ``allow_deserialization_module``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack, overload

from haystack.tools.errors import ToolInvocationError
from haystack.tools.tool import Tool
from pydantic import ValidationError

from haystack_state.errors import ToolDefinitionError
from haystack_state.tools._coercion import coerce_arguments, field_defaults
from haystack_state.tools._parameters import EMPTY, function_parameters, layout_parameters
from haystack_state.tools._validation import check_outputs_to_state, check_outputs_to_string, check_tool_name

__all__ = ["FunctionTool", "ToolOptions", "tool"]


class ToolOptions(TypedDict, total=False):
    """The keyword options of :func:`tool` and :meth:`FunctionTool.from_function`; each is described at :func:`tool`."""

    name: str | None
    description: str | None
    inputs_from_state: dict[str, str] | None
    outputs_to_state: dict[str, dict[str, Any]] | None
    outputs_to_string: dict[str, Any] | None
    timeout: float | None


def check_options(options: Mapping[str, object], caller: str) -> None:
    """
    Refuse an option :class:`ToolOptions` does not name, as a misspelt keyword argument would be.

    :param options: The keyword options given.
    :param caller: The function they were given to, for the error.
    :raises TypeError: Naming the first unknown option.
    """
    for key in options:
        if key not in ToolOptions.__annotations__:
            raise TypeError(f"{caller}() got an unexpected keyword argument '{key}'")


@dataclass
class FunctionTool(Tool):
    """
    A haystack ``Tool`` made from a function by :func:`tool`.

    It behaves like any haystack ``Tool`` (same fields, ``to_dict``/``from_dict``), and in addition converts the
    model's JSON arguments to the parameter types before calling the function (a dict becomes the dataclass or
    pydantic model the parameter declares, a string the Enum member), in ``invoke`` and ``invoke_async``.
    Arguments the model does not send (State, values filled from state, the streaming callback) are passed as
    they are.

    Build one with :func:`tool` (which validates the definition and derives the schema); constructing it directly
    takes the same arguments as ``haystack.tools.Tool``, and ``timeout``.

    :param timeout: The most seconds a call may take before the tool runner answers it with a ``ToolTimeoutError``
        (see ``ToolInvoker``); None for the runner's default.
    """

    timeout: float | None = None

    def __post_init__(self) -> None:
        """Validate like ``Tool``, then note the types of the model-visible parameters."""
        super().__post_init__()
        if (problem := _timeout_problem(self.name, self.timeout)) is not None:
            raise ToolDefinitionError(self.name, [problem])
        target = self.function if self.function is not None else self.async_function
        visible = set(self.parameters.get("properties", {}))
        try:
            params = function_parameters(target) if target is not None else []
        except (TypeError, ValueError):  # no signature: arguments are passed unconverted
            params = []
        self._argument_types: dict[str, Any] = {
            param.name: param.annotation
            for param in params
            if param.name in visible and param.annotation is not EMPTY and param.unresolved is None
        }
        self._field_defaults = field_defaults({param.name: param.default for param in params})

    @classmethod
    def from_function(cls, function: Callable[..., Any], **options: Unpack[ToolOptions]) -> FunctionTool:
        """
        Create a tool from a function; see :func:`tool` for what each argument means.

        :param function: The function (sync or ``async def``).
        :param options: ``name``, ``description``, ``inputs_from_state``, ``outputs_to_state``, ``outputs_to_string``
            and ``timeout``, as :func:`tool` takes them (see :class:`ToolOptions`).
        :returns: The tool.
        :raises ToolDefinitionError: Listing every problem of the definition at once.
        :raises TypeError: If ``function`` is not callable, or an option is unknown.
        """
        check_options(options, "FunctionTool.from_function")
        name, description = options.get("name"), options.get("description")
        inputs_from_state, timeout = options.get("inputs_from_state"), options.get("timeout")
        outputs_to_state, outputs_to_string = options.get("outputs_to_state"), options.get("outputs_to_string")
        if not callable(function):
            raise TypeError(f"@tool needs a function, got {type(function).__name__}.")
        tool_name = name if name is not None else str(getattr(function, "__name__", type(function).__name__))
        problems = check_tool_name(tool_name)
        try:
            params = function_parameters(function)
        except (TypeError, ValueError) as error:
            raise ToolDefinitionError(tool_name, [*problems, f"Tool '{tool_name}': no signature ({error})."]) from error
        if inputs_from_state is not None and not isinstance(inputs_from_state, Mapping):
            problems.append(f"Tool '{tool_name}': inputs_from_state must be a dict of state key -> parameter name.")
            inputs_from_state = None
        layout = layout_parameters(params, tool_name=tool_name, inputs_from_state=inputs_from_state)
        problems.extend(layout.problems)
        problems.extend(check_outputs_to_state(tool_name, outputs_to_state))
        problems.extend(check_outputs_to_string(tool_name, outputs_to_string))
        if (problem := _timeout_problem(tool_name, timeout)) is not None:
            problems.append(problem)
        if problems:
            raise ToolDefinitionError(tool_name, problems)

        is_async = inspect.iscoroutinefunction(function)
        try:
            return cls(
                name=tool_name,
                description=description if description is not None else (function.__doc__ or ""),
                parameters=layout.schema,
                function=None if is_async else function,
                async_function=function if is_async else None,
                inputs_from_state=dict(inputs_from_state) if inputs_from_state else None,
                outputs_to_state={key: dict(value) for key, value in outputs_to_state.items()}
                if outputs_to_state
                else None,
                outputs_to_string=dict(outputs_to_string) if outputs_to_string else None,
                timeout=float(timeout) if timeout is not None else None,
            )
        except (TypeError, ValueError) as error:  # haystack's own checks, should ours have missed one
            raise ToolDefinitionError(tool_name, [f"Tool '{tool_name}': {error}"]) from error

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the tool as haystack's ``Tool.to_dict`` does; ``timeout`` only when one is set.

        :returns: The serialized tool.
        """
        data = super().to_dict()
        if self.timeout is None:
            data["data"].pop("timeout", None)
        return data

    @property
    def argument_types(self) -> dict[str, Any]:
        """The annotation of each model-visible parameter, used to convert the model's JSON arguments."""
        return dict(self._argument_types)

    def coerce_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """
        Convert the model-visible arguments to their parameter types (see :mod:`haystack_state.tools._coercion`).

        :param arguments: The call's keyword arguments.
        :returns: A new dict with the converted arguments; the others are unchanged.
        :raises haystack.tools.errors.ToolInvocationError: If an argument does not fit its parameter's type.
        """
        try:
            return coerce_arguments(self._argument_types, arguments, self._field_defaults)
        except ValidationError as error:
            raise ToolInvocationError(
                f"Invalid arguments for Tool `{self.name}`: {error}", tool_name=self.name
            ) from error

    def invoke(self, **kwargs: Any) -> Any:
        """
        Convert the arguments to their types, then call the function (see ``haystack.tools.Tool.invoke``).

        :param kwargs: The arguments.
        :returns: The function's result.
        :raises haystack.tools.errors.ToolInvocationError: If an argument is invalid, the function raises, or the
            tool is async-only.
        """
        return super().invoke(**self.coerce_arguments(kwargs))

    async def invoke_async(self, **kwargs: Any) -> Any:
        """
        Convert the arguments to their types, then await the function (a sync one runs in a worker thread).

        :param kwargs: The arguments.
        :returns: The function's result.
        :raises haystack.tools.errors.ToolInvocationError: If an argument is invalid or the function raises.
        """
        if self.async_function is None:  # haystack runs self.invoke in a thread, which converts the arguments
            return await super().invoke_async(**kwargs)
        return await super().invoke_async(**self.coerce_arguments(kwargs))


@overload
def tool(function: Callable[..., Any], **options: Unpack[ToolOptions]) -> FunctionTool: ...


@overload
def tool(function: None = None, **options: Unpack[ToolOptions]) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    function: Callable[..., Any] | None = None, **options: Unpack[ToolOptions]
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """
    Turn a function, sync or ``async def``, into a haystack ``Tool`` (a :class:`FunctionTool`).

    The model sees the JSON schema haystack-ai's ``@tool`` makes for the same function: pydantic's, from the
    signature (Literal, Optional, lists, dicts, Enums, dataclasses and pydantic models as ``$defs``, ``Field(...)``
    defaults, descriptions and constraints included); parameters with a default are optional; a parameter is
    described by ``Annotated[T, "text"]``. The tool's description is the docstring as written (its ``:param:`` lines
    included) unless ``description`` is given.

    Hidden from the model (injected by the tool runner instead): parameters named in ``inputs_from_state``,
    parameters annotated ``State``, ``State | None``, ``Optional[State]`` or ``Annotated[State, ...]`` (haystack-state's
    State or haystack-ai's, and subclasses), a ``streaming_callback`` parameter, and optional parameters whose type
    has no JSON schema (e.g. callables; their default is used).

    Usage example:

    .. code-block:: python

        from typing import Annotated
        from haystack_state.state import State
        from haystack_state.tools import tool

        @tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"source": "note"}})
        def add_note(text: Annotated[str, "The note to save"], user: str, state: State) -> dict[str, str]:
            '''Save a note for the current user.'''
            return {"note": f"{user}: {text}"}

        assert list(add_note.parameters["properties"]) == ["text"]

        @tool
        async def fetch(url: str) -> str:
            '''Fetch a web page.'''
            ...

        assert fetch.async_function is not None and fetch.function is None

    :param function: The function, when used as ``@tool`` (without parentheses) or as ``tool(fn, ...)``.
    :param options: The keyword options below (:class:`ToolOptions`).
    :param name: The tool's name; the function's ``__name__`` by default.
    :param description: The tool's description; the docstring, as written, by default.
    :param inputs_from_state: ``{"state_key": "param_name"}``: parameters filled from state keys.
    :param outputs_to_state: ``{"state_key": {"source": "output_key", "handler": fn}}``; without ``source`` the
        whole result is merged into the state key; ``handler(current, new)`` overrides the key's merge handler.
    :param outputs_to_string: How the result becomes the tool message, in haystack-ai's format.
    :param timeout: The most seconds a call may take: a call over time is answered with a ``ToolTimeoutError`` and
        merges nothing (an async function is cancelled; a sync one is abandoned in its worker thread). None (the
        default) leaves it to the tool runner's ``tool_timeout``.
    :returns: The tool, or (with parentheses and no function) a decorator that makes it.
    :raises ToolDefinitionError: At decoration time, listing every problem at once: an ``inputs_from_state`` entry
        naming a missing parameter, a malformed ``outputs_to_state`` entry (unknown keys, a non-string source, a
        handler that is not callable), a required parameter that nobody could supply (no annotation, a type with no
        JSON schema), an invalid name, etc.
    :raises TypeError: For an unknown option.
    """
    check_options(options, "tool")

    def decorator(func: Callable[..., Any]) -> FunctionTool:
        return FunctionTool.from_function(func, **options)

    if function is None:
        return decorator
    return decorator(function)


def _timeout_problem(tool_name: str, timeout: object) -> str | None:
    """Why ``timeout`` is not a valid tool timeout, or None."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        return f"Tool '{tool_name}': timeout must be a positive number of seconds or None, got {timeout!r}."
    return None
