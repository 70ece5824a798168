"""
Retention: pruning old checkpoints and threads whose time to live expired (:meth:`Checkpointer.prune`).

A checkpoint is removed when it is neither among the newest ``keep_last`` of its thread nor newer than
``older_than``. The head and interrupted checkpoints are always kept. A kept checkpoint whose parent is removed gets
a snapshot of its full state first, so that it (and every kept checkpoint read through it) reads exactly as before;
its ``parent_id`` still names the removed checkpoint. Each thread is pruned under its lease, so a live run's thread
is skipped and no run forks from a checkpoint while it is removed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import TYPE_CHECKING, cast

from haystack_state.errors import HaystackStateError, ThreadBusyError, ThreadNotFoundError
from haystack_state.persistence import ops
from haystack_state.persistence._chain import check_chain, compose_chain, encoded_values
from haystack_state.persistence.codec import from_json, to_json
from haystack_state.persistence.delta import utc_now
from haystack_state.persistence.records import CheckpointMetadata, PruneResult, StoredCheckpoint, check_thread_id

if TYPE_CHECKING:
    from haystack_state.persistence.base import Checkpointer, Flow

__all__ = ["prune_flow", "removable", "stored_metadata", "ttl_seconds"]


def ttl_seconds(ttl: object) -> float | None:
    """
    A time to live as seconds.

    :param ttl: Seconds, a ``timedelta`` or None.
    :raises ValueError: If it is not positive.
    """
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, dt.timedelta) else ttl
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
        raise ValueError(f"A TTL must be a positive number of seconds or a timedelta, got {ttl!r}.")
    return float(seconds)


def stored_metadata(row: StoredCheckpoint) -> CheckpointMetadata | None:
    """
    A row's metadata as stored (its JSON parsed, values not decoded), or None if it is not a JSON object.

    :param row: The row.
    """
    try:
        metadata = from_json(row.metadata)
    except ValueError:
        return None
    return cast(CheckpointMetadata, metadata) if isinstance(metadata, dict) else None


def _is_interrupted(row: StoredCheckpoint) -> bool:
    """Whether a checkpoint waits for a human (an unreadable one counts: reading it reports the problem)."""
    metadata = stored_metadata(row)
    return metadata is None or bool(metadata.get("interrupted"))


def removable(
    rows: list[StoredCheckpoint], head: str | None, keep_last: int | None, cutoff: dt.datetime | None
) -> set[str]:
    """
    The ids of the checkpoints a prune removes (see the module docstring).

    :param rows: The thread's rows, newest first.
    :param head: The thread's head.
    :param keep_last: Keep the newest this many.
    :param cutoff: Keep those created at or after this time.
    """
    if keep_last is None and cutoff is None:
        return set()
    found = set()
    for index, row in enumerate(rows):
        if row.checkpoint_id == head or (keep_last is not None and index < keep_last):
            continue
        if cutoff is not None and row.created_at >= cutoff:
            continue
        if not _is_interrupted(row):
            found.add(row.checkpoint_id)
    return found


def prune_flow(
    checkpointer: Checkpointer,
    thread_id: str | None,
    keep_last: int | None,
    older_than: float | dt.timedelta | None,
) -> Flow[PruneResult]:
    """The flow of :meth:`Checkpointer.prune`."""
    if thread_id is not None:
        check_thread_id(thread_id)
    if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
        raise ValueError(f"prune: keep_last must be a positive int or None, got {keep_last!r}.")
    age = None
    if older_than is not None:
        age = older_than.total_seconds() if isinstance(older_than, dt.timedelta) else older_than
        if not isinstance(age, int | float) or isinstance(age, bool) or age < 0:
            raise ValueError(f"prune: older_than must be seconds (at least 0) or a timedelta, got {older_than!r}.")
    now = utc_now()
    cutoff = now - dt.timedelta(seconds=age) if age is not None else None
    threads, expired = yield ops.ReadPruneCandidates(thread_id, now)
    deleted: list[str] = []
    for expired_id in expired:
        if (yield ops.DeleteThread(expired_id, now, only_expired=True)):
            checkpointer._cache.drop(expired_id)
            deleted.append(expired_id)
    removed = snapshots = 0
    skipped: list[str] = []
    if keep_last is None and cutoff is None:
        return PruneResult(deleted, 0, 0, skipped)
    for current in threads:
        try:
            lease = yield from checkpointer._acquire_flow(current, None, None)
        except ThreadBusyError:
            skipped.append(current)
            continue
        try:
            try:
                rows: list[StoredCheckpoint] = yield ops.ReadHistory(current, None, None, now)
            except ThreadNotFoundError:
                continue
            head = yield ops.ReadHead(current, now)
            gone = removable(rows, head, keep_last, cutoff)
            if not gone:
                continue
            for row in rows:
                if row.checkpoint_id in gone or row.parent_id not in gone or row.snapshot is not None:
                    continue
                chain = yield ops.ReadChain(current, row.checkpoint_id, None)
                check_chain(current, row.checkpoint_id, None, chain)
                composed, _ = compose_chain(current, chain, from_snapshot=chain[0].snapshot is not None)
                yield ops.SetSnapshot(current, row.checkpoint_id, to_json(encoded_values(composed)))
                snapshots += 1
            removed += yield ops.DeleteCheckpoints(current, tuple(sorted(gone)))
        finally:
            with contextlib.suppress(HaystackStateError):  # the lease expires on its own
                yield ops.ReleaseLease(lease.thread_id, lease.owner)
    return PruneResult(deleted, removed, snapshots, skipped)
