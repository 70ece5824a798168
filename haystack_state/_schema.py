"""
State schemas: normalising the user's ``{key: {"type": T, "handler": fn, ...}}`` dict into :class:`FieldSpec`
objects, reporting every problem at once, and (de)serialising the schema. Checking values against the declared
types is :mod:`haystack_state._typecheck`'s (its names are importable from here too).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar, cast, get_args

from haystack.components.agents.state.state_utils import merge_lists as haystack_merge_lists
from haystack.components.agents.state.state_utils import replace_values as haystack_replace_values
from haystack.dataclasses import ChatMessage
from haystack.utils import (
    _deserialize_value_with_schema,
    _serialize_value_with_schema,
    deserialize_callable,
    deserialize_type,
    serialize_callable,
    serialize_type,
)

from haystack_state._typecheck import TypeCheck, is_list_type, is_type, type_check, type_name
from haystack_state.errors import StateSchemaError, StateSerializationError, StateTypeError
from haystack_state.handlers import merge_lists, replace_values
from haystack_state.values import freeze, thaw

__all__ = [
    "ENTRY_FIELDS",
    "FieldSpec",
    "TypeCheck",
    "build_schema",
    "is_list_type",
    "same_handler",
    "schema_from_dict",
    "schema_to_dict",
    "type_check",
    "type_name",
]

H = TypeVar("H")

ENTRY_FIELDS = ("type", "handler", "default", "description", "scope", "loader", "input", "output")
SCOPES = ("thread", "run", "input", "loaded")
# haystack-ai's own default handlers (in schemas written for it, or serialized by it) are the same functions as
# ours; reading them as ours keeps merge_lists appends O(1).
_SAME_HANDLERS = ((haystack_merge_lists, merge_lists), (haystack_replace_values, replace_values))


def same_handler(handler: H) -> H:
    """
    ``handler``, or ours when it is haystack-ai's ``merge_lists`` or ``replace_values``.

    :param handler: A handler (or anything: it is returned as it is unless it is one of haystack-ai's).
    :returns: The handler to use.
    """
    for theirs, ours in _SAME_HANDLERS:
        if handler is theirs:
            return cast(H, ours)
    return handler


_MISSING: Final = object()


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
    :param default: The default value (stored frozen, see :func:`haystack_state.values.freeze`) or factory, or
        ``FieldSpec.NO_DEFAULT``.
    :param description: A description for people (notebooks, the CLI, serialisations).
    :param scope: The value's lifecycle on a durable thread: ``"thread"`` (the default: kept across the thread's
        runs), ``"run"`` (reset to the default at the start of every run, for turn-scoped values), ``"input"``
        (set by the caller when a run starts, read-only to tools and hooks, stored with the run), or ``"loaded"``
        (computed by ``loader`` at the start of every run, never stored).
    :param loader: For a ``"loaded"`` field: ``loader(context, state) -> value`` (sync or async), given the run's
        ``RunContext`` and its State.
    :param is_input: Whether the key is an input of the Agent (``"input": False`` makes it private to the agent).
    :param is_output: Whether the key is an output of the Agent (``"output": False`` keeps it out of the result).
    """

    NO_DEFAULT: typing.ClassVar[Any] = _MISSING

    key: str
    type: Any
    handler: Callable[[Any, Any], Any]
    explicit_handler: bool = False
    default: Any = _MISSING
    description: str | None = None
    scope: str = "thread"
    loader: Callable[..., Any] | None = None
    is_input: bool = True
    is_output: bool = True
    # A default that build_schema made (calling the factory) to check it; the state built next uses it, so a
    # factory runs once per state.
    _prebuilt: list[Any] = dataclasses.field(default_factory=list, compare=False, repr=False)

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

    @functools.cached_property
    def items_expected(self) -> str:
        """How a type error on one appended item names what the key expects: ``items of type str (list[str])``."""
        return f"items of type {self.item_check.name} ({type_name(self.type)})"

    @property
    def handler_name(self) -> str:
        """The handler's name, for messages and displays."""
        return _handler_name(self.handler)

    @property
    def has_default(self) -> bool:
        """Whether the field declares a default."""
        return self.default is not _MISSING

    @functools.cached_property
    def default_is_factory(self) -> bool:
        """Whether ``default`` is a factory: a callable that is not itself a valid value of the declared type."""
        if not callable(self.default):
            return False
        try:
            self.check.check(self.key, self.default)
        except StateTypeError:
            return True
        return False

    def make_default(self) -> Any:
        """
        The field's default value: the value itself, or the factory's result when ``default`` is a factory (a
        callable that is not itself a valid value of the declared type).

        :returns: The default value (not yet frozen).
        """
        if self._prebuilt:
            try:
                return self._prebuilt.pop()
            except IndexError:  # another thread took it
                pass
        return self.default() if self.default_is_factory else self.default

    def as_entry(self) -> dict[str, Any]:
        """The schema entry as a dict, in haystack's form plus the extras that are set."""
        entry: dict[str, Any] = {"type": self.type, "handler": self.handler}
        if self.has_default:
            entry["default"] = self.default if self.default_is_factory else thaw(self.default)
        if self.description is not None:
            entry["description"] = self.description
        if self.scope != "thread":
            entry["scope"] = self.scope
        if self.loader is not None:
            entry["loader"] = self.loader
        if not self.is_input:
            entry["input"] = False
        if not self.is_output:
            entry["output"] = False
        return entry


def _entry_problems(key: object, entry: object) -> list[str]:
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
    elif not is_type(entry["type"]):
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
    scope = entry.get("scope", "thread")
    if scope not in SCOPES:
        problems.append(f"Key '{key}': 'scope' must be one of {', '.join(map(repr, SCOPES))}, got {scope!r}.")
    elif key == "messages" and scope != "thread":
        problems.append("Key 'messages': its scope is always 'thread' (the conversation is kept across runs).")
    loader = entry.get("loader")
    if scope == "loaded" and not callable(loader):
        problems.append(
            f"Key '{key}': a 'loaded' field needs a 'loader': a callable loader(context, state) -> value, "
            f"got {loader!r}."
        )
    elif loader is not None and scope != "loaded":
        problems.append(f"Key '{key}': 'loader' is only for fields with \"scope\": \"loaded\" (scope is {scope!r}).")
    for view in ("input", "output"):
        if view in entry and not isinstance(entry[view], bool):
            problems.append(f"Key '{key}': '{view}' must be True or False, got {entry[view]!r}.")
        elif key == "messages" and entry.get(view, True) is False:
            problems.append(f"Key 'messages' is always an {view} of the Agent; '{view}': False is not allowed.")
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
        handler = same_handler(entry.get("handler"))
        default = entry.get("default", _MISSING)
        if default is not _MISSING and not callable(default):
            try:
                default = freeze(default)  # a private copy: changing the caller's object later changes nothing
            except Exception as exc:
                problems.append(f"Key '{key}': the default cannot be copied: {type(exc).__name__}: {exc}")
                continue
        spec = FieldSpec(
            key=key,
            type=tp,
            handler=handler if handler is not None else (merge_lists if is_list_type(tp) else replace_values),
            explicit_handler=handler is not None,
            default=default,
            description=entry.get("description"),
            scope=entry.get("scope", "thread"),
            loader=entry.get("loader"),
            is_input=entry.get("input", True),
            is_output=entry.get("output", True),
        )
        if spec.has_default:
            try:
                value = spec.make_default()
                spec.check.check(key, value)
                if spec.default_is_factory:
                    spec._prebuilt.append(value)
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
        try:
            entry: dict[str, Any] = {"type": serialize_type(spec.type), "handler": serialize_callable(spec.handler)}
            if spec.description is not None:
                entry["description"] = spec.description
            if spec.scope != "thread":
                entry["scope"] = spec.scope
            if spec.loader is not None:
                entry["loader"] = serialize_callable(spec.loader)
            if not spec.is_input:
                entry["input"] = False
            if not spec.is_output:
                entry["output"] = False
            if spec.has_default:
                if spec.default_is_factory:
                    if isinstance(spec.default, type):
                        entry["default_factory"] = serialize_type(spec.default)
                    else:
                        entry["default_factory"] = serialize_callable(spec.default)
                else:
                    default = thaw(spec.default)
                    if _is_json_native(default):
                        entry["default"] = default
                    else:
                        entry["default_serialized"] = _serialize_value_with_schema(default)
        except Exception as exc:
            raise StateSerializationError(f"The schema of state key '{key}' cannot be serialized: {exc}") from exc
        out[key] = entry
    return out


def _is_json_native(value: object) -> bool:
    """Whether ``value`` survives a JSON round trip unchanged (and so can be stored as it is)."""
    if value is None or type(value) in (str, int, float, bool):
        return True
    if type(value) is list:
        return all(_is_json_native(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _is_json_native(v) for k, v in value.items())
    return False


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
                item["default"] = deserialize_type(path) if "." not in str(path) else deserialize_callable(path)
            elif "default_serialized" in entry:
                item["default"] = _deserialize_value_with_schema(entry["default_serialized"])
            elif "default" in entry:
                item["default"] = entry["default"]
            if entry.get("loader"):
                item["loader"] = deserialize_callable(entry["loader"])
        except Exception as exc:
            raise StateSerializationError(f"Serialized schema key '{key}' cannot be loaded: {exc}") from exc
        if "description" in entry:
            item["description"] = entry["description"]
        for extra in ("scope", "input", "output"):
            if extra in entry:
                item[extra] = entry[extra]
        schema[key] = item
    return schema
