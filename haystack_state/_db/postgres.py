"""
PostgreSQL connections for every table set of the package (checkpoints, stores, the server's tables), on psycopg 3:
the sync pools (:func:`open_pool`), the async connections of one event loop (:class:`LoopConnections`), read-only
sessions (:func:`read_only_conninfo`), the connection settings a backend may serialize (:func:`conninfo_parameter`),
and *scripts*: generators that yield SQL statements (:class:`Stmt`) and receive their results, run in one
transaction by :func:`run_script` or :func:`arun_script` on the package's one driver of flows
(:mod:`haystack_state._driver`).

Import it only with the ``postgres`` extra installed (the backends that use it say so when it is missing).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import weakref
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

import psycopg
from haystack.core.errors import SerializationError
from haystack.utils import Secret
from psycopg import sql
from psycopg_pool import ConnectionPool

from haystack_state._driver import run_flow, run_flow_async

__all__ = [
    "ALL",
    "COUNT",
    "NONE",
    "ONE",
    "Attempt",
    "EventLoopConnections",
    "LoopConnections",
    "Script",
    "Stmt",
    "Templates",
    "arun_script",
    "conninfo_parameter",
    "fetched",
    "open_pool",
    "read_only_conninfo",
    "run_script",
    "secret_conninfo",
]

#: What a statement's result is: ``one`` row, ``all`` rows, a row ``count``, nothing.
ONE, ALL, COUNT, NONE = "one", "all", "count", "none"


@dataclasses.dataclass(frozen=True, slots=True)
class Stmt:
    """
    One SQL statement of a script, and what its result is: ``one`` row, ``all`` rows, a row ``count``, nothing.
    ``alone``: the statement may run as a transaction of its own (one round trip) when it is the first of its script.
    """

    query: sql.Composed
    params: Any
    fetch: str = NONE
    alone: bool = False


#: A script yields a statement, or a tuple of them to send together in one round trip (each statement of a write
#: must then be ``alone``; they run as one implicit transaction) and receive a tuple of their results.
Script = Generator[Stmt | tuple[Stmt, ...], Any, Any]


class Templates:
    """
    Statement templates with their ``{table}`` names filled in (schema-qualified identifiers), each composed once.

    :param schema: The schema holding the tables.
    :param tables: The table names, by placeholder (``{"threads": "haystack_state_threads"}``).
    """

    def __init__(self, schema: str, tables: dict[str, str]) -> None:
        self._names = {key: sql.Identifier(schema, name) for key, name in tables.items()}
        self._composed: dict[str, sql.Composed] = {}

    def __call__(self, template: str) -> sql.Composed:
        """The statement of a template."""
        query = self._composed.get(template)
        if query is None:
            query = self._composed[template] = sql.SQL(template).format(**self._names)
        return query


def read_only_conninfo(conninfo: str) -> str:
    """
    ``conninfo`` with every transaction read-only (``-c default_transaction_read_only=on`` added to its options).

    :param conninfo: A libpq connection string or URL.
    :returns: The connection string.
    """
    given = psycopg.conninfo.conninfo_to_dict(conninfo).get("options") or ""
    return psycopg.conninfo.make_conninfo(conninfo, options=f"{given} -c default_transaction_read_only=on".strip())


def open_pool(conninfo: str, max_connections: int) -> ConnectionPool[Any]:
    """
    A sync pool of autocommit connections (at least one kept open), opened now.

    :param conninfo: Where to connect.
    :param max_connections: The pool's size.
    """
    return ConnectionPool(conninfo, min_size=1, max_size=max_connections, open=True, kwargs={"autocommit": True})


def conninfo_parameter(conninfo: str | Secret, owner: str) -> str | dict[str, Any]:
    """
    A connection setting as a backend's ``init_parameters`` stores it, without secrets: a ``Secret`` as its
    reference (for example ``Secret.from_env_var("PG_DSN")``), a string only if it holds no password.

    :param conninfo: The setting.
    :param owner: The backend's class name, for the error.
    :raises SerializationError: For a string with a password (it would be written in clear).
    """
    if isinstance(conninfo, Secret):
        return conninfo.to_dict()
    if "password" in psycopg.conninfo.conninfo_to_dict(conninfo):
        raise SerializationError(
            f"This {owner}'s conninfo holds a password, which would be written in clear; pass it as "
            "Secret.from_env_var('PG_DSN') instead."
        )
    return conninfo


def secret_conninfo(params: dict[str, Any]) -> dict[str, Any]:
    """``init_parameters`` output with a stored ``Secret`` reference rebuilt (see :func:`conninfo_parameter`)."""
    params = dict(params)
    if isinstance(params.get("conninfo"), dict):
        params["conninfo"] = Secret.from_dict(params["conninfo"])
    return params


def fetched(cursor: psycopg.Cursor[Any], fetch: str) -> Any:
    """A statement's result, as its ``fetch`` asks (``one``, ``all``, ``count``; None otherwise)."""
    if fetch == ONE:
        return cursor.fetchone()
    if fetch == ALL:
        return cursor.fetchall()
    return cursor.rowcount if fetch == COUNT else None


