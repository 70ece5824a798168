"""
The server's connection to the checkpointer's database: SQLite (a file, or private memory for an in-memory
checkpointer) or PostgreSQL (the checkpointer's schema), behind one small interface so that the server's SQL is
written once (see :mod:`haystack_state.server._storage`).

Each transaction is a :class:`Work`: a *flow* (:mod:`haystack_state._driver`, the package's one driver) that yields
:class:`Rows` and :class:`Change` operations and receives their results. Queries use ``:name`` parameters and
``{threads}``, ``{runs}``, ``{run_events}``, ``{migrations}`` table placeholders; each backend turns them into its
own parameter style and (schema-qualified) table names (once per query text).

The event loop awaits a work. On SQLite it runs inline, on the loop, as the checkpointer runs its short operations
(see :mod:`haystack_state.persistence.sqlite`): a point read or a one-row write takes tens of microseconds, less
than a hop to a worker thread and back. Work that would wait for the file's lock (another writer, of this process
or another, holds it) goes to a worker thread instead, before it has written anything. Both share the file's write
lock (:class:`~haystack_state._db.sqlite.SQLiteFile`), so the process's writers queue on it instead of sleeping in
SQLite's busy handler. On PostgreSQL it runs on the loop's own async connections, as the checkpointer's operations
do: no thread hop, and no thread waits for the network. :meth:`Work.result` runs a work from any other thread,
blocking it (on PostgreSQL on a sync connection pool).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import re
import sqlite3
import threading
from collections.abc import Callable, Generator, Mapping
from typing import Any, Generic, TypeVar

import anyio
from haystack.utils import Secret

from haystack_state._db.errors import UniqueViolation, unique_violation
from haystack_state._db.sqlite import SQLitePool, WouldBlock, lenient_read
from haystack_state._db.sqlite import transaction as sqlite_transaction
from haystack_state._driver import Flow, Op, run_flow, run_flow_async
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.memory import InMemoryCheckpointer
from haystack_state.persistence.sqlite import SQLiteCheckpointer

__all__ = [
    "Change",
    "Database",
    "PostgresDatabase",
    "Row",
    "Rows",
    "SQLiteDatabase",
    "UniqueViolation",
    "Work",
    "database_for",
    "postgres_schema",
    "postgres_settings",
]

TABLES = {
    "threads": "haystack_state_server_threads",
    "runs": "haystack_state_server_runs",
    "run_events": "haystack_state_server_run_events",
    "migrations": "haystack_state_server_migrations",
}
_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

T = TypeVar("T")


Row = tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Rows(Op[list[Row]]):
    """An operation of a table flow: run a query; its rows come back."""

    query: str
    params: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Change(Op[int]):
    """An operation of a table flow: run a write; the number of rows it changed comes back."""

    query: str
    params: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Work(Generic[T]):
    """
    One transaction on the server's tables: a *flow* (:mod:`haystack_state._driver`) that yields :class:`Rows` and
    :class:`Change` operations, written once for both backends. Await it on the event loop (``await
    storage.get_run(run_id)``), or call :meth:`result` from any thread, which blocks.

    :param database: The database it runs on.
    :param flow: Makes the flow (a fresh one for each attempt).
    :param write: Whether it writes: its statements then run in one transaction (on SQLite one that takes the write
        lock at once, so that it never has to upgrade a read lock and fail). A read runs each statement on its own.
    :param alone: Its writes each stand alone: on PostgreSQL each statement commits on its own (one round trip, no
        ``BEGIN`` and ``COMMIT``); SQLite still runs it as one transaction.
    :param again_on_unique: Run it once more when a unique index refuses a write (:class:`UniqueViolation`): a race
        with another writer of the same key, which the second attempt sees.
    :param on_unique: The value when a unique index refuses a write (the transaction is rolled back).
    """

    database: Database
    flow: Callable[[], Flow[T]]
    _: dataclasses.KW_ONLY
    write: bool
    alone: bool = False
    again_on_unique: bool = False
    on_unique: Callable[[], T] | None = None

    def result(self) -> T:
        """Run it now, blocking the calling thread (not for an event loop's thread: await the work there)."""
        return self.database.execute(self)

    def __await__(self) -> Generator[Any, None, T]:
        return self.database.aexecute(self).__await__()


class Database(abc.ABC):
    """Where the server keeps its tables."""

    #: ``"sqlite"`` or ``"postgres"``: picks the few dialect-specific fragments.
    dialect: str
    #: Whether the workers of other processes hear :meth:`notify` (else they find changes by polling).
    listens: bool = False

    def notify(self, payload: str) -> Flow[None]:
        """
        Part of a flow (``yield from database.notify(QUEUE)``): tell the workers of every process on the database,
        once the transaction commits, that something changed (``payload``: what). Nothing on a database that cannot
        (SQLite: workers poll).
        """
        yield from ()

    def read(self, query: str, params: Mapping[str, Any] | None = None) -> Work[list[Row]]:
        """A read of one statement, as a :class:`Work`: its rows."""
        return Work(self, functools.partial(_rows, query, params), write=False)

    def execute(self, work: Work[T]) -> T:
        """Run a work, blocking the calling thread."""
        return run_flow(_attempts(work), self._execute)

    async def aexecute(self, work: Work[T]) -> T:
        """Run a work for the event loop (see the module docstring: where each backend runs it)."""
        return await run_flow_async(_attempts(work), self._aexecute)

    @abc.abstractmethod
    def _execute(self, work: Work[T]) -> T:
        """Run a work once, blocking."""

    @abc.abstractmethod
    async def _aexecute(self, work: Work[T]) -> T:
        """Run a work once, for the event loop."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connections."""

    @abc.abstractmethod
    async def aclose_loop(self) -> None:
        """Close the connections that belong to the running event loop (at the app's shutdown), on it."""

    async def run(self, work: Callable[[], T]) -> T:
        """
        Do other blocking database work for the event loop (a checkpointer's sync call): in a worker thread, unless
        the backend can do it inline without waiting (SQLite: see the module docstring).

        :param work: The work.
        :returns: What it returns.
        """
        return await anyio.to_thread.run_sync(work)


class _SQLiteCursor:
    """Executes a flow's operations on one SQLite connection."""

    __slots__ = ("conn", "inline")

    def __init__(self, conn: sqlite3.Connection, inline: bool = False) -> None:
        self.conn = conn
        self.inline = inline  # (reads outside a transaction: a locked database is WouldBlock)

    def step(self, op: object) -> object:
        if type(op) is Rows:
            return lenient_read(self.conn, self._fetch, _sqlite_sql(op.query), op.params or {}, inline=self.inline)
        if type(op) is Change:
            try:
                return int(self.conn.execute(_sqlite_sql(op.query), op.params or {}).rowcount)
            except sqlite3.IntegrityError as error:
                violation = unique_violation(error)
                if violation is not None:
                    raise violation from error
                raise
        raise TypeError(f"Not an operation on the server's tables: {op!r}")

    def _fetch(self, sql: str, params: Mapping[str, object]) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()


class _Inline(threading.local):
    """The work a thread is doing inline (see :meth:`SQLiteDatabase.run`): whether it may still go to a thread."""

    active = False  # work runs inline on this thread now
    wrote = False  # it committed a write: it cannot be done again elsewhere, so it waits from now on


class SQLiteDatabase(Database):
    """
    The server's tables in a SQLite file (WAL mode), beside the checkpoints, or in private memory.

    :param path: The database file, or ``":memory:"``.
    :param timeout: How long a writer waits for another writer's lock, in seconds.
    """

    dialect = "sqlite"

    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self.path = path
        self._timeout = timeout
        self._connections = SQLitePool(path, timeout=timeout, wal=True)
        self._file = self._connections.file
        self._inline = _Inline()

    async def run(self, work: Callable[[], T]) -> T:
        """
        Do the work inline, on the event loop, unless it would wait for the file's lock before its first write:
        then in a worker thread (it has written nothing). Once it wrote, it finishes inline, waiting if it must.
        """
        state = self._inline
        if not state.active:  # (work that runs more work inline is part of it)
            state.active, state.wrote = True, False
            try:
                return work()
            except WouldBlock:
                pass
            finally:
                state.active = False
        return await anyio.to_thread.run_sync(work)

    async def _aexecute(self, work: Work[T]) -> T:
        return await self.run(functools.partial(self._execute, work))

    def _execute(self, work: Work[T]) -> T:
        """
        The work on a pooled connection (with the file's write lock for a write). Inline, when it may still go to a
        thread, a lock it would wait for is :class:`WouldBlock` instead.
        """
        state = self._inline
        inline = state.active and not state.wrote
        write = work.write
        with self._connections.connection(inline=inline, write=write) as conn:
            if not write:  # each statement on its own (a statement alone reads one consistent snapshot)
                return run_flow(work.flow(), _SQLiteCursor(conn, inline).step)
            with sqlite_transaction(conn, "BEGIN IMMEDIATE", inline=inline):
                value = run_flow(work.flow(), _SQLiteCursor(conn).step)
        if state.active:
            state.wrote = True
            if inline:
                self._file.wrote_inline()
        return value

    async def aclose_loop(self) -> None:
        """Nothing: no SQLite connection belongs to an event loop."""

    def close(self) -> None:
        self._connections.close()


class PostgresDatabase(Database):
    """
    The server's tables in a PostgreSQL schema (the checkpointer's). The event loop awaits them on async connections
    of its own (:class:`~haystack_state._db.postgres.LoopConnections`), as the checkpointer's; :meth:`Work.result`
    uses a sync connection pool.

    :param conninfo: A libpq connection string or URL.
    :param schema: The schema holding the tables (created if missing).
    :param max_connections: The size of the pool, and of each event loop's connections.
    """

    dialect = "postgres"
    listens = True

    def __init__(self, conninfo: str, *, schema: str = "public", max_connections: int = 8) -> None:
        try:
            from haystack_state._db.postgres import EventLoopConnections, LoopConnections, open_pool
        except ImportError as error:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                'The server on PostgreSQL needs the postgres extra: pip install "haystack-state[postgres,server]"'
            ) from error
        if not _IDENTIFIER.match(schema):
            raise ValueError(f"PostgreSQL schema name {schema!r} must be a plain identifier (letters, digits, _).")
        self.schema = schema
        self.conninfo = conninfo
        #: The ``LISTEN``/``NOTIFY`` channel of this schema's workers.
        self.channel = notify_channel(schema)
        self._tables = {key: f'"{schema}".{name}' for key, name in TABLES.items()}
        self._max_connections = max_connections
        self._pool = open_pool(conninfo, max_connections)
        self._loops = EventLoopConnections(lambda loop: LoopConnections(conninfo, max_connections, loop))

    def notify(self, payload: str) -> Flow[None]:
        yield Rows("SELECT pg_notify(:channel, :payload)", {"channel": self.channel, "payload": payload})

    def _query(self, op: object) -> tuple[str, dict[str, Any], bool]:
        """An operation's statement, its parameters, and whether it returns rows."""
        if type(op) is Rows:
            return _postgres_sql(op.query, self._tables), dict(op.params or {}), True
        if type(op) is Change:
            return _postgres_sql(op.query, self._tables), dict(op.params or {}), False
        raise TypeError(f"Not an operation on the server's tables: {op!r}")

    def _execute(self, work: Work[T]) -> T:
        def step(op: object) -> object:
            query, params, rows = self._query(op)
            cursor = conn.execute(query, params)
            return cursor.fetchall() if rows else cursor.rowcount

        with self._pool.connection() as conn:
            if not work.write or work.alone:  # (autocommit: one round trip a statement)
                return run_flow(work.flow(), step, wrap=_unique)
            with conn.transaction():
                return run_flow(work.flow(), step, wrap=_unique)

    async def _aexecute(self, work: Work[T]) -> T:
        import psycopg

        async def step(op: object) -> object:
            query, params, rows = self._query(op)
            cursor = await conn.execute(query, params)
            return await cursor.fetchall() if rows else cursor.rowcount

        connections = self._loops.of_running_loop()
        for attempt in (1, 2):
            conn = await connections.get()
            try:
                if not work.write or work.alone:
                    return await run_flow_async(work.flow(), step, wrap=_unique)
                async with conn.transaction():
                    return await run_flow_async(work.flow(), step, wrap=_unique)
            except psycopg.OperationalError:
                # A read on a connection that died (the server restarted, or dropped it) is tried once more on a new
                # one; a write is not (whether it was applied is unknown).
                if attempt == 2 or work.write or not (conn.closed or conn.broken):
                    raise
                connections.discard_idle()
            finally:
                connections.put(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose_loop(self) -> None:
        await self._loops.aclose_running_loop()

    def close(self) -> None:
        self._loops.finish()
        self._pool.close()


def _attempts(work: Work[T]) -> Flow[T]:
    """
    The attempts of a work, as a flow whose operation is one attempt (the backend runs it): a second one if a unique
    index refused the first and the work says to try again (``again_on_unique``), or ``on_unique``'s value instead.
    """
    try:
        first: T = yield work
        return first
    except UniqueViolation:
        if work.on_unique is not None:
            return work.on_unique()
        if not work.again_on_unique:
            raise
    second: T = yield work
    return second


def _rows(query: str, params: Mapping[str, Any] | None) -> Flow[list[Row]]:
    rows: list[Row] = yield Rows(query, params)
    return rows


def _unique(op: object, error: Exception) -> BaseException:
    """A unique index's refusal as :class:`UniqueViolation` (its key named); any other error as it is."""
    import psycopg

    if isinstance(error, psycopg.errors.UniqueViolation):
        return unique_violation(error) or UniqueViolation(str(error))
    return error


def notify_channel(schema: str) -> str:
    """The PostgreSQL ``NOTIFY`` channel of the server's workers on a schema (at most 63 bytes, as PostgreSQL keeps)."""
    name = f"haystack_state_server_{schema}".lower()
    if len(name) <= 63:
        return name
    import hashlib

    return "haystack_state_server_" + hashlib.sha1(schema.encode()).hexdigest()[:32]


def _tables(query: str, tables: Mapping[str, str]) -> str:
    for key, name in tables.items():
        query = query.replace("{" + key + "}", name)
    return query


@functools.lru_cache(maxsize=512)
def _sqlite_sql(query: str) -> str:
    """A query for SQLite: its table names (the parameters stay ``:name``)."""
    return _tables(query, TABLES)


_POSTGRES_SQL: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}


