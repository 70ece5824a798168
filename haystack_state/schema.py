"""
State schemas: normalising the user's ``{key: {"type": T, "handler": fn, ...}}`` dict into :class:`FieldSpec`
objects, reporting every problem at once, checking values against the declared types (with pydantic) and
(de)serialising the schema.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from haystack.dataclasses import ChatMessage
from haystack.utils import deserialize_callable, deserialize_type, serialize_callable, serialize_type
from pydantic import ConfigDict, InstanceOf, PydanticSchemaGenerationError, PydanticUserError, TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from haystack_state.errors import StateSchemaError, StateSerializationError, StateTypeError
from haystack_state.handlers import merge_lists, replace_values
from haystack_state.values import SCALARS

__all__ = [
    "ENTRY_FIELDS",
    "FieldSpec",
    "TypeCheck",
    "build_schema",
    "is_list_type",
    "schema_from_dict",
    "schema_to_dict",
    "type_name",
]

ENTRY_FIELDS = ("type", "handler", "default", "description")
_MISSING: Any = object()
_STRICT = ConfigDict(strict=True, arbitrary_types_allowed=True)


def type_name(tp: Any) -> str:
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


def is_list_type(tp: Any) -> bool:
    """
    Whether ``tp`` is a list type (``list``, ``list[T]``, ``List[T]``), the types whose default handler is
    ``merge_lists``. As in haystack-ai, ``list[T] | None`` is not a list type.

    :param tp: A type annotation.
    :returns: True for list types.
    """
    return tp is list or get_origin(tp) is list


def _is_type(tp: Any) -> bool:
    if tp is Any or inspect.isclass(tp):
        return True
    if tp is Union or tp is typing.Optional:
        return False
    return get_origin(tp) is not None


def _instance_of_leaves(tp: Any) -> Any:
    """Rewrite ``tp`` so that every class is checked with ``isinstance`` (for classes pydantic cannot model)."""
    origin = get_origin(tp)
    if origin is None:
        if inspect.isclass(tp) and tp.__module__ != "builtins":
            return InstanceOf[tp]
        return tp
    args = get_args(tp)
    if origin is Literal or not args:
        return tp
    if origin is Annotated:
        return Annotated[(_instance_of_leaves(args[0]), *args[1:])]
    new_args = tuple(_instance_of_leaves(a) for a in args)
    if origin in (Union, types.UnionType):
        return Union[new_args]
    return origin[new_args]


_BUILTIN_VALUE_TYPES = frozenset({str, int, float, bool, bytes, type(None), dict, list, tuple, set, frozenset})


def _bare_classes(tp: Any) -> bool:
    """Whether ``tp`` is a plain class or a union of plain classes (no parameters, literals or constraints)."""
    if get_origin(tp) in (Union, types.UnionType):
        return all(_bare_classes(arg) for arg in get_args(tp))
    return tp is type(None) or (inspect.isclass(tp) and get_origin(tp) is None and not get_args(tp))


def _adapter(tp: Any) -> TypeAdapter[Any]:
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

    def __init__(self, tp: Any) -> None:
        self.type = tp
        self.name = type_name(tp)
        self.is_any = tp is Any or tp is object
        # Exact value types pydantic has accepted, remembered when acceptance can only depend on the value's type
        # (the declared type is a class or a union of classes, and the value is of a built-in type).
        self.accepted: set[type] = set()
        self.accepted_scalars: set[type] = set()  # the immutable ones among them
        self.memoizable = _bare_classes(tp)
        try:
            self.adapter = _adapter(tp)
        except (PydanticSchemaGenerationError, PydanticUserError, TypeError):
            try:
                self.adapter = _adapter(_instance_of_leaves(tp))
            except Exception as exc:
                raise TypeError(f"type {self.name} cannot be checked: {exc}") from exc

    def check(self, key: str, value: Any) -> None:
        """
        Raise if ``value`` is not of the declared type.

        :param key: The state key, named in the error.
        :param value: The value to check; it is not converted.
        :raises StateTypeError: Naming the key, the expected type and the type received.
        """
        if self.is_any or type(value) in self.accepted:
            return
        try:
            self.adapter.validate_python(value, strict=True)
            if self.memoizable and type(value) in _BUILTIN_VALUE_TYPES:
                self.accepted.add(type(value))
                if type(value) in SCALARS:
                    self.accepted_scalars.add(type(value))
        except PydanticValidationError as exc:
            first = exc.errors()[0]
            where = "".join(f"[{p!r}]" for p in first.get("loc", ()))
            detail = f"At {key}{where}: {first['msg']}." if where else ""
            raise StateTypeError(key, self.name, value, detail) from None


@functools.lru_cache(maxsize=512)
def _cached_check(tp: Any) -> TypeCheck:
    return TypeCheck(tp)


def type_check(tp: Any) -> TypeCheck:
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


def _handler_name(handler: Callable[..., Any]) -> str:
    return getattr(handler, "__qualname__", None) or getattr(handler, "__name__", None) or repr(handler)


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """
    One normalised schema entry.

    :param key: The state key.
    :param type: The declared type.
    :param handler: The merge handler (the default one when the schema gives none).
    :param explicit_handler: Whether the schema named the handler.
    :param default: The default value or factory, or ``FieldSpec.NO_DEFAULT``.
    :param description: A description for people (notebooks, the CLI, serialisations).
    """

    NO_DEFAULT: typing.ClassVar[Any] = _MISSING

    key: str
    type: Any
    handler: Callable[[Any, Any], Any]
    explicit_handler: bool = False
    default: Any = _MISSING
    description: str | None = None

    @functools.cached_property
    def is_list(self) -> bool:
        """Whether the key holds a list type (and so is stored for O(1) appends)."""
        return is_list_type(self.type)

    @functools.cached_property
    def check(self) -> TypeCheck:
        """The checker of whole values."""
        return type_check(self.type)

    @functools.cached_property
    def item_check(self) -> TypeCheck:
        """The checker of list items (``Any`` for a bare ``list``)."""
        args = get_args(self.type)
        return type_check(args[0] if args else Any)

    @property
    def handler_name(self) -> str:
        """The handler's name, for messages and displays."""
        return _handler_name(self.handler)

    @property
    def has_default(self) -> bool:
        """Whether the field declares a default."""
        return self.default is not _MISSING

    def make_default(self) -> Any:
        """
        The field's default value: the value itself, or the factory's result when ``default`` is a factory (a
        callable that is not itself a valid value of the declared type).

        :returns: The default value (not yet frozen).
        """
        if callable(self.default):
            try:
                self.check.check(self.key, self.default)
                return self.default
            except StateTypeError:
                return self.default()
        return self.default

    def as_entry(self) -> dict[str, Any]:
        """The schema entry as a dict, in haystack's form plus the extras that are set."""
        entry: dict[str, Any] = {"type": self.type, "handler": self.handler}
        if self.has_default:
            entry["default"] = self.default
        if self.description is not None:
            entry["description"] = self.description
        return entry


