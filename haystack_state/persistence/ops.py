"""
The typed operations a storage backend executes.

A checkpointer's public API (``commit``, ``get``, ``history``, ``prune``, leases ..., and their async twins) is
written once in :class:`~haystack_state.persistence.base.Checkpointer` as flows that yield these operations; a
backend implements one pair of methods over them, ``_execute(op)`` and ``_aexecute(op)``. Each operation is one
transaction: all of it happens, or (on any error) nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Generator
from typing import Any, TypeVar

from haystack_state.persistence.records import StoredCheckpoint

__all__ = [
    "AcquireLease",
    "DeleteCheckpoints",
    "DeleteThread",
    "HoldThread",
    "Insert",
    "Op",
    "OpenThread",
    "ReadChain",
    "ReadHead",
    "ReadHistory",
    "ReadLease",
    "RequestStop",
    "ReadMeta",
    "ReadPruneCandidates",
    "ReadThreads",
    "ReleaseLease",
    "RenewLease",
    "SetSnapshot",
    "SetTTL",
    "Flow",
    "HANDLERS",
    "describe",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Insert:
    """
    Check a commit (:func:`~haystack_state.persistence.base.check_commit`), insert the row and make it the head.
    With ``lease_owner``, the commit is refused (``ThreadBusyError``) if another owner holds a live lease on the
    thread. A thread whose TTL has expired is deleted first (it is invisible already). Returns None.
    """

    row: StoredCheckpoint
    expected_head: str | None
    lease_owner: str | None
    now: dt.datetime
    ttl: float | None  # the TTL a new thread gets, in seconds


@dataclasses.dataclass(frozen=True, slots=True)
class ReadHead:
    """The thread's head id, or None (also for an expired thread)."""

    thread_id: str
    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class ReadMeta:
    """
    A checkpoint's row (the head's if ``checkpoint_id`` is None), without its delta; raises
    ``ThreadNotFoundError`` or ``CheckpointNotFoundError``.
    """

    thread_id: str
    checkpoint_id: str | None
    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class OpenThread:
    """
    :class:`ReadLease` and :class:`ReadMeta` read together: returns ``(holder, row)``, the lease as ``(owner,
    expires_at)`` or None, and the checkpoint's row or None if the thread does not exist; raises
    ``CheckpointNotFoundError``.
    """

    thread_id: str
    checkpoint_id: str | None
    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class ReadChain:
    """
    The links from a checkpoint back to the nearest snapshot (included) or the root, or to ``stop_at`` (excluded),
    oldest first. The walk is bounded by the number of rows the thread holds.
    """

    thread_id: str
    checkpoint_id: str
    stop_at: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class ReadHistory:
    """
    The thread's rows (no deltas; ``snapshot`` is ``""`` for a row that holds one), newest first: at most ``limit``,
    those committed before ``before``. Raises ``ThreadNotFoundError`` (or ``CheckpointNotFoundError`` for
    ``before``).
    """

    thread_id: str
    limit: int | None
    before: str | None
    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class ReadThreads:
    """The summaries of every visible thread, the most recently updated first."""

    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class DeleteThread:
    """
    Delete a thread, its checkpoints and its lease; returns whether it existed (visible). With ``only_expired``,
    only if its TTL has expired and no live lease holds it.
    """

    thread_id: str
    now: dt.datetime
    only_expired: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ReadPruneCandidates:
    """
    For pruning: the ids of the threads to look at (``thread_id`` alone, or all), and those whose TTL expired.
    Returns ``(thread_ids, expired_ids)``.
    """

    thread_id: str | None
    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class SetSnapshot:
    """Store the full state of a checkpoint (JSON text) beside its delta, so reads can start there."""

    thread_id: str
    checkpoint_id: str
    snapshot: str


