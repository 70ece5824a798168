"""
The flows of :class:`~haystack_state.persistence.base.Checkpointer`: each public method's logic, written once as a
generator that yields typed operations (:mod:`haystack_state.persistence.ops`) and receives their results, so the
sync and the async method drive the same code (see :mod:`haystack_state._flows`). Here are encoding and validation,
snapshots, the head cache's updates, leases and the checks of a commit inside a backend's transaction
(:func:`check_commit`); :mod:`haystack_state.persistence.base` holds the public methods that drive them.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from haystack_state._flows import FlowDriver
from haystack_state._text import find_bad_text
from haystack_state.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    CodecError,
    ThreadConflictError,
    ThreadNotFoundError,
    UnstorableTextError,
)
from haystack_state.persistence import ops
from haystack_state.persistence._cache import fresh_copy, merge_frozen
from haystack_state.persistence._chain import (
    check_chain,
    compose_chain,
    encoded_values,
    needs_snapshot,
    paused_gc,
    state_json,
)
from haystack_state.persistence._leases import new_owner
from haystack_state.persistence._reading import StateReader, adopt_op
from haystack_state.persistence._retention import ttl_seconds
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
from haystack_state.persistence.ops import Flow
from haystack_state.persistence.records import (
    SOURCES,
    Checkpoint,
    CheckpointMeta,
    Lease,
    LeaseHolder,
    StoredCheckpoint,
    check_thread_id,
    valid_checkpoint_id,
)

__all__ = ["CheckpointFlows", "EncodedCommit", "check_commit", "conflict_error", "encode_commit"]


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


class EncodedCommit(NamedTuple):
    """
    A commit's arguments (see :meth:`~haystack_state.persistence.base.Checkpointer.commit`), checked and encoded by
    :func:`encode_commit` before anything is read or written.

    :param delta: The delta as given (a ``frozen`` commit's head cache adopts its values).
    :param encoded: The delta's operations, their values encoded.
    :param delta_text: The delta's JSON text, as stored.
    :param metadata: The metadata, encoded.
    :param metadata_text: Its JSON text, as stored.
    """

    thread_id: str
    parent_id: str | None
    step: int
    source: str
    tool_names: tuple[str, ...]
    delta: Delta
    encoded: dict[str, dict[str, Any]]
    delta_text: str
    metadata: Any
    metadata_text: str


def encode_commit(
    thread_id: str,
    parent_id: str | None,
    delta: Delta,
    step: int,
    source: Source,
    tool_names: Sequence[str],
    metadata: dict[str, Any] | None,
) -> EncodedCommit:
    """
    Check a commit's arguments and encode its delta and metadata (the parameters and errors are
    :meth:`~haystack_state.persistence.base.Checkpointer.commit`'s).
    """
    _check_commit_args(thread_id, step, source, tool_names, metadata)
    if parent_id is not None and not valid_checkpoint_id(parent_id):
        raise CheckpointNotFoundError(thread_id, repr(parent_id))
    encoded = encode_delta(delta)
    encoded_metadata = encode(dict(metadata or {}), where="metadata")
    delta_text = delta_json(delta, encoded)
    metadata_text = checked_json(encoded_metadata, metadata, "The checkpoint metadata")
    return EncodedCommit(
        thread_id,
        parent_id,
        step,
        source,
        tuple(tool_names),
        delta,
        encoded,
        delta_text,
        encoded_metadata,
        metadata_text,
    )


class CheckpointFlows(StateReader, FlowDriver):
    """The flows and the backend's pair of methods behind :class:`~haystack_state.persistence.base.Checkpointer`."""

    _closed: bool
    lease_ttl: float
    thread_ttl: float | None
    _snapshot_min_bytes: int
    _snapshot_ratio: float

    # --- the pair of methods a backend implements ---------------------------------------------------------------

    @abc.abstractmethod
    def _execute(self, op: ops.Op) -> object:
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
        self, commit: EncodedCommit, expected_head: str | None, lease: Lease | None, frozen: bool
    ) -> Flow[CheckpointMeta]:
        thread_id, parent_id, encoded, delta_text = (
            commit.thread_id,
            commit.parent_id,
            commit.encoded,
            commit.delta_text,
        )
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
            snapshot = self._snapshot_from_cache(thread_id, parent_id, commit.delta)
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
            step=commit.step,
            source=commit.source,
            tool_names=commit.tool_names,
            created_at=now,
            changed_keys=tuple(encoded),
            metadata=commit.metadata_text,
            delta=delta_text,
            snapshot=snapshot,
            chain_bytes=chain_bytes,
            base_bytes=max(base_bytes, 0),
        )
        yield ops.Insert(row, expected_head, lease.owner if lease is not None else None, now, self.thread_ttl)
        self._advance_cache(row, encoded, commit.delta if frozen else None)
        return self._meta(row, decode(commit.metadata, where="metadata") if commit.metadata else {})

    def _get_flow(self, thread_id: str, checkpoint_id: str | None, read_only: bool) -> Flow[Checkpoint]:
        check_thread_id(thread_id)
        if checkpoint_id is not None and not valid_checkpoint_id(checkpoint_id):
            raise CheckpointNotFoundError(thread_id, repr(checkpoint_id))
        row: StoredCheckpoint = yield ops.ReadMeta(thread_id, checkpoint_id, utc_now())
        return (yield from self._checkpoint_flow(row, checkpoint_id is None, read_only))

    def _open_flow(self, thread_id: str, read_only: bool) -> Flow[tuple[Lease | None, Checkpoint | None]]:
        check_thread_id(thread_id)
        holder, row = yield ops.OpenThread(thread_id, None, utc_now())
        if holder is not None and holder.expires > utc_now():
            return Lease(thread_id, holder.owner, holder.expires), None
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
        from haystack_state.persistence._leases import lost_error

        now = utc_now()
        expires = now + dt.timedelta(seconds=self._lease_seconds(ttl))
        stop = yield ops.RenewLease(lease.thread_id, lease.owner, now, expires)
        if stop is None:
            raise lost_error(lease)
        return Lease(lease.thread_id, lease.owner, expires, stop_requested=bool(stop))

    def _read_lease_flow(self, thread_id: str) -> Flow[Lease | None]:
        check_thread_id(thread_id)
        found = yield ops.ReadLease(thread_id)
        if found is None or found.expires <= utc_now():
            return None
        return Lease(thread_id, found.owner, found.expires)

    def _lease_seconds(self, ttl: float | None) -> float:
        seconds = self.lease_ttl if ttl is None else ttl
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
            raise ValueError(f"A lease's ttl must be a positive number of seconds, got {ttl!r}.")
        return float(seconds)


def _refuse_held(thread_id: str, holder: LeaseHolder | None) -> None:
    """Raise ``ThreadBusyError`` naming a live lease's holder, if another owner holds one."""
    from haystack_state.persistence._leases import busy_error

    if holder is not None:
        raise busy_error(thread_id, holder.owner, holder.expires)


def _check_commit_args(
    thread_id: str, step: int, source: object, tool_names: Sequence[str], metadata: dict[str, Any] | None
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
