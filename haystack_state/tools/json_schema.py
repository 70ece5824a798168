"""
Turning parameter types into the JSON schema a model sees, through pydantic.

The schema is built from a pydantic model made with ``create_model`` and cleaned for LLM providers:

- ``$ref``s into ``$defs`` are inlined (enums, dataclasses and pydantic models then appear where they are used,
  which every provider accepts); only recursive types keep a ``$defs`` entry, referenced from inside itself;
- the ``title`` keywords pydantic adds are removed (they repeat the property names);
- dataclasses are described with the descriptions of their fields from their docstring (``:param x:`` etc.).

Fields are declared under internal names with the parameter name as alias, so parameters called ``json``,
``schema``, ``model_config`` or ``_private`` work and pydantic emits no shadowing warning.
"""

from __future__ import annotations

import dataclasses
import threading
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, create_model
from pydantic.json_schema import PydanticJsonSchemaWarning

from haystack_state.tools.docstrings import parse_docstring

__all__ = ["REQUIRED", "SchemaField", "build_parameters_schema", "clean_schema", "schema_failure", "schema_type"]

#: The ``default`` of a :class:`SchemaField` that the model must supply.
REQUIRED: Any = ...

# Keywords whose value maps *names* (of properties, definitions) to sub-schemas: recurse into values, keep the keys.
_NAME_KEYED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keywords whose value is instance data, not a schema: never touched.
_DATA_KEYWORDS = frozenset({"default", "const", "enum", "examples", "example", "required", "dependentRequired"})
_DEFS_PREFIX = "#/$defs/"

_dataclass_models: dict[type, type[BaseModel]] = {}
_local = threading.local()  # the dataclasses being converted by this thread (to stop on recursive ones)


@dataclasses.dataclass(frozen=True)
class SchemaField:
    """
    One model-visible parameter.

    :param annotation: Its type.
    :param default: Its default value, or :data:`REQUIRED`.
    :param description: What to tell the model about it.
    """

    annotation: Any
    default: Any = REQUIRED
    description: str | None = None


def schema_type(annotation: Any) -> Any:
    """
    Replace the dataclasses inside an annotation by pydantic models that carry their docstring's field descriptions.

    :param annotation: A type annotation, e.g. ``list[MyDataclass] | None``.
    :returns: An annotation pydantic describes the same way, with richer descriptions. Types it cannot rebuild are
        returned unchanged (pydantic describes dataclasses natively too).
    """
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass_model(annotation) or annotation
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is None or not args or origin is Literal or origin in (Callable, typing.Callable):
        return annotation
    if origin is Annotated:
        inner = schema_type(args[0])
        return annotation if inner is args[0] else Annotated[(inner, *annotation.__metadata__)]
    new_args = tuple(schema_type(arg) for arg in args)
    if all(new is old for new, old in zip(new_args, args, strict=True)):
        return annotation
    try:
        if origin in (Union, types.UnionType):
            return Union[new_args]  # noqa: UP007 - a union built from a tuple of members
        return origin[new_args]
    except TypeError:
        return annotation


def _dataclass_model(cls: type) -> type[BaseModel] | None:
    """Build (once) a pydantic model mirroring a dataclass, or ``None`` when the dataclass is recursive or odd."""
    if cls in _dataclass_models:
        return _dataclass_models[cls]
    converting: set[type] = _local.__dict__.setdefault("converting", set())
    if cls in converting:
        return None
    converting.add(cls)
    try:
        docs = parse_docstring(cls)
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception:  # unresolvable string annotations: let pydantic deal with the dataclass itself
            return None
        definitions: dict[str, Any] = {}
        # Fields named "_x" are sent as "x" when the class has from_dict (haystack's ChatMessage); otherwise pydantic
        # describes the dataclass natively.
        strip_underscores = callable(getattr(cls, "from_dict", None))
        for item in dataclasses.fields(cls):
            if not item.init:
                continue
            name = item.name
            if name.startswith("_"):
                if not strip_underscores:
                    return None
                name = name.lstrip("_")
            if item.default is not dataclasses.MISSING:
                info = Field(default=item.default, description=docs.params.get(name))
            elif item.default_factory is not dataclasses.MISSING:
                info = Field(default_factory=item.default_factory, description=docs.params.get(name))
            else:
                info = Field(description=docs.params.get(name))
            definitions[name] = (schema_type(hints.get(item.name, item.type)), info)
        model: type[BaseModel] = create_model(cls.__name__, __doc__=docs.description or None, **definitions)
    except Exception:  # anything pydantic refuses: describe the dataclass natively instead
        return None
    finally:
        converting.discard(cls)
    _dataclass_models[cls] = model
    return model


