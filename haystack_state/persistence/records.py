"""
The records of the checkpoint storage: what a checkpoint, a thread and a stored row hold.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import operator
from collections.abc import Callable
from typing import Any, NamedTuple, TypedDict

from haystack_state._text import repaired
from haystack_state.errors import CheckpointError

#: The longest thread id accepted, in characters and in UTF-8 bytes (every backend indexes it as text).
MAX_THREAD_ID = 1000
MAX_THREAD_ID_BYTES = 2000
#: The sources a checkpoint may have.
SOURCES: tuple[str, ...] = ("input", "model", "tools", "update")


@dataclasses.dataclass(frozen=True)
class CheckpointFields:
    """
    The fields a checkpoint's record (:class:`CheckpointMeta`, which documents them) and its stored row
    (:class:`StoredCheckpoint`) share, in this order.
    """

    thread_id: str
    checkpoint_id: str
    parent_id: str | None
    step: int
    source: str
    tool_names: tuple[str, ...]
    created_at: dt.datetime
    changed_keys: tuple[str, ...]


#: The values of a row's or record's :class:`CheckpointFields`, in order.
SharedValues = tuple[str, str, str | None, int, str, tuple[str, ...], dt.datetime, tuple[str, ...]]
#: A row's or record's :class:`CheckpointFields` as a tuple, so that ``CheckpointMeta(*shared_fields(row), metadata)``
#: builds a record from a row (one C call, on the commit path).
shared_fields: Callable[[CheckpointFields], SharedValues] = operator.attrgetter(
    *(field.name for field in dataclasses.fields(CheckpointFields))
)


@dataclasses.dataclass(frozen=True)
class CheckpointMeta(CheckpointFields):
    """
    What a checkpoint records besides the state values.

    :param thread_id: The thread the checkpoint belongs to.
    :param checkpoint_id: The checkpoint's id (a UUIDv7 string; sorts by creation time).
    :param parent_id: The checkpoint it follows, or None for the first checkpoint of the thread.
    :param step: The agent step that produced it.
    :param source: What produced it: ``"input"``, ``"model"``, ``"tools"`` or ``"update"``.
    :param tool_names: The tools whose results it records (for ``source="tools"``).
    :param created_at: When it was committed (timezone-aware, UTC).
    :param changed_keys: The state keys its delta changed, in delta order.
    :param metadata: Free-form metadata (pending tool calls, exit reason, ...), decoded.
    """

    metadata: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """
    A checkpoint with its materialized state.

    :param meta: The checkpoint's record.
    :param values: The full state at this checkpoint, decoded. A fresh dict on every read; changing it changes
        nothing stored. By default everything in it is the caller's own copy; a read with ``read_only=True`` gives
        values shared with the checkpointer's cache instead (read-only containers; objects must not be changed).
    """

    meta: CheckpointMeta
    values: dict[str, Any]

    @property
    def thread_id(self) -> str:
        """The thread the checkpoint belongs to."""
        return self.meta.thread_id

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint's id."""
        return self.meta.checkpoint_id

    @property
    def parent_id(self) -> str | None:
        """The id of the checkpoint it follows."""
        return self.meta.parent_id


@dataclasses.dataclass(frozen=True)
class ThreadInfo:
    """
    A summary of one thread.

    :param thread_id: The thread's id.
    :param head_id: The id of its latest checkpoint.
    :param checkpoint_count: How many checkpoints it holds (all branches).
    :param created_at: When its first checkpoint was committed.
    :param updated_at: When its latest checkpoint was committed.
    """

    thread_id: str
    head_id: str
    checkpoint_count: int
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class StoredCheckpoint(CheckpointFields):
    """
    A checkpoint row as backends store it: the record plus the JSON text of its metadata and delta.

    :param delta: The delta's JSON text; empty when a backend read only the record.
    :param snapshot: The full state at this checkpoint (JSON text) when one is stored, so that reads start here.
    :param chain_bytes: The bytes of the deltas from the nearest snapshot (or the root) to this checkpoint; 0 for a
        snapshot.
    :param base_bytes: The bytes of that nearest snapshot (0 if none).
    """

    metadata: str
    delta: str = ""
    snapshot: str | None = None
    chain_bytes: int = 0
    base_bytes: int = 0


class ChainLink(NamedTuple):
    """
    One checkpoint on the walk from a checkpoint back to the root: only what materializing a state needs.

    :param checkpoint_id: The checkpoint's id.
    :param parent_id: The checkpoint it follows, or None for the root.
    :param delta: The delta's JSON text.
    :param snapshot: The full state's JSON text if the checkpoint holds a snapshot (the walk stops there).
    """

    checkpoint_id: str
    parent_id: str | None
    delta: str
    snapshot: str | None = None


