"""
The abstract :class:`Checkpointer` that every storage backend implements.

A *thread* is a tree of checkpoints whose *head* is the latest one. Each checkpoint stores only its *delta* (the
operations on the keys it changed, see :mod:`haystack_state.persistence.delta`), and now and then a *snapshot* of the
whole state (see :mod:`haystack_state.persistence._chain`), so what a commit writes stays flat on average and a read
replays a bounded chain. Each checkpointer also caches the materialized state of the last head it read or wrote per
thread, decoded and frozen (see :mod:`haystack_state.persistence._cache`); a commit advances it with its own delta.

The public API is written once, as *flows*: generators that yield typed operations
(:mod:`haystack_state.persistence.ops`) and receive their results. ``commit``, ``get``, ... drive a flow with the
backend's ``_execute(op)``; ``acommit``, ``aget``, ... with its ``_aexecute(op)``. The flows (encoding,
validation, snapshots, leases) are in :mod:`haystack_state.persistence._checkpoint_flows`, reading and caching in
:mod:`haystack_state.persistence._reading`, retention in :mod:`haystack_state.persistence._retention`; a backend only
executes operations, one method each (named by :data:`haystack_state.persistence.ops.HANDLERS`). A driver's error is
wrapped in :class:`~haystack_state.errors.CheckpointStorageError` naming the thread and the operation.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from haystack.core.errors import SerializationError

from haystack_state.persistence import ops
from haystack_state.persistence._cache import HeadCache
from haystack_state.persistence._chain import (
    corrupt_error,
)
from haystack_state.persistence._checkpoint_flows import CheckpointFlows, check_commit, conflict_error, encode_commit
from haystack_state.persistence._retention import prune_flow, ttl_seconds
from haystack_state.persistence.delta import (
    Delta,
    Source,
)
from haystack_state.persistence.delta import utc_now as utc_now
from haystack_state.persistence.ops import Flow
from haystack_state.persistence.records import (
    ChainLink,
    Checkpoint,
    CheckpointMeta,
    Lease,
    PruneResult,
    StoredCheckpoint,
    ThreadInfo,
    check_thread_id,
)

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


class Checkpointer(CheckpointFlows):
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
        #: The backend's method for each operation (named by :data:`~haystack_state.persistence.ops.HANDLERS`),
        #: bound once: ``_execute`` looks one up per operation.
        self._handlers: dict[type, Callable[..., Any]] = {op: getattr(self, name) for op, name in ops.HANDLERS.items()}

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
        commit = encode_commit(thread_id, parent_id, delta, step, source, tool_names, metadata)
        return self._drive(self._commit_flow(commit, expected_head, lease, frozen))

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
        commit = encode_commit(thread_id, parent_id, delta, step, source, tool_names, metadata)
        return await self._adrive(self._commit_flow(commit, expected_head, lease, frozen))

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
