"""
How a component's input types are shown to the model: the type rewriting haystack-ai's ``ComponentTool`` applies
before pydantic describes a socket, reproduced so our schemas equal its schemas.

- A dataclass (haystack's ``Document``, ``ChatMessage``, ``ByteStream``... or the application's) becomes a pydantic
  model of the same name whose fields carry descriptions: the field's ``:param:`` line in the dataclass docstring, or
  ``"Field 'name' of 'Class'."``. A field's default factory is called so its value shows as the default; the fields
  ``ChatMessage`` stores as ``_role``/``_content``/``_name``/``_meta`` are shown without the underscore (the names
  ``ChatMessage.from_dict`` reads).
- ``Tool`` and ``Toolset`` become placeholder models (a tool's name, description and parameters), since a tool
  holds a function that no JSON schema can describe.
- The rewriting goes through ``list[...]``, ``Sequence[...]``, unions (``X | None``) and ``dict[K, ...]`` values, as
  haystack-ai's does; other containers (``tuple``, ``set``, ``Annotated``) are left for pydantic to describe.

Where haystack-ai's rewriting breaks, ours keeps working: a recursive dataclass is described by pydantic natively
(haystack-ai recurses forever), a dataclass with postponed (string) annotations has them resolved, and a dataclass
whose ``from_dict`` accepts names without their leading underscore is handled like ``ChatMessage``.

Function tools (``@tool``) do not use this: haystack-ai describes their parameters with pydantic as they are.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import threading
import types
import typing
from typing import Any, Final, Union, get_args, get_origin

from haystack.dataclasses import ChatMessage
from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset
from pydantic import BaseModel, Field, create_model

from haystack_state.tools._docstrings import parse_docstring

__all__ = ["component_schema_type"]

_MISSING: Final = ...

# When two different models share a class name (a dataclass rewritten here and the same dataclass described natively
# by pydantic elsewhere in one schema), pydantic names their $defs after module and class. haystack-ai's rewritten
# models live in this module, so ours claim it too: the $defs keys then match too.
_HAYSTACK_MODULE = "haystack.tools.parameters_schema_utils"


class _ToolSchemaPlaceholder(BaseModel):
    # Name and wording as haystack-ai's placeholder: they appear in the schema ($defs key and descriptions).
    """Placeholder model representing a Tool for JSON schema generation."""

    __module__ = _HAYSTACK_MODULE
    name: str = Field(description="Name of the tool")
    description: str = Field(description="Description of the tool")
    parameters: dict[str, Any] = Field(description="JSON schema of the tool parameters")


class _ToolsetSchemaPlaceholder(BaseModel):
    """Placeholder model representing a Toolset for JSON schema generation."""

    __module__ = _HAYSTACK_MODULE
    tools: list[_ToolSchemaPlaceholder] = Field(description="List of tools in the toolset")


class _RecursiveDataclass(Exception):
    """Raised inside the conversion of a dataclass that contains itself; carries that dataclass."""

    def __init__(self, cls: type) -> None:
        super().__init__(cls.__name__)
        self.cls = cls


_models: dict[type, type[BaseModel] | None] = {}  # None: describe this dataclass natively
_models_lock = threading.Lock()
_local = threading.local()  # the dataclasses being converted by this thread


def component_schema_type(annotation: object) -> Any:
    """
    Rewrite a component socket's type the way haystack-ai's ``ComponentTool`` does before describing it.

    Usage example:

    .. code-block:: python

        from haystack import Document

        model = component_schema_type(list[Document])
        # list[<pydantic model "Document" with described fields>]

    :param annotation: The socket's type.
    :returns: The type to give pydantic: dataclasses replaced by described models, ``Tool``/``Toolset`` by
        placeholders, inside lists, sequences, unions and dict values.
    """
    if annotation is Tool:
        return _ToolSchemaPlaceholder
    if annotation is Toolset:
        return _ToolsetSchemaPlaceholder
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass_model(annotation) or annotation
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is list:
        return list[component_schema_type(args[0]) if args else Any]  # type: ignore[misc]
    if origin is collections.abc.Sequence:
        return collections.abc.Sequence[component_schema_type(args[0]) if args else Any]  # type: ignore[misc]
    if origin is Union or origin is types.UnionType:
        return Union[tuple(component_schema_type(arg) for arg in args)]  # noqa: UP007 - a union from a tuple
    if origin is dict:
        return dict[args[0] if args else Any, component_schema_type(args[1]) if args else Any]  # type: ignore[misc]
    return annotation


def _dataclass_model(cls: type) -> Any:
    """
    The described model of a dataclass (built once), or ``None`` to let pydantic describe it natively.

    Inside its own conversion, a dataclass that refers to itself (``children: list[Node]``) is the model's name as a
    forward reference, which pydantic resolves to the model being made (haystack-ai gets the same schema when the
    dataclass's annotations are strings, and recurses forever when they are not). Dataclasses that refer to each
    other are described natively.
    """
    if cls in _models:
        return _models[cls]
    converting: list[type] = _local.__dict__.setdefault("converting", [])
    if cls in converting:
        if converting[-1] is cls:
            return cls.__name__
        raise _RecursiveDataclass(cls)
    converting.append(cls)
    try:
        model = _build_model(cls)
    except _RecursiveDataclass as error:
        if error.cls is not cls:  # the dataclass that closes the cycle is the one described natively
            raise
        model = None
    except Exception:  # anything pydantic refuses: describe the dataclass natively instead
        model = None
    finally:
        converting.pop()
    with _models_lock:
        _models.setdefault(cls, model)
    return _models[cls]


def _build_model(cls: type) -> type[BaseModel] | None:
    descriptions = parse_docstring(cls).params
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # unresolvable string annotations: let pydantic deal with the dataclass itself
        return None
    strip_underscores = cls is ChatMessage or callable(getattr(cls, "from_dict", None))
    definitions: dict[str, Any] = {}
    for index, item in enumerate(dataclasses.fields(cls)):
        name = item.name
        if name.startswith("_"):
            if not strip_underscores:
                return None
            name = name[1:]
        if callable(item.default_factory):
            default = item.default_factory()
        elif item.default is not dataclasses.MISSING:
            default = item.default
        else:
            default = _MISSING
        description = descriptions.get(name, f"Field '{name}' of '{cls.__name__}'.")
        annotation = component_schema_type(hints.get(item.name, item.type))
        # internal names with the field name as alias: fields called "json" or "model_config" work too
        definitions[f"field_{index}"] = (annotation, Field(default, alias=name, description=description))
    return create_model(cls.__name__, __module__=_HAYSTACK_MODULE, **definitions)
