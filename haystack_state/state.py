"""
``State``: the typed, schema-driven scratchpad that tools read from and write to. A drop-in for haystack-ai's
``State`` with typed writes, a reducer library, O(1) appends and isolation without deep copies. Its staged views
(what a tool writes through) are :class:`StagedState`, here too; the ``to_dict`` format is in
:mod:`haystack_state._state_dict`.

Writes, and why one of them takes no lock
-----------------------------------------
Every write is made under the State's lock by the one write path, ``_write``, and every append (``merge_lists``
into a list key, whether the schema or a ``handler_override`` names it, through a ``State`` or a ``StagedState``) by
the one append path, ``_append``, both in :mod:`haystack_state._state_store`: it checks and freezes only the new
items and extends the stored list in place, so an append costs O(items appended). ``set`` on a key whose schema
handler is ``merge_lists`` calls ``_append`` itself (still under the lock), skipping ``_write``'s preamble (the
spec, the read-only check, the handler): ~110 ns of ~1.1 us per single-item append, 10%, so it stays.

One write skips the lock: replacing a ``replace_values`` key by an immutable scalar of a type the key has already
accepted (``state.set("name", "Ann")``). It is two single-item dict stores, the value then the journal entry, and
such a store is atomic *by contract*, in the free-threaded build too (the "thread safety guarantees" of ``dict``,
https://docs.python.org/3/library/threadsafety.html), not by GIL accident. Taking the lock there would triple the
cost of a replace (~0.1 us -> ~0.33 us) and miss the benchmark's "no slower than haystack-ai by 1.5x". What the
locked code does so that such a store is never lost and never breaks it:

- whatever iterates ``_values`` or ``_journal`` iterates over a ``copy()`` (atomic for a dict), since a lock-free
  store may add a key meanwhile;
- ``drain_changes`` pops the journal entries one by one before reading the values: a replace whose journal entry
  it popped had stored its value before, so the delta holds it; one it did not pop stays for the next drain;
- a locked read-modify-write (a handler) stores its result only if no lock-free store came since it read (see
  ``_write``), and a failed ``apply`` does not roll back a key a lock-free store changed after it (``_atomic``).

Appends always take the lock, so two threads appending at once lose no item (``tests/state/test_state.py``).

``benchmarks/bench_state.py`` (best of 3; this machine is shared and noisy, so compare the two columns of a row),
before this design and after, two runs each (2026-11-27):

==================================  ==============  ==============  =====================================
measurement                         before          after           haystack-ai, same runs
==================================  ==============  ==============  =====================================
50,000 single-item appends          73 / 78 ms      59 / 92 ms      2,000 - 2,600 ms
get of a 10,000-dict list (x20)     0.20 ms         0.21 ms         290 - 350 ms
10,000 replace sets                 1.07 ms         1.03 / 1.06 ms  1.08 - 1.34 ms
==================================  ==============  ==============  =====================================

The append rows swing with the machine's load; timed alone (the best of 200 runs of 5,000 appends, alternating the
two trees) an append costs 0.93 - 1.02 us before and 0.95 - 0.98 us after. Through ``_write`` (no shortcut in
``set``) it cost 1.15 us; a replace under the lock 0.33 us instead of 0.10 us.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from haystack_state._display import StateDiff, state_html, state_repr, value_sizes
from haystack_state._schema import FieldSpec, build_schema
from haystack_state._state_dict import state_from_dict, state_to_dict
from haystack_state._state_store import Delta, StateStore, Write
from haystack_state._state_store import Handler as Handler  # importable from here, as it always was
from haystack_state.errors import UnstorableValueError
from haystack_state.handlers import RESET
from haystack_state.values import FrozenList, freeze, read, thaw

__all__ = ["State", "StagedState"]

#: What :meth:`State.watch` returns: the stored value and its length (-1 if it is not a list).
Mark = tuple[object, int]


class State(StateStore):
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

    def __init__(self, schema: Mapping[str, Any], data: Mapping[str, object] | None = None) -> None:
        self._init(build_schema(schema), {}, {}, {})  # the one constructor path, StagedState's too
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

    # --- reading -----------------------------------------------------------------------------------

    @property
    def schema(self) -> dict[str, dict[str, Any]]:
        """The schema with the handlers filled in, ``messages`` included (a copy: editing it changes nothing)."""
        return {key: spec.as_entry() for key, spec in self._specs.items()}

    @property
    def specs(self) -> dict[str, FieldSpec]:
        """The normalised schema entries by key (a copy)."""
        return dict(self._specs)

    def get(self, key: str, default: object = None) -> Any:
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

    def view(self, key: str, default: object = None) -> Any:
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

    def last(self, key: str, default: object = None) -> Any:
        """
        The last item of a list key, without reading the rest (the state's own item: do not change it in place).

        :param key: The key.
        :param default: Returned when the key holds no value, or an empty list.
        :returns: The last item, or ``default``.
        """
        with self._lock:
            value = self._values.get(key)
            return value[-1] if isinstance(value, list) and value else default

    def watch(self, key: str) -> Mark:
        """
        A mark of a key's value as it is now, for :meth:`appended_since`.

        :param key: The key.
        :returns: An opaque mark.
        """
        with self._lock:
            value = self._values.get(key)
            return value, len(value) if type(value) is list else -1

    def appended_since(self, key: str, mark: Mark) -> list[Any] | None:
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
            values = self._values.copy()  # a lock-free replace may add a key meanwhile (see the module docstring)
            return {key: read(value, self._has_objects.get(key)) for key, value in values.items()}

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
        if handler_override is None:
            scalars = self._lock_free.get(key)
            if scalars is not None:
                kind = type(value)
                # Other text is checked on the locked path (freeze).
                if kind in scalars and (kind is not str or value.isascii()):
                    self._values[key] = value  # the value, then the journal: see drain_changes
                    self._journal[key] = None
                    return
            spec = self._appends.get(key)
            if spec is not None and value is not RESET:
                with self._lock:
                    if not self._append(key, value, spec):
                        self._write(key, value, None)
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

    def update(self, values: Mapping[str, object]) -> None:
        """
        Merge several values at once, atomically: either every write succeeds or the state is unchanged.

        :param values: key -> value, each merged with its key's handler.
        """
        self.apply([(key, value, None) for key, value in values.items()])

    def apply(self, writes: list[Write]) -> None:
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
            values = self._values.copy()
        return value_sizes(values)

    def has_changes(self) -> bool:
        """Whether any value changed since the last :meth:`drain_changes` (or since the state was built)."""
        return bool(self.peek_changes())

    def peek_changes(self, *, transient: bool = False) -> Delta:
        """
        What changed since the last :meth:`drain_changes` (or since the state was built), as a delta: per key,
        ``{"op": "extend", "items": [...]}`` (the key was only appended to: the new items), ``{"op": "replace",
        "value": ...}`` or ``{"op": "delete"}``. Checkpoints store this, so they grow with the change, not the state.
        Keys with ``"scope": "loaded"`` are never stored, so they are left out unless ``transient`` is true.

        :param transient: Include the changes of ``"loaded"`` keys too (for live events).

        :returns: The delta; the values are the state's read-only values.
        """
        with self._lock:
            return self._delta(self._journal.copy(), transient)

    def drain_changes(self) -> Delta:
        """
        Return the changes (see :meth:`peek_changes`) and start a new journal.

        :returns: The delta.
        """
        with self._lock:
            # Popped one by one, then the values read: see the module docstring (lock-free replaces).
            journal = {key: self._journal.pop(key) for key in list(self._journal.copy())}
            return self._delta(journal, False)

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
            self._derive_fast_writes()

    def unprotect(self) -> None:
        """Make every key writable again (see :meth:`protect`)."""
        with self._lock:
            if self._read_only:
                self._read_only = {}
                self._derive_fast_writes()

    def stage(self) -> StagedState:
        """
        A staged view of this state: reads see this state plus the staged writes; writes are checked at once but
        reach this state only on :meth:`StagedState.commit`, all or nothing. Tools receive such a view, so a
        tool that fails leaves the state untouched.

        :returns: The staged view.
        """
        return StagedState(self)

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
            values = {key: thaw(value) for key, value in self._values.copy().items() if key not in skip}
        return state_to_dict({key: spec for key, spec in self._specs.items() if key not in skip}, values)

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
        return state_from_dict(cls, data)

    def __repr__(self) -> str:
        with self._lock:
            return state_repr(type(self).__name__, self._specs, self._values.copy())

    def _repr_html_(self) -> str:
        with self._lock:
            return state_html(self._specs, self._values.copy())


class StagedState(State):
    """
    Writes staged on top of a parent :class:`State`, applied to it by :meth:`commit` all at once or not at all.
    It is a ``State`` (tools annotated ``state: State`` accept it) with the parent's schema.

    :param parent: The state to stage writes for.
    """

    _fast_writes = False  # every write goes through _write, which records it

    def __init__(self, parent: State) -> None:
        with parent._lock:
            # The parent's values are shared, not copied: its lists only grow in place, so the first `length` items
            # of each are this view's snapshot. A list is copied only when this view reads or writes it.
            self._init(parent._specs, parent._values.copy(), dict(parent._has_objects), parent._read_only)
            self._shared_lengths = {key: len(value) for key, value in self._values.items() if type(value) is list}
        self.parent = parent
        self.writes: list[Write] = []

    def _own(self, keys: Iterable[str]) -> None:
        """Take private copies of the parent's lists for ``keys``, cut at the length they had when staged."""
        for key in keys:
            length = self._shared_lengths.pop(key, None)
            if length is not None:
                self._values[key] = self._values[key][:length]

    def _own_all(self) -> None:
        with self._lock:
            self._own(list(self._shared_lengths))

    def get(self, key: str, default: object = None) -> Any:
        with self._lock:
            self._own((key,))
        return super().get(key, default)

    def view(self, key: str, default: object = None) -> Any:
        with self._lock:
            self._own((key,))
        return super().view(key, default)

    def watch(self, key: str) -> Mark:
        with self._lock:
            self._own((key,))
        return super().watch(key)

    def last(self, key: str, default: object = None) -> Any:
        with self._lock:
            self._own((key,))
        return super().last(key, default)

    @property
    def data(self) -> dict[str, Any]:
        self._own_all()
        return super().data

    def size(self) -> dict[str, int]:
        self._own_all()
        return super().size()

    def to_dict(self, skip_keys: list[str] | None = None) -> dict[str, Any]:
        self._own_all()
        return super().to_dict(skip_keys)

    def _write(self, key: str, value: object, handler_override: Handler | None) -> None:
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

    def apply(self, writes: list[Write]) -> None:
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