def _entry_problems(key: Any, entry: Any) -> list[str]:
    if not isinstance(key, str):
        return [f"Key {key!r} must be a string."]
    if not isinstance(entry, Mapping):
        return [f"Key '{key}': the entry must be a dict like {{'type': str}}, got {type(entry).__name__}."]
    problems = []
    for field in entry:
        if field not in ENTRY_FIELDS:
            close = difflib.get_close_matches(str(field), ENTRY_FIELDS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append(f"Key '{key}' has an unknown field '{field}'{hint}; allowed: {', '.join(ENTRY_FIELDS)}.")
    if "type" not in entry:
        problems.append(f"Key '{key}' is missing a 'type' entry.")
    elif not _is_type(entry["type"]):
        problems.append(f"Key '{key}': 'type' must be a Python type, got {entry['type']!r}.")
    else:
        tp = entry["type"]
        try:
            type_check(tp)
        except TypeError as exc:
            problems.append(f"Key '{key}': {exc}.")
        if key == "messages":
            args = get_args(tp)
            if not (is_list_type(tp) and args and inspect.isclass(args[0]) and issubclass(args[0], ChatMessage)):
                problems.append(f"Key 'messages' must be of type list[ChatMessage], got {type_name(tp)}.")
    handler = entry.get("handler")
    if handler is not None and not callable(handler):
        problems.append(f"Key '{key}': 'handler' must be callable or None, got {handler!r}.")
    description = entry.get("description")
    if description is not None and not isinstance(description, str):
        problems.append(f"Key '{key}': 'description' must be a string, got {type(description).__name__}.")
    return problems


def build_schema(schema: Mapping[str, Any]) -> dict[str, FieldSpec]:
    """
    Validate a schema dict and normalise it, adding the automatic ``messages`` key.

    :param schema: ``{key: {"type": T, "handler": fn, "default": value_or_factory, "description": str}}``.
    :returns: The field specs by key, ``messages`` included.
    :raises StateSchemaError: Listing every problem of the schema at once.
    """
    if not isinstance(schema, Mapping):
        raise StateSchemaError([f"The schema must be a dict of key -> entry, got {type(schema).__name__}."])
    problems: list[str] = []
    specs: dict[str, FieldSpec] = {}
    for key, entry in schema.items():
        entry_problems = _entry_problems(key, entry)
        problems.extend(entry_problems)
        if entry_problems:
            continue
        tp = entry["type"]
        handler = entry.get("handler")
        spec = FieldSpec(
            key=key,
            type=tp,
            handler=handler or (merge_lists if is_list_type(tp) else replace_values),
            explicit_handler=handler is not None,
            default=entry.get("default", _MISSING),
            description=entry.get("description"),
        )
        if spec.has_default:
            try:
                spec.check.check(key, spec.make_default())
            except StateTypeError as exc:
                problems.append(f"Key '{key}': the default does not match the type: {exc}")
            except Exception as exc:
                problems.append(f"Key '{key}': the default factory raised {type(exc).__name__}: {exc}")
        specs[key] = spec
    if problems:
        raise StateSchemaError(problems)
    if "messages" not in specs:
        specs["messages"] = FieldSpec(key="messages", type=list[ChatMessage], handler=merge_lists)
    return specs


def schema_to_dict(specs: Mapping[str, FieldSpec]) -> dict[str, Any]:
    """
    Serialise field specs in haystack-ai's format (``type`` and ``handler`` as import paths), plus
    ``description`` and ``default`` when set. A default factory is stored by import path, a default value as is.

    :param specs: The field specs.
    :returns: A JSON-able dict.
    """
    out: dict[str, Any] = {}
    for key, spec in specs.items():
        entry: dict[str, Any] = {"type": serialize_type(spec.type), "handler": serialize_callable(spec.handler)}
        if spec.description is not None:
            entry["description"] = spec.description
        if spec.has_default:
            if callable(spec.default) and not isinstance(spec.default, type):
                entry["default_factory"] = serialize_callable(spec.default)
            elif isinstance(spec.default, type):
                entry["default_factory"] = serialize_type(spec.default)
            else:
                entry["default"] = spec.default
        out[key] = entry
    return out


def schema_from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """
    Turn a serialised schema (from :func:`schema_to_dict` or haystack-ai's ``State.to_dict``) back into a schema
    dict for :func:`build_schema`.

    :param data: The serialised schema.
    :returns: The schema dict.
    :raises StateSerializationError: If an entry is malformed or names a type or handler that cannot be loaded.
    """
    if not isinstance(data, Mapping):
        raise StateSerializationError(f"The serialized schema must be a dict, got {type(data).__name__}.")
    schema: dict[str, Any] = {}
    for key, entry in data.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("type"), str):
            raise StateSerializationError(f"Serialized schema key '{key}' needs a 'type' string, got {entry!r}.")
        try:
            item: dict[str, Any] = {"type": deserialize_type(entry["type"])}
            if entry.get("handler"):
                item["handler"] = deserialize_callable(entry["handler"])
            if "default_factory" in entry:
                path = entry["default_factory"]
                item["default"] = deserialize_type(path) if path in ("list", "dict", "set") else deserialize_callable(path)
            elif "default" in entry:
                item["default"] = entry["default"]
        except Exception as exc:
            raise StateSerializationError(f"Serialized schema key '{key}' cannot be loaded: {exc}") from exc
        if "description" in entry:
            item["description"] = entry["description"]
        schema[key] = item
    return schema
