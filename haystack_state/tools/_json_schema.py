"""
Turning parameter types into the JSON schema a model sees, through pydantic, exactly as haystack-ai 3.4 does.

The schema is pydantic's JSON schema of a model made with ``create_model``, one field per visible parameter, without
the ``title`` keywords pydantic adds (they repeat the property names). Nested models, dataclasses and enums are
``$ref``s into ``$defs``, as pydantic (and so haystack-ai) writes them; the tool runner's JSON Schema validator
resolves them. Two styles, one per kind of tool:

- ``"function"`` (``@tool``, like haystack-ai's ``create_tool_from_function``): each parameter is described by
  pydantic as it is (``Field(...)`` defaults, descriptions, constraints and examples included, also inside
  ``Annotated``); then the description written as the first metadata of ``Annotated[T, "text"]`` replaces the
  parameter's description.
- ``"component"`` (``ComponentTool``, like haystack-ai's): dataclasses and ``Tool``/``Toolset`` are rewritten first
  (see :mod:`haystack_state.tools._component_types`), and every parameter gets a description (from the ``run``
  docstring, or ``"Input 'name' for the component."``).

Fields are declared under internal names with the parameter name as alias, so parameters called ``json``,
``schema``, ``model_config`` or ``_private`` work (haystack-ai fails on the last two) and pydantic emits no shadowing
warning; the schema is the same.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo
from pydantic.json_schema import PydanticJsonSchemaWarning

from haystack_state.tools._component_types import component_schema_type

__all__ = [
    "REQUIRED",
    "SchemaField",
    "SchemaStyle",
    "build_parameters_schema",
    "is_required_default",
    "remove_titles",
    "schema_failure",
]

#: The ``default`` of a :class:`SchemaField` that the model must supply.
REQUIRED: Final = ...

#: How parameters are described: like haystack-ai's function tools, or like its component tools.
SchemaStyle = Literal["function", "component"]

# Keywords whose value maps *names* (of properties, definitions) to sub-schemas: recurse into values, keep the keys.
_NAME_KEYED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keywords whose value is instance data, not a schema: never touched.
_DATA_KEYWORDS = frozenset({"default", "const", "enum", "examples", "example", "required", "dependentRequired"})


@dataclasses.dataclass(frozen=True)
class SchemaField:
    """
    One model-visible parameter.

    :param annotation: Its type.
    :param default: Its default value, a pydantic ``FieldInfo`` (``x: int = Field(3, ge=1)``), or :data:`REQUIRED`.
    :param description: What to tell the model about it: in the ``"function"`` style it replaces whatever pydantic
        found; in the ``"component"`` style it is the field's description.
    """

    annotation: Any
    default: Any = REQUIRED
    description: str | None = None


def build_parameters_schema(
    fields: Mapping[str, SchemaField], *, style: SchemaStyle = "function", model_name: str = "parameters"
) -> dict[str, Any]:
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
    :param style: ``"function"`` for function tools, ``"component"`` for component tools (see the module docstring).
    :param model_name: The name of the intermediate pydantic model (never visible in the result).
    :returns: A JSON schema of ``"type": "object"`` with ``properties``, ``required`` when some are required, and
        ``$defs`` when some type is defined once and referenced.
    :raises Exception: Whatever pydantic raises for a type it cannot describe (see :func:`schema_failure`).
    """
    definitions: dict[str, Any] = {}
    for index, (name, item) in enumerate(fields.items()):
        alias = Field(alias=name)
        if style == "component":
            resolved: Any = component_schema_type(item.annotation)
            definitions[f"field_{index}"] = (
                Annotated[resolved, alias],
                Field(item.default, description=item.description),
            )
        else:
            definitions[f"field_{index}"] = (Annotated[item.annotation, alias], item.default)
    model: type[BaseModel] = create_model(model_name, **definitions)
    with warnings.catch_warnings():
        # a default that is not JSON serializable is left out of the schema: that is all we want
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        schema = model.model_json_schema(by_alias=True)
    remove_titles(schema)
    if style == "function":
        properties = schema.get("properties", {})
        for name, item in fields.items():
            if item.description is not None and name in properties:
                properties[name]["description"] = item.description
    return schema


def schema_failure(annotation: object, default: object = REQUIRED, style: SchemaStyle = "function") -> str | None:
    """
    Tell why a parameter of this type cannot be described to the model, if it cannot.

    :param annotation: The parameter's type.
    :param default: The parameter's default, or :data:`REQUIRED`.
    :param style: The schema style (see :func:`build_parameters_schema`).
    :returns: ``None`` when a JSON schema can be made; otherwise the first line of pydantic's explanation.
    """
    try:
        build_parameters_schema({"probe": SchemaField(annotation, default)}, style=style)
    except Exception as error:
        text = str(error).strip()
        if not text:
            return type(error).__name__
        first_line = text.splitlines()[0]
        return first_line.split(". ")[0].rstrip(".")  # pydantic's first sentence; its hints are for models
    return None


def is_required_default(default: object) -> bool:
    """
    Tell whether a parameter default means "required": :data:`REQUIRED`, or a ``Field(...)`` without a default.

    :param default: The default as written in the signature.
    :returns: Whether the model must supply the parameter.
    """
    return default is REQUIRED or (isinstance(default, FieldInfo) and default.is_required())


def remove_titles(node: object) -> None:
    """
    Delete the ``title`` keywords of a JSON schema in place, leaving properties and definitions named ``title`` and
    values (defaults, examples, enums) that contain a ``title`` key.

    :param node: A JSON schema (or part of one).
    """
    if isinstance(node, list):
        for item in node:
            remove_titles(item)
        return
    if not isinstance(node, dict):
        return
    node.pop("title", None)
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            continue
        if key in _NAME_KEYED and isinstance(value, dict):
            for sub in value.values():
                remove_titles(sub)
        else:
            remove_titles(value)
