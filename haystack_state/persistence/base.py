"""
The abstract :class:`Checkpointer` that every storage backend implements.

A *thread* is a tree of checkpoints whose *head* is the latest one. Each checkpoint stores only its *delta* (the
operations on the keys it changed, see :mod:`haystack_state.persistence.delta`), and now and then a *snapshot* of the
whole state (see :mod:`haystack_state.persistence.chain`), so what a commit writes stays flat on average and a read
replays a bounded chain. Each checkpointer also caches the materialized state of the last head it read or wrote per
thread, decoded and frozen (see :mod:`haystack_state.persistence.cache`); a commit advances it with its own delta.

The public API is written once, as *flows*: generators that yield typed operations
(:mod:`haystack_state.persistence.ops`) and receive their results. ``commit``, ``get``, ... drive a flow with the
backend's ``_execute(op)``; ``acommit``, ``aget``, ... with its ``_aexecute(op)``. Encoding, validation,
materialization, caching, snapshots, retention, leases and error messages live here; a backend only executes
operations. A driver's error is wrapped in :class:`~haystack_state.errors.CheckpointStorageError` naming the thread
and the operation.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from typing import Any, TypeVar

from haystack.core.errors import SerializationError

from haystack_state.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    CodecError,
    ThreadConflictError,
    ThreadNotFoundError,
    UnstorableTextError,
)
from haystack_state.flows import FlowDriver
from haystack_state.persistence import ops
from haystack_state.persistence.cache import HeadCache, fresh_copy, merge_frozen
from haystack_state.persistence.chain import (
    check_chain,
    compose_chain,
    corrupt_error,
    encoded_values,
    needs_snapshot,
    paused_gc,
    state_json,
)
from haystack_state.persistence.codec import decode, encode, to_json
from haystack_state.persistence.delta import (
    Delta,
    ExtendError,
    Source,
    checked_json,
    delta_json,
    encode_delta,
    new_checkpoint_id,
)
from haystack_state.persistence.delta import utc_now as utc_now
from haystack_state.persistence.leases import new_owner
from haystack_state.persistence.ops import Flow
from haystack_state.persistence.reading import StateReader, adopt_op
from haystack_state.persistence.records import (
    SOURCES,
    ChainLink,
    Checkpoint,
    CheckpointMeta,
    Lease,
    PruneResult,
    StoredCheckpoint,
    ThreadInfo,
    check_thread_id,
    valid_checkpoint_id,
)
from haystack_state.persistence.retention import prune_flow, ttl_seconds
from haystack_state.text import find_bad_text

__all__ = [
    "ChainLink",
    "Checkpoint",
    "CheckpointMeta",
    "Checkpointer",
    "Flow",
    "StoredCheckpoint",
    "ThreadInfo",
    "check_commit",
    "conflict_error",
    "corrupt_error",
]

T = TypeVar("T")


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


def check_commit(row: StoredCheckpoint, expected_head: str | None, actual_head: str | None, parent_exists: Any) -> None:
    """
    Check a commit against the thread as it is inside the backend's write transaction.

    :param row: The checkpoint to insert.
    :param expected_head: The head the caller expects.
    :param actual_head: The thread's head (None if the thread does not exist).
    :param parent_exists: A callable telling whether ``row.parent_id`` is a checkpoint of the thread (called only for
        a fork: the head exists by definition).
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