def _postgres_sql(query: str, tables: Mapping[str, str]) -> str:
    """A query for PostgreSQL: its schema-qualified table names, and ``%(name)s`` parameters."""
    key = (query, tuple(tables.items()))
    found = _POSTGRES_SQL.get(key)
    if found is None:
        found = _PARAM.sub(r"%(\1)s", _tables(query, tables))
        if len(_POSTGRES_SQL) < 4096:  # (queries built with many placeholders are not all kept)
            _POSTGRES_SQL[key] = found
    return found


def database_for(checkpointer: Checkpointer, database: str | None = None) -> Database:
    """
    Open the database the server keeps its tables in: the checkpointer's, unless ``database`` names another.

    :param checkpointer: The agents' checkpointer.
    :param database: A SQLite path or a ``postgresql://`` URL, for a checkpointer whose database cannot be found
        from its settings (a PostgreSQL checkpointer built on a pool, or with a password in its conninfo).
    :returns: The database.
    :raises ValueError: If the checkpointer's database cannot be found (pass ``database``).
    """
    if database is not None:
        if database.startswith(("postgresql://", "postgres://")):
            return PostgresDatabase(database, schema=postgres_schema(checkpointer))
        return SQLiteDatabase(database)
    if isinstance(checkpointer, InMemoryCheckpointer):
        return SQLiteDatabase(":memory:")
    if isinstance(checkpointer, SQLiteCheckpointer):
        params = checkpointer.init_parameters()
        return SQLiteDatabase(str(params["path"]), timeout=float(params.get("timeout", 30.0)))
    if type(checkpointer).__name__ == "PostgresCheckpointer":
        conninfo, schema = postgres_settings(
            checkpointer, "", "create_app(..., database='postgresql://...') naming the same database"
        )
        return PostgresDatabase(conninfo, schema=schema)
    raise ValueError(
        f"The server keeps its tables in the checkpointer's database and cannot use a {type(checkpointer).__name__}; "
        "pass create_app(..., database='threads.db' or 'postgresql://...')."
    )