@dataclasses.dataclass(frozen=True)
class PruneResult:
    """
    What :meth:`Checkpointer.prune` removed.

    :param threads_deleted: The threads deleted because their TTL expired.
    :param checkpoints_deleted: The checkpoints removed from the threads that remain.
    :param snapshots_written: The kept checkpoints given a snapshot because a checkpoint they were read through was
        removed.
    :param threads_skipped: The threads left alone because a live run holds their lease.
    """

    threads_deleted: list[str]
    checkpoints_deleted: int
    snapshots_written: int
    threads_skipped: list[str]


class CheckpointMetadata(TypedDict, total=False):
    """
    What an Agent's run writes in a checkpoint's metadata (``Checkpointer.commit(metadata=...)``); every field is
    optional, a caller may add others, and the stored JSON is exactly this dict (its format does not change).

    :param run_step: The model calls the run had made when it committed this checkpoint.
    :param run_start: The agent step the run started at.
    :param run_id: The id of the run (the server's), when it has one.
    :param usage: The run's token usage so far, as the chat generator reported it.
    :param tool_call_counts: How many times the run called each tool (only tools called at least once).
    :param continues: The run was not finished at this checkpoint (a later run on the thread continues it).
    :param interrupted: The run stopped here waiting for a human (``Agent.resume``); retention keeps such a
        checkpoint.
    :param pending: The ids of the tool calls waiting for a human.
    :param interrupts: The requests a human must answer, JSON-ready (``ThreadSnapshot.interrupts``).
    :param answers: The answers to ``interrupt()`` calls given so far, per tool call id.
    :param loaded: The ``"scope": "loaded"`` state keys computed since the previous checkpoint.
    :param retries: The model and tool calls retried since the previous checkpoint, one record each (attempts,
        errors, whether the last attempt succeeded).
    :param stopped: Why the run stopped on an error (at most 500 characters).
    :param context_summary: What a context policy's summary covers.
    """

    run_step: int
    run_start: int
    run_id: str
    usage: dict[str, object]
    tool_call_counts: dict[str, int]
    continues: bool
    interrupted: bool
    pending: list[str]
    interrupts: list[dict[str, object]]
    answers: dict[str, list[object]]
    loaded: list[str]
    retries: list[dict[str, object]]
    stopped: str
    context_summary: object


class CheckpointerSettings(TypedDict, total=False):
    """The settings every checkpointer takes (see :class:`~haystack_state.persistence.base.Checkpointer`)."""

    lease_ttl: float
    thread_ttl: float | None
    snapshot_min_bytes: int
    snapshot_ratio: float


class LeaseHolder(NamedTuple):
    """
    Who holds a thread's lease, as a backend reads it (a tuple: ``owner, expires = holder`` works).

    :param owner: The lease's owner.
    :param expires: When it expires unless renewed (timezone-aware, UTC).
    """

    owner: str
    expires: dt.datetime


@dataclasses.dataclass(frozen=True)
class Lease:
    """
    A run's hold on a thread.

    :param thread_id: The thread.
    :param owner: Who holds it (host, process and a random part).
    :param expires_at: When it expires unless renewed (timezone-aware, UTC).
    :param stop_requested: Whether a stop was asked of the run holding it (read at its last renewal).
    """

    thread_id: str
    owner: str
    expires_at: dt.datetime
    stop_requested: bool = False


def check_thread_id(thread_id: object) -> str:
    """
    Check a thread id: a non-empty ``str`` of at most :data:`MAX_THREAD_ID` characters (and
    :data:`MAX_THREAD_ID_BYTES` bytes of UTF-8) that every backend stores the same way (no NUL character, no lone
    surrogate).

    :param thread_id: The id.
    :returns: The id.
    :raises ValueError: If it is not such a string (an ``int`` included: ``5`` and ``"5"`` are different ids).
    """
    if not isinstance(thread_id, str):
        raise ValueError(f"thread_id must be a string, got {type(thread_id).__name__} {thread_id!r}.")
    problem = _text_problem(thread_id)
    if problem is None and (len(thread_id) > MAX_THREAD_ID or len(thread_id.encode()) > MAX_THREAD_ID_BYTES):
        problem = (
            f"is {len(thread_id):,} characters ({len(thread_id.encode()):,} bytes in UTF-8) long: at most "
            f"{MAX_THREAD_ID:,} characters and {MAX_THREAD_ID_BYTES:,} bytes"
        )
    if problem is not None:
        raise ValueError(f"thread_id {_shown(thread_id)} {problem}.")
    return thread_id


