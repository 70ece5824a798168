"""
:class:`PostgresCheckpointer`: checkpoints in PostgreSQL (psycopg 3, with a connection pool).

Each checkpoint is one row holding its delta; a ``threads`` row holds the head. A commit locks the thread's row
(``SELECT ... FOR UPDATE``), so two writers of the same thread are serialized and the second sees the first's head
(and gets a :class:`~haystack_state.errors.ThreadConflictError`); creating a thread relies on the primary key of
the ``threads`` table instead. Writers of different threads lock different rows and never wait for each other.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
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
from haystack_state.persistence.base import Checkpointer, check_commit, conflict_error
from haystack_state.persistence.records import ChainLink, StoredCheckpoint, ThreadInfo

#: Append-only: the schema version is the number of migrations applied. Never edit or reorder an entry.
#: ``{threads}`` and ``{checkpoints}`` are replaced by the schema-qualified table names.
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
]

_META = "thread_id, checkpoint_id, parent_id, step, source, tool_names, created_at, changed_keys, metadata"


class PostgresCheckpointer(Checkpointer):
    """
    A checkpointer backed by PostgreSQL. Creates or migrates its tables on construction.

    :param conninfo: A libpq connection string or URL (``"postgresql://user@host/db"``). None uses the libpq
        defaults and ``PG*`` environment variables. The checkpointer opens (and closes) its own pool.
    :param pool: A ``psycopg_pool.ConnectionPool`` to borrow connections from instead; it is not closed by
        :meth:`close`.
    :param schema: The schema holding the tables (created if missing).
    :param max_connections: The size of the pool the checkpointer opens when given a ``conninfo``.
    :param cache_size: How many threads' head states to keep materialized (0 disables the cache).
    """

    def __init__(
        self,
        conninfo: str | Secret | None = None,
        *,
        pool: ConnectionPool[Any] | None = None,
        schema: str = "public",
        max_connections: int = 4,
        cache_size: int = 64,
    ) -> None:
        super().__init__(cache_size=cache_size)
        if conninfo is not None and pool is not None:
            raise ValueError("Pass either conninfo or pool, not both.")
        self._schema = schema
        self._threads = sql.Identifier(schema, "haystack_state_threads")
        self._checkpoints = sql.Identifier(schema, "haystack_state_checkpoints")
        self._migrations = sql.Identifier(schema, "haystack_state_migrations")
        self._owns_pool = pool is None
        self._conninfo = conninfo
        self._max_connections = max_connections
        dsn = conninfo.resolve_value() if isinstance(conninfo, Secret) else conninfo
        if pool is None:
            # Connect once directly first: a wrong conninfo fails at once instead of after the pool's timeout.
            with psycopg.connect(dsn or "", autocommit=True) as conn:
                self._migrate(conn)
            pool = ConnectionPool(
                dsn or "", min_size=1, max_size=max_connections, open=True, kwargs={"autocommit": True}
            )
            self._pool = pool
        else:
            self._pool = pool
            with pool.connection() as conn:
                self._migrate(conn)

    # --- connections and SQL ------------------------------------------------------------------------------------

    def _q(self, template: str) -> sql.Composed:
        return sql.SQL(template).format(
            threads=self._threads, checkpoints=self._checkpoints, migrations=self._migrations
        )

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        # Reads need no explicit transaction: each is one statement, or two whose snapshots may differ harmlessly.
        with self._pool.connection() as conn:
            yield conn

    def _close(self) -> None:
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

    # --- storage primitives -------------------------------------------------------------------------------------

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
        return params

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

    def _insert(self, row: StoredCheckpoint, expected_head: str | None) -> None:
        with self._transaction() as conn:
            found = conn.execute(
                self._q("SELECT head_id, last_seq FROM {threads} WHERE thread_id = %s FOR UPDATE"), (row.thread_id,)
            ).fetchone()
            head, last_seq = (found[0], int(found[1])) if found is not None else (None, 0)

            def parent_exists() -> bool:
                query = self._q("SELECT 1 FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = %s")
                return conn.execute(query, (row.thread_id, row.parent_id)).fetchone() is not None

            check_commit(row, expected_head, head, parent_exists)
            if found is None:
                # A new thread: the primary key decides between concurrent creators (the loser inserts nothing).
                created = conn.execute(
                    self._q(
                        "INSERT INTO {threads} (thread_id, head_id, last_seq, created_at, updated_at) "
                        "VALUES (%s, %s, 1, %s, %s) ON CONFLICT (thread_id) DO NOTHING"
                    ),
                    (row.thread_id, row.checkpoint_id, row.created_at, row.created_at),
                )
                if created.rowcount != 1:
                    raise conflict_error(row.thread_id, expected_head, self._read_head_in(conn, row.thread_id))
            else:
                conn.execute(
                    self._q("UPDATE {threads} SET head_id = %s, last_seq = %s, updated_at = %s WHERE thread_id = %s"),
                    (row.checkpoint_id, last_seq + 1, row.created_at, row.thread_id),
                )
            conn.execute(
                self._q(
                    "INSERT INTO {checkpoints} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, "
                    "changed_keys, created_at, metadata, delta) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                ),
                (
                    row.thread_id,
                    row.checkpoint_id,
                    last_seq + 1,
                    row.parent_id,
                    row.step,
                    row.source,
                    list(row.tool_names),
                    list(row.changed_keys),
                    row.created_at,
                    row.metadata,
                    row.delta,
                ),
            )

    def _read_head_in(self, conn: psycopg.Connection[Any], thread_id: str) -> str | None:
        found = conn.execute(self._q("SELECT head_id FROM {threads} WHERE thread_id = %s"), (thread_id,)).fetchone()
        return str(found[0]) if found is not None else None

    def _read_head(self, thread_id: str) -> str | None:
        with self._connection() as conn:
            return self._read_head_in(conn, thread_id)

    def _read_meta(self, thread_id: str, checkpoint_id: str | None) -> StoredCheckpoint:
        with self._connection() as conn:
            head = self._read_head_in(conn, thread_id)
            if head is None:
                raise ThreadNotFoundError(thread_id)
            target = head if checkpoint_id is None else checkpoint_id
            found = conn.execute(
                self._q(f"SELECT {_META} FROM {{checkpoints}} WHERE thread_id = %s AND checkpoint_id = %s"),
                (thread_id, target),
            ).fetchone()
        if found is None:
            raise CheckpointNotFoundError(thread_id, target)
        return _row(found)

    def _read_chain(self, thread_id: str, checkpoint_id: str, stop_at: str | None) -> list[ChainLink]:
        # Each step of the walk is one primary-key lookup (LATERAL ... LIMIT 1 keeps the planner from hash-joining
        # the whole thread at every step); the depth bound stops a walk through corrupt, cyclic parent links. Only
        # what materializing needs is selected.
        query = self._q(
            "WITH RECURSIVE chain AS ("
            " SELECT checkpoint_id, parent_id, delta, 1 AS depth FROM {checkpoints}"
            " WHERE thread_id = %(thread)s AND checkpoint_id = %(checkpoint)s"
            " UNION ALL"
            " SELECT p.*, chain.depth + 1 FROM chain CROSS JOIN LATERAL ("
            " SELECT checkpoint_id, parent_id, delta FROM {checkpoints} AS c"
            " WHERE c.thread_id = %(thread)s AND c.checkpoint_id = chain.parent_id LIMIT 1) AS p"
            " WHERE chain.parent_id IS DISTINCT FROM %(stop)s::text"
            " AND chain.depth <= (SELECT last_seq FROM {threads} WHERE thread_id = %(thread)s)"
            ") SELECT checkpoint_id, parent_id, delta FROM chain ORDER BY depth DESC"
        )
        with self._connection() as conn:
            rows = conn.execute(query, {"thread": thread_id, "checkpoint": checkpoint_id, "stop": stop_at}).fetchall()
        return [ChainLink(found[0], found[1], found[2]) for found in rows]

    def _read_history(self, thread_id: str) -> list[StoredCheckpoint]:
        with self._connection() as conn:
            rows = conn.execute(
                self._q(f"SELECT {_META} FROM {{checkpoints}} WHERE thread_id = %s ORDER BY seq DESC"), (thread_id,)
            ).fetchall()
        return [_row(found) for found in rows]

    def _read_threads(self) -> list[ThreadInfo]:
        with self._connection() as conn:
            rows = conn.execute(
                self._q(
                    "SELECT thread_id, head_id, last_seq, created_at, updated_at FROM {threads} "
                    "ORDER BY updated_at DESC, thread_id"
                )
            ).fetchall()
        return [ThreadInfo(r[0], r[1], int(r[2]), _utc(r[3]), _utc(r[4])) for r in rows]

    def _delete(self, thread_id: str) -> bool:
        with self._transaction() as conn:
            deleted = conn.execute(self._q("DELETE FROM {threads} WHERE thread_id = %s"), (thread_id,)).rowcount
            conn.execute(self._q("DELETE FROM {checkpoints} WHERE thread_id = %s"), (thread_id,))
        return deleted > 0

    @contextmanager
    def _raw_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """Borrow a connection of the pool inside a transaction (for maintenance and tests); do not keep it."""
        with self._transaction() as conn:
            yield conn


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC)


def _row(found: Any) -> StoredCheckpoint:
    thread_id, checkpoint_id, parent_id, step, source, tool_names, created_at, changed_keys, metadata = found[:9]
    return StoredCheckpoint(
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        step=int(step),
        source=source,
        tool_names=tuple(tool_names),
        created_at=_utc(created_at),
        changed_keys=tuple(changed_keys),
        metadata=metadata,
        delta=found[9] if len(found) > 9 else "",
    )
