"""
:class:`SQLiteCheckpointer`: checkpoints in a SQLite file (stdlib ``sqlite3``, WAL mode).

Each checkpoint is one row holding its delta; a ``threads`` row holds the head. Commits run in ``BEGIN IMMEDIATE``
transactions, so two writers of the same thread are serialized and the second sees the first's head (and gets a
:class:`~haystack_state.errors.ThreadConflictError`). Connections are pooled: a thread borrows one per operation,
so reads from several threads run concurrently (WAL) while SQLite serializes the writers.

Durability: the database runs in WAL mode with ``synchronous=NORMAL``. A commit is durable against a crash of the
process as soon as ``commit`` returns (the transaction is in the WAL file, which the operating system keeps);
after a power loss or an operating-system crash the last commits before it may be lost, but the database is never
corrupted. ``FULL`` would add an ``fsync`` to every commit, which is what makes a commit cost milliseconds.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from haystack_state.errors import CheckpointError, CheckpointNotFoundError, ThreadNotFoundError
from haystack_state.persistence.base import Checkpointer, check_commit
from haystack_state.persistence.records import ChainLink, StoredCheckpoint, ThreadInfo

THREADS = "haystack_state_threads"
CHECKPOINTS = "haystack_state_checkpoints"
MIGRATIONS_TABLE = "haystack_state_migrations"

#: Append-only: the schema version is the number of migrations applied. Never edit or reorder an entry.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        f"""CREATE TABLE {THREADS} (
            thread_id TEXT PRIMARY KEY,
            head_id TEXT NOT NULL,
            last_seq INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        f"""CREATE TABLE {CHECKPOINTS} (
            thread_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            parent_id TEXT,
            step INTEGER NOT NULL,
            source TEXT NOT NULL,
            tool_names TEXT NOT NULL,
            changed_keys TEXT NOT NULL,
            created_at TEXT NOT NULL,
            metadata TEXT NOT NULL,
            delta TEXT NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_id),
            UNIQUE (thread_id, seq)
        )""",
        f"CREATE INDEX {THREADS}_updated ON {THREADS} (updated_at)",
    ),
]

_META = "thread_id, checkpoint_id, parent_id, step, source, tool_names, created_at, changed_keys, metadata"
# Each step of the walk is one primary-key lookup; the depth bound stops a walk through corrupt, cyclic parent links.
# Only what materializing needs is selected; the rows come newest first and are put in order in Python.
_CHAIN = f"""
    WITH RECURSIVE chain(checkpoint_id, parent_id, delta, depth) AS (
        SELECT checkpoint_id, parent_id, delta, 1 FROM {CHECKPOINTS}
        WHERE thread_id = :thread AND checkpoint_id = :checkpoint
        UNION ALL
        SELECT c.checkpoint_id, c.parent_id, c.delta, chain.depth + 1
        FROM chain JOIN {CHECKPOINTS} AS c ON c.thread_id = :thread AND c.checkpoint_id = chain.parent_id
        WHERE chain.parent_id IS NOT :stop
        AND chain.depth <= (SELECT last_seq FROM {THREADS} WHERE thread_id = :thread)
    )
    SELECT checkpoint_id, parent_id, delta, depth FROM chain
"""


