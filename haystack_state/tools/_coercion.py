"""
Converting the JSON values a model sends into the Python types a tool's function declares.

The model sends JSON: a dataclass parameter arrives as a dict, an Enum as its value, a pydantic model as a dict.
Before a function tool is called, each model-visible argument goes through ``pydantic.TypeAdapter(annotation)``
so the function receives a dataclass instance, an Enum member, a model instance (values that already have the
right type pass through unchanged). A dict (or a list of dicts) for a class with a ``from_dict`` classmethod
(haystack's ``Document``, ``ChatMessage``...) is converted with ``from_dict`` instead, as haystack-ai's
``ComponentTool`` does. Values of types pydantic cannot validate are passed through as they are.

JSON has no bytes: pydantic describes a ``bytes`` field as a string (``"format": "binary"``), so a string sent for a
``bytes`` field of a dataclass (``ByteStream.data``, also inside a ``Document``'s ``blob``) is turned into its UTF-8
bytes before ``from_dict`` sees it, as pydantic itself would (haystack-ai passes the string on and
``ByteStream.from_dict`` fails).

A parameter whose default is written as a pydantic ``Field(...)`` (``top_k: int = Field(5, ge=1)``) and that the
call leaves out gets the field's default (or ``default_factory()``), not the ``FieldInfo`` object Python would pass.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, Final, Union, cast, get_args, get_origin

from pydantic import TypeAdapter
from pydantic.fields import FieldInfo

from haystack_state.tools._annotations import unwrap_optional

__all__ = ["binary_strings_to_bytes", "coerce_arguments", "coerce_value", "field_defaults"]

_UNHANDLED: Final = object()

#: Types whose values, when already of exactly that type, pydantic returns as they are: no conversion to look for.
_AS_THEY_ARE: Final = frozenset({str, int, float, bool})


def coerce_arguments(
    annotations: Mapping[str, Any], arguments: Mapping[str, Any], field_defaults: Mapping[str, FieldInfo] | None = None
) -> dict[str, Any]:
    """
    Convert the arguments named in ``annotations`` to their types; leave the others untouched; fill in the defaults
    written as ``Field(...)`` of the parameters the call leaves out.

    Usage example:

    .. code-block:: python

        from enum import Enum

        class Unit(Enum):
            C = "celsius"

        assert coerce_arguments({"unit": Unit}, {"unit": "celsius", "state": object()})["unit"] is Unit.C

    :param annotations: The annotation of each model-visible parameter.
    :param arguments: The call's keyword arguments.
    :param field_defaults: The ``Field(...)`` default of each parameter that has one (see :func:`field_defaults`).
    :returns: A new dict of arguments.
    :raises pydantic.ValidationError: If a value does not fit its parameter's type.
    """
    result = dict(arguments)
    for name, annotation in annotations.items():
        if name in result:
            result[name] = coerce_value(result[name], annotation)
    for name, info in (field_defaults or {}).items():
        if name not in result and not info.is_required():
            result[name] = info.get_default(call_default_factory=True, validated_data={})
    return result


def field_defaults(defaults: Mapping[str, Any]) -> dict[str, FieldInfo]:
    """
    Pick the defaults written as pydantic ``Field(...)`` out of a function's parameter defaults.

    :param defaults: Each parameter's default.
    :returns: The ``FieldInfo`` defaults, by parameter name.
    """
    return {name: default for name, default in defaults.items() if isinstance(default, FieldInfo)}


def coerce_value(value: object, annotation: object) -> Any:
    """
    Convert one value to the type of its parameter.

    :param value: The value (typically parsed JSON).
    :param annotation: The parameter's annotation.
    :returns: The converted value.
    :raises pydantic.ValidationError: If the value does not fit the type.
    """
    if type(value) is annotation and annotation in _AS_THEY_ARE:  # the most frequent case, and the quickest
        return value
    converted = _from_dict(binary_strings_to_bytes(value, annotation), unwrap_optional(annotation))
    if converted is not _UNHANDLED:
        return converted
    adapter = _adapter(annotation)
    return adapter.validate_python(value) if adapter is not None else value


def binary_strings_to_bytes(value: object, annotation: object) -> Any:
    """
    Turn the strings a model sent for ``bytes`` fields of dataclasses into UTF-8 bytes, leaving all else as it is.

    Usage example:

    .. code-block:: python

        from haystack.dataclasses import ByteStream

        assert binary_strings_to_bytes({"data": "abc"}, ByteStream) == {"data": b"abc"}

    :param value: The value (parsed JSON): a dict for a dataclass, a list for a list of them.
    :param annotation: The type it is for (``Optional``, unions, ``list``/``Sequence`` and nested dataclasses are
        followed; a dataclass field named ``_x`` is also found as ``x``, like ``ChatMessage``'s).
    :returns: The value, or a copy with those strings encoded.
    """
    target = unwrap_optional(annotation)
    if target is bytes:
        return value.encode() if isinstance(value, str) else value
    origin = get_origin(target)
    if origin in (list, collections.abc.Sequence) and isinstance(value, list) and get_args(target):
        return [binary_strings_to_bytes(item, get_args(target)[0]) for item in value]
    if origin in (Union, types.UnionType) and isinstance(value, dict):
        for member in get_args(target):
            converted = binary_strings_to_bytes(value, member)
            if converted is not value:
                return converted
        return value
    if not (isinstance(target, type) and dataclasses.is_dataclass(target) and isinstance(value, dict)):
        return value
    result = value
    for name, field_type in _field_types(target).items():
        for key in {name, name.lstrip("_")} & value.keys():
            converted = binary_strings_to_bytes(value[key], field_type)
            if converted is not value[key]:
                if result is value:
                    result = dict(value)
                result[key] = converted
    return result


@functools.lru_cache(maxsize=256)
def _field_types(cls: type) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: nothing to follow
        return {}
    return {item.name: hints[item.name] for item in dataclasses.fields(cls) if item.name in hints}


def _adapter(annotation: object) -> TypeAdapter[Any] | None:
    try:
        return _cached_adapter(annotation)
    except TypeError:  # unhashable annotation (e.g. Annotated with a dict): build it uncached
        return _build_adapter(annotation)


@functools.lru_cache(maxsize=512)
def _cached_adapter(annotation: object) -> TypeAdapter[Any] | None:
    return _build_adapter(annotation)


def _build_adapter(annotation: Any) -> TypeAdapter[Any] | None:
    try:
        return TypeAdapter(annotation)
    except Exception:  # a type pydantic cannot validate: pass values through
        return None


def _from_dict(value: object, target: object) -> Any:
    """Convert with ``target.from_dict`` (or, for ``list[target]``, item by item); ``_UNHANDLED`` if not such a type."""
    if get_origin(target) in (list, collections.abc.Sequence) and get_args(target) and isinstance(value, list):
        item_type = unwrap_optional(get_args(target)[0])
        if _has_from_dict(item_type):
            return [item_type.from_dict(item) if isinstance(item, dict) else item for item in value]
        return _UNHANDLED
    if isinstance(value, dict) and _has_from_dict(target):
        return cast(Any, target).from_dict(value)  # (a class with from_dict: checked just above)
    return _UNHANDLED


def _has_from_dict(target: object) -> bool:
    return isinstance(target, type) and callable(getattr(target, "from_dict", None))
