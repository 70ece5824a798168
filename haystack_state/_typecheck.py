"""
Checking values against the types a State schema declares, and naming those types.

A :class:`TypeCheck` checks values strictly with pydantic (nothing is coerced); classes pydantic cannot model are
checked with ``isinstance``. It remembers the exact value types it accepted when acceptance can only depend on the
type, which is what lets ``State.set`` skip most checks (see :mod:`haystack_state.state`). Kept apart from
:mod:`haystack_state._schema` (which re-exports these names) because it is the one part of the schema that runs on
every write.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    GetPydanticSchema,
    InstanceOf,
    PydanticSchemaGenerationError,
    PydanticUserError,
    TypeAdapter,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import core_schema

from haystack_state.errors import StateTypeError
from haystack_state.values import SCALARS

__all__ = ["TypeCheck", "is_list_type", "is_type", "type_check", "type_name"]

_STRICT = ConfigDict(strict=True, arbitrary_types_allowed=True)


def type_name(tp: object) -> str:
    """
    A short readable name for a type annotation: ``list[Document]``, ``str | None``, ``Literal['a', 'b']``.

    :param tp: A type annotation.
    :returns: Its name as a user would write it.
    """
    origin = get_origin(tp)
    if origin is None:
        if tp is Any:
            return "Any"
        return tp.__name__ if isinstance(tp, type) else repr(tp).replace("typing.", "")
    args = get_args(tp)
    if origin in (Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is Annotated:
        return type_name(args[0])
    base = origin.__name__ if isinstance(origin, type) else repr(origin).replace("typing.", "")
    return f"{base}[{', '.join(type_name(a) for a in args)}]" if args else base


def is_list_type(tp: object) -> bool:
    """
    Whether ``tp`` is a list type (``list``, ``list[T]``, ``List[T]``), the types whose default handler is
    ``merge_lists``. As in haystack-ai, ``list[T] | None`` is not a list type.

    :param tp: A type annotation.
    :returns: True for list types.
    """
    return tp is list or get_origin(tp) is list


def is_type(tp: object) -> bool:
    """Whether ``tp`` can be a schema entry's ``type``: ``Any``, a class or a parametrised type."""
    if tp is Any or inspect.isclass(tp):
        return True
    if tp is Union or tp is typing.Optional:
        return False
    return get_origin(tp) is not None


_PLAIN_TYPE_ERRORS = frozenset({"is_instance_of", "union_tag_invalid", "model_attributes_type"})
_INSTANCE_OF: Any = InstanceOf  # pydantic's isinstance() check, applied to classes only known at run time


def _rewrite_leaves(tp: Any, leaf: Callable[[type], Any]) -> Any:
    """Rewrite the classes inside ``tp`` with ``leaf``; returns ``tp`` itself when nothing changes."""
    origin = get_origin(tp)
    if origin is None:
        return leaf(tp) if inspect.isclass(tp) else tp
    args = get_args(tp)
    if origin is Literal or not args:
        return tp
    if origin is Annotated:
        inner = _rewrite_leaves(args[0], leaf)
        return tp if inner is args[0] else Annotated[(inner, *args[1:])]
    new_args = tuple(_rewrite_leaves(a, leaf) for a in args)
    if all(new is old for new, old in zip(new_args, args, strict=True)):
        return tp
    if origin in (Union, types.UnionType):
        return Union[new_args]  # noqa: UP007 - a union of a tuple of arguments
    return origin[new_args]


def _is_model_class(cls: type) -> bool:
    """Whether instances of ``cls`` are built from field values (pydantic models, dataclasses, named tuples)."""
    return (
        issubclass(cls, BaseModel)
        or dataclasses.is_dataclass(cls)
        or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
    )


def _instances_only(cls: type) -> Any:
    # pydantic validates a model (or a pydantic dataclass) from a dict even in strict mode, building a new object:
    # that is coercion. A value of a model type must be an instance of it; its fields were validated when it was
    # built. (Stdlib dataclasses such as Document are checked the same way, without re-validating every field.)
    return _INSTANCE_OF[cls] if _is_model_class(cls) else cls


def _isinstance_leaf(cls: type) -> Any:
    if typing.is_typeddict(cls):  # isinstance() rejects TypedDicts; a TypedDict value is a dict
        return dict[str, Any]
    if cls.__module__ == "builtins":
        return cls
    # A bare isinstance() check that asks the class nothing (pydantic's InstanceOf would still ask it for a schema).
    return Annotated[cls, GetPydanticSchema(lambda _source, _handler: core_schema.is_instance_schema(cls))]


def _instance_of_leaves(tp: Any) -> Any:
    """Rewrite ``tp`` so that every class is checked with ``isinstance`` (for classes pydantic cannot model)."""
    return _rewrite_leaves(tp, _isinstance_leaf)


