"""
:class:`PostgresCheckpointer`: checkpoints in PostgreSQL (psycopg 3, with connection pools).

Each checkpoint is one row holding its delta (and now and then a snapshot of the whole state); a ``threads`` row
holds the head, a ``leases`` row a run's lease. A commit locks the thread's row (``SELECT ... FOR UPDATE``), so two
writers of the same thread are serialized and the second sees the first's head (and gets a
:class:`~haystack_state.errors.ThreadConflictError`); creating a thread relies on the primary key of the ``threads``
table instead.

Each operation is written once, as a *script*: a generator that yields SQL statements and receives their results.
The sync methods run scripts on a ``ConnectionPool``, the async ones on ``AsyncConnection``s of the caller's event
loop (a few per loop, reused, with no background task: psycopg's ``AsyncConnectionPool`` keeps tasks that make
``asyncio.run`` hang at exit unless the pool is closed first, which a library cannot ask of every caller). Connections
of a loop that has closed are closed on the next use or by ``close``; ``aclose`` closes the current loop's.

A statement that fails because the pooled connection died is retried once on a fresh connection if the transaction is
known not to have been applied: it failed before its ``COMMIT`` was sent, or (for a commit) the checkpoint is not there
when looked up again; lease, TTL and snapshot writes are idempotent and simply run again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import threading
import weakref
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool
except ImportError as _error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'PostgresCheckpointer needs the postgres extra: pip install "haystack-state[postgres]"'
    ) from _error

from haystack.core.errors import SerializationError
from haystack.utils import Secret

from haystack_state.errors import CheckpointError, CheckpointNotFoundError, ThreadNotFoundError
from haystack_state.persistence import ops
from haystack_state.persistence.base import Checkpointer, check_commit, conflict_error
from haystack_state.persistence.leases import busy_error
from haystack_state.persistence.records import ChainLink, StoredCheckpoint, ThreadInfo, parse_row, string_list_json

#: Append-only: the schema version is the number of migrations applied. Never edit or reorder an entry.
#: ``{threads}``, ``{checkpoints}`` and ``{leases}`` are replaced by the schema-qualified table names.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE {threads} (
            thread_id text PRIMARY KEY,
            head_id text NOT NULL,
            last_seq bigint NOT NULL,
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL
        )""",
        """CREATE TABLE {checkpoints} (
            thread_id text NOT NULL,
            checkpoint_id text NOT NULL,
            seq bigint NOT NULL,
            parent_id text,
            step bigint NOT NULL,
            source text NOT NULL,
            tool_names text[] NOT NULL,
            changed_keys text[] NOT NULL,
            created_at timestamptz NOT NULL,
            metadata text NOT NULL,
            delta text NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_id),
            UNIQUE (thread_id, seq)
        )""",
        "CREATE INDEX ON {threads} (updated_at)",
    ),
    (  # snapshots, thread TTLs, leases; tool names and keys as JSON text (text[] cannot hold a NUL character)
        "ALTER TABLE {checkpoints} ADD COLUMN snapshot text",
        "ALTER TABLE {checkpoints} ADD COLUMN chain_bytes bigint NOT NULL DEFAULT 0",
        "ALTER TABLE {checkpoints} ADD COLUMN base_bytes bigint NOT NULL DEFAULT 0",
        "ALTER TABLE {checkpoints} ALTER COLUMN tool_names TYPE text USING array_to_json(tool_names)::text",
        "ALTER TABLE {checkpoints} ALTER COLUMN changed_keys TYPE text USING array_to_json(changed_keys)::text",
        "ALTER TABLE {threads} ADD COLUMN ttl double precision",
        "ALTER TABLE {threads} ADD COLUMN expires_at double precision",
        """CREATE TABLE {leases} (
            thread_id text PRIMARY KEY,
            owner text NOT NULL,
            expires_at double precision NOT NULL
        )""",
    ),
]

