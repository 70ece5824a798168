"""
SQLite connections for every table set of the package (checkpoints, stores, the server's tables): the per-file
state shared by all the connections of one process (:class:`SQLiteFile`: the write lock, the WAL checkpoints of
inline writes), a pool of connections (:class:`SQLitePool`), transactions (:func:`transaction`), and read-only opens
that leave nothing behind (:func:`connect_read_only`).

An event loop runs the short operations *inline*, on the loop, as long as they need not wait: a connection opened
for inline work has no busy timeout, and an operation that meets a locked database (or a process lock another
thread holds) raises :class:`WouldBlock` with nothing written; the caller then does it in a worker thread. A thread
hop costs more than such an operation (tens of microseconds in WAL mode with ``synchronous=NORMAL``).
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, TypeVar, TypeVarTuple

from haystack_state._text import lenient_text

__all__ = [
    "SQLiteFile",
    "SQLitePool",
    "WouldBlock",
    "connect_read_only",
    "enter_wal",
    "is_busy",
    "lenient_read",
    "transaction",
]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


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
    checkpointer, the stores and the server's own tables.
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


def enter_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """
    Put the database in WAL mode, waiting up to ``timeout`` seconds for other connections.

    The switch reads the file's header, then upgrades to a write; SQLite calls no busy handler on such an upgrade,
    so a process that meets another one's switch (workers opening one new file together) would fail at once with
    "database is locked". It is tried again instead, until the connection's own timeout.

    :param conn: A connection outside any transaction.
    :param timeout: How long to keep trying, in seconds (the connection's busy timeout).
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def lenient_read(
    conn: sqlite3.Connection, read: Callable[[*Ts], T], *args: *Ts, inline: bool = False, restart: bool = False
) -> T:
    """
    Run ``read(*args)``, a read on ``conn``; if a cell is not valid UTF-8 (another program wrote it), read again with
    its bad bytes as escapes that the records repair (U+FFFD) with a warning naming the thread.

    :param conn: The connection ``read`` uses.
    :param read: The read.
    :param args: Its arguments.
    :param inline: Work inline on an event loop: a locked database raises :class:`WouldBlock`.
    :param restart: Roll back the transaction ``read`` opened before reading again (it opens its own).
    """
    try:
        return read(*args)
    except sqlite3.OperationalError as error:
        if inline and is_busy(error):
            raise WouldBlock from error
        if "Could not decode to UTF-8" not in str(error):
            raise
    if restart and conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.text_factory = lenient_text
    try:
        return read(*args)
    finally:
        conn.text_factory = str


class SQLiteFile:
    """
    What every connection of one SQLite file in this process shares: the write lock, on which the process's writers
    (the checkpointer's, the store's, the server's tables', any thread's) queue instead of sleeping in SQLite's busy
    handler; and the WAL checkpoints of the writes made inline on an event loop, whose connections do not checkpoint
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


class SQLitePool:
    """
    The pooled connections of one user of a SQLite file: a thread borrows one per operation, so reads from several
    threads run concurrently (WAL). Inline work (on an event loop) borrows from a second pool of connections that
    never wait for a lock. A ``":memory:"`` database is one connection's: every operation uses that one, in turn.

    :param path: The database file, ``":memory:"``, or a ``file:`` URI.
    :param timeout: How long a connection waits for another's lock, in seconds (inline ones: not at all).
    :param read_only: Open the file read-only (see :func:`connect_read_only`).
    :param wal: Set ``journal_mode=WAL`` on every connection opened (else the owner sets it once).
    :param threads: The name of the worker threads of :meth:`in_thread` (a pool of 4, started on first use).
    """

    THREADS: ClassVar[int] = 4

    def __init__(
        self,
        path: str,
        *,
        timeout: float,
        read_only: bool = False,
        wal: bool = False,
        threads: str = "haystack-state-sqlite",
    ) -> None:
        self.path = path
        self._thread_name = threads
        self._executor: ThreadPoolExecutor | None = None
        self.timeout = timeout
        self.read_only = read_only
        self._wal = wal
        self.file = SQLiteFile.of(path)
        self.lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._inline_idle: list[sqlite3.Connection] = []  # for the event loops' inline operations: they never wait
        self._all: list[sqlite3.Connection] = []  # one list for the pool's life: the finalizer closes what it holds
        self._single = threading.Lock() if path == ":memory:" else None
        # A pool dropped without close() (a checkpointer nobody closes, as in a Haystack pipeline) closes its
        # connections when it is collected or at exit, rather than leaving them to the connections' own
        # finalizers, which Python 3.13 reports with a ResourceWarning ("unclosed database").
        weakref.finalize(self, _close_all, self._all)

    @property
    def single(self) -> bool:
        """Whether the database is one connection's (``":memory:"``)."""
        return self._single is not None

    def _open(self, inline: bool) -> sqlite3.Connection:
        timeout = 0.0 if inline else self.timeout  # an inline operation that would wait is done in a thread
        if self.read_only:
            return connect_read_only(self.path, timeout=timeout)
        conn = sqlite3.connect(self.path, timeout=timeout, check_same_thread=False, isolation_level=None)
        try:
            if self._wal:
                enter_wal(conn, timeout)
            conn.execute("PRAGMA synchronous=NORMAL")
            if inline:
                conn.execute("PRAGMA wal_autocheckpoint=0")  # a background thread checkpoints (SQLiteFile)
        except sqlite3.Error as error:
            conn.close()
            if inline and is_busy(error):  # another connection holds the file: open one in a thread instead
                raise WouldBlock from error
            raise
        return conn

    @contextmanager
    def connection(self, *, inline: bool = False, write: bool = False) -> Iterator[sqlite3.Connection]:
        """
        Borrow a connection (rolled back if left in a transaction); with ``write``, hold the file's write lock too.
        ``inline``: :class:`WouldBlock` instead of waiting for a lock.
        """
        lock = self.file.write_lock if write else None
        if lock is not None and not lock.acquire(blocking=not inline):
            raise WouldBlock
        try:
            if self._single is not None:
                if not self._single.acquire(blocking=not inline):
                    raise WouldBlock
                inline = False  # ":memory:" is one connection's database: every operation uses that one
            try:
                idle = self._inline_idle if inline else self._idle
                with self.lock:
                    conn = idle.pop() if idle else None
                if conn is None:
                    conn = self._open(inline)
                    with self.lock:
                        self._all.append(conn)
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    with self.lock:
                        idle.append(conn)
            finally:
                if self._single is not None:
                    self._single.release()
        finally:
            if lock is not None:
                lock.release()

    async def in_thread(self, work: Callable[[*Ts], T], *args: *Ts) -> T:
        """
        Do blocking work in one of the pool's worker threads, so the event loop does not wait for a lock or a long
        read.

        :param work: The work.
        :param args: Its arguments.
        """
        executor = self._executor
        if executor is None:
            with self.lock:
                executor = self._executor
                if executor is None:
                    executor = self._executor = ThreadPoolExecutor(
                        max_workers=self.THREADS, thread_name_prefix=self._thread_name
                    )
        return await asyncio.get_running_loop().run_in_executor(executor, work, *args)

    def close(self) -> None:
        """
        Stop the worker threads (waiting for their work) and close every connection (borrowed ones included: do not
        close while they are in use).
        """
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self.lock:
            self._idle, self._inline_idle = [], []
        _close_all(self._all)


def _close_all(connections: list[sqlite3.Connection]) -> None:
    """Close and forget the connections of a pool (closing a closed one does nothing)."""
    while connections:
        try:
            conn = connections.pop()
        except IndexError:  # another thread closed the last one
            return
        conn.close()


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
