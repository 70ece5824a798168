"""
``State``: the typed, schema-driven scratchpad that tools read from and write to. A drop-in for haystack-ai's
``State`` with typed writes, a reducer library, O(1) appends and isolation without deep copies.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import Any

from haystack import logging
from haystack.utils import _deserialize_value_with_schema, _serialize_value_with_schema

from haystack_state.display import StateDiff, state_html, state_repr
from haystack_state.errors import (
    ReadOnlyStateKeyError,
    StateHandlerError,
    StateSchemaError,
    StateSerializationError,
    StateTypeError,
    UnknownStateKeyError,
    UnstorableValueError,
)
from haystack_state.handlers import RESET, merge_lists, replace_values
from haystack_state.schema import (
    FieldSpec,
    build_schema,
    same_handler,
    schema_from_dict,
    schema_to_dict,
    type_check,
    type_name,
)
from haystack_state.values import SHAREABLE, FrozenList, freeze, needs_copy_on_read, read, thaw, to_jsonable

__all__ = ["State", "StagedState"]

logger = logging.getLogger(__name__)

Handler = Callable[[Any, Any], Any]


def _items_of(spec: FieldSpec) -> str:
    """How a type error on one appended item names what the key expects: ``items of type str (list[str])``."""
    return f"items of type {spec.item_check.name} ({type_name(spec.type)})"


class State:
    """
    A container for the information an Agent and its tools share: typed, merged by handlers, isolated.

    The schema maps each key to ``{"type": T, "handler": fn, "default": value_or_factory, "description": str}``;
    only ``type`` is required. The handler defaults to ``merge_lists`` for list types and ``replace_values``
    otherwise. A ``messages: list[ChatMessage]`` key is added unless the schema declares one.

    Every write is checked against the key's type (nothing is coerced) and changes nothing when it fails.
    Appends through ``merge_lists`` cost O(items appended). ``get`` and ``data`` never deep-copy: they hand out a
    fresh top-level list/dict whose contents are read-only, so nothing a caller does to a value it read can
    change the state (see ``haystack_state.values``). All methods are thread-safe.

    ### Usage example
    ```python
    from haystack_state import State

    state = State(schema={"documents": {"type": list}, "user_name": {"type": str}})
    state.set("documents", [1, 2])
    state.set("documents", [3, 4])
    state.get("documents")         # [1, 2, 3, 4]
    state.set("user_name", "Alice")
    state.set("user_name", "Bob")
    state.get("user_name")         # "Bob"
    ```

    :param schema: The schema: key -> entry.
    :param data: Initial values. They are checked against the schema but not passed through handlers.
    :raises StateSchemaError: If the schema is invalid (every problem listed).
    :raises StateTypeError: If an initial value does not match its key's type.
    :raises UnknownStateKeyError: If ``data`` holds a key the schema does not declare.
    """

    def __init__(self, schema: Mapping[str, Any], data: Mapping[str, Any] | None = None) -> None:
        self._init(build_schema(schema))
        initial = dict(data or {})
        for key in initial:
            self._spec(key)
        for key, value in initial.items():
            self._specs[key].check.check(key, value)
        for key, value in initial.items():
            self._store(key, value)
        for key, spec in self._specs.items():
            if key not in self._values and spec.has_default:
                default = spec.make_default()
                spec.check.check(key, default)
                self._store(key, default)

    def _init(self, specs: dict[str, FieldSpec]) -> None:
        self._specs = specs
        self._values: dict[str, Any] = {}
        self._has_objects: dict[str, bool] = {}
        self._lock = threading.RLock()
        # What changed since the last drain_changes(), for checkpoints: per key, the list length before the first
        # append (the key was only appended to), or None (the key was replaced, reset or removed).
        self._journal: dict[str, int | None] = {}
        # Keys that refuse writes for now (an Agent run's "input" keys), with the reason the error gives; and keys
        # whose changes are never journaled for a checkpoint (an Agent's "loaded" keys, computed at every run).
        self._read_only: dict[str, str] = {}
        self._transient: frozenset[str] = frozenset(key for key, spec in specs.items() if spec.scope == "loaded")
        # Keys written by replace_values, with the immutable value types already accepted for them: such a write
        # is one atomic store and skips the lock (see ``set``).
        self._fast_types: dict[str, set[type]] = {
            key: spec.check.accepted_scalars for key, spec in specs.items() if spec.handler is replace_values
        }
        # Keys appended to by merge_lists, with the check of their items and how its errors name the item type.
        self._appenders: dict[str, tuple[set[type], Callable[[str, Any, str | None], None], str]] = {
            key: (spec.item_check.accepted, spec.item_check.check, _items_of(spec))
            for key, spec in specs.items()
            if spec.handler is merge_lists and spec.is_list
        }

    # --- reading -----------------------------------------------------------------------------------

    @property
    def schema(self) -> dict[str, dict[str, Any]]:
        """The schema with the handlers filled in, ``messages`` included (a copy: editing it changes nothing)."""
        return {key: spec.as_entry() for key, spec in self._specs.items()}

    @property
    def specs(self) -> dict[str, FieldSpec]:
        """The normalised schema entries by key (a copy)."""
        return dict(self._specs)

    def get(self, key: str, default: Any = None) -> Any:
        """
        Read a value.

        Lists and dicts come back as fresh top-level containers (one shallow copy, no deep copy); what is nested
        inside them is read-only. Use ``haystack_state.thaw(value)`` for a fully mutable copy.

        :param key: The key to read.
        :param default: Returned when the key holds no value (or is not in the schema, as in haystack-ai).
        :returns: The value, or ``default``.
        """
        with self._lock:
            if key not in self._values:
                return default
            return read(self._values[key], self._has_objects.get(key))

    def view(self, key: str, default: Any = None) -> Any:
        """
        Read a value without copying anything inside it: a list comes back as a read-only list (``FrozenList``)
        sharing the stored items, everything else as it is stored (read-only containers, frozen values). The cost
        does not depend on how big the items are, only on the length of a list.

        Unlike :meth:`get`, the objects inside are the state's own: objects such as ``ChatMessage`` or ``Document``
        must not be changed in place (haystack warns when one is). Hooks and context policies read the
        conversation this way.

        :param key: The key to read.
        :param default: Returned when the key holds no value.
        :returns: The value, or ``default``.
        """
        with self._lock:
            if key not in self._values:
                return default
            value = self._values[key]
            return FrozenList(value) if type(value) is list else value

    def last(self, key: str, default: Any = None) -> Any:
        """
        The last item of a list key, without reading the rest (the state's own item: do not change it in place).

        :param key: The key.
        :param default: Returned when the key holds no value, or an empty list.
        :returns: The last item, or ``default``.
        """
        with self._lock:
            value = self._values.get(key)
            return value[-1] if isinstance(value, list) and value else default

    def watch(self, key: str) -> tuple[Any, int]:
        """
        A mark of a key's value as it is now, for :meth:`appended_since`.

        :param key: The key.
        :returns: An opaque mark.
        """
        with self._lock:
            value = self._values.get(key)
            return value, len(value) if type(value) is list else -1

    def appended_since(self, key: str, mark: tuple[Any, int]) -> list[Any] | None:
        """
        What was appended to a list key since :meth:`watch` gave ``mark``, without reading the rest: lets a reader
        that keeps its own copy of a long list (the agent loop, for the conversation) follow it in O(new items).

        :param key: The key.
        :param mark: A mark of the same key.
        :returns: The appended items (the state's own, read-only), or None if the value was replaced, reset or is not
            a list (then read it again whole).
        """
        stored, length = mark
        with self._lock:
            value = self._values.get(key)
            if value is not stored or type(value) is not list or len(value) < length:
                return None
            return value[length:]

    def has(self, key: str) -> bool:
        """
        Whether the key holds a value.

        :param key: The key.
        :returns: True if the key was set, given initial data or a default.
        """
        return key in self._values

    @property
    def data(self) -> dict[str, Any]:
        """A snapshot of every value, read as ``get`` reads them. Later writes do not change it."""
        with self._lock:
            return {key: read(value, self._has_objects.get(key)) for key, value in self._values.items()}

    def keys(self) -> list[str]:
        """The keys the schema declares, ``messages`` included."""
        return list(self._specs)

    # --- writing -----------------------------------------------------------------------------------

    def set(self, key: str, value: Any, handler_override: Handler | None = None) -> None:
        """
        Merge ``value`` into ``key`` with the key's handler (or ``handler_override``), after checking its type.

        Writing ``RESET`` restores the key's initial value (see :meth:`reset`). On any error the state is
        unchanged.

        :param key: The key to write; it must be in the schema.
        :param value: The value to merge. For ``merge_lists`` keys, an item or a list of items.
        :param handler_override: A handler to use for this write instead of the schema's.
        :raises UnknownStateKeyError: If the key is not in the schema (the error lists the known keys).
        :raises StateTypeError: If the value (or, for ``merge_lists``, an item) does not match the key's type.
        :raises StateHandlerError: If the handler raises.
        :raises TypeError: If ``handler_override`` is not callable.
        """
        fast = self._fast_types.get(key)
        kind = type(value)
        if (
            fast is not None
            and handler_override is None
            and kind in fast
            and (kind is not str or value.isascii())  # other text is checked on the locked path (freeze)
        ):
            # An immutable value of a type this key already accepted, replacing the old one: a single dict store,
            # atomic under the GIL, so it needs no lock. Locked writers re-check before they store (see _write).
            self._values[key] = value
            self._journal[key] = None
            return
        appender = self._appenders.get(key)
        if appender is not None and handler_override is None and value is not RESET:
            # merge_lists into a list key: check and freeze only the new items, then append in place.
            accepted, check, items_of = appender
            if isinstance(value, list):
                for each in value:
                    if type(each) not in accepted:
                        check(key, each, items_of)
                try:
                    frozen = [freeze(each) for each in value]
                except UnstorableValueError as exc:
                    raise exc.for_key(key, value) from exc.__cause__
                has_objects = any(map(needs_copy_on_read, frozen))
                with self._lock:
                    current = self._values.get(key)
                    if type(current) is list:
                        self._journal.setdefault(key, len(current))
                        current += frozen
                        if has_objects:
                            self._has_objects[key] = True
                        return
                    if current is None:
                        self._values[key] = frozen
                        self._has_objects[key] = has_objects
                        self._journal[key] = None
                        return
            else:  # a single item: the common case of an agent appending one result at a time
                if kind not in accepted:
                    check(key, value, items_of)
                try:
                    item = freeze(value)
                except UnstorableValueError as exc:
                    raise exc.for_key(key, value) from exc.__cause__
                has_objects = type(item) not in SHAREABLE and needs_copy_on_read(item)
                with self._lock:
                    current = self._values.get(key)
                    if type(current) is list:
                        self._journal.setdefault(key, len(current))
                        current.append(item)
                        if has_objects:
                            self._has_objects[key] = True
                        return
                    if current is None:
                        self._values[key] = [item]
                        self._has_objects[key] = has_objects
                        self._journal[key] = None
                        return
        with self._lock:
            self._write(key, value, handler_override)

    def reset(self, key: str) -> None:
        """
        Restore a key's initial value: its ``default`` if the schema declares one, otherwise no value at all
        (``has(key)`` is False and ``get(key)`` returns its default argument).

        :param key: The key to reset.
        :raises UnknownStateKeyError: If the key is not in the schema.
        """
        with self._lock:
            self._write(key, RESET, None)

    def update(self, values: Mapping[str, Any]) -> None:
        """
        Merge several values at once, atomically: either every write succeeds or the state is unchanged.

        :param values: key -> value, each merged with its key's handler.
        """
        self.apply([(key, value, None) for key, value in values.items()])

    def apply(self, writes: list[tuple[str, Any, Handler | None]]) -> None:
        """
        Apply ``(key, value, handler_override)`` writes in order, atomically: if one fails, the ones before it are
        undone and the error propagates.

        :param writes: The writes, as ``set`` takes them.
        """
        with self._lock, self._atomic({key for key, _, _ in writes}) as written:
            for key, value, handler in writes:
                self._write(key, value, handler)
                written[key] = self._values.get(key)

    def diff(self, other: State) -> StateDiff:
        """
        What differs from this state to ``other``: ``{key: (value here, value there)}`` for each key whose values
        differ (``None`` where a key holds no value). Prints one line per key; renders as a table in notebooks.

        :param other: The state to compare with (for example a later checkpoint's).
        :returns: The differences.
        """
        mine, theirs = self.data, other.data
        keys = list(self._specs) + [key for key in other._specs if key not in self._specs]
        return StateDiff({key: (mine.get(key), theirs.get(key)) for key in keys if mine.get(key) != theirs.get(key)})

    def size(self) -> dict[str, int]:
        """
        The bytes each key holds, measured as the UTF-8 length of its JSON rendering: roughly what the value costs
        in a prompt or a checkpoint. Shows which key is growing before the state outgrows a model's context.

        :returns: key -> bytes, largest first; keys without a value are left out.
        """
        with self._lock:
            values = dict(self._values)
        sizes = {}
        for key, value in values.items():
            try:
                text = json.dumps(to_jsonable(value), ensure_ascii=False, default=str)
            except (TypeError, ValueError):
                text = str(value)
            sizes[key] = len(text.encode("utf-8"))
        return dict(sorted(sizes.items(), key=lambda item: item[1], reverse=True))

    def has_changes(self) -> bool:
        """Whether any value changed since the last :meth:`drain_changes` (or since the state was built)."""
        return bool(self.peek_changes())

    def peek_changes(self, *, transient: bool = False) -> dict[str, dict[str, Any]]:
        """
        What changed since the last :meth:`drain_changes` (or since the state was built), as a delta: per key,
        ``{"op": "extend", "items": [...]}`` (the key was only appended to: the new items), ``{"op": "replace",
        "value": ...}`` or ``{"op": "delete"}``. Checkpoints store this, so they grow with the change, not the state.
        Keys with ``"scope": "loaded"`` are never stored, so they are left out unless ``transient`` is true.

        :param transient: Include the changes of ``"loaded"`` keys too (for live events).

        :returns: The delta; the values are the state's read-only values.
        """
        delta: dict[str, dict[str, Any]] = {}
        with self._lock:
            for key, start in self._journal.items():
                if key in self._transient and not transient:
                    continue
                if key not in self._values:
                    delta[key] = {"op": "delete"}
                    continue
                value = self._values[key]
                if start is None:
                    delta[key] = {"op": "replace", "value": list(value) if type(value) is list else value}
                elif len(value) > start:
                    delta[key] = {"op": "extend", "items": value[start:]}
        return delta

    def drain_changes(self) -> dict[str, dict[str, Any]]:
        """
        Return the changes (see :meth:`peek_changes`) and start a new journal.

        :returns: The delta.
        """
        with self._lock:
            delta = self.peek_changes()
            self._journal.clear()
            return delta

    def protect(self, keys: Mapping[str, str]) -> None:
        """
        Make keys read-only until :meth:`unprotect`: a write or reset raises ``ReadOnlyStateKeyError`` with the given
        reason, and the state is unchanged. An Agent protects its ``"scope": "input"`` keys while a run is under way;
        staged views (what tools write through) inherit it.

        :param keys: key -> the reason the error gives (what the key is and who may set it).
        """
        for key in keys:
            self._spec(key)
        with self._lock:
            self._read_only = {**self._read_only, **keys}
            self._fast_types = {k: v for k, v in self._fast_types.items() if k not in keys}
            self._appenders = {k: v for k, v in self._appenders.items() if k not in keys}

    def unprotect(self) -> None:
        """Make every key writable again (see :meth:`protect`)."""
        with self._lock:
            if not self._read_only:
                return
            self._read_only = {}
            self._fast_types = {
                key: spec.check.accepted_scalars for key, spec in self._specs.items() if spec.handler is replace_values
            }
            self._appenders = {
                key: (spec.item_check.accepted, spec.item_check.check, _items_of(spec))
                for key, spec in self._specs.items()
                if spec.handler is merge_lists and spec.is_list
            }

    def stage(self) -> StagedState:
        """
        A staged view of this state: reads see this state plus the staged writes; writes are checked at once but
        reach this state only on :meth:`StagedState.commit`, all or nothing. Tools receive such a view, so a
        tool that fails leaves the state untouched.

        :returns: The staged view.
        """
        return StagedState(self)

    # --- internals -----------------------------------------------------------------------------------

    def _spec(self, key: str) -> FieldSpec:
        try:
            return self._specs[key]
        except KeyError:
            raise UnknownStateKeyError(key, list(self._specs)) from None

    def _store(self, key: str, value: Any) -> None:
        """Store an already-checked whole value."""
        spec = self._specs[key]
        try:
            if isinstance(value, FrozenList) and spec.is_list:  # frozen already (a checkpoint's): items shared
                self._journal[key] = None
                self._values[key] = list(value)
                self._has_objects[key] = value.has_objects
            elif spec.is_list and isinstance(value, list):
                items = [freeze(item) for item in value]
                self._journal[key] = None
                self._values[key] = items
                self._has_objects[key] = any(map(needs_copy_on_read, items))
            else:
                frozen = freeze(value)
                self._journal[key] = None
                self._values[key] = frozen
        except UnstorableValueError as exc:
            raise exc.for_key(key, value) from exc.__cause__

    def _write(self, key: str, value: Any, handler_override: Handler | None) -> None:
        spec = self._spec(key)
        if self._read_only and key in self._read_only:
            raise ReadOnlyStateKeyError(key, self._read_only[key])
        if handler_override is not None and not callable(handler_override):
            raise TypeError(f"handler_override for state key '{key}' must be callable, got {handler_override!r}.")
        if value is RESET:
            default = spec.make_default() if spec.has_default else None
            if spec.has_default:
                spec.check.check(key, default)
            self._values.pop(key, None)
            self._has_objects.pop(key, None)
            self._journal[key] = None
            if spec.has_default:
                self._store(key, default)
            return
        handler = same_handler(handler_override) if handler_override is not None else spec.handler
        current = self._values.get(key)
        if handler is merge_lists and spec.is_list and (current is None or type(current) is list):
            items = value if isinstance(value, list) else [value]
            check = spec.item_check.check
            items_of = _items_of(spec)
            for item in items:
                check(key, item, items_of)
            try:
                frozen = [freeze(item) for item in items]
            except UnstorableValueError as exc:
                raise exc.for_key(key, value) from exc.__cause__
            has_objects = any(map(needs_copy_on_read, frozen))
            if current is None:
                self._values[key] = frozen
                self._has_objects[key] = has_objects
                self._journal[key] = None
            else:
                self._journal.setdefault(key, len(current))
                current.extend(frozen)
                if has_objects:
                    self._has_objects[key] = True
            return
        while True:
            readable = None if key not in self._values else read(current, self._has_objects.get(key))
            try:
                merged = handler(readable, value)
            except Exception as exc:
                name = str(getattr(handler, "__qualname__", None) or getattr(handler, "__name__", repr(handler)))
                raise StateHandlerError(key, name, exc) from exc
            spec.check.check(key, merged)
            if self._values.get(key) is current:  # no lock-free store slipped in while the handler ran
                self._store(key, merged)
                return
            current = self._values.get(key)

    @contextmanager
    def _atomic(self, keys: AbstractSet[str]) -> Iterator[dict[str, Any]]:
        """
        Undo every change the block makes to ``keys`` if it raises. The block records in the yielded dict what it
        stored last for each key it changed; only those keys are restored, and a key whose value has changed
        since (a lock-free store that came later) keeps that later value. Keys the block did not change are left
        alone: a lock-free store to one of them while the block ran is not lost.
        """
        saved = {}
        for key in keys:
            if key in self._values:
                value = self._values[key]
                length = len(value) if type(value) is list else None
                saved[key] = (value, length, self._has_objects.get(key))
        written: dict[str, Any] = {}
        try:
            yield written
        except BaseException:
            for key in written:
                if self._values.get(key) is not written[key]:
                    continue
                if key in saved:
                    value, length, has_objects = saved[key]
                    if length is not None:
                        del value[length:]
                    self._values[key] = value
                    if has_objects is not None:
                        self._has_objects[key] = has_objects
                else:
                    self._values.pop(key, None)
                    self._has_objects.pop(key, None)
            raise

    # --- serialisation and display --------------------------------------------------------------------

    def to_dict(self, skip_keys: list[str] | None = None) -> dict[str, Any]:
        """
        Serialise the schema and the values, in haystack-ai's format.

        As in haystack-ai, a value that cannot be serialised is left out (its key stays in the schema), with a
        warning naming the key, so that one live object does not lose the rest of the state. Durable threads do
        not go through here: a checkpoint refuses such a value (``CodecError``) rather than drop it.

        :param skip_keys: Keys to leave out of the serialization (schema and value), as in haystack-ai.
        :returns: ``{"schema": ..., "data": ...}``.
        :raises StateSerializationError: If a handler or a default factory cannot be serialised (the error names
            the key).
        """
        skip = set(skip_keys or ())
        with self._lock:
            values = {key: thaw(value) for key, value in self._values.items() if key not in skip}
        specs = {key: spec for key, spec in self._specs.items() if key not in skip}
        schema = schema_to_dict(specs)
        data = {}
        for key, value in values.items():
            try:
                data[key] = _serialize_value_with_schema(value)
            except Exception as exc:
                logger.warning(
                    "Failed to serialize the '{field_name}' field of the agent's State data. The field will be "
                    "omitted from the snapshot. Error: {error}",
                    field_name=key,
                    error=exc,
                )
        return {"schema": schema, "data": self._merge_serialized(data)}

    @staticmethod
    def _merge_serialized(per_key: dict[str, dict[str, Any]]) -> dict[str, Any]:
        properties = {key: item["serialization_schema"] for key, item in per_key.items()}
        return {
            "serialization_schema": {"type": "object", "properties": properties},
            "serialized_data": {key: item["serialized_data"] for key, item in per_key.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> State:
        """
        Rebuild a State from :meth:`to_dict` output (or haystack-ai's ``State.to_dict``). Returns ``cls``.

        Values are checked against the schema like initial data; where JSON lost a type the declared type can
        restore (a ``Counter`` stored as an object, ...), the value is converted back.

        :param data: The serialised state.
        :returns: An instance of ``cls``.
        :raises StateSerializationError: If the input is malformed: not a dict, a schema that cannot be loaded or
            is invalid, a ``data`` entry that is not a serialized object, a value under a key the schema does not
            declare or of the wrong type. The cause is chained.
        """
        if not isinstance(data, Mapping) or "schema" not in data:
            raise StateSerializationError("State.from_dict expects a dict with 'schema' and 'data' entries.")
        schema = schema_from_dict(data["schema"])
        raw = data.get("data") or {}
        try:
            values = _deserialize_value_with_schema(raw) if raw else {}
        except Exception as exc:
            raise StateSerializationError(f"State.from_dict cannot read the 'data' entry: {exc}") from exc
        if not isinstance(values, dict):
            raise StateSerializationError(f"State.from_dict: 'data' must hold an object, got {type(values).__name__}.")
        try:
            for key, value in values.items():
                entry = schema.get(key)
                if isinstance(entry, Mapping) and "type" in entry:
                    values[key] = type_check(entry["type"]).convert(key, value)
            return cls(schema, values)
        except (StateSchemaError, StateTypeError, UnknownStateKeyError, TypeError) as exc:
            raise StateSerializationError(f"State.from_dict: {exc}") from exc

    def __repr__(self) -> str:
        with self._lock:
            return state_repr(type(self).__name__, self._specs, self._values)

    def _repr_html_(self) -> str:
        with self._lock:
            return state_html(self._specs, self._values)


class StagedState(State):
    """
    Writes staged on top of a parent :class:`State`, applied to it by :meth:`commit` all at once or not at all.
    It is a ``State`` (tools annotated ``state: State`` accept it) with the parent's schema.

    :param parent: The state to stage writes for.
    """

    def __init__(self, parent: State) -> None:
        with parent._lock:
            # What _init sets, taken from the parent (a view is made per tool call: nothing is derived again).
            self._specs = parent._specs
            self._lock = threading.RLock()
            self._journal = {}
            # The parent's values are shared, not copied: its lists only grow in place, so the first `length` items
            # of each are this view's snapshot. A list is copied only when this view reads or writes it.
            self._values = dict(parent._values)
            self._has_objects = dict(parent._has_objects)
            self._shared_lengths = {key: len(value) for key, value in self._values.items() if type(value) is list}
        self._fast_types = {}  # every write goes through _write, which records it
        self._appenders = {}
        self._read_only = parent._read_only
        self._transient = parent._transient
        self.parent = parent
        self.writes: list[tuple[str, Any, Handler | None]] = []

    def _own(self, keys: Iterable[str]) -> None:
        """Take private copies of the parent's lists for ``keys``, cut at the length they had when staged."""
        for key in keys:
            length = self._shared_lengths.pop(key, None)
            if length is not None:
                self._values[key] = self._values[key][:length]

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            self._own((key,))
        return super().get(key, default)

    def view(self, key: str, default: Any = None) -> Any:
        with self._lock:
            self._own((key,))
        return super().view(key, default)

    def watch(self, key: str) -> tuple[Any, int]:
        with self._lock:
            self._own((key,))
        return super().watch(key)

    def last(self, key: str, default: Any = None) -> Any:
        with self._lock:
            self._own((key,))
        return super().last(key, default)

    @property
    def data(self) -> dict[str, Any]:
        with self._lock:
            self._own(list(self._shared_lengths))
        return super().data

    def size(self) -> dict[str, int]:
        with self._lock:
            self._own(list(self._shared_lengths))
        return super().size()

    def to_dict(self, skip_keys: list[str] | None = None) -> dict[str, Any]:
        with self._lock:
            self._own(list(self._shared_lengths))
        return super().to_dict(skip_keys)

    def _write(self, key: str, value: Any, handler_override: Handler | None) -> None:
        self._own((key,))
        if value is not RESET:
            # Record a private, read-only copy: a caller that changes its object after set() cannot change what
            # commit() applies.
            try:
                value = freeze(value)
            except UnstorableValueError as exc:
                raise exc.for_key(key, value) from exc.__cause__
        super()._write(key, value, handler_override)
        self.writes.append((key, value, handler_override))

    def apply(self, writes: list[tuple[str, Any, Handler | None]]) -> None:
        """
        Stage ``(key, value, handler_override)`` writes, atomically: if one fails, none of them is staged.

        :param writes: The writes, as ``set`` takes them.
        """
        with self._lock:
            self._own(key for key, _, _ in writes)  # before apply saves the values it would restore
            staged = len(self.writes)
            try:
                super().apply(writes)
            except BaseException:
                del self.writes[staged:]
                raise

    def commit(self) -> None:
        """
        Apply the staged writes to the parent state, in order, all or nothing.

        :raises StateTypeError: If a write no longer fits (the parent is unchanged).
        :raises StateHandlerError: If a handler raises (the parent is unchanged).
        """
        self.parent.apply(self.writes)
        self.writes = []
