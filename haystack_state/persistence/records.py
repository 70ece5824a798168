"""
The records of the checkpoint storage: what a checkpoint, a thread and a stored row hold.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, NamedTuple


@dataclasses.dataclass(frozen=True)
class CheckpointMeta:
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

    thread_id: str
    checkpoint_id: str
    parent_id: str | None
    step: int
    source: str
    tool_names: tuple[str, ...]
    created_at: dt.datetime
    changed_keys: tuple[str, ...]
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
class StoredCheckpoint:
    """
    A checkpoint row as backends store it: the record plus the JSON text of its metadata and delta.

    :param delta: The delta's JSON text; empty when a backend read only the record.
    """

    thread_id: str
    checkpoint_id: str
    parent_id: str | None
    step: int
    source: str
    tool_names: tuple[str, ...]
    created_at: dt.datetime
    changed_keys: tuple[str, ...]
    metadata: str
    delta: str = ""


class ChainLink(NamedTuple):
    """
    One checkpoint on the walk from a checkpoint back to the root: only what materializing a state needs.

    :param checkpoint_id: The checkpoint's id.
    :param parent_id: The checkpoint it follows, or None for the root.
    :param delta: The delta's JSON text.
    """

    checkpoint_id: str
    parent_id: str | None
    delta: str
