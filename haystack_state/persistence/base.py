"""
The abstract :class:`Checkpointer` that every storage backend implements, and the helpers the backends share.

The record types (:class:`CheckpointMeta`, :class:`Checkpoint`, :class:`ThreadInfo`, :class:`StoredCheckpoint`) live
in :mod:`haystack_state.persistence.records` and are re-exported here.

A *thread* is a tree of checkpoints whose *head* is the latest one. Each checkpoint stores only its *delta* (the
operations on the keys it changed, see :mod:`haystack_state.persistence.delta`), so what a commit writes does not
grow with the thread. Reading a checkpoint walks its ancestors and applies their deltas, root first. To keep reading
the head of a long thread cheap, each checkpointer caches the materialized (still encoded) state of the last head it
read or wrote per thread; a checkpoint never changes once written, so a cached state is valid for as long as its
checkpoint exists, and a read only fetches the deltas between the cached checkpoint and the one asked for.

Backends implement a handful of storage primitives (the ``_read_*``, ``_insert``, ``_delete`` and ``_close``
methods); everything else - encoding, validation, materialization, caching, error messages - lives here.
"""

from __future__ import annotations

import abc
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from haystack_state.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CodecError,
    ThreadConflictError,
    ThreadNotFoundError,
)
from haystack_state.persistence.codec import decode, encode, from_json, to_json
from haystack_state.persistence.delta import (
    SOURCES,
    Delta,
    Source,
    apply_delta,
    encode_delta,
    new_checkpoint_id,
    utc_now,
    validate_delta,
)
from haystack_state.persistence.records import Checkpoint, CheckpointMeta, StoredCheckpoint, ThreadInfo

__all__ = [
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
    :param parent_exists: Tells whether ``row.parent_id`` is a checkpoint of the thread (called only if needed).
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
    elif actual_head is None or not parent_exists():
        raise CheckpointNotFoundError(row.thread_id, row.parent_id)


def corrupt_error(thread_id: str, checkpoint_id: str, error: Exception) -> CodecError:
    """
    Build the error for stored data that cannot be read.

    :param thread_id: The thread.
    :param checkpoint_id: The checkpoint whose stored data is at fault.
    :param error: What went wrong.
    """
    return CodecError(f"Thread '{thread_id}', checkpoint '{checkpoint_id}': stored data is unreadable: {error}")


def _parse_delta(row: StoredCheckpoint) -> dict[str, Any]:
    try:
        delta = from_json(row.delta)
        validate_delta(delta)
    except ValueError as error:  # CodecError is a ValueError too
        raise corrupt_error(row.thread_id, row.checkpoint_id, error) from None
    return dict(delta)


def _decode_op_values(op: dict[str, Any], key: str) -> None:
    if op["op"] == "extend":
        decode(op.get("items"), key=key)
    elif op["op"] == "replace":
        decode(op.get("value"), key=key)


class Checkpointer(abc.ABC):
    """
    Durable storage of state checkpoints, organized in threads. Thread-safe; usable as a context manager.

    :param cache_size: How many threads' head states to keep materialized in memory (0 disables the cache).
    """

    def __init__(self, *, cache_size: int = 64) -> None:
        self._cache_size = cache_size
        self._cache: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        self._cache_lock = threading.Lock()
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
        metadata_text = to_json(encode(dict(metadata or {}), where="metadata"))
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
        self._advance_cache(row)
        return self._meta(row)

    def get(self, thread_id: str, checkpoint_id: str | None = None) -> Checkpoint:
        """
        Read a checkpoint with its full state.

        :param thread_id: The thread.
        :param checkpoint_id: The checkpoint; None for the thread's head.
        :returns: The checkpoint, with its materialized and decoded values.
        :raises ThreadNotFoundError: If the thread does not exist.
        :raises CheckpointNotFoundError: If the checkpoint is not in the thread.
        :raises CodecError: If stored data is corrupt (the message names the thread and checkpoint).
        """
        self._check_open()
        row = self._read_meta(thread_id, checkpoint_id)
        state = self._materialize(row, cache=checkpoint_id is None)
        return Checkpoint(meta=self._meta(row), values=self._decode_state(row, state))

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
        with self._cache_lock:
            self._cache.pop(thread_id, None)
        if not self._delete(thread_id):
            raise ThreadNotFoundError(thread_id)

    def close(self) -> None:
        """Release the backend's resources. Idempotent; the checkpointer cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        with self._cache_lock:
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
    def _read_chain(self, thread_id: str, checkpoint_id: str, stop_at: str | None) -> list[StoredCheckpoint]:
        """Return the rows with deltas from the checkpoint back to the root, or to ``stop_at`` (excluded), oldest
        first."""

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

    def _meta(self, row: StoredCheckpoint) -> CheckpointMeta:
        try:
            metadata = decode(from_json(row.metadata), where="metadata")
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

    def _materialize(self, row: StoredCheckpoint, *, cache: bool) -> dict[str, Any]:
        thread_id, checkpoint_id = row.thread_id, row.checkpoint_id
        with self._cache_lock:
            cached = self._cache.get(thread_id)
        if cached is not None and cached[0] == checkpoint_id:
            return cached[1]
        stop_at = cached[0] if cached is not None else None
        chain = self._read_chain(thread_id, checkpoint_id, stop_at)
        _check_chain(thread_id, checkpoint_id, stop_at, chain)
        state = cached[1] if cached is not None and chain[0].parent_id == stop_at else {}
        for link in chain:
            delta = _parse_delta(link)
            try:
                state = apply_delta(state, delta)
            except ValueError as error:
                raise CheckpointError(f"Thread '{thread_id}', checkpoint '{link.checkpoint_id}': {error}.") from None
        if cache:
            self._cache_put(thread_id, checkpoint_id, state)
        return state

    def _decode_state(self, row: StoredCheckpoint, state: dict[str, Any]) -> dict[str, Any]:
        try:
            return {key: decode(value, key=key) for key, value in state.items()}
        except CodecError as error:
            culprit = self._find_unreadable(row, error)
            raise corrupt_error(row.thread_id, culprit, error) from None

    def _find_unreadable(self, row: StoredCheckpoint, error: CodecError) -> str:
        """Find the checkpoint whose delta holds the value that failed to decode (slow path, errors only)."""
        for link in self._read_chain(row.thread_id, row.checkpoint_id, None):
            for key, op in _parse_delta(link).items():
                try:
                    _decode_op_values(op, key)
                except CodecError:
                    return link.checkpoint_id
        return row.checkpoint_id

    def _cache_put(self, thread_id: str, checkpoint_id: str, state: dict[str, Any]) -> None:
        if self._cache_size <= 0:
            return
        with self._cache_lock:
            self._cache[thread_id] = (checkpoint_id, state)
            self._cache.move_to_end(thread_id)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _advance_cache(self, row: StoredCheckpoint) -> None:
        """After a commit, derive the new head's state from the cached parent state (no read needed)."""
        with self._cache_lock:
            cached = self._cache.get(row.thread_id)
        if row.parent_id is None:
            base: dict[str, Any] = {}
        elif cached is not None and cached[0] == row.parent_id:
            base = cached[1]
        else:
            return
        try:
            state = apply_delta(base, from_json(row.delta))
        except (ValueError, CodecError):
            with self._cache_lock:
                self._cache.pop(row.thread_id, None)
            return
        self._cache_put(row.thread_id, row.checkpoint_id, state)


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


def _check_chain(thread_id: str, checkpoint_id: str, stop_at: str | None, chain: list[StoredCheckpoint]) -> None:
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