_META = "thread_id, checkpoint_id, parent_id, step, source, tool_names, created_at, changed_keys, metadata"
_APPEND = """
    WITH moved AS (
        UPDATE {threads} SET head_id = %(id)s, last_seq = last_seq + 1, updated_at = %(created)s,
            expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE %(now)s + ttl END
        WHERE thread_id = %(thread)s AND head_id = %(expected)s AND (expires_at IS NULL OR expires_at > %(now)s)
        AND (%(owner)s::text IS NULL OR NOT EXISTS (
            SELECT 1 FROM {leases} WHERE thread_id = %(thread)s AND owner <> %(owner)s AND expires_at > %(now)s))
        RETURNING last_seq
    )
    INSERT INTO {checkpoints} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, changed_keys,
        created_at, metadata, delta, snapshot, chain_bytes, base_bytes)
    SELECT %(thread)s, %(id)s, last_seq, %(parent)s, %(step)s, %(source)s, %(tools)s, %(keys)s, %(created)s,
        %(metadata)s, %(delta)s, %(snapshot)s, %(chain)s, %(base)s FROM moved
"""
_VISIBLE = "(expires_at IS NULL OR expires_at > %(now)s)"
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


Script = Generator[Stmt, Any, Any]


class _Attempt:
    """How far an attempt got: whether its COMMIT was sent, and on which connection."""

    def __init__(self) -> None:
        self.committing = False
        self.conn: Any = None

    def dead(self) -> bool:
        return self.conn is not None and bool(self.conn.closed or getattr(self.conn, "broken", False))


