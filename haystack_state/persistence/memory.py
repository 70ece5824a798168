"""
:class:`InMemoryCheckpointer`: checkpoints kept in process memory, for tests, notebooks and short-lived agents.

It stores the same JSON text as the database backends, so values go through the codec exactly as they would in
SQLite or PostgreSQL (an unencodable value fails here too, and reads return fresh copies).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from typing import Any

from haystack_state.errors import CheckpointNotFoundError, ThreadNotFoundError
from haystack_state.persistence.base import Checkpointer, check_commit
from haystack_state.persistence.records import ChainLink, StoredCheckpoint, ThreadInfo


@dataclasses.dataclass
class _Thread:
    head_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    rows: dict[str, StoredCheckpoint] = dataclasses.field(default_factory=dict)  # in commit order


class InMemoryCheckpointer(Checkpointer):
    """
    A checkpointer that keeps everything in memory; nothing survives the process.

    :param cache_size: How many threads' head states to keep materialized (0 disables the cache).
    """

    def __init__(self, *, cache_size: int = 64) -> None:
        super().__init__(cache_size=cache_size)
        self._lock = threading.Lock()
        self._threads: dict[str, _Thread] = {}

    def init_parameters(self) -> dict[str, Any]:
        """No settings: a rebuilt in-memory checkpointer starts empty (its threads live only in this object)."""
        return {}

    def _insert(self, row: StoredCheckpoint, expected_head: str | None) -> None:
        with self._lock:
            thread = self._threads.get(row.thread_id)
            head = thread.head_id if thread is not None else None
            check_commit(row, expected_head, head, lambda: thread is not None and row.parent_id in thread.rows)
            if thread is None:
                thread = self._threads[row.thread_id] = _Thread(row.checkpoint_id, row.created_at, row.created_at)
            thread.rows[row.checkpoint_id] = row
            thread.head_id = row.checkpoint_id
            thread.updated_at = row.created_at

    def _read_head(self, thread_id: str) -> str | None:
        with self._lock:
            thread = self._threads.get(thread_id)
            return thread.head_id if thread is not None else None

    def _read_meta(self, thread_id: str, checkpoint_id: str | None) -> StoredCheckpoint:
        with self._lock:
            thread = self._threads.get(thread_id)
            if thread is None:
                raise ThreadNotFoundError(thread_id)
            row = thread.rows.get(thread.head_id if checkpoint_id is None else checkpoint_id)
        if row is None:
            raise CheckpointNotFoundError(thread_id, str(checkpoint_id))
        return row

    def _read_chain(self, thread_id: str, checkpoint_id: str, stop_at: str | None) -> list[ChainLink]:
        with self._lock:
            thread = self._threads.get(thread_id)
            rows = thread.rows if thread is not None else {}
            chain: list[ChainLink] = []
            seen: set[str] = set()
            current: str | None = checkpoint_id
            while current is not None and current != stop_at and current not in seen:
                row = rows.get(current)
                if row is None:
                    break
                chain.append(ChainLink(row.checkpoint_id, row.parent_id, row.delta))
                seen.add(current)
                current = row.parent_id
        chain.reverse()
        return chain

    def _read_history(self, thread_id: str) -> list[StoredCheckpoint]:
        with self._lock:
            thread = self._threads.get(thread_id)
            return list(reversed(thread.rows.values())) if thread is not None else []

    def _read_threads(self) -> list[ThreadInfo]:
        with self._lock:
            infos = [
                ThreadInfo(thread_id, t.head_id, len(t.rows), t.created_at, t.updated_at)
                for thread_id, t in self._threads.items()
            ]
        return sorted(infos, key=lambda info: (-info.updated_at.timestamp(), info.thread_id))

    def _delete(self, thread_id: str) -> bool:
        with self._lock:
            return self._threads.pop(thread_id, None) is not None

    def _close(self) -> None:
        with self._lock:
            self._threads.clear()

    def _replace_row(self, row: StoredCheckpoint) -> None:
        """Overwrite a stored row as is (for tests of corrupt data)."""
        with self._lock:
            self._threads[row.thread_id].rows[row.checkpoint_id] = row