class SQLiteCheckpointer(Checkpointer):
    """
    A checkpointer backed by a SQLite database file. Creates or migrates the schema on construction.

    :param path: The database file (created if missing), or ``":memory:"`` for a private in-memory database
        (then a single connection is shared by all threads).
    :param timeout: How long a writer waits for another writer's lock, in seconds.
    :param cache_size: How many threads' head states to keep materialized (0 disables the cache).
    """

    def __init__(self, path: str | Path, *, timeout: float = 30.0, cache_size: int = 64) -> None:
        super().__init__(cache_size=cache_size)
        self._path = str(path)
        self._timeout = timeout
        self._pool_lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._single = threading.Lock() if self._path == ":memory:" else None
        try:
            with self._connection() as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                _migrate(conn)
        except sqlite3.DatabaseError as exc:
            self._close()
            raise CheckpointError(f"SQLiteCheckpointer: '{self._path}' cannot be used as a database: {exc}.") from exc
        except BaseException:
            self._close()
            raise

    # --- connections --------------------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, timeout=self._timeout, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if self._single is not None:
            self._single.acquire()
        try:
            with self._pool_lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._open()
                with self._pool_lock:
                    self._all.append(conn)
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                with self._pool_lock:
                    self._idle.append(conn)
        finally:
            if self._single is not None:
                self._single.release()

    @contextmanager
    def _transaction(self, begin: str = "BEGIN") -> Iterator[sqlite3.Connection]:
        with self._connection() as conn:
            conn.execute(begin)
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _close(self) -> None:
        with self._pool_lock:
            connections, self._all, self._idle = self._all, [], []
        for conn in connections:
            conn.close()

    # --- storage primitives -------------------------------------------------------------------------------------

    def init_parameters(self) -> dict[str, Any]:
        """The file's path and the busy timeout: what rebuilds this checkpointer on the same database."""
        return {"path": self._path, "timeout": self._timeout}

    def _insert(self, row: StoredCheckpoint, expected_head: str | None) -> None:
        with self._transaction("BEGIN IMMEDIATE") as conn:
            if expected_head is not None and row.parent_id == expected_head and self._append(conn, row, expected_head):
                return
            found = conn.execute(
                f"SELECT head_id, last_seq FROM {THREADS} WHERE thread_id = ?", (row.thread_id,)
            ).fetchone()
            head, last_seq = (found[0], found[1]) if found is not None else (None, 0)

            def parent_exists() -> bool:
                return (
                    conn.execute(
                        f"SELECT 1 FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?",
                        (row.thread_id, row.parent_id),
                    ).fetchone()
                    is not None
                )

            check_commit(row, expected_head, head, parent_exists)
            created = row.created_at.isoformat()
            conn.execute(
                f"INSERT INTO {CHECKPOINTS} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, "
                "changed_keys, created_at, metadata, delta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.thread_id,
                    row.checkpoint_id,
                    last_seq + 1,
                    row.parent_id,
                    row.step,
                    row.source,
                    json.dumps(list(row.tool_names)),
                    json.dumps(list(row.changed_keys)),
                    created,
                    row.metadata,
                    row.delta,
                ),
            )
            conn.execute(
                f"INSERT INTO {THREADS} (thread_id, head_id, last_seq, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET head_id = excluded.head_id, "
                "last_seq = excluded.last_seq, updated_at = excluded.updated_at",
                (row.thread_id, row.checkpoint_id, last_seq + 1, created, created),
            )

    @staticmethod
    def _append(conn: sqlite3.Connection, row: StoredCheckpoint, expected_head: str) -> bool:
        """
        The common commit, a child of the expected head, in two statements: move the head if it is the expected one,
        then insert the row. Returns False (having changed nothing) if the head is not the expected one.
        """
        created = row.created_at.isoformat()
        moved = conn.execute(
            f"UPDATE {THREADS} SET head_id = ?, last_seq = last_seq + 1, updated_at = ? "
            "WHERE thread_id = ? AND head_id = ?",
            (row.checkpoint_id, created, row.thread_id, expected_head),
        ).rowcount
        if moved != 1:
            return False
        conn.execute(
            f"INSERT INTO {CHECKPOINTS} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, "
            "changed_keys, created_at, metadata, delta) "
            f"VALUES (?, ?, (SELECT last_seq FROM {THREADS} WHERE thread_id = ?), ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.thread_id,
                row.checkpoint_id,
                row.thread_id,
                row.parent_id,
                row.step,
                row.source,
                json.dumps(list(row.tool_names)),
                json.dumps(list(row.changed_keys)),
                created,
                row.metadata,
                row.delta,
            ),
        )
        return True

    def _read_head(self, thread_id: str) -> str | None:
        with self._connection() as conn:
            found = conn.execute(f"SELECT head_id FROM {THREADS} WHERE thread_id = ?", (thread_id,)).fetchone()
        return str(found[0]) if found is not None else None

    def _read_meta(self, thread_id: str, checkpoint_id: str | None) -> StoredCheckpoint:
        with self._transaction() as conn:
            head = conn.execute(f"SELECT head_id FROM {THREADS} WHERE thread_id = ?", (thread_id,)).fetchone()
            if head is None:
                raise ThreadNotFoundError(thread_id)
            target = head[0] if checkpoint_id is None else checkpoint_id
            found = conn.execute(
                f"SELECT {_META} FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?", (thread_id, target)
            ).fetchone()
        if found is None:
            raise CheckpointNotFoundError(thread_id, target)
        return _row(found)

    def _read_chain(self, thread_id: str, checkpoint_id: str, stop_at: str | None) -> list[ChainLink]:
        with self._connection() as conn:
            rows = conn.execute(_CHAIN, {"thread": thread_id, "checkpoint": checkpoint_id, "stop": stop_at}).fetchall()
        rows.sort(key=_depth, reverse=True)  # already in this order: one linear pass
        return [ChainLink(found[0], found[1], found[2]) for found in rows]

    def _read_history(self, thread_id: str) -> list[StoredCheckpoint]:
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT {_META} FROM {CHECKPOINTS} WHERE thread_id = ? ORDER BY seq DESC", (thread_id,)
            ).fetchall()
        return [_row(found) for found in rows]

    def _read_threads(self) -> list[ThreadInfo]:
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT thread_id, head_id, last_seq, created_at, updated_at FROM {THREADS} "
                "ORDER BY updated_at DESC, thread_id"
            ).fetchall()
        return [ThreadInfo(r[0], r[1], r[2], _time(r[3]), _time(r[4])) for r in rows]

    def _delete(self, thread_id: str) -> bool:
        with self._transaction("BEGIN IMMEDIATE") as conn:
            conn.execute(f"DELETE FROM {CHECKPOINTS} WHERE thread_id = ?", (thread_id,))
            return conn.execute(f"DELETE FROM {THREADS} WHERE thread_id = ?", (thread_id,)).rowcount > 0

    @contextmanager
    def _raw_connection(self) -> Iterator[sqlite3.Connection]:
        """Borrow a connection of the pool (for maintenance and tests); do not keep it."""
        with self._connection() as conn:
            yield conn


