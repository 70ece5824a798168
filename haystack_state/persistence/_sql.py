"""
The SQL text that both SQL checkpointers (:mod:`~haystack_state.persistence._sqlite_ops` and
:mod:`~haystack_state.persistence._postgres_scripts`) run alike, with the driver's parameter marker.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from haystack_state.persistence.records import StoredCheckpoint, parse_row

__all__ = ["META_COLUMNS", "epoch", "from_epoch", "history_query", "stored_row"]

#: The stored columns of a :class:`~haystack_state.persistence.records.CheckpointMeta`, in order (as
#: :func:`~haystack_state.persistence.records.parse_row` takes them).
META_COLUMNS = "thread_id, checkpoint_id, parent_id, step, source, tool_names, created_at, changed_keys, metadata"


def history_query(table: str, marker: str, *, before: bool, limit: int | None) -> str:
    """
    The SQL of a page of a thread's history, newest first: the records without their delta (a stored snapshot read
    as ``''``), as :func:`stored_row` takes them. Its parameters: the thread id, then with ``before`` the ``seq`` of
    the checkpoint the page starts below.

    :param table: The checkpoints table.
    :param marker: The driver's parameter marker (``?`` or ``%s``).
    :param before: Whether the page starts below a checkpoint.
    :param limit: At most this many records (None: all).
    """
    where = f"thread_id = {marker} AND seq < {marker}" if before else f"thread_id = {marker}"
    page = f" LIMIT {int(limit)}" if limit is not None else ""
    return (
        f"SELECT {META_COLUMNS}, '', CASE WHEN snapshot IS NULL THEN NULL ELSE '' END, chain_bytes, base_bytes "
        f"FROM {table} WHERE {where} ORDER BY seq DESC{page}"
    )


def epoch(moment: dt.datetime) -> float:
    """A time as stored: seconds since the epoch."""
    return moment.timestamp()


def from_epoch(value: float) -> dt.datetime:
    """A stored time (seconds since the epoch) as a timezone-aware datetime, in UTC."""
    return dt.datetime.fromtimestamp(value, dt.UTC)


def stored_row(found: Sequence[Any]) -> StoredCheckpoint:
    """A row read as ``SELECT {META_COLUMNS}, delta, snapshot, chain_bytes, base_bytes`` (or a prefix of the four)."""
    return parse_row(
        found[0], found[1], found[2], found[3], found[4], found[5], found[6], found[7], found[8], tuple(found[9:])
    )