@dataclasses.dataclass(frozen=True, slots=True)
class DeleteCheckpoints:
    """Delete these checkpoints of a thread (never its head); returns how many were deleted."""

    thread_id: str
    checkpoint_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class SetTTL:
    """Set (or clear, with None) a thread's time to live in seconds; returns whether the thread exists."""

    thread_id: str
    ttl: float | None
    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class AcquireLease:
    """
    Take the thread's lease for ``owner`` until ``expires_at`` unless another owner holds it past ``now``. Returns
    None on success, or the live holder's ``(owner, expires_at)``.
    """

    thread_id: str
    owner: str
    now: dt.datetime
    expires_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class HoldThread:
    """
    :class:`AcquireLease`, then (once it is taken) read the thread's visible head, as :class:`ReadHead` would right
    after. Returns ``(None, head)`` on success, or ``(holder, None)`` with the live holder's ``(owner, expires_at)``.
    """

    thread_id: str
    owner: str
    now: dt.datetime
    expires_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class RenewLease:
    """
    Extend ``owner``'s lease to ``expires_at``; returns None if it does not hold it (any more), else whether a stop
    was asked of the run (``RequestStop``).
    """

    thread_id: str
    owner: str
    now: dt.datetime
    expires_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseLease:
    """Drop ``owner``'s lease (nothing if it does not hold it); returns whether it held it."""

    thread_id: str
    owner: str


@dataclasses.dataclass(frozen=True, slots=True)
class ReadLease:
    """The thread's lease as ``(owner, expires_at)``, or None."""

    thread_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class RequestStop:
    """Ask the run holding the thread's lease (live at ``now``) to stop; returns whether such a run was found."""

    thread_id: str
    now: dt.datetime


Op = (
    Insert
    | ReadHead
    | ReadMeta
    | OpenThread
    | ReadChain
    | ReadHistory
    | ReadThreads
    | DeleteThread
    | ReadPruneCandidates
    | SetSnapshot
    | DeleteCheckpoints
    | SetTTL
    | AcquireLease
    | HoldThread
    | RenewLease
    | ReleaseLease
    | ReadLease
    | RequestStop
)

T = TypeVar("T")
#: A flow: yields operations, receives their results, returns a public method's result (written once; driven by a
#: checkpointer's ``_execute`` or, awaited, by its ``_aexecute``).
Flow = Generator[Op, Any, T]

#: The operations that write (a backend runs them in a write transaction).
WRITES = (
    Insert,
    DeleteThread,
    SetSnapshot,
    DeleteCheckpoints,
    SetTTL,
    AcquireLease,
    HoldThread,
    RenewLease,
    ReleaseLease,
    RequestStop,
)


#: The name of the method that executes each operation, the same in every backend: the one op->handler table
#: (:class:`~haystack_state.persistence.base.Checkpointer` binds it once per checkpointer).
HANDLERS: dict[type, str] = {
    Insert: "_insert",
    ReadHead: "_read_head",
    ReadMeta: "_read_meta",
    OpenThread: "_open_thread",
    ReadChain: "_read_chain",
    ReadHistory: "_read_history",
    ReadThreads: "_read_threads",
    DeleteThread: "_delete",
    ReadPruneCandidates: "_prune_candidates",
    SetSnapshot: "_set_snapshot",
    DeleteCheckpoints: "_delete_checkpoints",
    SetTTL: "_set_ttl",
    AcquireLease: "_acquire",
    HoldThread: "_hold",
    RenewLease: "_renew",
    ReleaseLease: "_release",
    ReadLease: "_read_lease",
    RequestStop: "_request_stop",
}


def describe(op: Op) -> str:
    """
    Name an operation for an error message: what it did, on which thread.

    :param op: The operation.
    :returns: Such as ``"commit to thread 'a'"``.
    """
    thread_id = op.row.thread_id if isinstance(op, Insert) else getattr(op, "thread_id", None)
    what = {
        Insert: "commit",
        ReadHead: "reading the head",
        ReadMeta: "reading a checkpoint",
        OpenThread: "reading a checkpoint",
        ReadChain: "reading a checkpoint's state",
        ReadHistory: "reading the history",
        ReadThreads: "listing threads",
        DeleteThread: "deleting",
        ReadPruneCandidates: "pruning",
        SetSnapshot: "writing a snapshot",
        DeleteCheckpoints: "pruning checkpoints",
        SetTTL: "setting the TTL",
        AcquireLease: "acquiring the lease",
        HoldThread: "acquiring the lease",
        RenewLease: "renewing the lease",
        ReleaseLease: "releasing the lease",
        ReadLease: "reading the lease",
        RequestStop: "asking the run to stop",
    }[type(op)]
    if thread_id is None:
        return what
    return f"{what} {'to' if isinstance(op, Insert) else 'of'} thread '{thread_id}'"
