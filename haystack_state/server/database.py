"""
The server's connection to the checkpointer's database: SQLite (a file, or private memory for an in-memory
checkpointer) or PostgreSQL (the checkpointer's schema), behind one small interface so that the server's SQL is
written once (see :mod:`haystack_state.server.storage`).

Queries use ``:name`` parameters and ``{threads}``, ``{runs}``, ``{run_events}``, ``{migrations}`` table
placeholders; each backend turns them into its own parameter style and (schema-qualified) table names.
"""

from __future__ import annotations

import abc
import re
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from haystack.utils import Secret

from haystack_state.errors import CheckpointError
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.memory import InMemoryCheckpointer
from haystack_state.persistence.sqlite import SQLiteCheckpointer
from haystack_state.text import lenient_text

__all__ = ["Database", "PostgresDatabase", "SQLiteDatabase", "UniqueViolation", "database_for"]

TABLES = {
    "threads": "haystack_state_server_threads",
    "runs": "haystack_state_server_runs",
    "run_events": "haystack_state_server_run_events",
    "migrations": "haystack_state_server_migrations",
}
_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UniqueViolation(CheckpointError):
    """A write broke a unique constraint (for example a second running run on one thread)."""


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


class _SQLiteCursor(Cursor):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        try:
            return list(self.conn.execute(_tables(query, TABLES), dict(params or {})).fetchall())
        except sqlite3.OperationalError as error:
            if "Could not decode to UTF-8" not in str(error):
                raise
        # A cell that is not valid UTF-8 (another program wrote it): read again, its bad bytes as escapes that the
        # thread records read as U+FFFD, with a warning naming the thread.
        self.conn.text_factory = lenient_text
        try:
            return list(self.conn.execute(_tables(query, TABLES), dict(params or {})).fetchall())
        finally:
            self.conn.text_factory = str

    def change(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        try:
            return int(self.conn.execute(_tables(query, TABLES), dict(params or {})).rowcount)
        except sqlite3.IntegrityError as error:
            if "UNIQUE" in str(error):
                raise UniqueViolation(str(error)) from error
            raise


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
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._single = threading.Lock() if path == ":memory:" else None

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._timeout, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Cursor]:
        if self._single is not None:
            self._single.acquire()
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._open()
                with self._lock:
                    self._all.append(conn)
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield _SQLiteCursor(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                with self._lock:
                    self._idle.append(conn)
        finally:
            if self._single is not None:
                self._single.release()

    def close(self) -> None:
        with self._lock:
            connections, self._all, self._idle = self._all, [], []
        for conn in connections:
            conn.close()


class _PostgresCursor(Cursor):
    def __init__(self, conn: Any, tables: Mapping[str, str]) -> None:
        self.conn = conn
        self.tables = tables

    def _sql(self, query: str) -> str:
        return _PARAM.sub(r"%(\1)s", _tables(query, self.tables))

    def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(self._sql(query), dict(params or {})).fetchall())

    def change(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        import psycopg

        try:
            return int(self.conn.execute(self._sql(query), dict(params or {})).rowcount)
        except psycopg.errors.UniqueViolation as error:
            raise UniqueViolation(str(error).splitlines()[0]) from error


class PostgresDatabase(Database):
    """
    The server's tables in a PostgreSQL schema (the checkpointer's), through a psycopg connection pool.

    :param conninfo: A libpq connection string or URL.
    :param schema: The schema holding the tables (created if missing).
    :param max_connections: The pool's size.
    """

    dialect = "postgres"

    def __init__(self, conninfo: str, *, schema: str = "public", max_connections: int = 8) -> None:
        try:
            from psycopg_pool import ConnectionPool
        except ImportError as error:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                'The server on PostgreSQL needs the postgres extra: pip install "haystack-state[postgres,server]"'
            ) from error
        if not _IDENTIFIER.match(schema):
            raise ValueError(f"PostgreSQL schema name {schema!r} must be a plain identifier (letters, digits, _).")
        self.schema = schema
        self._tables = {key: f'"{schema}".{name}' for key, name in TABLES.items()}
        self._pool = ConnectionPool(
            conninfo, min_size=1, max_size=max_connections, open=True, kwargs={"autocommit": True}
        )

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Cursor]:
        with self._pool.connection() as conn, conn.transaction():
            yield _PostgresCursor(conn, self._tables)

    def close(self) -> None:
        self._pool.close()


def _tables(query: str, tables: Mapping[str, str]) -> str:
    for key, name in tables.items():
        query = query.replace("{" + key + "}", name)
    return query


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
            return PostgresDatabase(database, schema=_postgres_schema(checkpointer))
        return SQLiteDatabase(database)
    if isinstance(checkpointer, InMemoryCheckpointer):
        return SQLiteDatabase(":memory:")
    if isinstance(checkpointer, SQLiteCheckpointer):
        params = checkpointer.init_parameters()
        return SQLiteDatabase(str(params["path"]), timeout=float(params.get("timeout", 30.0)))
    if type(checkpointer).__name__ == "PostgresCheckpointer":
        try:
            params = checkpointer.init_parameters()
        except Exception as error:
            raise ValueError(
                f"The server cannot find the database of this PostgresCheckpointer ({error}). Pass "
                "create_app(..., database='postgresql://...') naming the same database."
            ) from error
        conninfo = params.get("conninfo")
        if isinstance(conninfo, dict):
            conninfo = Secret.from_dict(conninfo).resolve_value()
        return PostgresDatabase(str(conninfo or ""), schema=str(params.get("schema", "public")))
    raise ValueError(
        f"The server keeps its tables in the checkpointer's database and cannot use a {type(checkpointer).__name__}; "
        "pass create_app(..., database='threads.db' or 'postgresql://...')."
    )


def _postgres_schema(checkpointer: Checkpointer) -> str:
    """The PostgreSQL checkpointer's schema, when its settings tell it ("public" otherwise)."""
    if type(checkpointer).__name__ != "PostgresCheckpointer":
        return "public"
    try:
        return str(checkpointer.init_parameters().get("schema", "public"))
    except Exception:  # a checkpointer built on a pool, or with a password in its conninfo, hides its settings
        return "public"