def _bare_classes(tp: object) -> bool:
    """
    Whether a value being of type ``tp`` depends on the value's class alone: ``tp`` is a built-in class, a class
    checked with isinstance (models, dataclasses), or a union of those; no parameters, literals or constraints.
    (Not a TypedDict, for instance: whether a dict is one depends on its keys.)
    """
    if get_origin(tp) in (Union, types.UnionType):
        return all(_bare_classes(arg) for arg in get_args(tp))
    if not inspect.isclass(tp) or get_origin(tp) is not None or get_args(tp):
        return False
    return tp.__module__ == "builtins" or _is_model_class(tp)


def _adapter(tp: Any) -> TypeAdapter[object]:
    try:
        return TypeAdapter(tp, config=_STRICT)
    except PydanticUserError:  # dataclasses and pydantic models carry their own config
        return TypeAdapter(tp)


class TypeCheck:
    """
    Checks values against one declared type, strictly (nothing is coerced), with pydantic. Types pydantic cannot
    model are checked with ``isinstance`` on their classes.

    :param tp: The declared type.
    :raises TypeError: If the type cannot be checked at all.
    """

    def __init__(self, tp: object) -> None:
        self.type = tp
        self.name = type_name(tp)
        self.is_any = tp is Any or tp is object
        # Exact value types pydantic has accepted, remembered when acceptance can only depend on the value's type
        # (see _bare_classes).
        self.accepted: set[type] = set()
        self.accepted_scalars: set[type] = set()  # the immutable ones among them
        self.memoizable = _bare_classes(tp)
        try:
            self.adapter = _adapter(_rewrite_leaves(tp, _instances_only))
        except (PydanticSchemaGenerationError, PydanticUserError, TypeError):
            try:
                self.adapter = _adapter(_instance_of_leaves(tp))
            except Exception as exc:
                raise TypeError(f"type {self.name} cannot be checked: {exc}") from exc

    def check(self, key: str, value: object, expected: str | None = None) -> None:
        """
        Raise if ``value`` is not of the declared type.

        :param key: The state key, named in the error.
        :param value: The value to check; it is not converted.
        :param expected: How the error names the expected type (default: the type's name).
        :raises StateTypeError: Naming the key, the expected type and the type received.
        """
        if self.is_any or type(value) in self.accepted:
            return
        try:
            self.adapter.validate_python(value, strict=True)
            if self.memoizable:
                self.accepted.add(type(value))
                if type(value) in SCALARS:
                    self.accepted_scalars.add(type(value))
        except PydanticValidationError as exc:
            first = exc.errors()[0]
            where = "".join(f"[{p!r}]" for p in _value_path(value, first.get("loc", ())))
            if where:
                detail = f"At {key}{where}: {first['msg']}."
            elif (
                not first.get("loc") and first["type"] not in _PLAIN_TYPE_ERRORS and not first["type"].endswith("_type")
            ):
                detail = f"{first['msg']}."  # a constraint (a bound, a length, a literal value), not the type
            else:
                detail = ""
            raise StateTypeError(key, expected or self.name, value, detail) from None

    def convert(self, key: str, value: object) -> object:
        """
        Return ``value`` if it is of the declared type; if the declared type is a subclass of ``dict`` or ``list``
        (``Counter``, ``OrderedDict``, ...) and ``value`` a plain one, convert it. Only for values read back from
        JSON (``State.from_dict``), which keeps no such subclass. Writes never convert, and nothing else is.

        :param key: The state key, named in the error.
        :param value: The deserialized value.
        :returns: ``value`` itself, or its conversion to the declared type.
        :raises StateTypeError: If the value is not of the declared type and cannot be converted to it.
        """
        try:
            self.check(key, value)
            return value
        except StateTypeError as error:
            target = get_origin(self.type) or self.type
            if not (
                isinstance(value, dict | list)
                and type(value) in (dict, list)
                and inspect.isclass(target)
                and issubclass(target, type(value))
                and target is not type(value)
            ):
                raise
            try:
                converted = target(value)
                self.check(key, converted)
            except Exception:
                raise error from None
            return converted


def _value_path(value: Any, loc: tuple[int | str, ...]) -> list[int | str]:
    """The leading part of a pydantic error location that indexes into ``value`` (not union member tags)."""
    path = []
    for part in loc:
        in_mapping = isinstance(value, Mapping) and part in value
        in_sequence = isinstance(value, list | tuple) and isinstance(part, int) and 0 <= part < len(value)
        if not (in_mapping or in_sequence):
            break
        value = value[part]
        path.append(part)
    return path


@functools.lru_cache(maxsize=512)
def _cached_check(tp: object) -> TypeCheck:
    return TypeCheck(tp)


def type_check(tp: object) -> TypeCheck:
    """
    A (cached) :class:`TypeCheck` for ``tp``.

    :param tp: The declared type.
    :returns: The checker.
    """
    try:
        return _cached_check(tp)
    except TypeError as exc:
        if "unhashable" in str(exc):
            return TypeCheck(tp)
        raise
