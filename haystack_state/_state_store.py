"""
How a :class:`~haystack_state.state.State` stores its values: the lock, the journal of changes, the one write path
(``_write``), the one append path (``_append``), the undo of a failed batch (``_atomic``) and the tables of the
writes that skip parts of it.

``StateStore`` is the private base of ``State``: ``State`` adds the public methods (reading, writing, the journal,
protection, staging, serialisation). Why one replace skips the lock, and what makes that correct without the GIL,
is in :mod:`haystack_state.state`'s docstring.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import Any, ClassVar

from haystack_state._schema import FieldSpec, same_handler
from haystack_state.errors import ReadOnlyStateKeyError, StateHandlerError, UnknownStateKeyError, UnstorableValueError
from haystack_state.handlers import RESET, merge_lists, replace_values
from haystack_state.values import SHAREABLE, FrozenList, freeze, needs_copy_on_read, read

__all__ = ["Delta", "Handler", "StateStore", "Write"]

#: A merge handler: ``handler(current, new) -> merged``.
Handler = Callable[[Any, Any], Any]
#: A write as ``State.apply`` takes it: ``(key, value, handler_override)``.
Write = tuple[str, object, Handler | None]
#: A journal delta: per key ``{"op": "extend", "items": [...]}``, ``{"op": "replace", "value": ...}`` or
#: ``{"op": "delete"}`` (see ``State.peek_changes``).
Delta = dict[str, dict[str, Any]]


class StateStore:
    """The values of a State and the one path that writes them (the base of ``State``; see the module docstring)."""

    #: Whether ``set`` may skip ``_write`` (see the module docstring). A staged view records every write in
    #: ``_write``, so not.
    _fast_writes: ClassVar[bool] = True

    def _init(
        self,
        specs: dict[str, FieldSpec],
        values: dict[str, Any],
        has_objects: dict[str, bool],
        read_only: dict[str, str],
    ) -> None:
        """Set every field: the one constructor path of a ``State`` and of a ``StagedState``."""
        self._specs = specs
        self._values = values
        self._has_objects = has_objects  # list keys whose items read() must copy (see haystack_state.values)
        self._lock = threading.RLock()
        # What changed since the last drain_changes(), for checkpoints: per key, the list length before the first
        # append (the key was only appended to), or None (the key was replaced, reset or removed).
        self._journal: dict[str, int | None] = {}
        # Keys that refuse writes for now (an Agent run's "input" keys), with the reason the error gives.
        self._read_only = read_only
        self._derive_fast_writes()

    def _derive_fast_writes(self) -> None:
        """
        The writable keys whose writes ``set`` makes without ``_write``, derived from the schema and the read-only
        keys: the ``replace_values`` keys with the immutable types they accepted so far (lock-free replaces), and
        the list keys ``merge_lists`` appends to (straight to ``_append``).
        """
        lock_free: dict[str, set[type]] = {}
        appends: dict[str, FieldSpec] = {}
        for key, spec in self._specs.items() if self._fast_writes else ():
            if key in self._read_only:
                continue
            if spec.handler is replace_values:
                lock_free[key] = spec.check.accepted_scalars
            elif spec.handler is merge_lists and spec.is_list:
                appends[key] = spec
        # Whole tables, swapped in: a lock-free set() reads either the old one or the new one.
        self._lock_free = lock_free
        self._appends = appends

    def _spec(self, key: str) -> FieldSpec:
        try:
            return self._specs[key]
        except KeyError:
            raise UnknownStateKeyError(key, list(self._specs)) from None

    def _store(self, key: str, value: object) -> None:
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

    def _write(self, key: str, value: object, handler_override: Handler | None) -> None:
        """The one write path, the lock held: check, merge with the handler, store, journal."""
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
        if handler is merge_lists and spec.is_list and self._append(key, value, spec):
            return
        current = self._values.get(key)
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

    def _append(self, key: str, value: object, spec: FieldSpec) -> bool:
        """
        The one append path (``merge_lists`` into a list key), the lock held: check and freeze only the new items
        (``value``, or the items of a list ``value``), then extend the stored list in place.

        :returns: False, having changed nothing, if the key holds a value that is not a list (the handler merges).
        """
        current = self._values.get(key)
        if current is not None and type(current) is not list:
            return False
        check = spec.item_check
        if isinstance(value, list):
            if not check.is_any:
                for item in value:
                    if type(item) not in check.accepted:
                        check.check(key, item, spec.items_expected)
            try:
                frozen = [freeze(item) for item in value]
            except UnstorableValueError as exc:
                raise exc.for_key(key, value) from exc.__cause__
            has_objects = any(map(needs_copy_on_read, frozen))
        else:  # a single item: the common case of an agent appending one result at a time
            if type(value) not in check.accepted and not check.is_any:
                check.check(key, value, spec.items_expected)
            try:
                item = freeze(value)
            except UnstorableValueError as exc:
                raise exc.for_key(key, value) from exc.__cause__
            has_objects = type(item) not in SHAREABLE and needs_copy_on_read(item)
            if current is not None:  # the hot case, one item onto a list: append rather than extend
                self._journal.setdefault(key, len(current))
                current.append(item)
                if has_objects:
                    self._has_objects[key] = True
                return True
            frozen = [item]
        if current is None:
            self._values[key] = frozen
            self._has_objects[key] = has_objects
            self._journal[key] = None
        else:
            self._journal.setdefault(key, len(current))
            current += frozen
            if has_objects:
                self._has_objects[key] = True
        return True

    @contextmanager
    def _atomic(self, keys: AbstractSet[str]) -> Iterator[dict[str, object]]:
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
        written: dict[str, object] = {}
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

    def _delta(self, journal: Mapping[str, int | None], transient: bool) -> Delta:
        """The delta of the journal entries ``journal`` (the lock held), ``"loaded"`` keys only if ``transient``."""
        delta: Delta = {}
        for key, start in journal.items():
            if not transient and self._specs[key].scope == "loaded":  # computed at every run: never stored
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