def postgres_settings(checkpointer: Checkpointer, purpose: str, fix: str) -> tuple[str, str]:
    """
    The conninfo and schema of a PostgreSQL checkpointer, from its settings (a ``Secret`` resolved).

    :param checkpointer: The checkpointer.
    :param purpose: What the server needs them for, in the error (``" for its store"``, or ``""``).
    :param fix: What to pass instead, in the error.
    :raises ValueError: If its settings hide them (a pool, or a password in its conninfo).
    """
    try:
        params = checkpointer.init_parameters()
    except Exception as error:
        raise ValueError(
            f"The server cannot find the database of this PostgresCheckpointer{purpose} ({error}). Pass {fix}."
        ) from error
    conninfo = params.get("conninfo")
    if isinstance(conninfo, dict):
        conninfo = Secret.from_dict(conninfo).resolve_value()
    return str(conninfo or ""), str(params.get("schema", "public"))


def postgres_schema(checkpointer: Checkpointer) -> str:
    """The PostgreSQL checkpointer's schema, when its settings tell it ("public" otherwise)."""
    if type(checkpointer).__name__ != "PostgresCheckpointer":
        return "public"
    try:
        return str(checkpointer.init_parameters().get("schema", "public"))
    except Exception:  # a checkpointer built on a pool, or with a password in its conninfo, hides its settings
        return "public"