class _LoopConnections:
    """
    The async connections of one event loop: at most ``size``, reused, waited for when all are busy.

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
        loop = self.loop()
        return loop is None or loop.is_closed()

    async def get(self) -> psycopg.AsyncConnection[Any]:
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
        for conn in self.open:
            await conn.close()
        self.open.clear()
        self.idle.clear()


def _epoch(moment: dt.datetime) -> float:
    return moment.timestamp()


def _from_epoch(value: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(value, dt.UTC)


class PostgresCheckpointer(Checkpointer):
    """
    A checkpointer backed by PostgreSQL. Creates or migrates its tables on construction.

    :param conninfo: A libpq connection string or URL (``"postgresql://user@host/db"``). None uses the libpq
        defaults and ``PG*`` environment variables. The checkpointer opens (and closes) its own pools.
    :param pool: A ``psycopg_pool.ConnectionPool`` to borrow connections from instead; it is not closed by
        :meth:`close` (the async methods open pools of their own on its ``conninfo``).
    :param schema: The schema holding the tables (created if missing).
    :param max_connections: The size of each pool the checkpointer opens.
    :param cache_size: How many threads' head states to keep materialized (0 disables the cache).
    :param kwargs: The settings of :class:`~haystack_state.persistence.base.Checkpointer` (``lease_ttl``,
        ``thread_ttl``, ``snapshot_min_bytes``, ``snapshot_ratio``).
    """

    def __init__(
        self,
        conninfo: str | Secret | None = None,
        *,
        pool: ConnectionPool[Any] | None = None,
        schema: str = "public",
        max_connections: int = 4,
        cache_size: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(cache_size=cache_size, **kwargs)
        if conninfo is not None and pool is not None:
            raise ValueError("Pass either conninfo or pool, not both.")
        self._schema = schema
        self._names = {
            "threads": sql.Identifier(schema, "haystack_state_threads"),
            "checkpoints": sql.Identifier(schema, "haystack_state_checkpoints"),
            "leases": sql.Identifier(schema, "haystack_state_leases"),
            "migrations": sql.Identifier(schema, "haystack_state_migrations"),
        }
        self._queries: dict[str, sql.Composed] = {}
        self._owns_pool = pool is None
        self._conninfo = conninfo
        self._max_connections = max_connections
        self._io_lock = threading.Lock()
        self._aconns: dict[int, _LoopConnections] = {}
        self._scripts: dict[type, Callable[[Any], Script]] = {
            ops.Insert: self._insert,
            ops.ReadHead: self._read_head,
            ops.ReadMeta: self._read_meta,
            ops.ReadChain: self._read_chain,
            ops.ReadHistory: self._read_history,
            ops.ReadThreads: self._read_threads,
            ops.DeleteThread: self._delete,
            ops.ReadPruneCandidates: self._prune_candidates,
            ops.SetSnapshot: self._set_snapshot,
            ops.DeleteCheckpoints: self._delete_checkpoints,
            ops.SetTTL: self._set_ttl,
            ops.AcquireLease: self._acquire,
            ops.RenewLease: self._renew,
            ops.ReleaseLease: self._release,
            ops.ReadLease: self._read_lease,
        }
        if pool is None:
            self._dsn = (conninfo.resolve_value() if isinstance(conninfo, Secret) else conninfo) or ""
            # Connect once directly first: a wrong conninfo fails at once instead of after the pool's timeout.
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                self._migrate(conn)
            self._pool = ConnectionPool(
                self._dsn, min_size=1, max_size=max_connections, open=True, kwargs={"autocommit": True}
            )
        else:
            self._dsn = pool.conninfo
            self._pool = pool
            with pool.connection() as conn:
                self._migrate(conn)

    # --- connections and scripts --------------------------------------------------------------------------------

    def _q(self, template: str) -> sql.Composed:
        query = self._queries.get(template)
        if query is None:
            query = self._queries[template] = sql.SQL(template).format(**self._names)
        return query

    def _execute(self, op: ops.Op) -> Any:
        for attempt in (1, 2):
            state = _Attempt()
            try:
                with self._pool.connection() as conn:
                    state.conn = conn
                    return self._run(conn, op, state)
            except psycopg.OperationalError:
                if attempt == 2 or not state.dead():
                    raise
                self._pool.check()  # replace the pool's other dead connections before the retry
                if state.committing and self._applied(op):
                    return None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _aexecute(self, op: ops.Op) -> Any:
        connections = self._async_connections()
        for attempt in (1, 2):
            state = _Attempt()
            conn = await connections.get()
            try:
                state.conn = conn
                return await self._arun(conn, op, state)
            except psycopg.OperationalError:
                if attempt == 2 or not state.dead():
                    raise
                connections.discard_idle()  # its siblings died with it, most likely: connect afresh
                if state.committing and await asyncio.to_thread(self._applied, op):
                    return None
            finally:
                connections.put(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    def _async_connections(self) -> _LoopConnections:
        loop = asyncio.get_running_loop()
        with self._io_lock:
            for key, connections in list(self._aconns.items()):
                if key != id(loop) and connections.loop_gone():
                    del self._aconns[key]
                    connections.finish()
            found = self._aconns.get(id(loop))
            if found is None or found.loop_gone():
                found = self._aconns[id(loop)] = _LoopConnections(self._dsn, self._max_connections, loop)
            return found

    def _applied(self, op: ops.Op) -> bool:
        """
        After a transaction lost with its connection while it committed: whether it was applied. A commit is looked
        up by its checkpoint id; the other writes (leases, TTLs, snapshots) are idempotent, so they are run again.
        """
        if not isinstance(op, ops.Insert):
            return False
        query = self._q("SELECT 1 FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = %s")
        with self._pool.connection() as conn:
            return conn.execute(query, (op.row.thread_id, op.row.checkpoint_id)).fetchone() is not None

    def _run(self, conn: psycopg.Connection[Any], op: ops.Op, state: _Attempt) -> Any:
        script = self._scripts[type(op)](op)
        write = isinstance(op, ops.WRITES)
        opened = False  # whether BEGIN was sent: a write's first statement may run alone (autocommit)
        result: Any = None
        try:
            while True:
                try:
                    stmt = script.send(result)
                except StopIteration as stop:
                    value = stop.value
                    break
                if write and not opened:
                    if stmt.alone:
                        state.committing = True  # applied as soon as it runs: its outcome is unknown if the link dies
                    else:
                        conn.execute("BEGIN")
                        opened, state.committing = True, False
                cursor = conn.execute(stmt.query, stmt.params)
                state.committing = False
                if stmt.fetch == ONE:
                    result = cursor.fetchone()
                elif stmt.fetch == ALL:
                    result = cursor.fetchall()
                else:
                    result = cursor.rowcount if stmt.fetch == COUNT else None
        except BaseException:
            if opened and not state.dead():
                conn.execute("ROLLBACK")
            raise
        if opened:
            state.committing = True
            conn.execute("COMMIT")
        return value

    async def _arun(self, conn: psycopg.AsyncConnection[Any], op: ops.Op, state: _Attempt) -> Any:
        script = self._scripts[type(op)](op)
        write = isinstance(op, ops.WRITES)
        opened = False  # whether BEGIN was sent: a write's first statement may run alone (autocommit)
        result: Any = None
        try:
            while True:
                try:
                    stmt = script.send(result)
                except StopIteration as stop:
                    value = stop.value
                    break
                if write and not opened:
                    if stmt.alone:
                        state.committing = True  # applied as soon as it runs: its outcome is unknown if the link dies
                    else:
                        await conn.execute("BEGIN")
                        opened, state.committing = True, False
                cursor = await conn.execute(stmt.query, stmt.params)
                state.committing = False
                if stmt.fetch == ONE:
                    result = await cursor.fetchone()
                elif stmt.fetch == ALL:
                    result = await cursor.fetchall()
                else:
                    result = cursor.rowcount if stmt.fetch == COUNT else None
        except BaseException:
            if opened and not state.dead():
                await conn.execute("ROLLBACK")
            raise
        if opened:
            state.committing = True
            await conn.execute("COMMIT")
        return value

    async def _aclose(self) -> None:
        with self._io_lock:
            connections = self._aconns.pop(id(asyncio.get_running_loop()), None)
        if connections is not None:
            await connections.aclose()

    def _close(self) -> None:
        with self._io_lock:
            everything, self._aconns = list(self._aconns.values()), {}
        for connections in everything:
            connections.finish()
        if self._owns_pool:
            self._pool.close()

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Apply the pending migrations in one transaction, under an advisory lock on the schema name."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"haystack_state:{self._schema}",))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema)))
            conn.execute(
                self._q("CREATE TABLE IF NOT EXISTS {migrations} (version integer PRIMARY KEY, applied_at timestamptz)")
            )
            row = conn.execute(self._q("SELECT COALESCE(MAX(version), 0) FROM {migrations}")).fetchone()
            current = int(row[0]) if row is not None else 0
            if current > len(MIGRATIONS):
                raise CheckpointError(
                    f"The schema '{self._schema}' is at version {current}, newer than this haystack-state supports "
                    f"({len(MIGRATIONS)}); upgrade haystack-state."
                )
            for version in range(current + 1, len(MIGRATIONS) + 1):
                for statement in MIGRATIONS[version - 1]:
                    conn.execute(self._q(statement))
                conn.execute(self._q("INSERT INTO {migrations} VALUES (%s, now())"), (version,))

    # --- settings -----------------------------------------------------------------------------------------------

    def init_parameters(self) -> dict[str, Any]:
        """
        The connection settings, without secrets: a ``Secret`` conninfo is stored as its reference (for example
        ``Secret.from_env_var("PG_DSN")``), a conninfo string only if it holds no password.

        :raises SerializationError: For a checkpointer built on a pool, or a conninfo string with a password.
        """
        if not self._owns_pool:
            raise SerializationError(
                "A PostgresCheckpointer built on a pool cannot be serialized; build it from conninfo, for example "
                "PostgresCheckpointer(Secret.from_env_var('PG_DSN'))."
            )
        params: dict[str, Any] = {"schema": self._schema, "max_connections": self._max_connections}
        if isinstance(self._conninfo, Secret):
            params["conninfo"] = self._conninfo.to_dict()
        elif self._conninfo is not None:
            if "password" in psycopg.conninfo.conninfo_to_dict(self._conninfo):
                raise SerializationError(
                    "This PostgresCheckpointer's conninfo holds a password, which would be written in clear; pass "
                    "it as Secret.from_env_var('PG_DSN') instead."
                )
            params["conninfo"] = self._conninfo
        return {**params, **self._common_parameters()}

    @classmethod
    def from_init_parameters(cls, params: dict[str, Any]) -> PostgresCheckpointer:
        """
        Rebuild a checkpointer from :meth:`init_parameters` output.

        :param params: The parameters.
        :returns: The checkpointer.
        """
        params = dict(params)
        if isinstance(params.get("conninfo"), dict):
            params["conninfo"] = Secret.from_dict(params["conninfo"])
        return cls(**params)

    # --- scripts ------------------------------------------------------------------------------------------------

    def _insert(self, op: ops.Insert) -> Script:
        row, expected_head, now = op.row, op.expected_head, _epoch(op.now)
        if op.lease_owner is not None:
            query = self._q("SELECT owner, expires_at FROM {leases} WHERE thread_id = %s")
            holder = yield Stmt(query, (row.thread_id,), ONE)
            if holder is not None and holder[0] != op.lease_owner and holder[1] > now:
                raise busy_error(row.thread_id, holder[0], _from_epoch(holder[1]))
        if expected_head is not None and row.parent_id == expected_head:
            # The common commit, a child of the expected head, in one statement (one round trip): move the head if
            # it is the expected one and no other owner holds a live lease, and insert the row. If nothing moved,
            # the full path below finds out why.
            inserted = yield Stmt(self._q(_APPEND), self._row_params(row, op, expected_head), COUNT, alone=True)
            if inserted == 1:
                return None
        query = self._q("SELECT head_id, last_seq, expires_at FROM {threads} WHERE thread_id = %s FOR UPDATE")
        found = yield Stmt(query, (row.thread_id,), ONE)
        expired = found is not None and found[2] is not None and found[2] <= now
        if expired and expected_head is None:  # invisible already: the new thread replaces it
            yield Stmt(self._q("DELETE FROM {checkpoints} WHERE thread_id = %s"), (row.thread_id,))
            yield Stmt(self._q("DELETE FROM {threads} WHERE thread_id = %s"), (row.thread_id,))
            found = None
        head, last_seq = (found[0], int(found[1])) if found is not None and not expired else (None, 0)
        parent_exists = True
        if row.parent_id is not None and head is not None and row.parent_id != head:
            query = self._q("SELECT 1 FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = %s")
            parent_exists = (yield Stmt(query, (row.thread_id, row.parent_id), ONE)) is not None
        check_commit(row, expected_head, head, lambda: parent_exists)
        if found is None:
            # A new thread: the primary key decides between concurrent creators (the loser inserts nothing).
            created = yield Stmt(
                self._q(
                    "INSERT INTO {threads} (thread_id, head_id, last_seq, created_at, updated_at, ttl, expires_at) "
                    "VALUES (%s, %s, 1, %s, %s, %s, %s) ON CONFLICT (thread_id) DO NOTHING"
                ),
                (
                    row.thread_id,
                    row.checkpoint_id,
                    row.created_at,
                    row.created_at,
                    op.ttl,
                    now + op.ttl if op.ttl is not None else None,
                ),
                COUNT,
            )
            if created != 1:
                actual = yield Stmt(
                    self._q("SELECT head_id FROM {threads} WHERE thread_id = %s"), (row.thread_id,), ONE
                )
                raise conflict_error(row.thread_id, expected_head, actual[0] if actual is not None else None)
        else:
            yield Stmt(
                self._q(
                    "UPDATE {threads} SET head_id = %s, last_seq = %s, updated_at = %s, "
                    "expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE %s + ttl END WHERE thread_id = %s"
                ),
                (row.checkpoint_id, last_seq + 1, row.created_at, now, row.thread_id),
            )
        yield Stmt(
            self._q(
                "INSERT INTO {checkpoints} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, "
                "changed_keys, created_at, metadata, delta, snapshot, chain_bytes, base_bytes) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            ),
            (
                row.thread_id,
                row.checkpoint_id,
                last_seq + 1,
                row.parent_id,
                row.step,
                row.source,
                string_list_json(row.tool_names),
                string_list_json(row.changed_keys),
                row.created_at,
                row.metadata,
                row.delta,
                row.snapshot,
                row.chain_bytes,
                row.base_bytes,
            ),
        )

    @staticmethod
    def _row_params(row: StoredCheckpoint, op: ops.Insert, expected_head: str) -> dict[str, Any]:
        return {
            "thread": row.thread_id,
            "id": row.checkpoint_id,
            "expected": expected_head,
            "owner": op.lease_owner,
            "now": _epoch(op.now),
            "parent": row.parent_id,
            "step": row.step,
            "source": row.source,
            "tools": string_list_json(row.tool_names),
            "keys": string_list_json(row.changed_keys),
            "created": row.created_at,
            "metadata": row.metadata,
            "delta": row.delta,
            "snapshot": row.snapshot,
            "chain": row.chain_bytes,
            "base": row.base_bytes,
        }

    def _visible_head(self, thread_id: str, now: dt.datetime) -> Script:
        query = self._q(f"SELECT head_id FROM {{threads}} WHERE thread_id = %(thread)s AND {_VISIBLE}")
        found = yield Stmt(query, {"thread": thread_id, "now": _epoch(now)}, ONE)
        return str(found[0]) if found is not None else None

    def _read_head(self, op: ops.ReadHead) -> Script:
        return (yield from self._visible_head(op.thread_id, op.now))

    def _read_meta(self, op: ops.ReadMeta) -> Script:
        # One round trip in the common case: the thread's visible head and the row, joined.
        query = self._q(
            f"SELECT {', '.join('c.' + column for column in _META.split(', '))}, '', NULL, c.chain_bytes, "
            "c.base_bytes FROM {threads} AS t JOIN {checkpoints} AS c ON c.thread_id = t.thread_id "
            "AND c.checkpoint_id = COALESCE(%(checkpoint)s, t.head_id) WHERE t.thread_id = %(thread)s "
            "AND (t.expires_at IS NULL OR t.expires_at > %(now)s)"
        )
        params = {"thread": op.thread_id, "checkpoint": op.checkpoint_id, "now": _epoch(op.now)}
        found = yield Stmt(query, params, ONE)
        if found is not None:
            return _row(found)
        head = yield from self._visible_head(op.thread_id, op.now)
        if head is None:
            raise ThreadNotFoundError(op.thread_id)
        raise CheckpointNotFoundError(op.thread_id, head if op.checkpoint_id is None else op.checkpoint_id)

    def _read_chain(self, op: ops.ReadChain) -> Script:
        # Each step of the walk is one primary-key lookup (LATERAL ... LIMIT 1 keeps the planner from hash-joining
        # the whole thread at every step); it stops at a snapshot, at ``stop`` or at the root. PostgreSQL evaluates
        # only the rows the outer LIMIT takes, so a corrupt, cyclic chain stops after as many rows as the thread has.
        query = self._q(
            "WITH RECURSIVE chain AS ("
            " SELECT checkpoint_id, parent_id, delta, snapshot FROM {checkpoints}"
            " WHERE thread_id = %(thread)s AND checkpoint_id = %(checkpoint)s"
            " UNION ALL"
            " SELECT p.* FROM chain CROSS JOIN LATERAL ("
            " SELECT checkpoint_id, parent_id, delta, snapshot FROM {checkpoints} AS c"
            " WHERE c.thread_id = %(thread)s AND c.checkpoint_id = chain.parent_id LIMIT 1) AS p"
            " WHERE chain.parent_id IS DISTINCT FROM %(stop)s::text AND chain.snapshot IS NULL"
            ") SELECT checkpoint_id, parent_id, delta, snapshot FROM chain"
            " LIMIT (SELECT count(*) + 1 FROM {checkpoints} WHERE thread_id = %(thread)s)"
        )
        rows = yield Stmt(query, {"thread": op.thread_id, "checkpoint": op.checkpoint_id, "stop": op.stop_at}, ALL)
        return [ChainLink(found[0], found[1], found[2], found[3]) for found in reversed(rows)]

    def _read_history(self, op: ops.ReadHistory) -> Script:
        if (yield from self._visible_head(op.thread_id, op.now)) is None:
            raise ThreadNotFoundError(op.thread_id)
        where, params = "thread_id = %s", [op.thread_id]
        if op.before is not None:
            query = self._q("SELECT seq FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = %s")
            found = yield Stmt(query, (op.thread_id, op.before), ONE)
            if found is None:
                raise CheckpointNotFoundError(op.thread_id, op.before)
            where += " AND seq < %s"
            params.append(found[0])
        limit = f" LIMIT {int(op.limit)}" if op.limit is not None else ""
        query = self._q(
            f"SELECT {_META}, '', CASE WHEN snapshot IS NULL THEN NULL ELSE '' END, chain_bytes, base_bytes "
            f"FROM {{checkpoints}} WHERE {where} ORDER BY seq DESC{limit}"
        )
        rows = yield Stmt(query, params, ALL)
        return [_row(found) for found in rows]

    def _read_threads(self, op: ops.ReadThreads) -> Script:
        query = self._q(
            "SELECT t.thread_id, t.head_id, (SELECT count(*) FROM {checkpoints} AS c WHERE c.thread_id = t.thread_id), "
            f"t.created_at, t.updated_at FROM {{threads}} AS t WHERE {_VISIBLE} ORDER BY t.updated_at DESC, t.thread_id"
        )
        rows = yield Stmt(query, {"now": _epoch(op.now)}, ALL)
        return [ThreadInfo(r[0], r[1], int(r[2]), _utc(r[3]), _utc(r[4])) for r in rows]

    def _delete(self, op: ops.DeleteThread) -> Script:
        params = {"thread": op.thread_id, "now": _epoch(op.now)}
        if op.only_expired:
            condition = (
                "expires_at IS NOT NULL AND expires_at <= %(now)s AND NOT EXISTS (SELECT 1 FROM {leases} AS l "
                "WHERE l.thread_id = %(thread)s AND l.expires_at > %(now)s)"
            )
        else:
            condition = _VISIBLE
        query = self._q(f"SELECT {condition} FROM {{threads}} WHERE thread_id = %(thread)s FOR UPDATE")
        found = yield Stmt(query, params, ONE)
        if found is None or (op.only_expired and not found[0]):
            return False
        yield Stmt(self._q("DELETE FROM {checkpoints} WHERE thread_id = %s"), (op.thread_id,))
        yield Stmt(self._q("DELETE FROM {threads} WHERE thread_id = %s"), (op.thread_id,))
        yield Stmt(self._q("DELETE FROM {leases} WHERE thread_id = %s"), (op.thread_id,))
        return bool(found[0])

    def _prune_candidates(self, op: ops.ReadPruneCandidates) -> Script:
        where = "WHERE thread_id = %(thread)s" if op.thread_id is not None else ""
        query = self._q(
            f"SELECT thread_id, expires_at IS NOT NULL AND expires_at <= %(now)s FROM {{threads}} {where} "
            "ORDER BY thread_id"
        )
        rows = yield Stmt(query, {"thread": op.thread_id, "now": _epoch(op.now)}, ALL)
        return [r[0] for r in rows if not r[1]], [r[0] for r in rows if r[1]]

    def _set_snapshot(self, op: ops.SetSnapshot) -> Script:
        query = self._q(
            "UPDATE {checkpoints} SET snapshot = %s, chain_bytes = 0, base_bytes = %s "
            "WHERE thread_id = %s AND checkpoint_id = %s"
        )
        yield Stmt(query, (op.snapshot, len(op.snapshot), op.thread_id, op.checkpoint_id), alone=True)

    def _delete_checkpoints(self, op: ops.DeleteCheckpoints) -> Script:
        query = self._q(
            "DELETE FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = ANY(%s) AND checkpoint_id NOT IN "
            "(SELECT head_id FROM {threads} WHERE thread_id = %s)"
        )
        return (yield Stmt(query, (op.thread_id, list(op.checkpoint_ids), op.thread_id), COUNT))

    def _set_ttl(self, op: ops.SetTTL) -> Script:
        query = self._q(
            "UPDATE {threads} SET ttl = %(ttl)s, expires_at = CASE WHEN %(ttl)s::double precision IS NULL THEN NULL "
            f"ELSE extract(epoch FROM updated_at) + %(ttl)s END WHERE thread_id = %(thread)s AND {_VISIBLE}"
        )
        params = {"ttl": op.ttl, "thread": op.thread_id, "now": _epoch(op.now)}
        return (yield Stmt(query, params, COUNT, alone=True)) == 1

    def _acquire(self, op: ops.AcquireLease) -> Script:
        # Insert, or take over an expired lease or one's own, in one statement; otherwise the holder comes back.
        query = self._q(
            "INSERT INTO {leases} AS l (thread_id, owner, expires_at) VALUES (%(thread)s, %(owner)s, %(expires)s) "
            "ON CONFLICT (thread_id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
            "WHERE l.owner = excluded.owner OR l.expires_at <= %(now)s RETURNING 1"
        )
        params = {"thread": op.thread_id, "owner": op.owner, "expires": _epoch(op.expires_at), "now": _epoch(op.now)}
        for _ in range(3):  # a holder that releases between the two statements: try again
            if (yield Stmt(query, params, ONE, alone=True)) is not None:
                return None
            holder = yield Stmt(
                self._q("SELECT owner, expires_at FROM {leases} WHERE thread_id = %s"), (op.thread_id,), ONE
            )
            if holder is not None:
                return (holder[0], _from_epoch(holder[1]))
        raise CheckpointError(f"Thread '{op.thread_id}': the lease could not be acquired (it kept changing hands).")

    def _renew(self, op: ops.RenewLease) -> Script:
        query = self._q("UPDATE {leases} SET expires_at = %s WHERE thread_id = %s AND owner = %s")
        return (yield Stmt(query, (_epoch(op.expires_at), op.thread_id, op.owner), COUNT, alone=True)) == 1

    def _release(self, op: ops.ReleaseLease) -> Script:
        query = self._q("DELETE FROM {leases} WHERE thread_id = %s AND owner = %s")
        return (yield Stmt(query, (op.thread_id, op.owner), COUNT, alone=True)) == 1

    def _read_lease(self, op: ops.ReadLease) -> Script:
        found = yield Stmt(self._q("SELECT owner, expires_at FROM {leases} WHERE thread_id = %s"), (op.thread_id,), ONE)
        return (found[0], _from_epoch(found[1])) if found is not None else None

    @contextmanager
    def _raw_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """Borrow a connection of the pool inside a transaction (for maintenance and tests); do not keep it."""
        with self._pool.connection() as conn, conn.transaction():
            yield conn


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC)


def _row(found: Any) -> StoredCheckpoint:
    return parse_row(
        found[0], found[1], found[2], found[3], found[4], found[5], found[6], found[7], found[8], tuple(found[9:])
    )
