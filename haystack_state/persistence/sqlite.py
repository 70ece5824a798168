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
import datetime as dt
import errno
import os
import sqlite3
import threading
import weakref
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from haystack_state.errors import CheckpointError, CheckpointNotFoundError, CheckpointStorageError, ThreadNotFoundError
from haystack_state.migrations import migrate_sqlite, sqlite_version
from haystack_state.persistence import ops
from haystack_state.persistence.base import Checkpointer, check_commit
from haystack_state.persistence.grouping import Failed, GroupCommit
from haystack_state.persistence.leases import busy_error
from haystack_state.persistence.records import ChainLink, StoredCheckpoint, ThreadInfo, parse_row, string_list_json
from haystack_state.text import lenient_text

THREADS = "haystack_state_threads"
CHECKPOINTS = "haystack_state_checkpoints"
LEASES = "haystack_state_leases"
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
    (  # snapshots, thread TTLs and leases
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN snapshot TEXT",
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN chain_bytes INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN base_bytes INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE {THREADS} ADD COLUMN ttl REAL",
        f"ALTER TABLE {THREADS} ADD COLUMN expires_at REAL",
        f"""CREATE TABLE {LEASES} (
            thread_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
    ),
    (  # snapshots written from now on are zlib-compressed UTF-8 (a BLOB); older ones (TEXT) still read as they are
        f"CREATE INDEX {CHECKPOINTS}_snapshots ON {CHECKPOINTS} (thread_id, seq) WHERE snapshot IS NOT NULL",
    ),
    (  # a stop asked of the run holding the lease (Agent.cancel, from any process)
        f"ALTER TABLE {LEASES} ADD COLUMN stop_requested INTEGER NOT NULL DEFAULT 0",
    ),
]

_META = "thread_id, checkpoint_id, parent_id, step, source, tool_names, created_at, changed_keys, metadata"
# A checkpoint's record (the head's if :checkpoint is NULL) and the thread's visible head: no row if the thread is
# not visible; the head and NULLs if the checkpoint is not in it.
_READ_META = f"""
    SELECT t.head_id, c.thread_id, c.checkpoint_id, c.parent_id, c.step, c.source, c.tool_names, c.created_at,
        c.changed_keys, c.metadata, '', NULL, c.chain_bytes, c.base_bytes
    FROM {THREADS} AS t LEFT JOIN {CHECKPOINTS} AS c
        ON c.thread_id = t.thread_id AND c.checkpoint_id = COALESCE(:checkpoint, t.head_id)
    WHERE t.thread_id = :thread AND (t.expires_at IS NULL OR t.expires_at > :now)
"""
_VISIBLE = "(expires_at IS NULL OR expires_at > :now)"
# Each step of the walk is one primary-key lookup; it stops at a snapshot, at ``stop`` or at the root. SQLite yields
# the rows as it walks, and the reader stops at the first repeated id (a corrupt, cyclic chain).
_CHAIN = f"""
    WITH RECURSIVE chain(checkpoint_id, parent_id, delta, snapshot) AS (
        SELECT checkpoint_id, parent_id, delta, snapshot FROM {CHECKPOINTS}
        WHERE thread_id = :thread AND checkpoint_id = :checkpoint
        UNION ALL
        SELECT c.checkpoint_id, c.parent_id, c.delta, c.snapshot
        FROM chain JOIN {CHECKPOINTS} AS c ON c.thread_id = :thread AND c.checkpoint_id = chain.parent_id
        WHERE chain.parent_id IS NOT :stop AND chain.snapshot IS NULL
    )
    SELECT checkpoint_id, parent_id, delta, snapshot FROM chain
"""


#: The operations done inline on the event loop (when they need not wait): each is a few statements on one thread's
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


class WouldBlock(Exception):
    """
    An operation tried inline on an event loop would have to wait (another writer holds the database's lock, in
    this process or another): nothing was done, and it is done in a worker thread instead. Never reaches a caller.
    """


@contextmanager
def transaction(conn: sqlite3.Connection, begin: str, *, inline: bool) -> Iterator[None]:
    """
    ``begin`` (``BEGIN`` or ``BEGIN IMMEDIATE``), then ``COMMIT``; rolled back on an error. ``inline`` (on an event
    loop): a locked database raises :class:`WouldBlock`, with nothing written, instead of its error. Shared by the
    checkpointer and the server's own tables.
    """
    try:
        conn.execute(begin)
        yield
        conn.execute("COMMIT")
    except BaseException as error:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if inline and is_busy(error):
            raise WouldBlock from error
        raise


def is_busy(error: BaseException) -> bool:
    """Whether a SQLite error says that the database is locked by another connection (``SQLITE_BUSY``/``LOCKED``)."""
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, sqlite3.OperationalError) and code is not None and code & 0xFF in (5, 6)


class SQLiteFile:
    """
    What every connection of one SQLite file in this process shares: the write lock, on which the process's writers
    (the checkpointer's, the server's tables', any thread's) queue instead of sleeping in SQLite's busy handler;
    and the WAL checkpoints of the writes made inline on an event loop, whose connections do not checkpoint
    themselves (a checkpoint syncs the file: a background thread does it, every :attr:`CHECKPOINT_EVERY` such
    writes).

    :param path: The file (its real path names it).
    """

    CHECKPOINT_EVERY: ClassVar[int] = 200
    _files: ClassVar[dict[str, SQLiteFile]] = {}
    _files_lock: ClassVar[threading.Lock] = threading.Lock()
    _checkpointer: ClassVar[ThreadPoolExecutor | None] = None

    def __init__(self, path: str) -> None:
        self.path = path
        #: Reentrant: a thread that writes inside its own write (it should not) meets SQLite's busy timeout, as
        #: before, rather than a deadlock.
        self.write_lock = threading.RLock()
        self._writes = 0
        self._checkpointing = False

    @classmethod
    def of(cls, path: str) -> SQLiteFile:
        """The shared state of a database file (a private one for ``":memory:"`` and URIs)."""
        if path == ":memory:" or path.startswith("file:"):
            return cls(path)
        key = os.path.realpath(path)
        with cls._files_lock:
            found = cls._files.get(key)
            if found is None:
                found = cls._files[key] = cls(key)
            return found

    def wrote_inline(self) -> None:
        """Count a write made inline; every :attr:`CHECKPOINT_EVERY`, checkpoint the WAL in the background."""
        self._writes += 1
        if self._writes < self.CHECKPOINT_EVERY or self._checkpointing or self.path.startswith(("file:", ":memory:")):
            return
        self._writes = 0
        self._checkpointing = True
        executor = SQLiteFile._checkpointer
        if executor is None:
            with SQLiteFile._files_lock:
                executor = SQLiteFile._checkpointer
                if executor is None:
                    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="haystack-state-wal")
                    SQLiteFile._checkpointer = executor
        try:
            executor.submit(self._checkpoint)
        except RuntimeError:  # the interpreter is shutting down
            self._checkpointing = False

    def _checkpoint(self) -> None:
        try:
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                conn.close()
        except sqlite3.Error:  # the file went away; the next one tries again
            pass
        finally:
            self._checkpointing = False


def _forget_files_after_fork() -> None:
    SQLiteFile._files = {}
    SQLiteFile._files_lock = threading.Lock()
    SQLiteFile._checkpointer = None


os.register_at_fork(after_in_child=_forget_files_after_fork)


def pack_snapshot(snapshot: str | None) -> bytes | None:
    """A snapshot as stored: its UTF-8 text compressed with zlib (a state's JSON shrinks several times)."""
    if snapshot is None:
        return None
    packer = zlib.compressobj(1)
    step = 1 << 20  # encoded a slice at a time: never a second whole copy of a large state's text
    chunks = [
        packer.compress(snapshot[start : start + step].encode("utf-8")) for start in range(0, len(snapshot), step)
    ]
    chunks.append(packer.flush())
    return b"".join(chunks)


def unpack_snapshot(stored: Any) -> str | None:
    """A stored snapshot's text: a compressed BLOB (schema version 3), or TEXT as earlier versions wrote it."""
    if stored is None or type(stored) is str:
        return stored
    try:
        return zlib.decompress(stored).decode("utf-8")
    except (zlib.error, UnicodeDecodeError, TypeError) as error:
        return f"<unreadable compressed snapshot: {error}>"  # not JSON: reading it reports the checkpoint


def _epoch(moment: dt.datetime) -> float:
    return moment.timestamp()


def _from_epoch(value: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(value, dt.UTC)


class SQLiteCheckpointer(Checkpointer):
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
        **kwargs: Any,
    ) -> None:
        super().__init__(cache_size=cache_size, **kwargs)
        self._path = str(path)
        self._timeout = timeout
        self._read_only = read_only
        self._pool_lock = threading.Lock()
        self._file = SQLiteFile.of(self._path)
        self._write_lock = self._file.write_lock
        self._idle: list[sqlite3.Connection] = []
        self._inline_idle: list[sqlite3.Connection] = []  # for the event loops' inline operations: they never wait
        self._all: list[sqlite3.Connection] = []
        self._single = threading.Lock() if self._path == ":memory:" else None
        self._executor: ThreadPoolExecutor | None = None
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit[ops.Insert]] = (
            weakref.WeakKeyDictionary()
        )
        self._identity: tuple[int, int] | None = None
        self._handlers: dict[type, Callable[[sqlite3.Connection, Any], Any]] = {
            ops.Insert: self._insert,
            ops.ReadHead: self._read_head,
            ops.ReadMeta: self._read_meta,
            ops.OpenThread: self._open_thread,
            ops.ReadChain: self._read_chain,
            ops.ReadHistory: self._read_history,
            ops.ReadThreads: self._read_threads,
            ops.DeleteThread: self._delete,
            ops.ReadPruneCandidates: self._prune_candidates,
            ops.SetSnapshot: self._set_snapshot,
            ops.DeleteCheckpoints: self._delete_checkpoints,
            ops.SetTTL: self._set_ttl,
            ops.AcquireLease: self._acquire,
            ops.HoldThread: self._hold,
            ops.RenewLease: self._renew,
            ops.ReleaseLease: self._release,
            ops.ReadLease: self._read_lease,
            ops.RequestStop: self._request_stop,
        }
        try:
            with self._connection() as conn:
                if read_only:
                    _check_version(conn, self._path)
                else:
                    conn.execute("PRAGMA journal_mode=WAL")
                    _migrate(conn)
            self._identity = self._file_identity()
        except sqlite3.DatabaseError as exc:
            self._close()
            raise CheckpointError(f"SQLiteCheckpointer: '{self._path}' cannot be used as a database: {exc}.") from exc
        except BaseException:
            self._close()
            raise

    # --- connections --------------------------------------------------------------------------------------------

    def _open(self, inline: bool = False) -> sqlite3.Connection:
        timeout = 0.0 if inline else self._timeout  # an inline operation that would wait is done in a thread
        if self._read_only:
            conn = connect_read_only(self._path, timeout=timeout)
        else:
            conn = sqlite3.connect(self._path, timeout=timeout, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA synchronous=NORMAL")
            if inline:
                conn.execute("PRAGMA wal_autocheckpoint=0")  # a background thread checkpoints (SQLiteFile)
        return conn

    @contextmanager
    def _connection(self, inline: bool = False) -> Iterator[sqlite3.Connection]:
        if self._single is not None:
            if not self._single.acquire(blocking=not inline):
                raise WouldBlock
            inline = False  # ":memory:" is one connection's database: every operation uses that one
        try:
            idle = self._inline_idle if inline else self._idle
            with self._pool_lock:
                conn = idle.pop() if idle else None
            if conn is None:
                conn = self._open(inline)
                with self._pool_lock:
                    self._all.append(conn)
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                with self._pool_lock:
                    idle.append(conn)
        finally:
            if self._single is not None:
                self._single.release()

    @contextmanager
    def _writing(self, inline: bool = False) -> Iterator[sqlite3.Connection]:
        """
        A write transaction (``BEGIN IMMEDIATE``), committed at the end, rolled back on an error. ``inline`` (on an
        event loop): :class:`WouldBlock` instead of waiting for the lock, and nothing is written then.
        """
        if not self._write_lock.acquire(blocking=not inline):
            raise WouldBlock
        try:
            with self._connection(inline) as conn:
                self._check_file()
                with transaction(conn, "BEGIN IMMEDIATE", inline=inline):
                    yield conn
        finally:
            self._write_lock.release()
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

    def _execute(self, op: ops.Op, inline: bool = False) -> Any:
        handler = self._handlers[type(op)]
        if isinstance(op, ops.WRITES):
            with self._writing(inline) as conn:
                return handler(conn, op)
        with self._connection(inline) as conn:
            try:
                return handler(conn, op)
            except sqlite3.OperationalError as error:
                if inline and is_busy(error):
                    raise WouldBlock from error
                if "Could not decode to UTF-8" not in str(error):
                    raise
            # A cell that is not valid UTF-8 (another program wrote it): read again, its bad bytes as escapes that
            # reading repairs (U+FFFD) with a warning naming the thread.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.text_factory = lenient_text
            try:
                return handler(conn, op)
            finally:
                conn.text_factory = str

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            with self._pool_lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="haystack-state-sqlite")
        return self._executor

    async def _aexecute(self, op: ops.Op) -> Any:
        loop = asyncio.get_running_loop()
        if isinstance(op, ops.Insert):
            group = self._groups.get(loop)
            if group is None:
                with self._pool_lock:
                    group = self._groups.setdefault(loop, GroupCommit())
            return await group.submit(op, self._write_batch)
        if isinstance(op, INLINE_OPS):
            try:
                return self._execute(op, inline=True)
            except WouldBlock:
                pass
        return await loop.run_in_executor(self._pool(), self._execute, op)

    async def _write_batch(self, batch: list[ops.Insert]) -> list[Any]:
        """A group commit: inline on the event loop, or in a thread if it would wait for the lock."""
        try:
            return self._insert_batch(batch, inline=True)
        except WouldBlock:
            return await asyncio.get_running_loop().run_in_executor(self._pool(), self._insert_batch, batch)

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
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self._pool_lock:
            connections, self._all, self._idle = self._all, [], []
        for conn in connections:
            conn.close()

    def init_parameters(self) -> dict[str, Any]:
        """The file's path and the settings: what rebuilds this checkpointer on the same database."""
        params: dict[str, Any] = {"path": self._path, "timeout": self._timeout}
        if self._read_only:
            params["read_only"] = True
        return {**params, **self._common_parameters()}

    # --- operations ---------------------------------------------------------------------------------------------

    def _insert(self, conn: sqlite3.Connection, op: ops.Insert) -> None:
        row, expected_head, now = op.row, op.expected_head, _epoch(op.now)
        created = row.created_at.isoformat()
        if expected_head is not None and row.parent_id == expected_head:
            # The usual commit, in two statements: move the head (unless another run holds the thread's lease),
            # then insert the row. Anything else takes the checks below, which say what is wrong.
            moved = conn.execute(
                f"UPDATE {THREADS} SET head_id = ?, last_seq = last_seq + 1, updated_at = ?, "
                "expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE ? + ttl END "
                f"WHERE thread_id = ? AND head_id = ? AND {_VISIBLE.replace(':now', '?')} AND NOT EXISTS "
                f"(SELECT 1 FROM {LEASES} WHERE thread_id = ? AND owner IS NOT ? AND expires_at > ?) "
                "RETURNING last_seq",
                (
                    row.checkpoint_id,
                    created,
                    now,
                    row.thread_id,
                    expected_head,
                    now,
                    row.thread_id,
                    op.lease_owner if op.lease_owner is not None else "",
                    now if op.lease_owner is not None else float("inf"),
                ),
            ).fetchall()
            if len(moved) == 1:
                self._insert_row(conn, row, "?", (moved[0][0],))
                return
        if op.lease_owner is not None:
            holder = conn.execute(f"SELECT owner, expires_at FROM {LEASES} WHERE thread_id = ?", (row.thread_id,))
            found = holder.fetchone()
            if found is not None and found[0] != op.lease_owner and found[1] > now:
                raise busy_error(row.thread_id, found[0], _from_epoch(found[1]))
        found = conn.execute(
            f"SELECT head_id, last_seq, expires_at FROM {THREADS} WHERE thread_id = ?", (row.thread_id,)
        ).fetchone()
        expired = found is not None and found[2] is not None and found[2] <= now
        if expired and expected_head is None:  # invisible already: the new thread replaces it
            conn.execute(f"DELETE FROM {CHECKPOINTS} WHERE thread_id = ?", (row.thread_id,))
            conn.execute(f"DELETE FROM {THREADS} WHERE thread_id = ?", (row.thread_id,))
            found = None
        head, last_seq = (found[0], int(found[1])) if found is not None and not expired else (None, 0)

        def parent_exists() -> bool:
            query = f"SELECT 1 FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?"
            return conn.execute(query, (row.thread_id, row.parent_id)).fetchone() is not None

        check_commit(row, expected_head, head, parent_exists)
        self._insert_row(conn, row, "?", (last_seq + 1,))
        conn.execute(
            f"INSERT INTO {THREADS} (thread_id, head_id, last_seq, created_at, updated_at, ttl, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET head_id = excluded.head_id, "
            "last_seq = excluded.last_seq, updated_at = excluded.updated_at, "
            f"expires_at = CASE WHEN {THREADS}.ttl IS NULL THEN NULL ELSE ? + {THREADS}.ttl END",
            (
                row.thread_id,
                row.checkpoint_id,
                last_seq + 1,
                created,
                created,
                op.ttl,
                now + op.ttl if op.ttl is not None else None,
                now,
            ),
        )

    @staticmethod
    def _insert_row(conn: sqlite3.Connection, row: StoredCheckpoint, seq: str, seq_params: tuple[Any, ...]) -> None:
        conn.execute(
            f"INSERT INTO {CHECKPOINTS} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, "
            f"changed_keys, created_at, metadata, delta, snapshot, chain_bytes, base_bytes) VALUES (?, ?, {seq}, "
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.thread_id,
                row.checkpoint_id,
                *seq_params,
                row.parent_id,
                row.step,
                row.source,
                string_list_json(row.tool_names),
                string_list_json(row.changed_keys),
                row.created_at.isoformat(),
                row.metadata,
                row.delta,
                pack_snapshot(row.snapshot),
                row.chain_bytes,
                row.base_bytes,
            ),
        )

    @staticmethod
    def _visible_head(conn: sqlite3.Connection, thread_id: str, now: dt.datetime) -> str | None:
        found = conn.execute(
            f"SELECT head_id FROM {THREADS} WHERE thread_id = :thread AND {_VISIBLE}",
            {"thread": thread_id, "now": _epoch(now)},
        ).fetchone()
        return str(found[0]) if found is not None else None

    def _read_head(self, conn: sqlite3.Connection, op: ops.ReadHead) -> str | None:
        return self._visible_head(conn, op.thread_id, op.now)

    def _read_meta(self, conn: sqlite3.Connection, op: ops.ReadMeta) -> StoredCheckpoint:
        # One statement (a consistent read without a transaction): the visible head and the checkpoint's record.
        found = conn.execute(
            _READ_META, {"thread": op.thread_id, "now": _epoch(op.now), "checkpoint": op.checkpoint_id}
        )
        row = found.fetchone()
        if row is None:
            raise ThreadNotFoundError(op.thread_id)
        if row[1] is None:
            raise CheckpointNotFoundError(op.thread_id, row[0] if op.checkpoint_id is None else op.checkpoint_id)
        return _row(row[1:])

    def _open_thread(
        self, conn: sqlite3.Connection, op: ops.OpenThread
    ) -> tuple[tuple[str, dt.datetime] | None, StoredCheckpoint | None]:
        holder = self._read_lease(conn, ops.ReadLease(op.thread_id))
        try:
            return holder, self._read_meta(conn, ops.ReadMeta(op.thread_id, op.checkpoint_id, op.now))
        except ThreadNotFoundError:
            return holder, None

    def _read_chain(self, conn: sqlite3.Connection, op: ops.ReadChain) -> list[ChainLink]:
        if op.stop_at is None:
            chain = self._read_chain_by_range(conn, op)
            if chain is not None:
                return chain
        chain = []
        seen: set[str] = set()
        cursor = conn.execute(_CHAIN, {"thread": op.thread_id, "checkpoint": op.checkpoint_id, "stop": op.stop_at})
        for found in cursor:
            chain.append(ChainLink(found[0], found[1], found[2], unpack_snapshot(found[3])))
            if found[0] in seen:  # a cycle: check_chain reports it
                break
            seen.add(found[0])
        cursor.close()
        chain.reverse()
        return chain

    @staticmethod
    def _read_chain_by_range(conn: sqlite3.Connection, op: ops.ReadChain) -> list[ChainLink] | None:
        """
        The chain from the nearest snapshot, read as one range of rows by sequence number (a child is always
        written after its parent) instead of one lookup per link, then walked by parent links in memory. None if the
        walk leaves the range (a branch forked from before the snapshot): the recursive walk reads it then.
        """
        conn.execute("BEGIN")
        try:
            found = conn.execute(
                f"SELECT seq FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?",
                (op.thread_id, op.checkpoint_id),
            ).fetchone()
            if found is None:
                return []
            top = found[0]
            base = conn.execute(
                f"SELECT max(seq) FROM {CHECKPOINTS} WHERE thread_id = ? AND seq <= ? AND snapshot IS NOT NULL",
                (op.thread_id, top),
            ).fetchone()[0]
            rows = conn.execute(
                f"SELECT checkpoint_id, parent_id, delta, snapshot FROM {CHECKPOINTS} "
                "WHERE thread_id = ? AND seq BETWEEN ? AND ?",
                (op.thread_id, base if base is not None else -(2**62), top),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        by_id = {row[0]: row for row in rows}
        chain: list[ChainLink] = []
        link = by_id.get(op.checkpoint_id)
        while link is not None:
            chain.append(ChainLink(link[0], link[1], link[2], unpack_snapshot(link[3])))
            if link[3] is not None or link[1] is None:
                chain.reverse()
                return chain
            if len(chain) > len(rows):  # a cycle: check_chain reports it
                chain.reverse()
                return chain
            link = by_id.get(link[1])
        return None

    def _read_history(self, conn: sqlite3.Connection, op: ops.ReadHistory) -> list[StoredCheckpoint]:
        conn.execute("BEGIN")
        if self._visible_head(conn, op.thread_id, op.now) is None:
            raise ThreadNotFoundError(op.thread_id)
        where, params = "thread_id = ?", [op.thread_id]
        if op.before is not None:
            found = conn.execute(
                f"SELECT seq FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?", (op.thread_id, op.before)
            ).fetchone()
            if found is None:
                raise CheckpointNotFoundError(op.thread_id, op.before)
            where += " AND seq < ?"
            params.append(found[0])
        limit = f" LIMIT {int(op.limit)}" if op.limit is not None else ""
        rows = conn.execute(
            f"SELECT {_META}, '', CASE WHEN snapshot IS NULL THEN NULL ELSE '' END, chain_bytes, base_bytes "
            f"FROM {CHECKPOINTS} WHERE {where} ORDER BY seq DESC{limit}",
            params,
        ).fetchall()
        conn.execute("COMMIT")
        return [_row(found) for found in rows]

    def _read_threads(self, conn: sqlite3.Connection, op: ops.ReadThreads) -> list[ThreadInfo]:
        rows = conn.execute(
            f"SELECT t.thread_id, t.head_id, (SELECT count(*) FROM {CHECKPOINTS} AS c "
            f"WHERE c.thread_id = t.thread_id), t.created_at, t.updated_at FROM {THREADS} AS t WHERE {_VISIBLE} "
            "ORDER BY t.updated_at DESC, t.thread_id",
            {"now": _epoch(op.now)},
        ).fetchall()
        return [ThreadInfo(r[0], r[1], int(r[2]), _time(r[3]), _time(r[4])) for r in rows]

    def _delete(self, conn: sqlite3.Connection, op: ops.DeleteThread) -> bool:
        params = {"thread": op.thread_id, "now": _epoch(op.now)}
        if op.only_expired:
            condition = (
                f"expires_at IS NOT NULL AND expires_at <= :now AND NOT EXISTS (SELECT 1 FROM {LEASES} AS l "
                "WHERE l.thread_id = :thread AND l.expires_at > :now)"
            )
        else:
            condition = _VISIBLE
        found = conn.execute(f"SELECT 1 FROM {THREADS} WHERE thread_id = :thread AND {condition}", params).fetchone()
        exists = conn.execute(f"SELECT 1 FROM {THREADS} WHERE thread_id = ?", (op.thread_id,)).fetchone()
        if exists is None or (found is None and op.only_expired):
            return False
        conn.execute(f"DELETE FROM {CHECKPOINTS} WHERE thread_id = ?", (op.thread_id,))
        conn.execute(f"DELETE FROM {THREADS} WHERE thread_id = ?", (op.thread_id,))
        conn.execute(f"DELETE FROM {LEASES} WHERE thread_id = ?", (op.thread_id,))
        return found is not None

    def _prune_candidates(self, conn: sqlite3.Connection, op: ops.ReadPruneCandidates) -> tuple[list[str], list[str]]:
        where = "WHERE thread_id = :thread" if op.thread_id is not None else ""
        rows = conn.execute(
            f"SELECT thread_id, expires_at IS NOT NULL AND expires_at <= :now FROM {THREADS} {where} "
            "ORDER BY thread_id",
            {"thread": op.thread_id, "now": _epoch(op.now)},
        ).fetchall()
        return [r[0] for r in rows if not r[1]], [r[0] for r in rows if r[1]]

    def _set_snapshot(self, conn: sqlite3.Connection, op: ops.SetSnapshot) -> None:
        conn.execute(
            f"UPDATE {CHECKPOINTS} SET snapshot = ?, chain_bytes = 0, base_bytes = ? "
            "WHERE thread_id = ? AND checkpoint_id = ?",
            (pack_snapshot(op.snapshot), len(op.snapshot), op.thread_id, op.checkpoint_id),
        )

    def _delete_checkpoints(self, conn: sqlite3.Connection, op: ops.DeleteCheckpoints) -> int:
        deleted = 0
        for start in range(0, len(op.checkpoint_ids), 500):
            batch = op.checkpoint_ids[start : start + 500]
            marks = ", ".join("?" * len(batch))
            deleted += conn.execute(
                f"DELETE FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id IN ({marks}) AND checkpoint_id "
                f"NOT IN (SELECT head_id FROM {THREADS} WHERE thread_id = ?)",
                (op.thread_id, *batch, op.thread_id),
            ).rowcount
        return deleted

    def _set_ttl(self, conn: sqlite3.Connection, op: ops.SetTTL) -> bool:
        found = conn.execute(
            f"SELECT updated_at FROM {THREADS} WHERE thread_id = :thread AND {_VISIBLE}",
            {"thread": op.thread_id, "now": _epoch(op.now)},
        ).fetchone()
        if found is None:
            return False
        expires = _time(found[0]).timestamp() + op.ttl if op.ttl is not None else None
        conn.execute(
            f"UPDATE {THREADS} SET ttl = ?, expires_at = ? WHERE thread_id = ?", (op.ttl, expires, op.thread_id)
        )
        return True

    def _acquire(self, conn: sqlite3.Connection, op: ops.AcquireLease) -> tuple[str, dt.datetime] | None:
        # Taken unless another owner's live lease holds the thread (one statement; the holder is read if so).
        taken = conn.execute(
            f"INSERT INTO {LEASES} (thread_id, owner, expires_at) VALUES (?, ?, ?) ON CONFLICT (thread_id) "
            "DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at, stop_requested = 0 "
            f"WHERE {LEASES}.owner = excluded.owner OR {LEASES}.expires_at <= ?",
            (op.thread_id, op.owner, _epoch(op.expires_at), _epoch(op.now)),
        ).rowcount
        if taken:
            return None
        found = conn.execute(f"SELECT owner, expires_at FROM {LEASES} WHERE thread_id = ?", (op.thread_id,)).fetchone()
        return (found[0], _from_epoch(found[1]))

    def _hold(self, conn: sqlite3.Connection, op: ops.HoldThread) -> tuple[tuple[str, dt.datetime] | None, str | None]:
        holder = self._acquire(conn, ops.AcquireLease(op.thread_id, op.owner, op.now, op.expires_at))
        if holder is not None:
            return holder, None
        return None, self._visible_head(conn, op.thread_id, op.now)

    def _renew(self, conn: sqlite3.Connection, op: ops.RenewLease) -> bool | None:
        found = conn.execute(
            f"UPDATE {LEASES} SET expires_at = ? WHERE thread_id = ? AND owner = ? RETURNING stop_requested",
            (_epoch(op.expires_at), op.thread_id, op.owner),
        ).fetchone()
        return bool(found[0]) if found is not None else None

    def _request_stop(self, conn: sqlite3.Connection, op: ops.RequestStop) -> bool:
        query = f"UPDATE {LEASES} SET stop_requested = 1 WHERE thread_id = ? AND expires_at > ?"
        return conn.execute(query, (op.thread_id, _epoch(op.now))).rowcount == 1

    def _release(self, conn: sqlite3.Connection, op: ops.ReleaseLease) -> bool:
        query = f"DELETE FROM {LEASES} WHERE thread_id = ? AND owner = ?"
        return conn.execute(query, (op.thread_id, op.owner)).rowcount == 1

    def _read_lease(self, conn: sqlite3.Connection, op: ops.ReadLease) -> tuple[str, dt.datetime] | None:
        found = conn.execute(f"SELECT owner, expires_at FROM {LEASES} WHERE thread_id = ?", (op.thread_id,)).fetchone()
        return (found[0], _from_epoch(found[1])) if found is not None else None

    @contextmanager
    def _raw_connection(self) -> Iterator[sqlite3.Connection]:
        """Borrow a connection of the pool (for maintenance and tests); do not keep it."""
        with self._connection() as conn:
            yield conn


def connect_read_only(path: str | Path, *, timeout: float = 5.0) -> sqlite3.Connection:
    """
    A connection that only reads an existing SQLite file, and leaves nothing behind: the file is never created,
    changed or migrated, and no ``-wal`` or ``-shm`` file stays beside it.

    A file we may write, in a folder we may write, is opened read-write with ``PRAGMA query_only`` (a plain
    read-only connection to a WAL database would leave its ``-wal`` and ``-shm`` files behind); a file with a
    ``-wal`` beside it (a writer has it open) read-only, seeing the writer's commits; any other file (read-only, or
    in a read-only folder) immutable, which needs no ``-shm`` (it does not see a writer that starts meanwhile).

    :param path: The database file.
    :param timeout: How long to wait for another connection's lock, in seconds.
    :returns: A connection usable from any thread, in autocommit mode.
    :raises FileNotFoundError: If the file does not exist.
    """
    file = Path(path).resolve()
    if not file.exists():
        raise FileNotFoundError(errno.ENOENT, "no such database file", str(path))
    writable = os.access(file, os.W_OK) and os.access(file.parent, os.W_OK | os.X_OK)
    if writable:
        mode = "rw"
    elif Path(f"{file}-wal").exists():
        mode = "ro"
    else:
        mode = "ro&immutable=1"
    conn = sqlite3.connect(
        f"{file.as_uri()}?mode={mode}", uri=True, timeout=timeout, check_same_thread=False, isolation_level=None
    )
    if writable:
        conn.execute("PRAGMA query_only = ON")
    return conn


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _row(found: Any) -> StoredCheckpoint:
    return parse_row(
        found[0], found[1], found[2], found[3], found[4], found[5], found[6], found[7], found[8], tuple(found[9:])
    )


def _check_version(conn: sqlite3.Connection, path: str) -> None:
    """For a read-only open: the file must hold this version's schema (it cannot be migrated)."""
    current = sqlite_version(conn, MIGRATIONS_TABLE)
    if current != len(MIGRATIONS):
        raise CheckpointError(
            f"SQLiteCheckpointer: '{path}' is at schema version {current}, and this haystack-state reads version "
            f"{len(MIGRATIONS)}; a read-only file cannot be migrated (open it once writable to migrate it)."
        )


def _migrate(conn: sqlite3.Connection) -> None:
    """Apply the pending migrations (see :func:`haystack_state.migrations.migrate_sqlite`)."""
    migrate_sqlite(conn, MIGRATIONS_TABLE, MIGRATIONS, _newer_schema)


def _newer_schema(current: int, supported: int) -> CheckpointError:
    return CheckpointError(
        f"The database schema is at version {current}, newer than this haystack-state supports ({supported}); "
        "upgrade haystack-state."
    )
