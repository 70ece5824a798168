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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Unpack

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

from haystack_state._db.migrations import check_postgres_version, migrate_postgres
from haystack_state._db.postgres import (
    Attempt,
    EventLoopConnections,
    LoopConnections,
    Templates,
    arun_script,
    conninfo_parameter,
    open_pool,
    read_only_conninfo,
    run_script,
    secret_conninfo,
)
from haystack_state.errors import CheckpointError
from haystack_state.persistence import ops
from haystack_state.persistence._grouping import Failed, GroupCommit
from haystack_state.persistence._postgres_scripts import PostgresScripts
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointerSettings

__all__ = ["MIGRATIONS", "PostgresCheckpointer", "read_only_conninfo"]

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
    (  # a stop asked of the run holding the lease (Agent.cancel, from any process)
        "ALTER TABLE {leases} ADD COLUMN stop_requested boolean NOT NULL DEFAULT false",
    ),
]


class _LoopConnections(LoopConnections):
    """An event loop's connections (:class:`~haystack_state._db.postgres.LoopConnections`) and its group commits."""

    def __init__(self, dsn: str, size: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(dsn, size, loop)
        self.appends: GroupCommit[ops.Insert] = GroupCommit()
        self.releases: GroupCommit[ops.ReleaseLease] = GroupCommit()


class PostgresCheckpointer(PostgresScripts, Checkpointer):
    """
    A checkpointer backed by PostgreSQL. Creates or migrates its tables on construction.

    :param conninfo: A libpq connection string or URL (``"postgresql://user@host/db"``). None uses the libpq
        defaults and ``PG*`` environment variables. The checkpointer opens (and closes) its own pools.
    :param pool: A ``psycopg_pool.ConnectionPool`` to borrow connections from instead; it is not closed by
        :meth:`close` (the async methods open pools of their own on its ``conninfo``).
    :param schema: The schema holding the tables (created if missing).
    :param max_connections: The size of each pool the checkpointer opens.
    :param cache_size: How many threads' head states to keep materialized (0 disables the cache).
    :param read_only: Read existing tables only: nothing is created or migrated, and the sessions the checkpointer
        opens are read-only (``default_transaction_read_only``; a given ``pool``'s connections are used as they
        are). The schema must hold this version's tables.
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
        read_only: bool = False,
        **kwargs: Unpack[CheckpointerSettings],
    ) -> None:
        super().__init__(cache_size=cache_size, **kwargs)
        if conninfo is not None and pool is not None:
            raise ValueError("Pass either conninfo or pool, not both.")
        self._schema = schema
        self._read_only = read_only
        self._templates = Templates(
            schema,
            {
                "threads": "haystack_state_threads",
                "checkpoints": "haystack_state_checkpoints",
                "leases": "haystack_state_leases",
                "migrations": "haystack_state_migrations",
            },
        )
        self._owns_pool = pool is None
        self._conninfo = conninfo
        self._max_connections = max_connections
        self._aconns = EventLoopConnections(lambda loop: _LoopConnections(self._dsn, self._max_connections, loop))
        if pool is None:
            self._dsn = (conninfo.resolve_value() if isinstance(conninfo, Secret) else conninfo) or ""
            if read_only:
                self._dsn = read_only_conninfo(self._dsn)
            # Connect once directly first: a wrong conninfo fails at once instead of after the pool's timeout.
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                self._prepare(conn)
            self._pool = open_pool(self._dsn, max_connections)
        else:
            self._dsn = pool.conninfo
            self._pool = pool
            with pool.connection() as conn:
                self._prepare(conn)

    # --- connections and scripts --------------------------------------------------------------------------------

    def _q(self, template: str) -> sql.Composed:
        return self._templates(template)

    def _execute(self, op: ops.Op) -> object:
        for attempt in (1, 2):
            state = Attempt()
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

    async def _aexecute(self, op: ops.Op) -> object:
        connections = self._async_connections()
        if isinstance(op, ops.Insert) and self.appends(op):
            return await connections.appends.submit(op, lambda batch: self._append_batch(connections, batch))
        if isinstance(op, ops.ReleaseLease):
            return await connections.releases.submit(op, lambda batch: self._release_batch(connections, batch))
        return await self._aexecute_alone(connections, op)

    async def _append_batch(self, connections: _LoopConnections, batch: list[ops.Insert]) -> list[Any]:
        """
        Apply the usual commits of several runs in one statement (one round trip, one WAL flush: a group commit).
        Each gets None once applied, or is run on its own (a commit that did not apply, say a stale head, runs the
        full script, which reports why; after a failure of the batch, each is looked up and run again if missing).
        """
        conn = await connections.get()
        state = Attempt()
        state.conn = conn
        applied: set[tuple[str, str]] = set()
        failed: BaseException | None = None
        try:
            query, params = self.batch_statement(batch)
            state.committing = True  # applied as soon as it runs: its outcome is unknown if the link dies
            applied = {(row[0], row[1]) for row in await (await conn.execute(query, params)).fetchall()}
        except psycopg.Error as error:
            failed = error
        except BaseException:
            conn.pgconn.finish()  # cancelled mid-batch: the statement may be running on it, so it is not reused
            raise
        finally:
            connections.put(conn)
        results: list[Any] = []
        for op in batch:
            if (op.row.thread_id, op.row.checkpoint_id) in applied:
                results.append(None)
                continue
            try:
                if failed is not None and state.dead() and await asyncio.to_thread(self._applied, op):
                    results.append(None)
                    continue
                results.append(await self._aexecute_alone(connections, op))
            except BaseException as error:  # handed to the commit it belongs to
                results.append(Failed(error))
        return results

    async def _release_batch(self, connections: _LoopConnections, batch: list[ops.ReleaseLease]) -> list[Any]:
        """
        Release the leases of several runs in one statement (one round trip). Each gets whether it held its lease;
        after a failure, each is run on its own (a release is idempotent).
        """
        conn = await connections.get()
        try:
            rows = await (await conn.execute(*self.release_statement(batch))).fetchall()
        except psycopg.Error:
            rows = None
        except BaseException:
            conn.pgconn.finish()  # cancelled mid-statement: not reused
            raise
        finally:
            connections.put(conn)
        if rows is not None:
            released = {(row[0], row[1]) for row in rows}
            held: list[Any] = []
            for op in batch:  # the same lease twice: the first release had it, as one after the other would
                held.append((op.thread_id, op.owner) in released)
                released.discard((op.thread_id, op.owner))
            return held
        results: list[Any] = []
        for op in batch:
            try:
                results.append(await self._aexecute_alone(connections, op))
            except BaseException as error:  # handed to the release it belongs to
                results.append(Failed(error))
        return results

    async def _aexecute_alone(self, connections: _LoopConnections, op: ops.Op) -> object:
        for attempt in (1, 2):
            state = Attempt()
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
        return self._aconns.of_running_loop()

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

    def _run(self, conn: psycopg.Connection[Any], op: ops.Op, state: Attempt) -> object:
        return run_script(conn, self._handlers[type(op)](op), write=isinstance(op, ops.WRITES), state=state)

    async def _arun(self, conn: psycopg.AsyncConnection[Any], op: ops.Op, state: Attempt) -> object:
        return await arun_script(conn, self._handlers[type(op)](op), write=isinstance(op, ops.WRITES), state=state)

    async def _aclose(self) -> None:
        await self._aconns.aclose_running_loop()

    def _close(self) -> None:
        self._aconns.finish()
        if self._owns_pool:
            self._pool.close()

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Migrate the tables; for a read-only checkpointer, check that they are at this version instead."""
        if not self._read_only:
            self._migrate(conn)
            return
        check_postgres_version(
            conn,
            self._q,
            MIGRATIONS,
            CheckpointError,
            schema=self._schema,
            table="haystack_state_migrations",
            owner="PostgresCheckpointer",
            holds="no haystack-state checkpoints (it has no haystack_state_threads table)",
        )

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Apply the pending migrations (see :func:`haystack_state._db.migrations.migrate_postgres`)."""
        schema = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema))
        migrate_postgres(conn, f"haystack_state:{self._schema}", schema, self._q, MIGRATIONS, self._newer_schema)

    def _newer_schema(self, current: int, supported: int) -> CheckpointError:
        return CheckpointError(
            f"The schema '{self._schema}' is at version {current}, newer than this haystack-state supports "
            f"({supported}); upgrade haystack-state."
        )

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
        if self._read_only:
            params["read_only"] = True
        if self._conninfo is not None:
            params["conninfo"] = conninfo_parameter(self._conninfo, "PostgresCheckpointer")
        return {**params, **self._common_parameters()}

    @classmethod
    def from_init_parameters(cls, params: dict[str, Any]) -> PostgresCheckpointer:
        """
        Rebuild a checkpointer from :meth:`init_parameters` output.

        :param params: The parameters.
        :returns: The checkpointer.
        """
        return cls(**secret_conninfo(params))

    @contextmanager
    def _raw_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """Borrow a connection of the pool inside a transaction (for maintenance and tests); do not keep it."""
        with self._pool.connection() as conn, conn.transaction():
            yield conn