def _depth(found: Any) -> int:
    return int(found[3])


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _row(found: Any) -> StoredCheckpoint:
    thread_id, checkpoint_id, parent_id, step, source, tool_names, created_at, changed_keys, metadata = found[:9]
    try:
        names, keys = tuple(json.loads(tool_names)), tuple(json.loads(changed_keys))
    except ValueError as error:
        raise CheckpointError(f"Thread '{thread_id}', checkpoint '{checkpoint_id}': corrupt record: {error}") from None
    return StoredCheckpoint(
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        step=step,
        source=source,
        tool_names=names,
        created_at=_time(created_at),
        changed_keys=keys,
        metadata=metadata,
        delta=found[9] if len(found) > 9 else "",
    )


def _migrate(conn: sqlite3.Connection) -> None:
    """Apply the pending migrations in one transaction; concurrent constructions are serialized by SQLite."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        current = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {MIGRATIONS_TABLE}").fetchone()[0]
        if current > len(MIGRATIONS):
            raise CheckpointError(
                f"The database schema is at version {current}, newer than this haystack-state supports "
                f"({len(MIGRATIONS)}); upgrade haystack-state."
            )
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} (version, applied_at) VALUES (?, ?)",
                (version, dt.datetime.now(dt.UTC).isoformat()),
            )
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
