"""
The abstract :class:`Checkpointer` that every storage backend implements, and the helpers the backends share.

The record types (:class:`CheckpointMeta`, :class:`Checkpoint`, :class:`ThreadInfo`, :class:`StoredCheckpoint`) live
in :mod:`haystack_state.persistence.records` and are re-exported here.

A *thread* is a tree of checkpoints whose *head* is the latest one. Each checkpoint stores only its *delta* (the
operations on the keys it changed, see :mod:`haystack_state.persistence.delta`), so what a commit writes does not
grow with the thread. Reading a checkpoint walks its ancestors, folds their deltas into one (root first; see
:func:`~haystack_state.persistence.delta.compose_deltas`) and decodes what survives, once. To keep reading the head
of a long thread cheap, each checkpointer caches the materialized state of the last head it read or wrote per thread,
decoded and frozen (see :mod:`haystack_state.persistence.cache`); a commit advances it by decoding only its own
delta. A checkpoint never changes once written, so a cached state is valid for as long as its checkpoint exists, and
a read only fetches the deltas between the cached checkpoint and the one asked for.

Backends implement a handful of storage primitives (the ``_read_*``, ``_insert``, ``_delete`` and ``_close``
methods); everything else - encoding, validation, materialization, caching, error messages - lives here.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from haystack.core.errors import SerializationError

from haystack_state.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CodecError,
    ThreadConflictError,
    ThreadNotFoundError,
)
from haystack_state.persistence.cache import HeadCache, apply_frozen, freeze_delta, freeze_state, fresh_copy
from haystack_state.persistence.codec import decode, encode, from_json, to_json
from haystack_state.persistence.delta import (
    SOURCES,
    Delta,
    ExtendError,
    Source,
    check_extends,
    compose_deltas,
    encode_delta,
    new_checkpoint_id,
    utc_now,
    validate_delta,
)
from haystack_state.persistence.records import ChainLink, Checkpoint, CheckpointMeta, StoredCheckpoint, ThreadInfo

__all__ = [
    "ChainLink",
    "Checkpoint",
    "CheckpointMeta",
    "Checkpointer",
    "StoredCheckpoint",
    "ThreadInfo",
    "check_commit",
    "conflict_error",
    "corrupt_error",
]


def conflict_error(thread_id: str, expected_head: str | None, actual_head: str | None) -> ThreadConflictError:
    """
    Build the error for a commit whose expected head is not the thread's head.

    :param thread_id: The thread.
    :param expected_head: The head the commit expected.
    :param actual_head: The thread's actual head (None if the thread does not exist).
    """
    if actual_head is None:
        what = f"Thread '{thread_id}' does not exist (any more), but the commit expected head '{expected_head}'"
    elif expected_head is None:
        what = f"Thread '{thread_id}' already exists with head '{actual_head}', but the commit expected a new thread"
    else:
        what = f"Thread '{thread_id}' has head '{actual_head}', but the commit expected '{expected_head}'"
    return ThreadConflictError(f"{what}: another run committed first. Nothing was written; reload and retry.")


def check_commit(
    row: StoredCheckpoint, expected_head: str | None, actual_head: str | None, parent_exists: Callable[[], bool]
) -> None:
    """
    Check a commit against the thread as it is inside the backend's write transaction.

    :param row: The checkpoint to insert.
    :param expected_head: The head the caller expects.
    :param actual_head: The thread's head (None if the thread does not exist).
    :param parent_exists: Tells whether ``row.parent_id`` is a checkpoint of the thread (called only for a fork: the
        head exists by definition).
    :raises ThreadConflictError: If the head is not the expected one.
    :raises CheckpointNotFoundError: If the parent is not a checkpoint of the thread.
    :raises CheckpointError: If a checkpoint without parent is committed to an existing thread.
    """
    if actual_head != expected_head:
        raise conflict_error(row.thread_id, expected_head, actual_head)
    if row.parent_id is None:
        if actual_head is not None:
            raise CheckpointError(
                f"Thread '{row.thread_id}' already has checkpoints: a commit to it needs a parent_id "
                f"(its head is '{actual_head}')."
            )
    elif actual_head is None or (row.parent_id != actual_head and not parent_exists()):
        raise CheckpointNotFoundError(row.thread_id, row.parent_id)


def corrupt_error(thread_id: str, checkpoint_id: str, error: Exception) -> CodecError:
    """
    Build the error for stored data that cannot be read.

    :param thread_id: The thread.
    :param checkpoint_id: The checkpoint whose stored data is at fault.
    :param error: What went wrong.
    """
    return CodecError(f"Thread '{thread_id}', checkpoint '{checkpoint_id}': stored data is unreadable: {error}")


def _parse_delta(thread_id: str, link: ChainLink) -> dict[str, Any]:
    try:
        delta = from_json(link.delta)
        validate_delta(delta)
    except ValueError as error:  # CodecError is a ValueError too
        raise corrupt_error(thread_id, link.checkpoint_id, error) from None
    return dict(delta)


def _parse_deltas(thread_id: str, chain: list[ChainLink]) -> list[tuple[str, dict[str, Any]]]:
    """Parse and validate the deltas of a chain: as one JSON array (one parser call), or one by one to find a fault."""
    try:
        deltas = from_json("[" + ",".join(link.delta for link in chain) + "]")
        if len(deltas) == len(chain):
            for delta in deltas:
                validate_delta(delta)
            return [(link.checkpoint_id, delta) for link, delta in zip(chain, deltas, strict=True)]
    except ValueError:
        pass
    return [(link.checkpoint_id, _parse_delta(thread_id, link)) for link in chain]


def _decode_op_values(op: Mapping[str, Any], key: str) -> dict[str, Any]:
    if op["op"] == "extend":
        return {"op": "extend", "items": decode(op.get("items"), key=key)}
    if op["op"] == "replace":
        return {"op": "replace", "value": decode(op.get("value"), key=key)}
    return {"op": "delete"}


@dataclasses.dataclass(frozen=True)
class _Materialized:
    """A materialized state: frozen (maybe shared with the cache), or freshly decoded and owned by no one."""

    frozen: dict[str, Any] | None
    plain: dict[str, Any] | None


class Checkpointer(abc.ABC):
    """
    Durable storage of state checkpoints, organized in threads. Thread-safe; usable as a context manager.

    :param cache_size: How many threads' head states to keep materialized in memory, decoded (0 disables the cache).
    """

    def __init__(self, *, cache_size: int = 64) -> None:
        self._cache = HeadCache(cache_size)
        self._closed = False

    # --- public API -------------------------------------------------------------------------------------------

    def commit(
        self,
        thread_id: str,
        *,
        parent_id: str | None,
        expected_head: str | None,
        delta: Delta,
        step: int,
        source: Source,
        tool_names: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
    ) -> CheckpointMeta:
        """
        Write a checkpoint atomically: all of it, or (on any error) nothing.

        Values are encoded before anything is written. ``parent_id`` may differ from ``expected_head``: that forks
        the thread from an earlier checkpoint; the new checkpoint becomes the head and the old branch stays readable.

        :param thread_id: The thread.
        :param parent_id: The checkpoint this one follows; None for the first checkpoint of a new thread.
        :param expected_head: The thread's head as the caller last saw it; None for a new thread.
        :param delta: The changed keys and their operations (see :mod:`haystack_state.persistence.delta`).
        :param step: The agent step.
        :param source: ``"input"``, ``"model"``, ``"tools"`` or ``"update"``.
        :param tool_names: The tools whose results this checkpoint records.
        :param metadata: Free-form metadata; any value the codec can encode.
        :returns: The new checkpoint's record.
        :raises ThreadConflictError: If the thread's head is not ``expected_head``.
        :raises CheckpointNotFoundError: If ``parent_id`` is not a checkpoint of the thread.
        :raises CodecError: If a value cannot be encoded (the message names the state key).
        :raises ValueError: If the delta, source, step or tool names are malformed.
        """
        self._check_open()
        _check_commit_args(thread_id, step, source, tool_names, metadata)
        encoded = encode_delta(delta)
        encoded_metadata = encode(dict(metadata or {}), where="metadata")
        metadata_text = to_json(encoded_metadata)
        row = StoredCheckpoint(
            thread_id=thread_id,
            checkpoint_id=new_checkpoint_id(),
            parent_id=parent_id,
            step=step,
            source=source,
            tool_names=tuple(tool_names),
            created_at=utc_now(),
            changed_keys=tuple(encoded),
            metadata=metadata_text,
            delta=to_json(encoded),
        )
        self._insert(row, expected_head)
        self._advance_cache(row, encoded)
        return self._meta(row, decode(encoded_metadata, where="metadata") if encoded_metadata else {})

    def get(self, thread_id: str, checkpoint_id: str | None = None, *, read_only: bool = False) -> Checkpoint:
        """
        Read a checkpoint with its full state.

        By default the values are the caller's own: plain, fully mutable containers and objects that share nothing
        with the checkpointer. Reading the cached head of a long thread then costs one copy of its values (much less
        than decoding them). With ``read_only=True`` the values may be shared with the checkpointer's cache and cost
        nothing to hand out: lists and dicts inside are read-only (``FrozenList``/``FrozenDict``; changing them
        raises ``TypeError``), and objects such as ``ChatMessage`` must not be changed in place (haystack warns when
        one is). That suits a caller that copies or freezes what it reads, such as a ``State``.

        :param thread_id: The thread.
        :param checkpoint_id: The checkpoint; None for the thread's head.
        :param read_only: Hand out the values without copying them; the caller must not modify them.
        :returns: The checkpoint, with its materialized and decoded values.
        :raises ThreadNotFoundError: If the thread does not exist.
        :raises CheckpointNotFoundError: If the checkpoint is not in the thread.
        :raises CodecError: If stored data is corrupt (the message names the thread and checkpoint).
        """
        self._check_open()
        row = self._read_meta(thread_id, checkpoint_id)
        state = self._materialize(row, cache=checkpoint_id is None, read_only=read_only)
        if state.plain is not None:
            values = state.plain
        elif read_only:
            values = dict(state.frozen or {})
        else:
            values = {key: fresh_copy(value) for key, value in (state.frozen or {}).items()}
        return Checkpoint(meta=self._meta(row), values=values)

    def head(self, thread_id: str) -> str | None:
        """
        Return the id of the thread's head, or None if the thread does not exist.

        :param thread_id: The thread.
        """
        self._check_open()
        return self._read_head(thread_id)

    def history(self, thread_id: str) -> list[CheckpointMeta]:
        """
        Return the records of all checkpoints of the thread (every branch), newest first.

        :param thread_id: The thread.
        :raises ThreadNotFoundError: If the thread does not exist.
        """
        self._check_open()
        rows = self._read_history(thread_id)
        if not rows:
            raise ThreadNotFoundError(thread_id)
        return [self._meta(row) for row in rows]

    def list_threads(self) -> list[ThreadInfo]:
        """Return a summary of every thread, the most recently updated first."""
        self._check_open()
        return self._read_threads()

    def delete_thread(self, thread_id: str) -> None:
        """
        Delete a thread and all its checkpoints.

        :param thread_id: The thread.
        :raises ThreadNotFoundError: If the thread does not exist.
        """
        self._check_open()
        self._cache.drop(thread_id)
        if not self._delete(thread_id):
            raise ThreadNotFoundError(thread_id)

    def to_dict(self) -> dict[str, Any]:
        """
        Serialise the checkpointer's settings (never its data), so an Agent that uses it round-trips through
        ``to_dict`` and a Pipeline's YAML. Rebuild it with :func:`haystack_state.persistence.checkpointer_from_dict`.

        :returns: ``{"type": ..., "init_parameters": {...}}``.
        :raises SerializationError: If the settings cannot be serialised safely (for example a password).
        """
        return {"type": f"{type(self).__module__}.{type(self).__name__}", "init_parameters": self.init_parameters()}

    def init_parameters(self) -> dict[str, Any]:
        """
        The keyword arguments that rebuild this checkpointer (see :meth:`to_dict`).

        :returns: The arguments.
        :raises SerializationError: If this checkpointer cannot be rebuilt from settings alone.
        """
        raise SerializationError(f"{type(self).__name__} cannot be serialized.")

    def close(self) -> None:
        """Release the backend's resources. Idempotent; the checkpointer cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        self._cache.clear()
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- storage primitives, implemented by the backends --------------------------------------------------------

    @abc.abstractmethod
    def _insert(self, row: StoredCheckpoint, expected_head: str | None) -> None:
        """Atomically check the commit with :func:`check_commit`, insert the row and make it the head."""

    @abc.abstractmethod
    def _read_head(self, thread_id: str) -> str | None:
        """Return the thread's head id, or None."""

    @abc.abstractmethod
    def _read_meta(self, thread_id: str, checkpoint_id: str | None) -> StoredCheckpoint:
        """Return a checkpoint's row (the head's if None), delta optional; raise Thread/CheckpointNotFoundError."""

    @abc.abstractmethod
    def _read_chain(self, thread_id: str, checkpoint_id: str, stop_at: str | None) -> list[ChainLink]:
        """Return the links from the checkpoint back to the root, or to ``stop_at`` (excluded), oldest first."""

    @abc.abstractmethod
    def _read_history(self, thread_id: str) -> list[StoredCheckpoint]:
        """Return the thread's rows (delta optional) newest first; empty if the thread does not exist."""

    @abc.abstractmethod
    def _read_threads(self) -> list[ThreadInfo]:
        """Return the summaries of all threads, the most recently updated first."""

    @abc.abstractmethod
    def _delete(self, thread_id: str) -> bool:
        """Delete the thread; return whether it existed."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release resources."""

    # --- shared machinery ---------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"{type(self).__name__} is closed.")

    def _meta(self, row: StoredCheckpoint, metadata: dict[str, Any] | None = None) -> CheckpointMeta:
        """Build a row's record, decoding its metadata unless given (decoded already)."""
        if metadata is None:
            try:
                metadata = {} if row.metadata == "{}" else decode(from_json(row.metadata), where="metadata")
            except CodecError as error:
                raise corrupt_error(row.thread_id, row.checkpoint_id, error) from None
            if not isinstance(metadata, dict):
                raise corrupt_error(row.thread_id, row.checkpoint_id, CodecError("metadata is not a mapping"))
        return CheckpointMeta(
            thread_id=row.thread_id,
            checkpoint_id=row.checkpoint_id,
            parent_id=row.parent_id,
            step=row.step,
            source=row.source,
            tool_names=row.tool_names,
            created_at=row.created_at,
            changed_keys=row.changed_keys,
            metadata=metadata,
        )

    def _materialize(self, row: StoredCheckpoint, *, cache: bool, read_only: bool) -> _Materialized:
        """
        Build the state at ``row``: from the cached state if the row is the cached checkpoint or descends from it
        (decoding only the deltas since), otherwise from the root (decoding only the values that survive).

        :param row: The checkpoint.
        :param cache: Whether to cache the result as the thread's head state.
        :param read_only: Whether the caller takes a frozen state (then a state decoded from the root is frozen in
            place and shared with the cache, rather than copied for it).
        """
        thread_id, checkpoint_id = row.thread_id, row.checkpoint_id
        cached = self._cache.get(thread_id)
        if cached is not None and cached[0] == checkpoint_id:
            return _Materialized(frozen=cached[1], plain=None)
        stop_at = cached[0] if cached is not None else None
        chain = self._read_chain(thread_id, checkpoint_id, stop_at)
        _check_chain(thread_id, checkpoint_id, stop_at, chain)
        if cached is not None and chain[0].parent_id == stop_at:
            try:
                composed, origins = compose_deltas(_parse_deltas(thread_id, chain))
                check_extends(cached[1], origins)
                frozen = apply_frozen(cached[1], self._decode_delta(row, composed))
            except ExtendError:
                # A delta extends a value that is not a list; the walk from the root names the checkpoint exactly
                # (which one fails first depends on the state before it).
                chain = self._read_chain(thread_id, checkpoint_id, None)
                _check_chain(thread_id, checkpoint_id, None, chain)
            else:
                if cache:
                    self._cache.put(thread_id, checkpoint_id, frozen)
                return _Materialized(frozen=frozen, plain=None)
        try:
            # From the root, the state before the first delta is empty: composing finds the first broken extend.
            composed, _ = compose_deltas(_parse_deltas(thread_id, chain))
        except ExtendError as error:
            raise _extend_error(thread_id, error, error.checkpoint_id or checkpoint_id) from None
        encoded = {
            key: op["items"] if op["op"] == "extend" else op["value"]
            for key, op in composed.items()
            if op["op"] != "delete"
        }
        plain = self._decode_state(row, encoded)
        if cache and self._cache.size > 0:
            try:
                frozen = freeze_state(plain, owned=read_only)
            except Exception:  # the cache is an optimization: a value it cannot freeze is simply not cached
                self._cache.drop(thread_id)
                return _Materialized(frozen=None, plain=self._decode_state(row, encoded) if read_only else plain)
            self._cache.put(thread_id, checkpoint_id, frozen)
            if read_only:
                return _Materialized(frozen=frozen, plain=None)
        return _Materialized(frozen=None, plain=plain)

    def _decode_delta(self, row: StoredCheckpoint, delta: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        try:
            return {key: _decode_op_values(op, key) for key, op in delta.items()}
        except CodecError as error:
            culprit = self._find_unreadable(row, error)
            raise corrupt_error(row.thread_id, culprit, error) from None

    def _decode_state(self, row: StoredCheckpoint, state: dict[str, Any]) -> dict[str, Any]:
        try:
            return {key: decode(value, key=key) for key, value in state.items()}
        except CodecError as error:
            culprit = self._find_unreadable(row, error)
            raise corrupt_error(row.thread_id, culprit, error) from None

    def _find_unreadable(self, row: StoredCheckpoint, error: CodecError) -> str:
        """Find the checkpoint whose delta holds the value that failed to decode (slow path, errors only)."""
        for link in self._read_chain(row.thread_id, row.checkpoint_id, None):
            for key, op in _parse_delta(row.thread_id, link).items():
                try:
                    _decode_op_values(op, key)
                except CodecError:
                    return link.checkpoint_id
        return row.checkpoint_id

    def _advance_cache(self, row: StoredCheckpoint, encoded: Mapping[str, Mapping[str, Any]]) -> None:
        """After a commit, move the cached state to the new head, decoding and freezing only its delta."""
        if self._cache.size <= 0:
            return
        try:
            delta = freeze_delta({key: _decode_op_values(op, key) for key, op in encoded.items()})
        except Exception:  # the commit is written: a delta the cache cannot take only costs the cache entry
            self._cache.drop(row.thread_id)
            return
        self._cache.advance(row.thread_id, row.parent_id, row.checkpoint_id, delta)


def _extend_error(thread_id: str, error: ExtendError, checkpoint_id: str) -> CheckpointError:
    return CheckpointError(f"Thread '{thread_id}', checkpoint '{checkpoint_id}': {error}.")


def _check_commit_args(
    thread_id: Any, step: Any, source: Any, tool_names: Any, metadata: dict[str, Any] | None
) -> None:
    if not isinstance(thread_id, str) or not thread_id:
        raise ValueError(f"thread_id must be a non-empty string, got {thread_id!r}.")
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"step must be an int, got {step!r}.")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
    if isinstance(tool_names, str) or not all(isinstance(name, str) for name in tool_names):
        raise ValueError(f"tool_names must be a sequence of strings, got {tool_names!r}.")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}.")


def _check_chain(thread_id: str, checkpoint_id: str, stop_at: str | None, chain: list[ChainLink]) -> None:
    if not chain:
        raise CheckpointNotFoundError(thread_id, checkpoint_id)
    if chain[-1].checkpoint_id != checkpoint_id or chain[0].parent_id not in (None, stop_at):
        raise CheckpointError(f"Thread '{thread_id}', checkpoint '{checkpoint_id}': its chain of parents is broken.")
    for parent, child in itertools.pairwise(chain):
        if child.parent_id != parent.checkpoint_id:
            raise CheckpointError(
                f"Thread '{thread_id}', checkpoint '{child.checkpoint_id}': its parent "
                f"'{child.parent_id}' is missing from the stored chain."
            )