class Checkpointer(StateReader, FlowDriver):
    """
    Durable storage of state checkpoints, organized in threads. Thread-safe; usable as a context manager (``with``
    or ``async with``). Every method has an async twin (``acommit``, ``aget``, ...) that does not block the event loop.

    :param cache_size: How many threads' head states to keep materialized in memory, decoded (0 disables the cache).
    :param lease_ttl: How long a run's lease on a thread lasts, in seconds, unless renewed (a run renews it every
        third of that while it works, from a background thread). A run that crashed is taken over this long after
        its last renewal.
    :param thread_ttl: The time to live of new threads, in seconds (None: threads never expire); see :meth:`set_ttl`.
    :param snapshot_min_bytes: The smallest chain of deltas (in bytes) worth a snapshot.
    :param snapshot_ratio: A commit stores a snapshot of the whole state when the deltas since the last snapshot add
        up to more than this many times that snapshot's size.
    """

    def __init__(
        self,
        *,
        cache_size: int = 64,
        lease_ttl: float = 30.0,
        thread_ttl: float | None = None,
        snapshot_min_bytes: int = 64 * 1024,
        snapshot_ratio: float = 1.0,
    ) -> None:
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}.")
        if snapshot_min_bytes < 0 or not snapshot_ratio > 0:
            raise ValueError("snapshot_min_bytes must be at least 0 and snapshot_ratio positive.")
        self._cache = HeadCache(cache_size)
        self._closed = False
        self.lease_ttl = float(lease_ttl)
        self.thread_ttl = ttl_seconds(thread_ttl)
        self._snapshot_min_bytes = snapshot_min_bytes
        self._snapshot_ratio = snapshot_ratio

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
        lease: Lease | None = None,
        frozen: bool = False,
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
        :param lease: The caller's lease on the thread: the commit is refused if another owner took the thread.
        :param frozen: The delta's values are a ``State``'s read-only values (``State.peek_changes()``), which nothing
            changes: the head cache adopts them instead of decoding copies (each value is held once).
        :returns: The new checkpoint's record.
        :raises ThreadConflictError: If the thread's head is not ``expected_head``.
        :raises ThreadBusyError: If ``lease`` is given and another owner holds a live lease on the thread.
        :raises CheckpointNotFoundError: If ``parent_id`` is not a checkpoint of the thread.
        :raises CodecError: If a value cannot be encoded (the message names the state key).
        :raises UnstorableTextError: If a value, a state key, the metadata or a tool name holds text that is not
            valid Unicode (a lone surrogate; the message names the key and where in the value). Nothing is written.
        :raises CheckpointStorageError: If the storage fails (nothing is written).
        :raises ValueError: If the thread id, delta, source, step or tool names are malformed.
        """
        flow = self._commit_flow(
            thread_id, parent_id, expected_head, delta, step, source, tool_names, metadata, lease, frozen
        )
        return self._drive(flow)

    async def acommit(
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
        lease: Lease | None = None,
        frozen: bool = False,
    ) -> CheckpointMeta:
        """:meth:`commit`, awaiting the storage instead of blocking on it."""
        flow = self._commit_flow(
            thread_id, parent_id, expected_head, delta, step, source, tool_names, metadata, lease, frozen
        )
        return await self._adrive(flow)

    def get(self, thread_id: str, checkpoint_id: str | None = None, *, read_only: bool = False) -> Checkpoint:
        """
        Read a checkpoint with its full state.

        By default the values are the caller's own: plain, fully mutable containers and objects that share nothing
        with the checkpointer. With ``read_only=True`` the values may be shared with the checkpointer's cache and cost
        nothing to hand out: lists and dicts inside are read-only (``FrozenList``/``FrozenDict``; changing them
        raises ``TypeError``), and objects such as ``ChatMessage`` must not be changed in place. That suits a caller
        that copies or freezes what it reads, such as a ``State``.

        :param thread_id: The thread.
        :param checkpoint_id: The checkpoint; None for the thread's head.
        :param read_only: Hand out the values without copying them; the caller must not modify them.
        :returns: The checkpoint, with its materialized and decoded values.
        :raises ThreadNotFoundError: If the thread does not exist (or its TTL expired).
        :raises CheckpointNotFoundError: If the checkpoint is not in the thread.
        :raises CheckpointError: If stored data is corrupt (the message names the thread, checkpoint and field).
        """
        return self._drive(self._get_flow(thread_id, checkpoint_id, read_only))

    async def aget(self, thread_id: str, checkpoint_id: str | None = None, *, read_only: bool = False) -> Checkpoint:
        """:meth:`get`, awaiting the storage."""
        return await self._adrive(self._get_flow(thread_id, checkpoint_id, read_only))

    def head(self, thread_id: str) -> str | None:
        """
        Return the id of the thread's head, or None if the thread does not exist (or its TTL expired).

        :param thread_id: The thread.
        """
        head: str | None = self._drive(self._one(ops.ReadHead(check_thread_id(thread_id), utc_now())))
        return head

    async def ahead(self, thread_id: str) -> str | None:
        """:meth:`head`, awaiting the storage."""
        return await self._adrive(self._one(ops.ReadHead(check_thread_id(thread_id), utc_now())))

    def history(self, thread_id: str, limit: int | None = None, before: str | None = None) -> list[CheckpointMeta]:
        """
        Return the records of the thread's checkpoints (every branch), newest first, a page at a time.

        :param thread_id: The thread.
        :param limit: At most this many records (None: all).
        :param before: Only the checkpoints committed before this one (the last id of the previous page).
        :raises ThreadNotFoundError: If the thread does not exist.
        :raises CheckpointNotFoundError: If ``before`` is not a checkpoint of the thread.
        """
        return self._drive(self._history_flow(thread_id, limit, before))

    async def ahistory(
        self, thread_id: str, limit: int | None = None, before: str | None = None
    ) -> list[CheckpointMeta]:
        """:meth:`history`, awaiting the storage."""
        return await self._adrive(self._history_flow(thread_id, limit, before))

    def list_threads(self) -> list[ThreadInfo]:
        """Return a summary of every thread, the most recently updated first (expired threads left out)."""
        return self._drive(self._one(ops.ReadThreads(utc_now())))

    async def alist_threads(self) -> list[ThreadInfo]:
        """:meth:`list_threads`, awaiting the storage."""
        return await self._adrive(self._one(ops.ReadThreads(utc_now())))

    def delete_thread(self, thread_id: str) -> None:
        """
        Delete a thread, all its checkpoints and its lease.

        :param thread_id: The thread.
        :raises ThreadNotFoundError: If the thread does not exist.
        """
        self._drive(self._delete_flow(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread`, awaiting the storage."""
        await self._adrive(self._delete_flow(thread_id))

    def prune(
        self,
        thread_id: str | None = None,
        keep_last: int | None = None,
        older_than: float | dt.timedelta | None = None,
    ) -> PruneResult:
        """
        Reclaim storage: delete the threads whose TTL expired, and remove old checkpoints.

        In each thread (``thread_id``, or every thread), a checkpoint is removed when it is neither among the newest
        ``keep_last`` nor newer than ``older_than``; with neither given, only expired threads are deleted. Never
        removed: the head, an interrupted checkpoint (waiting for ``Agent.resume``), and what a kept checkpoint needs
        to be read (a kept checkpoint whose parent is removed gets a snapshot of its state first, so every kept
        checkpoint reads exactly as before). A thread a live run holds is skipped. The space is reused by later
        writes; to give it back to the file system, see the README (SQLite ``VACUUM``, PostgreSQL autovacuum).

        :param thread_id: The thread to prune; all threads if None.
        :param keep_last: Keep the newest this many checkpoints of each thread.
        :param older_than: Keep the checkpoints younger than this (seconds, or a ``timedelta``).
        :returns: What was removed.
        :raises ValueError: For a ``keep_last`` below 1, or a negative ``older_than``.
        """
        return self._drive(prune_flow(self, thread_id, keep_last, older_than))

    async def aprune(
        self,
        thread_id: str | None = None,
        keep_last: int | None = None,
        older_than: float | dt.timedelta | None = None,
    ) -> PruneResult:
        """:meth:`prune`, awaiting the storage."""
        return await self._adrive(prune_flow(self, thread_id, keep_last, older_than))

    def set_ttl(self, thread_id: str, ttl: float | dt.timedelta | None) -> None:
        """
        Give a thread a time to live (or none, with None). A thread expires ``ttl`` after its last commit: from then
        on it is invisible (reads raise ``ThreadNotFoundError``, ``head`` is None, ``list_threads`` leaves it out,
        a new run starts it afresh) and :meth:`prune` deletes it.

        :param thread_id: The thread.
        :param ttl: Seconds, or a ``timedelta``; None removes the TTL.
        :raises ThreadNotFoundError: If the thread does not exist.
        """
        self._drive(self._ttl_flow(thread_id, ttl))

    async def aset_ttl(self, thread_id: str, ttl: float | dt.timedelta | None) -> None:
        """:meth:`set_ttl`, awaiting the storage."""
        await self._adrive(self._ttl_flow(thread_id, ttl))

    # --- leases ----------------------------------------------------------------------------------------------

    def acquire_lease(self, thread_id: str, owner: str | None = None, ttl: float | None = None) -> Lease:
        """
        Take a thread's lease: while it is live, no other run starts on the thread (it gets ``ThreadBusyError``) and
        no other lease holder commits to it. Taking a lease whose holder stopped renewing it (a crash) succeeds once
        it has expired. Re-acquiring one's own lease renews it.

        :param thread_id: The thread (it need not exist yet).
        :param owner: Who takes it; a new unique owner id if None.
        :param ttl: Its length in seconds; the checkpointer's ``lease_ttl`` if None.
        :returns: The lease.
        :raises ThreadBusyError: If another owner holds a live lease (naming it and when that lease expires).
        """
        return self._drive(self._acquire_flow(thread_id, owner, ttl))

    async def aacquire_lease(self, thread_id: str, owner: str | None = None, ttl: float | None = None) -> Lease:
        """:meth:`acquire_lease`, awaiting the storage."""
        return await self._adrive(self._acquire_flow(thread_id, owner, ttl))

    def open_thread(self, thread_id: str, *, read_only: bool = False) -> tuple[Lease | None, Checkpoint | None]:
        """
        :meth:`read_lease` and :meth:`get` of the head, read together (one round trip on PostgreSQL): how a run opens
        its thread.

        :param thread_id: The thread.
        :param read_only: As for :meth:`get`.
        :returns: The thread's live lease (None if no run holds it) and its head checkpoint (None if the thread does
            not exist, and not read when another run holds the lease: that run is about to change it).
        """
        return self._drive(self._open_flow(thread_id, read_only))

    async def aopen_thread(self, thread_id: str, *, read_only: bool = False) -> tuple[Lease | None, Checkpoint | None]:
        """:meth:`open_thread`, awaiting the storage."""
        return await self._adrive(self._open_flow(thread_id, read_only))

    def hold_thread(
        self, thread_id: str, owner: str | None = None, ttl: float | None = None
    ) -> tuple[Lease, str | None]:
        """
        :meth:`acquire_lease`, then read the thread's head as :meth:`head` would right after, in one operation (one
        round trip on PostgreSQL): how a run starts on a thread it has loaded, checking that no commit landed since.

        :param thread_id: The thread (it need not exist yet).
        :param owner: Who takes the lease; a new unique owner id if None.
        :param ttl: Its length in seconds; the checkpointer's ``lease_ttl`` if None.
        :returns: The lease, and the thread's head id (None if the thread does not exist).
        :raises ThreadBusyError: If another owner holds a live lease (naming it and when that lease expires).
        """
        return self._drive(self._hold_flow(thread_id, owner, ttl))

    async def ahold_thread(
        self, thread_id: str, owner: str | None = None, ttl: float | None = None
    ) -> tuple[Lease, str | None]:
        """:meth:`hold_thread`, awaiting the storage."""
        return await self._adrive(self._hold_flow(thread_id, owner, ttl))

    def renew_lease(self, lease: Lease, ttl: float | None = None) -> Lease:
        """
        Extend a lease from now.

        :param lease: The lease.
        :param ttl: Its new length in seconds; the checkpointer's ``lease_ttl`` if None.
        :returns: The renewed lease.
        :raises ThreadBusyError: If the lease was lost (it expired and another owner took the thread).
        """
        return self._drive(self._renew_flow(lease, ttl))

    async def arenew_lease(self, lease: Lease, ttl: float | None = None) -> Lease:
        """:meth:`renew_lease`, awaiting the storage."""
        return await self._adrive(self._renew_flow(lease, ttl))

    def release_lease(self, lease: Lease) -> bool:
        """
        Give a lease up, so another run may start on the thread at once.

        :param lease: The lease.
        :returns: Whether it was still held.
        """
        return bool(self._drive(self._one(ops.ReleaseLease(lease.thread_id, lease.owner))))

    async def arelease_lease(self, lease: Lease) -> bool:
        """:meth:`release_lease`, awaiting the storage."""
        return bool(await self._adrive(self._one(ops.ReleaseLease(lease.thread_id, lease.owner))))

    def read_lease(self, thread_id: str) -> Lease | None:
        """
        The thread's live lease, or None if no run holds it.

        :param thread_id: The thread.
        """
        return self._drive(self._read_lease_flow(thread_id))

    async def aread_lease(self, thread_id: str) -> Lease | None:
        """:meth:`read_lease`, awaiting the storage."""
        return await self._adrive(self._read_lease_flow(thread_id))

    def request_stop(self, thread_id: str) -> bool:
        """
        Ask the run that holds the thread's lease, in any process, to stop at its next step boundary (it finds the
        request when it next renews its lease: the renewed ``Lease`` has ``stop_requested``). A run that starts later
        is not affected.

        :param thread_id: The thread.
        :returns: Whether a live run holds the thread (False: nothing to stop).
        """
        check_thread_id(thread_id)
        return bool(self._drive(self._one(ops.RequestStop(thread_id, utc_now()))))

    async def arequest_stop(self, thread_id: str) -> bool:
        """:meth:`request_stop`, awaiting the storage."""
        check_thread_id(thread_id)
        return bool(await self._adrive(self._one(ops.RequestStop(thread_id, utc_now()))))

    # --- settings and lifetime -------------------------------------------------------------------------------

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

    def _common_parameters(self) -> dict[str, Any]:
        """The settings of this base class that differ from their defaults, for :meth:`init_parameters`."""
        params: dict[str, Any] = {}
        if self.lease_ttl != 30.0:
            params["lease_ttl"] = self.lease_ttl
        if self.thread_ttl is not None:
            params["thread_ttl"] = self.thread_ttl
        return params

    def close(self) -> None:
        """Release the backend's resources. Idempotent; the checkpointer cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        self._cache.clear()
        self._close()

    async def aclose(self) -> None:
        """Release the backend's resources, awaiting its async connections. Idempotent."""
        if self._closed:
            return
        await self._aclose()
        self.close()

    # --- the pair of methods a backend implements ---------------------------------------------------------------

    @abc.abstractmethod
    def _execute(self, op: ops.Op) -> Any:
        """Execute one operation (one transaction) and return its result (see :mod:`~.ops`)."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release resources."""

    async def _aclose(self) -> None:
        """Release async resources (the event loop's connections); called by :meth:`aclose` before :meth:`close`."""

    # --- driving flows ------------------------------------------------------------------------------------------

    def _storage_error(self, op: ops.Op, exc: Exception) -> CheckpointStorageError:
        return CheckpointStorageError(
            f"{type(self).__name__}: {ops.describe(op)} failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"{type(self).__name__} is closed.")

    # --- flows --------------------------------------------------------------------------------------------------

    def _commit_flow(
        self,
        thread_id: str,
        parent_id: str | None,
        expected_head: str | None,
        delta: Delta,
        step: int,
        source: Source,
        tool_names: Sequence[str],
        metadata: dict[str, Any] | None,
        lease: Lease | None,
        frozen: bool = False,
    ) -> Flow[CheckpointMeta]:
        _check_commit_args(thread_id, step, source, tool_names, metadata)
        if parent_id is not None and not valid_checkpoint_id(parent_id):
            raise CheckpointNotFoundError(thread_id, repr(parent_id))
        encoded = encode_delta(delta)
        encoded_metadata = encode(dict(metadata or {}), where="metadata")
        delta_text = delta_json(delta, encoded)
        metadata_text = checked_json(encoded_metadata, metadata, "The checkpoint metadata")
        chain_bytes, base_bytes = len(delta_text), 0
        if parent_id is not None:
            info = self._cache.chain_info(thread_id, parent_id)
            if info is None:
                try:
                    parent: StoredCheckpoint = yield ops.ReadMeta(thread_id, parent_id, utc_now())
                    info = (parent.chain_bytes, parent.base_bytes)
                except (ThreadNotFoundError, CheckpointNotFoundError):
                    info = (0, -1)  # the insert reports what is wrong (a conflict, a missing parent)
            chain_bytes, base_bytes = info[0] + len(delta_text), info[1]
        snapshot = None
        if (
            parent_id is not None
            and base_bytes >= 0
            and needs_snapshot(chain_bytes, base_bytes, min_bytes=self._snapshot_min_bytes, ratio=self._snapshot_ratio)
        ):
            snapshot = self._snapshot_from_cache(thread_id, parent_id, delta)
            if snapshot is None:
                chain = yield ops.ReadChain(thread_id, parent_id, None)
                check_chain(thread_id, parent_id, None, chain)
                try:
                    with paused_gc():
                        composed, _ = compose_chain(
                            thread_id, chain, from_snapshot=chain[0].snapshot is not None, extra=encoded
                        )
                        snapshot = to_json(encoded_values(composed))
                except ExtendError:
                    snapshot = None  # a corrupt chain: no snapshot now; reading the checkpoint reports it
            if snapshot is not None:
                chain_bytes, base_bytes = 0, len(snapshot)
        now = utc_now()
        row = StoredCheckpoint(
            thread_id=thread_id,
            checkpoint_id=new_checkpoint_id(),
            parent_id=parent_id,
            step=step,
            source=source,
            tool_names=tuple(tool_names),
            created_at=now,
            changed_keys=tuple(encoded),
            metadata=metadata_text,
            delta=delta_text,
            snapshot=snapshot,
            chain_bytes=chain_bytes,
            base_bytes=max(base_bytes, 0),
        )
        yield ops.Insert(row, expected_head, lease.owner if lease is not None else None, now, self.thread_ttl)
        self._advance_cache(row, encoded, delta if frozen else None)
        return self._meta(row, decode(encoded_metadata, where="metadata") if encoded_metadata else {})

    def _get_flow(self, thread_id: str, checkpoint_id: str | None, read_only: bool) -> Flow[Checkpoint]:
        check_thread_id(thread_id)
        if checkpoint_id is not None and not valid_checkpoint_id(checkpoint_id):
            raise CheckpointNotFoundError(thread_id, repr(checkpoint_id))
        row: StoredCheckpoint = yield ops.ReadMeta(thread_id, checkpoint_id, utc_now())
        return (yield from self._checkpoint_flow(row, checkpoint_id is None, read_only))

    def _open_flow(self, thread_id: str, read_only: bool) -> Flow[tuple[Lease | None, Checkpoint | None]]:
        check_thread_id(thread_id)
        holder, row = yield ops.OpenThread(thread_id, None, utc_now())
        if holder is not None and holder[1] > utc_now():
            return Lease(thread_id, holder[0], holder[1]), None
        if row is None:
            return None, None
        return None, (yield from self._checkpoint_flow(row, True, read_only))

    def _checkpoint_flow(self, row: StoredCheckpoint, head: bool, read_only: bool) -> Flow[Checkpoint]:
        """The checkpoint of a row read (``head``: the thread's head, then its state is cached)."""
        state = yield from self._materialize(row, cache=head, read_only=read_only)
        if state.plain is not None:
            values = state.plain
        elif read_only:
            values = dict(state.frozen or {})
        else:
            with paused_gc():
                values = {key: fresh_copy(value) for key, value in (state.frozen or {}).items()}
        return Checkpoint(meta=self._meta(row), values=values)

    def _snapshot_from_cache(self, thread_id: str, parent_id: str, delta: Delta) -> str | None:
        """
        A commit's snapshot from the parent's state in the head cache (the usual case for the process that writes a
        thread), serialized item by item; None if the cache does not hold the parent (then it is composed from the
        stored rows).
        """
        cached = self._cache.get(thread_id)
        if cached is None or cached[0] != parent_id:
            return None
        try:
            with paused_gc():
                return state_json(merge_frozen(cached[1], {key: adopt_op(op) for key, op in delta.items()}))
        except (ExtendError, CodecError):
            return None  # the rows path reports it, or writes no snapshot

    def _history_flow(self, thread_id: str, limit: int | None, before: str | None) -> Flow[list[CheckpointMeta]]:
        check_thread_id(thread_id)
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ValueError(f"history: limit must be a positive int or None, got {limit!r}.")
        if before is not None and not valid_checkpoint_id(before):
            raise CheckpointNotFoundError(thread_id, repr(before))
        rows: list[StoredCheckpoint] = yield ops.ReadHistory(thread_id, limit, before, utc_now())
        return [self._meta(row) for row in rows]

    def _delete_flow(self, thread_id: str) -> Flow[None]:
        check_thread_id(thread_id)
        self._cache.drop(thread_id)
        existed = yield ops.DeleteThread(thread_id, utc_now())
        self._cache.drop(thread_id)
        if not existed:
            raise ThreadNotFoundError(thread_id)

    def _ttl_flow(self, thread_id: str, ttl: float | dt.timedelta | None) -> Flow[None]:
        check_thread_id(thread_id)
        exists = yield ops.SetTTL(thread_id, ttl_seconds(ttl), utc_now())
        if not exists:
            raise ThreadNotFoundError(thread_id)

    def _acquire_flow(self, thread_id: str, owner: str | None, ttl: float | None) -> Flow[Lease]:
        owner, now, expires = self._lease_terms(thread_id, owner, ttl)
        holder = yield ops.AcquireLease(thread_id, owner, now, expires)
        _refuse_held(thread_id, holder)
        return Lease(thread_id, owner, expires)

    def _hold_flow(self, thread_id: str, owner: str | None, ttl: float | None) -> Flow[tuple[Lease, str | None]]:
        owner, now, expires = self._lease_terms(thread_id, owner, ttl)
        holder, head = yield ops.HoldThread(thread_id, owner, now, expires)
        _refuse_held(thread_id, holder)
        return Lease(thread_id, owner, expires), head

    def _lease_terms(
        self, thread_id: str, owner: str | None, ttl: float | None
    ) -> tuple[str, dt.datetime, dt.datetime]:
        """A lease's owner (a new one if None), the time now and its expiry."""
        check_thread_id(thread_id)
        now = utc_now()
        return owner or new_owner(), now, now + dt.timedelta(seconds=self._lease_seconds(ttl))

    def _renew_flow(self, lease: Lease, ttl: float | None) -> Flow[Lease]:
        from haystack_state.persistence.leases import lost_error

        now = utc_now()
        expires = now + dt.timedelta(seconds=self._lease_seconds(ttl))
        stop = yield ops.RenewLease(lease.thread_id, lease.owner, now, expires)
        if stop is None:
            raise lost_error(lease)
        return Lease(lease.thread_id, lease.owner, expires, stop_requested=bool(stop))

    def _read_lease_flow(self, thread_id: str) -> Flow[Lease | None]:
        check_thread_id(thread_id)
        found = yield ops.ReadLease(thread_id)
        if found is None or found[1] <= utc_now():
            return None
        return Lease(thread_id, found[0], found[1])

    def _lease_seconds(self, ttl: float | None) -> float:
        seconds = self.lease_ttl if ttl is None else ttl
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
            raise ValueError(f"A lease's ttl must be a positive number of seconds, got {ttl!r}.")
        return float(seconds)


def _refuse_held(thread_id: str, holder: tuple[str, dt.datetime] | None) -> None:
    """Raise ``ThreadBusyError`` naming a live lease's holder, if another owner holds one."""
    from haystack_state.persistence.leases import busy_error

    if holder is not None:
        raise busy_error(thread_id, holder[0], holder[1])


def _check_commit_args(
    thread_id: Any, step: Any, source: Any, tool_names: Any, metadata: dict[str, Any] | None
) -> None:
    check_thread_id(thread_id)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an int of at least 0, got {step!r}.")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
    if isinstance(tool_names, str) or not all(isinstance(name, str) for name in tool_names):
        raise ValueError(f"tool_names must be a sequence of strings, got {tool_names!r}.")
    found = find_bad_text(list(tool_names))
    if found is not None:
        raise UnstorableTextError(None, found.problem, path=found.python_path(), subject="The checkpoint's tool_names")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}.")