def valid_checkpoint_id(checkpoint_id: object) -> bool:
    """
    Whether a checkpoint id could exist: a non-empty string of at most 100 characters without NUL or lone
    surrogates. Any other id names no checkpoint (a read of it is a ``CheckpointNotFoundError``).

    :param checkpoint_id: The id.
    """
    return isinstance(checkpoint_id, str) and len(checkpoint_id) <= 100 and _text_problem(checkpoint_id) is None


def _text_problem(text: str) -> str | None:
    if not text:
        return "is empty"
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (it is not valid Unicode text)"
    return None


def _shown(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def parse_row(
    thread_id: str,
    checkpoint_id: object,
    parent_id: object,
    step: object,
    source: object,
    tool_names: object,
    created_at: object,
    changed_keys: object,
    metadata: object,
    extra: tuple[Any, ...] = (),
) -> StoredCheckpoint:
    """
    Build a :class:`StoredCheckpoint` from stored columns, checking every field.

    :param tool_names: A JSON array of strings (text), as stored.
    :param changed_keys: A JSON array of strings (text), as stored.
    :param created_at: An ISO 8601 time with a UTC offset (text), or a timezone-aware datetime.
    :param extra: ``(delta, snapshot, chain_bytes, base_bytes)``, or a prefix of it.
    :returns: The row.
    :raises CheckpointError: Naming the thread, the checkpoint and the field, if a field is corrupt.
    """

    def corrupt(field: str, value: object, expected: str) -> CheckpointError:
        return CheckpointError(
            f"Thread '{thread_id}', checkpoint '{checkpoint_id}': the stored record is corrupt: field '{field}' "
            f"should be {expected}, got {_shown(repr(value))}."
        )

    if not isinstance(checkpoint_id, str) or not checkpoint_id:
        raise corrupt("checkpoint_id", checkpoint_id, "a non-empty string")
    if parent_id is not None and (not isinstance(parent_id, str) or not parent_id):
        raise corrupt("parent_id", parent_id, "a checkpoint id or null")
    if type(step) is not int or step < 0:
        raise corrupt("step", step, "an integer of at least 0")
    if source not in SOURCES:
        raise corrupt("source", source, f"one of {', '.join(SOURCES)}")
    names = _string_list(tool_names, thread_id, checkpoint_id, "tool_names")
    if names is None:
        raise corrupt("tool_names", tool_names, "a JSON array of strings")
    keys = _string_list(changed_keys, thread_id, checkpoint_id, "changed_keys")
    if keys is None:
        raise corrupt("changed_keys", changed_keys, "a JSON array of strings")
    created = _utc_time(created_at)
    if created is None:
        raise corrupt("created_at", created_at, "an ISO 8601 time with a UTC offset")
    if not isinstance(metadata, str):
        raise corrupt("metadata", metadata, "JSON text")
    defaults: tuple[Any, ...] = ("", None, 0, 0)
    delta, snapshot, chain_bytes, base_bytes = (*extra[:4], *defaults[len(extra[:4]) :])
    return StoredCheckpoint(
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        step=step,
        source=source,
        tool_names=names,
        created_at=created,
        changed_keys=keys,
        metadata=metadata,
        delta=delta if delta is not None else "",
        snapshot=snapshot,
        chain_bytes=chain_bytes if type(chain_bytes) is int else 0,
        base_bytes=base_bytes if type(base_bytes) is int else 0,
    )


def _string_list(text: Any, thread_id: Any, checkpoint_id: str, what: str) -> tuple[str, ...] | None:
    if not isinstance(text, str):
        return None
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if type(items) is not list or not all(type(item) is str for item in items):
        return None
    return tuple(repaired(items, text, thread_id=thread_id, checkpoint_id=checkpoint_id, what=what))


def _utc_time(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    if moment.tzinfo is None:
        return None
    return moment.astimezone(dt.UTC)


@functools.lru_cache(maxsize=1024)  # the same few tuples come back at every step
def string_list_json(items: tuple[str, ...]) -> str:
    """
    The stored form of ``tool_names`` and ``changed_keys``: a JSON array, ASCII-escaped (so NUL characters are stored
    as escapes, on every backend; lone surrogates are refused before, and read repaired from rows stored earlier).

    :param items: The strings.
    :returns: The JSON text.
    """
    return json.dumps(list(items))