async def afetched(cursor: psycopg.AsyncCursor[Any], fetch: str) -> Any:
    """:func:`fetched`, awaiting the cursor."""
    if fetch == ONE:
        return await cursor.fetchone()
    if fetch == ALL:
        return await cursor.fetchall()
    return cursor.rowcount if fetch == COUNT else None


class Attempt:
    """How far an attempt got: whether its COMMIT was sent, and on which connection."""

    def __init__(self) -> None:
        self.committing = False
        self.conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None = None

    def dead(self) -> bool:
        """Whether the attempt's connection was closed or broken (the link died)."""
        return self.conn is not None and bool(self.conn.closed or getattr(self.conn, "broken", False))


class _ScriptRun:
    """One script's transaction: ``BEGIN`` before its first statement unless that may run alone (a write's)."""

    def __init__(self, write: bool, state: Attempt) -> None:
        self.write = write
        self.state = state
        self.opened = False  # whether BEGIN was sent: a write's first statement may run alone (autocommit)

    def begins(self, stmt: Stmt | tuple[Stmt, ...]) -> bool:
        """Whether ``BEGIN`` goes before this statement (else, for a write's first, it runs alone)."""
        if not self.write or self.opened:
            return False
        if (stmt[0] if isinstance(stmt, tuple) else stmt).alone:
            self.state.committing = True  # applied as soon as it runs: its outcome is unknown if the link dies
            return False
        self.opened, self.state.committing = True, False
        return True


def run_script(conn: psycopg.Connection[Any], script: Script, *, write: bool, state: Attempt) -> object:
    """
    Run a script's statements on ``conn``, in one transaction (a write's), and return the script's value.

    :param conn: An autocommit connection.
    :param script: The script.
    :param write: Whether the script writes (its statements then run in a transaction, committed at the end).
    :param state: Records whether the outcome is unknown if the link dies (a ``COMMIT`` or a lone write was sent).
    """
    run = _ScriptRun(write, state)

    def step(stmt: Stmt | tuple[Stmt, ...]) -> object:
        if run.begins(stmt):
            conn.execute("BEGIN")
        if isinstance(stmt, tuple):
            with conn.pipeline():
                cursors = [conn.execute(one.query, one.params) for one in stmt]
            result: object = tuple(fetched(cursor, one.fetch) for cursor, one in zip(cursors, stmt, strict=True))
        else:
            result = fetched(conn.execute(stmt.query, stmt.params), stmt.fetch)
        state.committing = False
        return result

    try:
        value = run_flow(script, step)
    except BaseException:
        if run.opened and not state.dead():
            conn.execute("ROLLBACK")
        raise
    if run.opened:
        state.committing = True
        conn.execute("COMMIT")
    return value


async def arun_script(conn: psycopg.AsyncConnection[Any], script: Script, *, write: bool, state: Attempt) -> object:
    """:func:`run_script` on an async connection."""
    run = _ScriptRun(write, state)

    async def step(stmt: Stmt | tuple[Stmt, ...]) -> object:
        if run.begins(stmt):
            await conn.execute("BEGIN")
        if isinstance(stmt, tuple):
            async with conn.pipeline():
                cursors = [await conn.execute(one.query, one.params) for one in stmt]
            result: object = tuple(
                [await afetched(cursor, one.fetch) for cursor, one in zip(cursors, stmt, strict=True)]
            )
        else:
            result = await afetched(await conn.execute(stmt.query, stmt.params), stmt.fetch)
        state.committing = False
        return result

    try:
        value = await run_flow_async(script, step)
    except BaseException:
        if run.opened and not state.dead():
            await conn.execute("ROLLBACK")
        raise
    if run.opened:
        state.committing = True
        await conn.execute("COMMIT")
    return value


