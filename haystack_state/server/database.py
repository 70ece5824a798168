"""
The server's connection to the checkpointer's database: SQLite (a file, or private memory for an in-memory
checkpointer) or PostgreSQL (the checkpointer's schema), behind one small interface so that the server's SQL is
written once (see :mod:`haystack_state.server.storage`).

Queries use ``:name`` parameters and ``{threads}``, ``{runs}``, ``{run_events}``, ``{migrations}`` table
placeholders; each backend turns them into its own parameter style and (schema-qualified) table names (once per
query text).

The event loop reaches the tables through :meth:`Database.run`. On SQLite it runs the work inline, on the loop, as
the checkpointer runs its short operations (see :mod:`haystack_state.persistence.sqlite`): a point read or a
one-row write takes tens of microseconds, less than a hop to a worker thread and back. Work that would wait for
the file's lock (another writer, of this process or another, holds it) goes to a worker thread instead, before it
has written anything. Both share the file's write lock (:class:`~haystack_state.db.sqlite.SQLiteFile`),
so the process's writers queue on it instead of sleeping in SQLite's busy handler. On PostgreSQL the work runs in
a worker thread (a round trip over the network must not hold the loop).
"""

from __future__ import annotations

import abc
import functools
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from haystack.utils import Secret

from haystack_state.db.errors import UniqueViolation, unique_violation
from haystack_state.db.sqlite import SQLitePool, WouldBlock, lenient_read
from haystack_state.db.sqlite import transaction as sqlite_transaction
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.memory import InMemoryCheckpointer
from haystack_state.persistence.sqlite import SQLiteCheckpointer

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "Database",
    "PostgresDatabase",
    "SQLiteDatabase",
    "UniqueViolation",
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


class Cursor(abc.ABC):
    """One transaction's handle: runs a query and returns its rows, or the number of rows it changed."""

    @abc.abstractmethod
    def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a query and return its rows."""

    @abc.abstractmethod
    def change(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        """Run a write and return how many rows it changed."""


class Database(abc.ABC):
    """Where the server keeps its tables."""

    #: ``"sqlite"`` or ``"postgres"``: picks the few dialect-specific fragments.
    dialect: str
    #: Whether the workers of other processes hear :meth:`notify` (else they find changes by polling).
    listens: bool = False

    def notify(self, cur: Cursor, payload: str) -> None:
        """
        Tell the workers of every process on the database, once this transaction commits, that something changed
        (``payload``: what). Nothing on a database that cannot (SQLite: workers poll).
        """
        del cur, payload

    @abc.abstractmethod
    def transaction(self, *, write: bool = True) -> AbstractContextManager[Cursor]:
        """
        A context manager yielding a :class:`Cursor`; commits on success, rolls back on error.

        :param write: Whether the transaction writes (SQLite then takes the write lock at once, so that it never
            has to upgrade a read lock and fail); a read-only one does not block writers.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connections."""

    def read(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """
        Run one read-only query and return its rows: a transaction of one statement, without ``BEGIN`` and
        ``COMMIT`` (a statement alone reads one consistent snapshot).
        """
        with self.transaction(write=False) as cur:
            return cur.rows(query, params)

    async def run(self, work: Callable[[], T]) -> T:
        """
        Do blocking database work (one or more transactions, through :meth:`transaction`) for the event loop: in a
        worker thread, unless the backend can do it inline without waiting (SQLite: see the module docstring).

        :param work: The work.
        :returns: What it returns.
        """
        return await anyio.to_thread.run_sync(work)


class _SQLiteCursor(Cursor):
    def __init__(self, conn: sqlite3.Connection, inline: bool = False) -> None:
        self.conn = conn
        self.inline = inline  # (a read outside a transaction: a locked database is WouldBlock)

    def rows(self, query: str, params: Mapping[str, object] | None = None) -> list[tuple[Any, ...]]:
        return lenient_read(self.conn, self._fetch, _sqlite_sql(query), params or {}, inline=self.inline)

    def _fetch(self, sql: str, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def change(self, query: str, params: Mapping[str, object] | None = None) -> int:
        try:
            return int(self.conn.execute(_sqlite_sql(query), params or {}).rowcount)
        except sqlite3.IntegrityError as error:
            violation = unique_violation(error)
            if violation is not None:
                raise violation from error
            raise


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

    @contextmanager
    def _connection(self, *, write: bool) -> Iterator[tuple[sqlite3.Connection, bool]]:
        """
        A pooled connection (with the file's write lock for a write), and whether the work is inline and may still
        go to a thread: then :class:`WouldBlock` instead of waiting for a lock.
        """
        state = self._inline
        inline = state.active and not state.wrote
        with self._connections.connection(inline=inline, write=write) as conn:
            yield conn, inline

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Cursor]:
        with (
            self._connection(write=write) as (conn, inline),
            sqlite_transaction(conn, "BEGIN IMMEDIATE" if write else "BEGIN", inline=inline),
        ):
            yield _SQLiteCursor(conn)
        state = self._inline
        if write and state.active:
            state.wrote = True
            if inline:
                self._file.wrote_inline()

    def read(self, query: str, params: Mapping[str, object] | None = None) -> list[tuple[Any, ...]]:
        with self._connection(write=False) as (conn, inline):
            return _SQLiteCursor(conn, inline).rows(query, params)

    def close(self) -> None:
        self._connections.close()


class _PostgresCursor(Cursor):
    def __init__(self, conn: psycopg.Connection[Any], tables: Mapping[str, str]) -> None:
        self.conn = conn
        self.tables = tables

    def _sql(self, query: str) -> str:
        return _postgres_sql(query, self.tables)

    def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(self._sql(query), dict(params or {})).fetchall())

    def change(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        import psycopg

        try:
            return int(self.conn.execute(self._sql(query), dict(params or {})).rowcount)
        except psycopg.errors.UniqueViolation as error:
            raise unique_violation(error) or UniqueViolation(str(error)) from error


class PostgresDatabase(Database):
    """
    The server's tables in a PostgreSQL schema (the checkpointer's), through a psycopg connection pool.

    :param conninfo: A libpq connection string or URL.
    :param schema: The schema holding the tables (created if missing).
    :param max_connections: The pool's size.
    """

    dialect = "postgres"
    listens = True

    def __init__(self, conninfo: str, *, schema: str = "public", max_connections: int = 8) -> None:
        try:
            from haystack_state.db.postgres import open_pool
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
        self._pool = open_pool(conninfo, max_connections)

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Cursor]:
        with self._pool.connection() as conn, conn.transaction():
            yield _PostgresCursor(conn, self._tables)

    def notify(self, cur: Cursor, payload: str) -> None:
        cur.rows("SELECT pg_notify(:channel, :payload)", {"channel": self.channel, "payload": payload})

    def read(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        with self._pool.connection() as conn:  # (autocommit: one round trip)
            return _PostgresCursor(conn, self._tables).rows(query, params)

    def close(self) -> None:
        self._pool.close()


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