def build_parameters_schema(fields: Mapping[str, SchemaField], model_name: str = "parameters") -> dict[str, Any]:
    """
    Build the JSON schema of a tool's model-visible parameters.

    Usage example:

    .. code-block:: python

        from typing import Literal

        schema = build_parameters_schema(
            {
                "city": SchemaField(str, description="The city."),
                "unit": SchemaField(Literal["C", "F"], default="C"),
            }
        )
        assert schema["required"] == ["city"]
        assert schema["properties"]["unit"] == {"enum": ["C", "F"], "type": "string", "default": "C"}

    :param fields: The parameters, by name, in the order the model should see them.
    :param model_name: The name of the intermediate pydantic model (never visible in the result).
    :returns: A JSON schema of ``"type": "object"`` with ``properties`` and, when some are required, ``required``.
    :raises Exception: Whatever pydantic raises for a type it cannot describe (see :func:`schema_failure`).
    """
    definitions: dict[str, Any] = {}
    for index, (name, item) in enumerate(fields.items()):
        # no description=None: it would override a pydantic Field(description=...) given inside Annotated
        extra: dict[str, Any] = {"description": item.description} if item.description else {}
        info = Field(default=item.default, alias=name, **extra)
        definitions[f"field_{index}"] = (schema_type(item.annotation), info)
    model: type[BaseModel] = create_model(model_name, **definitions)
    with warnings.catch_warnings():
        # a default that is not JSON serializable is left out of the schema: that is all we want
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        schema = model.model_json_schema(by_alias=True)
    return clean_schema(schema)


def schema_failure(annotation: Any, default: Any = REQUIRED) -> str | None:
    """
    Tell why a parameter of this type cannot be described to the model, if it cannot.

    :param annotation: The parameter's type.
    :param default: The parameter's default, or :data:`REQUIRED`.
    :returns: ``None`` when a JSON schema can be made; otherwise the first line of pydantic's explanation.
    """
    try:
        build_parameters_schema({"probe": SchemaField(annotation, default)})
    except Exception as error:
        text = str(error).strip()
        if not text:
            return type(error).__name__
        first_line = text.splitlines()[0]
        return first_line.split(". ")[0].rstrip(".")  # pydantic's first sentence; its hints are for models
    return None


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """
    Inline the ``$defs`` of a pydantic JSON schema and drop its ``title`` keywords.

    :param schema: A JSON schema as produced by pydantic's ``model_json_schema`` (not modified).
    :returns: The cleaned schema. Recursive definitions stay in ``$defs`` (themselves inlined as far as possible).
    """
    definitions: dict[str, Any] = dict(schema.get("$defs", {}))
    body = {key: value for key, value in schema.items() if key != "$defs"}
    recursive: set[str] = set()
    result = _inline(body, definitions, frozenset(), recursive)
    kept: dict[str, Any] = {}
    while recursive - kept.keys():
        for name in sorted(recursive - kept.keys()):
            kept[name] = _inline(definitions[name], definitions, frozenset({name}), recursive)
    if kept:
        result["$defs"] = kept
    _remove_titles(result)
    return dict(result)


def _inline(node: Any, definitions: dict[str, Any], expanding: frozenset[str], recursive: set[str]) -> Any:
    """Replace the ``$ref``s in ``node`` by copies of their definitions, except those that would recurse."""
    if isinstance(node, list):
        return [_inline(item, definitions, expanding, recursive) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX) and ref[len(_DEFS_PREFIX) :] in definitions:
        name = ref[len(_DEFS_PREFIX) :]
        siblings = {key: _inline_value(key, value, definitions, expanding, recursive) for key, value in node.items()}
        if name in expanding:
            recursive.add(name)
            return siblings
        del siblings["$ref"]
        inlined = _inline(definitions[name], definitions, expanding | {name}, recursive)
        return {**inlined, **siblings}
    return {key: _inline_value(key, value, definitions, expanding, recursive) for key, value in node.items()}


def _inline_value(
    key: str, value: Any, definitions: dict[str, Any], expanding: frozenset[str], recursive: set[str]
) -> Any:
    if key in _DATA_KEYWORDS:
        return value
    if key in _NAME_KEYED and isinstance(value, dict):
        return {name: _inline(sub, definitions, expanding, recursive) for name, sub in value.items()}
    return _inline(value, definitions, expanding, recursive)


def _remove_titles(node: Any) -> None:
    """Delete the ``title`` keywords of a schema in place, leaving properties that happen to be named ``title``."""
    if isinstance(node, list):
        for item in node:
            _remove_titles(item)
        return
    if not isinstance(node, dict):
        return
    node.pop("title", None)
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            continue
        if key in _NAME_KEYED and isinstance(value, dict):
            for sub in value.values():
                _remove_titles(sub)
        else:
            _remove_titles(value)
