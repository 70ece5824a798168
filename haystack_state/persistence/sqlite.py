"""
:class:`SQLiteCheckpointer`: checkpoints in a SQLite file (stdlib ``sqlite3``, WAL mode).

Each checkpoint is one row holding its delta (and now and then a snapshot of the whole state); a ``threads`` row
holds the head, a ``leases`` row a run's lease. Commits run in ``BEGIN IMMEDIATE`` transactions, so two writers of
the same thread are serialized and the second sees the first's head (and gets a
:class:`~haystack_state.errors.ThreadConflictError`); the writers of one process also queue on a lock rather than
on SQLite's busy timeout (one lock per file, shared with the server's tables on it: :class:`SQLiteFile`).
Connections are pooled: a thread borrows one per operation, so reads from several threads run concurrently (WAL).

The async methods run the short operations (a commit, a lease, a head's metadata: tens of microseconds in WAL mode
with ``synchronous=NORMAL``, which syncs nothing at a commit) inline on the event loop, as long as they need not wait:
one that would (another writer, of this process or another, holds the database) is done on a dedicated thread pool
instead, as are the long ones (reading a state's chain, history, deleting, pruning), so the loop never waits for a
lock or a large read. The WAL checkpoints of the inline writes, which sync the file, run in a background thread too.
A thread hop costs more than such an operation: on a loaded server it was the larger part of the storage's CPU.

Durability: the database runs in WAL mode with ``synchronous=NORMAL``. A commit is durable against a crash of the
process as soon as ``commit`` returns; after a power loss or an operating-system crash the last commits before it
may be lost, but the database is never corrupted. Before every write the checkpointer checks that its file is still
the one it opened (deleted or replaced files are reported instead of acknowledging lost commits).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Unpack

from haystack_state._db.migrations import SQLiteSchema
from haystack_state._db.sqlite import (
    SQLiteFile,
    SQLitePool,
    WouldBlock,
    connect_read_only,
    is_busy,
    lenient_read,
    transaction,
)
from haystack_state.errors import CheckpointError, CheckpointStorageError
from haystack_state.persistence import ops
from haystack_state.persistence._grouping import Failed, GroupCommit
from haystack_state.persistence._sqlite_ops import (
    CHECKPOINTS,
    LEASES,
    MIGRATIONS,
    MIGRATIONS_TABLE,
    THREADS,
    SQLiteOperations,
    pack_snapshot,
    unpack_snapshot,
)
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointerSettings

__all__ = [
    "CHECKPOINTS",
    "LEASES",
    "MIGRATIONS",
    "MIGRATIONS_TABLE",
    "THREADS",
    "SQLiteCheckpointer",
    "SQLiteFile",
    "WouldBlock",
    "connect_read_only",
    "pack_snapshot",
    "transaction",
    "unpack_snapshot",
]
#: rows. The others (a state's chain, history, thread lists, deletes, pruning) may read or write much more.
INLINE_OPS = (
    ops.Insert,
    ops.ReadHead,
    ops.ReadMeta,
    ops.OpenThread,
    ops.HoldThread,
    ops.AcquireLease,
    ops.RenewLease,
    ops.ReleaseLease,
    ops.ReadLease,
    ops.RequestStop,
    ops.SetTTL,
)


class SQLiteCheckpointer(SQLiteOperations, Checkpointer):
    """
    A checkpointer backed by a SQLite database file. Creates or migrates the schema on construction.

    :param path: The database file (created if missing), or ``":memory:"`` for a private in-memory database
        (then a single connection is shared by all threads).
    :param timeout: How long a writer waits for another process's lock, in seconds.
    :param cache_size: How many threads' head states to keep materialized (0 disables the cache).
    :param read_only: Open an existing file read-only (nothing is created or migrated; writes fail; see
        :func:`connect_read_only`). It must hold this version's tables.
    :param kwargs: The settings of :class:`~haystack_state.persistence.base.Checkpointer` (``lease_ttl``,
        ``thread_ttl``, ``snapshot_min_bytes``, ``snapshot_ratio``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 30.0,
        cache_size: int = 64,
        read_only: bool = False,
        **kwargs: Unpack[CheckpointerSettings],
    ) -> None:
        super().__init__(cache_size=cache_size, **kwargs)
        self._path = str(path)
        self._timeout = timeout
        self._read_only = read_only
        self._connections = SQLitePool(self._path, timeout=timeout, read_only=read_only)
        self._file = self._connections.file
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit[ops.Insert]] = (
            weakref.WeakKeyDictionary()
        )
        self._identity: tuple[int, int] | None = None
        SCHEMA.open(self._connections, read_only=read_only)
        try:
            self._identity = self._file_identity()
        except BaseException:
            self._close()
            raise

    # --- connections --------------------------------------------------------------------------------------------

    def _connection(self, inline: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        """Borrow a connection of the pool (``inline``: one that never waits; see :class:`SQLitePool`)."""
        return self._connections.connection(inline=inline)

    @contextmanager
    def _writing(self, inline: bool = False) -> Iterator[sqlite3.Connection]:
        """
        A write transaction (``BEGIN IMMEDIATE``), committed at the end, rolled back on an error. ``inline`` (on an
        event loop): :class:`WouldBlock` instead of waiting for the lock, and nothing is written then.
        """
        with self._connections.connection(inline=inline, write=True) as conn:
            self._check_file()
            with transaction(conn, "BEGIN IMMEDIATE", inline=inline):
                yield conn
        if inline:
            self._file.wrote_inline()

    def _file_identity(self) -> tuple[int, int] | None:
        if self._path == ":memory:" or self._path.startswith("file:"):
            return None
        info = os.stat(self._path)
        return (info.st_dev, info.st_ino)

    def _check_file(self) -> None:
        if self._identity is None:
            return
        try:
            identity = self._file_identity()
        except FileNotFoundError:
            identity = None
        if identity != self._identity:
            what = "was deleted" if identity is None else "was replaced by another file"
            raise CheckpointStorageError(
                f"SQLiteCheckpointer: the database file '{self._path}' {what} after it was opened; nothing more is "
                "written to it (a commit would be lost). Open a new checkpointer on the file."
            )

    def _execute(self, op: ops.Op, inline: bool = False) -> object:
        handler = self._handlers[type(op)]
        if isinstance(op, ops.WRITES):
            with self._writing(inline) as conn:
                return handler(conn, op)
        with self._connection(inline) as conn:
            return lenient_read(conn, handler, conn, op, inline=inline, restart=True)

    async def _aexecute(self, op: ops.Op) -> object:
        loop = asyncio.get_running_loop()
        if isinstance(op, ops.Insert):
            group = self._groups.get(loop)
            if group is None:
                with self._connections.lock:
                    group = self._groups.setdefault(loop, GroupCommit())
            return await group.submit(op, self._write_batch)
        if isinstance(op, INLINE_OPS):
            try:
                return self._execute(op, inline=True)
            except WouldBlock:
                pass
        return await self._connections.in_thread(self._execute, op)

    async def _write_batch(self, batch: list[ops.Insert]) -> list[Any]:
        """A group commit: inline on the event loop, or in a thread if it would wait for the lock."""
        try:
            return self._insert_batch(batch, inline=True)
        except WouldBlock:
            return await self._connections.in_thread(self._insert_batch, batch)

    def _insert_batch(self, batch: list[ops.Insert], inline: bool = False) -> list[Any]:
        """
        Apply the commits of several async runs in one transaction (a group commit), each in a savepoint of its own:
        one that fails (a stale head, a lease held by another run) is undone alone and gets its error.
        """
        results: list[Any] = []
        with self._writing(inline) as conn:
            for op in batch:
                conn.execute("SAVEPOINT one_commit")
                try:
                    self._insert(conn, op)
                except Exception as error:
                    if inline and is_busy(error):
                        raise  # the whole batch goes to a thread (rolled back: nothing is written)
                    conn.execute("ROLLBACK TO one_commit")
                    results.append(Failed(error))
                else:
                    results.append(None)
                conn.execute("RELEASE one_commit")
        return results

    def _close(self) -> None:
        self._connections.close()

    def init_parameters(self) -> dict[str, Any]:
        """The file's path and the settings: what rebuilds this checkpointer on the same database."""
        params: dict[str, Any] = {"path": self._path, "timeout": self._timeout}
        if self._read_only:
            params["read_only"] = True
        return {**params, **self._common_parameters()}

    @contextmanager
    def _raw_connection(self) -> Iterator[sqlite3.Connection]:
        """Borrow a connection of the pool (for maintenance and tests); do not keep it."""
        with self._connection() as conn:
            yield conn


#: The checkpointer's tables on SQLite: their migrations and the errors of a file it cannot use.
SCHEMA = SQLiteSchema("SQLiteCheckpointer", MIGRATIONS_TABLE, MIGRATIONS, CheckpointError)