class LoopConnections:
    """
    The async connections of one event loop: at most ``size``, reused, waited for when all are busy. (No pool task:
    psycopg's ``AsyncConnectionPool`` keeps tasks that make ``asyncio.run`` hang at exit unless it is closed first.)

    :param dsn: Where to connect.
    :param size: How many connections at most.
    :param loop: The loop they belong to.
    """

    def __init__(self, dsn: str, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.dsn = dsn
        self.size = size
        self.loop = weakref.ref(loop)
        self.idle: list[psycopg.AsyncConnection[Any]] = []
        self.open: list[psycopg.AsyncConnection[Any]] = []
        self.connecting = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def loop_gone(self) -> bool:
        """Whether their loop has closed (or was freed)."""
        loop = self.loop()
        return loop is None or loop.is_closed()

    async def get(self) -> psycopg.AsyncConnection[Any]:
        """Borrow a connection: an idle one, a new one, or (at ``size``) the next one given back."""
        while True:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    return conn
                self.open.remove(conn)
            if len(self.open) + self.connecting < self.size:
                self.connecting += 1
                try:
                    conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                finally:
                    self.connecting -= 1
                self.open.append(conn)
                return conn
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            await waiter

    def put(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Give a connection back (a broken one is closed and forgotten) and wake one waiter."""
        if conn.closed or getattr(conn, "broken", False):
            if conn in self.open:
                self.open.remove(conn)
            if not conn.closed:
                conn.pgconn.finish()
        else:
            self.idle.append(conn)
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def discard_idle(self) -> None:
        """Close the idle connections (after one died, its siblings most likely did too)."""
        for conn in self.idle:
            self.open.remove(conn)
            conn.pgconn.finish()
        self.idle.clear()

    def finish(self) -> None:
        """Close every connection at once, without their loop (libpq's ``PQfinish``)."""
        for conn in self.open:
            if not conn.closed:
                conn.pgconn.finish()
        self.open.clear()
        self.idle.clear()

    async def aclose(self) -> None:
        """Close every connection, on their loop."""
        for conn in self.open:
            await conn.close()
        self.open.clear()
        self.idle.clear()


C = TypeVar("C", bound=LoopConnections)


class EventLoopConnections(Generic[C]):
    """
    The async connections of every event loop a backend serves (an async connection belongs to the loop that opened
    it): a loop's set is made at its first use, and finished once that loop has closed.

    :param make: Makes a loop's set (for example ``lambda loop: LoopConnections(dsn, 8, loop)``).
    """

    def __init__(self, make: Callable[[asyncio.AbstractEventLoop], C]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._by_loop: dict[int, C] = {}

    def of_running_loop(self) -> C:
        """The running loop's connections (made now if it has none; those of closed loops are finished)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for key, connections in list(self._by_loop.items()):
                if key != id(loop) and connections.loop_gone():
                    del self._by_loop[key]
                    connections.finish()
            found = self._by_loop.get(id(loop))
            if found is not None and found.loop() is not loop:
                # A closed loop's connections, under the id a new loop now has (ids are reused once an object is
                # freed): they are closed here, or they would be dropped open.
                found.finish()
                found = None
            if found is None:
                found = self._by_loop[id(loop)] = self._make(loop)
            return found

    async def aclose_running_loop(self) -> None:
        """Close the running loop's connections, on it."""
        with self._lock:
            connections = self._by_loop.pop(id(asyncio.get_running_loop()), None)
        if connections is not None:
            await connections.aclose()

    def finish(self) -> None:
        """Close every loop's connections at once, without their loops."""
        with self._lock:
            everything, self._by_loop = list(self._by_loop.values()), {}
        for connections in everything:
            connections.finish()
