"""
:class:`InMemoryCheckpointer`: checkpoints kept in process memory, for tests, notebooks and short-lived agents.

It stores the same JSON text as the database backends, so values go through the codec exactly as they would in
SQLite or PostgreSQL (an unencodable value fails here too, and reads return fresh copies). It executes the same
operations (:mod:`haystack_state.persistence.ops`), so leases, TTLs, snapshots and pruning behave as they do there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from typing import Any, Unpack

from haystack_state.errors import CheckpointNotFoundError, ThreadNotFoundError
from haystack_state.persistence import ops
from haystack_state.persistence._leases import busy_error
from haystack_state.persistence.base import Checkpointer, check_commit
from haystack_state.persistence.records import (
    ChainLink,
    CheckpointerSettings,
    LeaseHolder,
    StoredCheckpoint,
    ThreadInfo,
)


@dataclasses.dataclass
class _Thread:
    head_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    ttl: float | None = None
    rows: dict[str, StoredCheckpoint] = dataclasses.field(default_factory=dict)  # in commit order

    def expired(self, now: dt.datetime) -> bool:
        return self.ttl is not None and self.updated_at + dt.timedelta(seconds=self.ttl) <= now


class InMemoryCheckpointer(Checkpointer):
    """
    A checkpointer that keeps everything in memory; nothing survives the process.

    :param cache_size: How many threads' head states to keep materialized (0 disables the cache).
    :param kwargs: The settings of :class:`~haystack_state.persistence.base.Checkpointer` (``lease_ttl``,
        ``thread_ttl``, ``snapshot_min_bytes``, ``snapshot_ratio``).
    """

    def __init__(self, *, cache_size: int = 64, **kwargs: Unpack[CheckpointerSettings]) -> None:
        super().__init__(cache_size=cache_size, **kwargs)
        self._lock = threading.Lock()
        self._threads: dict[str, _Thread] = {}
        self._leases: dict[str, LeaseHolder] = {}
        self._stops: set[tuple[str, str]] = set()  # (thread, owner) of the runs asked to stop

    def init_parameters(self) -> dict[str, Any]:
        """No settings: a rebuilt in-memory checkpointer starts empty (its threads live only in this object)."""
        return self._common_parameters()

    def _execute(self, op: ops.Op) -> object:
        with self._lock:
            return self._handlers[type(op)](op)

    def _visible(self, thread_id: str, now: dt.datetime) -> _Thread | None:
        thread = self._threads.get(thread_id)
        return thread if thread is not None and not thread.expired(now) else None

    def _insert(self, op: ops.Insert) -> None:
        row = op.row
        thread = self._threads.get(row.thread_id)
        if thread is not None and thread.expired(op.now) and op.expected_head is None:
            del self._threads[row.thread_id]
            thread = None
        if op.lease_owner is not None:
            holder = self._leases.get(row.thread_id)
            if holder is not None and holder.owner != op.lease_owner and holder.expires > op.now:
                raise busy_error(row.thread_id, *holder)
        head = thread.head_id if thread is not None else None
        check_commit(row, op.expected_head, head, lambda: thread is not None and row.parent_id in thread.rows)
        if thread is None:
            thread = self._threads[row.thread_id] = _Thread(row.checkpoint_id, row.created_at, row.created_at, op.ttl)
        thread.rows[row.checkpoint_id] = row
        thread.head_id = row.checkpoint_id
        thread.updated_at = row.created_at

    def _read_head(self, op: ops.ReadHead) -> str | None:
        thread = self._visible(op.thread_id, op.now)
        return thread.head_id if thread is not None else None

    def _read_meta(self, op: ops.ReadMeta) -> StoredCheckpoint:
        thread = self._visible(op.thread_id, op.now)
        if thread is None:
            raise ThreadNotFoundError(op.thread_id)
        target = thread.head_id if op.checkpoint_id is None else op.checkpoint_id
        row = thread.rows.get(target)
        if row is None:
            raise CheckpointNotFoundError(op.thread_id, target)
        return row

    def _open_thread(self, op: ops.OpenThread) -> tuple[LeaseHolder | None, StoredCheckpoint | None]:
        holder = self._leases.get(op.thread_id)
        try:
            return holder, self._read_meta(ops.ReadMeta(op.thread_id, op.checkpoint_id, op.now))
        except ThreadNotFoundError:
            return holder, None

    def _read_chain(self, op: ops.ReadChain) -> list[ChainLink]:
        thread = self._threads.get(op.thread_id)
        rows = thread.rows if thread is not None else {}
        chain: list[ChainLink] = []
        current: str | None = op.checkpoint_id
        while current is not None and current != op.stop_at and len(chain) <= len(rows):
            row = rows.get(current)
            if row is None:
                break
            chain.append(ChainLink(row.checkpoint_id, row.parent_id, row.delta, row.snapshot))
            if row.snapshot is not None:
                break
            current = row.parent_id
        chain.reverse()
        return chain

    def _read_history(self, op: ops.ReadHistory) -> list[StoredCheckpoint]:
        thread = self._visible(op.thread_id, op.now)
        if thread is None:
            raise ThreadNotFoundError(op.thread_id)
        rows = list(reversed(thread.rows.values()))
        if op.before is not None:
            ids = [row.checkpoint_id for row in rows]
            if op.before not in thread.rows:
                raise CheckpointNotFoundError(op.thread_id, op.before)
            rows = rows[ids.index(op.before) + 1 :]
        if op.limit is not None:
            rows = rows[: op.limit]
        return [dataclasses.replace(row, snapshot="" if row.snapshot is not None else None) for row in rows]

    def _read_threads(self, op: ops.ReadThreads) -> list[ThreadInfo]:
        infos = [
            ThreadInfo(thread_id, t.head_id, len(t.rows), t.created_at, t.updated_at)
            for thread_id, t in self._threads.items()
            if not t.expired(op.now)
        ]
        return sorted(infos, key=lambda info: (-info.updated_at.timestamp(), info.thread_id))

    def _delete(self, op: ops.DeleteThread) -> bool:
        thread = self._threads.get(op.thread_id)
        if thread is None:
            return False
        if op.only_expired:
            lease = self._leases.get(op.thread_id)
            if not thread.expired(op.now) or (lease is not None and lease[1] > op.now):
                return False
        elif thread.expired(op.now):
            del self._threads[op.thread_id]
            return False
        del self._threads[op.thread_id]
        self._leases.pop(op.thread_id, None)
        return True

    def _prune_candidates(self, op: ops.ReadPruneCandidates) -> tuple[list[str], list[str]]:
        ids = [op.thread_id] if op.thread_id is not None else list(self._threads)
        present = [thread_id for thread_id in ids if thread_id in self._threads]
        expired = [thread_id for thread_id in present if self._threads[thread_id].expired(op.now)]
        return [thread_id for thread_id in present if thread_id not in expired], expired

    def _set_snapshot(self, op: ops.SetSnapshot) -> None:
        thread = self._threads.get(op.thread_id)
        if thread is not None and op.checkpoint_id in thread.rows:
            row = thread.rows[op.checkpoint_id]
            thread.rows[op.checkpoint_id] = dataclasses.replace(
                row, snapshot=op.snapshot, chain_bytes=0, base_bytes=len(op.snapshot)
            )

    def _delete_checkpoints(self, op: ops.DeleteCheckpoints) -> int:
        thread = self._threads.get(op.thread_id)
        if thread is None:
            return 0
        doomed = [cid for cid in op.checkpoint_ids if cid in thread.rows and cid != thread.head_id]
        for cid in doomed:
            del thread.rows[cid]
        return len(doomed)

    def _set_ttl(self, op: ops.SetTTL) -> bool:
        thread = self._visible(op.thread_id, op.now)
        if thread is None:
            return False
        thread.ttl = op.ttl
        return True

    def _acquire(self, op: ops.AcquireLease) -> LeaseHolder | None:
        holder = self._leases.get(op.thread_id)
        if holder is not None and holder.owner != op.owner and holder.expires > op.now:
            return holder
        self._leases[op.thread_id] = LeaseHolder(op.owner, op.expires_at)
        self._stops = {stop for stop in self._stops if stop[0] != op.thread_id}
        return None

    def _hold(self, op: ops.HoldThread) -> tuple[LeaseHolder | None, str | None]:
        holder = self._acquire(ops.AcquireLease(op.thread_id, op.owner, op.now, op.expires_at))
        if holder is not None:
            return holder, None
        return None, self._read_head(ops.ReadHead(op.thread_id, op.now))

    def _renew(self, op: ops.RenewLease) -> bool | None:
        holder = self._leases.get(op.thread_id)
        if holder is None or holder.owner != op.owner:
            return None
        self._leases[op.thread_id] = LeaseHolder(op.owner, op.expires_at)
        return (op.thread_id, op.owner) in self._stops

    def _read_lease(self, op: ops.ReadLease) -> LeaseHolder | None:
        return self._leases.get(op.thread_id)

    def _request_stop(self, op: ops.RequestStop) -> bool:
        holder = self._leases.get(op.thread_id)
        if holder is None or holder.expires <= op.now:
            return False
        self._stops.add((op.thread_id, holder.owner))
        return True

    def _release(self, op: ops.ReleaseLease) -> bool:
        holder = self._leases.get(op.thread_id)
        if holder is None or holder.owner != op.owner:
            return False
        del self._leases[op.thread_id]
        return True

    def _close(self) -> None:
        with self._lock:
            self._threads.clear()
            self._leases.clear()

    def _replace_row(self, row: StoredCheckpoint) -> None:
        """Overwrite a stored row as is (for tests of corrupt data)."""
        with self._lock:
            self._threads[row.thread_id].rows[row.checkpoint_id] = row
