"""
:class:`PostgresStore`: a store in PostgreSQL (psycopg 3), with full-text search on a ``tsvector`` column (the
``english`` configuration, ranked by ``ts_rank``) and a GIN index.

Each operation is written once, as a *script*: a generator that yields SQL statements and receives their rows, so the
sync methods (on a ``ConnectionPool``) and the async ones (on an ``AsyncConnectionPool`` of the caller's event loop,
one per loop) run the same SQL. Semantic search keeps embeddings in a plain column and ranks them in Python: it does
not use ``pgvector``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool
except ImportError as _error:  # pragma: no cover - depends on the installed extras
    raise ImportError('PostgresStore needs the postgres extra: pip install "haystack-state[postgres]"') from _error

from haystack.utils import Secret

from haystack_state._db.migrations import check_postgres_version, migrate_postgres
from haystack_state._db.postgres import (
    ALL,
    COUNT,
    ONE,
    Templates,
    afetched,
    conninfo_parameter,
    fetched,
    open_pool,
    read_only_conninfo,
    secret_conninfo,
)
from haystack_state._driver import run_flow, run_flow_async
from haystack_state.errors import StoreError
from haystack_state.store import ops
from haystack_state.store._search import Condition
from haystack_state.store._sql import COLUMNS, SearchSQL, prefix_sql, search_query
from haystack_state.store.base import Store
from haystack_state.store.records import Row

__all__ = ["MIGRATIONS", "PostgresStore"]

#: Append-only: the schema version is the number of migrations applied. Never edit or reorder an entry.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE {items} (
            namespace text COLLATE "C" NOT NULL,
            key text NOT NULL,
            value text NOT NULL,
            doc jsonb,
            tsv tsvector NOT NULL,
            vector text,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            ttl double precision,
            expires_at double precision,
            PRIMARY KEY (namespace, key)
        )""",
        "CREATE INDEX ON {items} USING gin (tsv)",
        "CREATE INDEX ON {items} (updated_at)",
        "CREATE INDEX ON {items} (expires_at) WHERE expires_at IS NOT NULL",
    ),
]

_VISIBLE = "(s.expires_at IS NULL OR s.expires_at > %(now)s)"
_ITEM = "s.namespace = %(ns)s AND s.key = %(key)s"
_SIGNS = {"$eq": "=", "$ne": "=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
#: A store script yields ``(template, params, fetch)`` (see :func:`~haystack_state._db.postgres.fetched`).
Script = Generator[tuple[str, dict[str, Any], str], Any, Any]


def _on_item(op: ops.Get | ops.Delete, template: str) -> tuple[str, dict[str, Any], str]:
    """A script's statement on the item ``op`` names (``_ITEM`` in ``template`` tests it), fetching one row."""
    return template, {"ns": op.namespace, "key": op.key, "now": op.now}, ONE


def _mark(name: str) -> str:
    return f"%({name})s"


def _condition_sql(index: int, condition: Condition, params: dict[str, Any]) -> str:
    """The SQL of one pushable condition on the row's ``doc`` (its JSON value)."""
    name = f"c{index}"
    params[f"{name}f"] = condition.field
    field, kind = f"s.doc -> %({name}f)s", f"jsonb_typeof(s.doc -> %({name}f)s)"
    operand = condition.operand
    if operand is None:
        equal = f"{kind} = 'null'"
    elif isinstance(operand, bool):
        equal = f"({kind} = 'boolean' AND {field} = '{'true' if operand else 'false'}'::jsonb)"
    elif isinstance(operand, str):
        params[name] = operand
        sign = _SIGNS[condition.op]
        equal = f"({kind} = 'string' AND (s.doc ->> %({name}f)s) COLLATE \"C\" {sign} %({name})s)"
    else:
        params[name] = json.dumps(operand)
        sign = _SIGNS[condition.op]
        equal = f"({kind} = 'number' AND (s.doc ->> %({name}f)s)::numeric {sign} %({name})s::numeric)"
    return f"NOT COALESCE({equal}, false)" if condition.op == "$ne" else f"COALESCE({equal}, false)"


def _ranked(terms: Sequence[str], params: dict[str, Any]) -> tuple[str, str, str, str]:
    """A full-text query on ``tsv``, ranked by ``ts_rank`` (the statement's 7th column)."""
    params["query"] = " | ".join(terms)
    source = "{items} AS s, to_tsquery('english', %(query)s) AS q(query)"
    return "ts_rank(s.tsv, q.query)::float8", source, "s.tsv @@ q.query", "7 DESC"


#: A search's statement on PostgreSQL (the items' table is named when the statement runs).
_SEARCH = SearchSQL(_mark, _condition_sql, "{items}", "s.doc IS NULL", "ALL", "NULL::float8", _ranked)


@contextlib.contextmanager
def _alone() -> Iterator[None]:
    """No transaction block: the operation is one statement, a transaction of its own (one round trip)."""
    yield


@contextlib.asynccontextmanager
async def _aalone() -> AsyncIterator[None]:
    yield


class PostgresStore(Store):
    """
    A store backed by PostgreSQL. Creates or migrates its table on construction.

    :param conninfo: A libpq connection string or URL (``"postgresql://user@host/db"``), or a ``Secret`` holding one.
    :param schema: The schema holding the table (created if missing); it may be a checkpointer's.
    :param max_connections: The size of each pool the store opens (one for sync calls, one per event loop).
    :param read_only: Read an existing store only: nothing is created or migrated, and the store's sessions are
        read-only (``default_transaction_read_only``). The schema must hold this version's store table.
    :param kwargs: The settings of :class:`~haystack_state.store.base.Store` (``index``, ``embedder``,
        ``default_ttl``).
    """

    def __init__(
        self,
        conninfo: str | Secret,
        *,
        schema: str = "public",
        max_connections: int = 4,
        read_only: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._conninfo = conninfo
        self._schema = schema
        self._max_connections = max_connections
        self._read_only = read_only
        dsn = conninfo.resolve_value() if isinstance(conninfo, Secret) else conninfo
        if not isinstance(dsn, str):
            raise ValueError("PostgresStore: conninfo must be a connection string or a Secret holding one.")
        self._dsn: str = read_only_conninfo(dsn) if read_only else dsn
        self._templates = Templates(
            schema, {"items": "haystack_state_store", "migrations": "haystack_state_store_migrations"}
        )
        self._lock = threading.Lock()
        self._apools: dict[int, tuple[weakref.ref[asyncio.AbstractEventLoop], AsyncConnectionPool[Any]]] = {}
        self._scripts: dict[type, Callable[[Any], Script]] = {
            ops.Put: self._put,
            ops.Get: self._get,
            ops.Delete: self._delete,
            ops.Search: self._search,
            ops.Touch: self._touch,
            ops.Namespaces: self._namespaces,
            ops.Purge: self._purge,
        }
        try:
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                if read_only:
                    self._check_version(conn)
                else:
                    self._migrate(conn)
        except psycopg.Error as error:
            raise StoreError(f"PostgresStore: cannot open the store in schema '{schema}': {error}") from error
        self._pool = open_pool(self._dsn, max_connections)

    # --- settings -----------------------------------------------------------------------------------------------

    def init_parameters(self) -> dict[str, Any]:
        """
        The connection settings, without secrets: a ``Secret`` conninfo is stored as its reference, a string only if
        it holds no password.

        :raises SerializationError: For a conninfo string with a password.
        """
        params: dict[str, Any] = {"schema": self._schema, "max_connections": self._max_connections}
        if self._read_only:
            params["read_only"] = True
        params["conninfo"] = conninfo_parameter(self._conninfo, "PostgresStore")
        return {**params, **self._common_parameters()}

    @classmethod
    def from_init_parameters(cls, params: dict[str, Any]) -> PostgresStore:
        """Rebuild a store from :meth:`init_parameters` output."""
        return cls(**secret_conninfo(params))

    # --- running scripts ----------------------------------------------------------------------------------------

    def _q(self, template: str) -> sql.Composed:
        return self._templates(template)

    def _execute(self, op: ops.Op) -> object:
        script = self._scripts[type(op)](op)
        with self._pool.connection() as conn, conn.transaction() if isinstance(op, ops.Touch) else _alone():
            return run_flow(script, lambda stmt: fetched(conn.execute(self._q(stmt[0]), stmt[1]), stmt[2]))

    async def _aexecute(self, op: ops.Op) -> object:
        script = self._scripts[type(op)](op)
        pool = await self._async_pool()
        async with pool.connection() as conn, conn.transaction() if isinstance(op, ops.Touch) else _aalone():

            async def step(stmt: tuple[str, dict[str, object], str]) -> object:
                return await afetched(await conn.execute(self._q(stmt[0]), stmt[1]), stmt[2])

            return await run_flow_async(script, step)

    async def _async_pool(self) -> AsyncConnectionPool[Any]:
        loop = asyncio.get_running_loop()
        with self._lock:
            for key, (ref, _) in list(self._apools.items()):
                gone = ref()
                if gone is None or gone.is_closed():
                    del self._apools[key]  # its loop has closed: its connections went with it
            found = self._apools.get(id(loop))
            if found is None or found[0]() is not loop:
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self._dsn, min_size=1, max_size=self._max_connections, open=False, kwargs={"autocommit": True}
                )
                self._apools[id(loop)] = (weakref.ref(loop), pool)
            else:
                pool = found[1]
        await pool.open()
        return pool

    async def _aclose(self) -> None:
        with self._lock:
            found = self._apools.pop(id(asyncio.get_running_loop()), None)
        if found is not None:
            await found[1].close()

    def _close(self) -> None:
        with self._lock:
            pools, self._apools = list(self._apools.values()), {}
        for ref, pool in pools:
            loop = ref()
            if loop is not None and loop.is_running() and not loop.is_closed():
                # the loop may be this thread's, or stop meanwhile: its pool then goes with it
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(pool.close(), loop).result(timeout=10)
        self._pool.close()

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """Apply the pending migrations (see :func:`haystack_state._db.migrations.migrate_postgres`)."""
        schema = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema))
        migrate_postgres(conn, f"haystack_state_store:{self._schema}", schema, self._q, MIGRATIONS, self._newer_schema)

    def _check_version(self, conn: psycopg.Connection[Any]) -> None:
        """For a read-only store: the schema must hold this version's table (it cannot be migrated)."""
        check_postgres_version(
            conn,
            self._q,
            MIGRATIONS,
            StoreError,
            schema=self._schema,
            table="haystack_state_store_migrations",
            owner="PostgresStore",
            holds="no store (it has no haystack_state_store table)",
        )

    def _newer_schema(self, current: int, supported: int) -> StoreError:
        return StoreError(
            f"The store's schema '{self._schema}' is at version {current}, newer than this haystack-state "
            f"supports ({supported}); upgrade haystack-state."
        )

    @contextmanager
    def _raw_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """Borrow a connection of the pool inside a transaction (for maintenance and tests); do not keep it."""
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    # --- scripts ------------------------------------------------------------------------------------------------

    @staticmethod
    def _put(op: ops.Put) -> Script:
        params = {
            "ns": op.namespace,
            "key": op.key,
            "value": op.value,
            "doc": op.value if op.plain else None,
            "text": op.text,
            "vector": op.vector,
            "now": op.now,
            "ttl": op.ttl,
            "expires": op.now + op.ttl if op.ttl is not None else None,
        }
        yield (
            "INSERT INTO {items} AS s (namespace, key, value, doc, tsv, vector, created_at, updated_at, ttl, "
            "expires_at) VALUES (%(ns)s, %(key)s, %(value)s, %(doc)s::jsonb, to_tsvector('english', %(text)s), "
            "%(vector)s, %(now)s, %(now)s, %(ttl)s, %(expires)s) ON CONFLICT (namespace, key) DO UPDATE SET "
            "value = excluded.value, doc = excluded.doc, tsv = excluded.tsv, vector = excluded.vector, "
            "updated_at = excluded.updated_at, ttl = excluded.ttl, expires_at = excluded.expires_at, "
            f"created_at = CASE WHEN {_VISIBLE} THEN s.created_at ELSE excluded.created_at END",
            params,
            COUNT,
        )

    @staticmethod
    def _get(op: ops.Get) -> Script:
        found = yield _on_item(op, f"SELECT {COLUMNS} FROM {{items}} AS s WHERE {_ITEM} AND {_VISIBLE}")
        return Row(*found) if found is not None else None

    @staticmethod
    def _delete(op: ops.Delete) -> Script:
        found = yield _on_item(op, f"DELETE FROM {{items}} AS s WHERE {_ITEM} RETURNING {_VISIBLE}")
        return found is not None and bool(found[0])

    @staticmethod
    def _touch(op: ops.Touch) -> Script:
        for namespace, key in op.items:
            yield (
                f"UPDATE {{items}} AS s SET expires_at = %(now)s + s.ttl "
                f"WHERE {_ITEM} AND s.ttl IS NOT NULL AND {_VISIBLE}",
                {"ns": namespace, "key": key, "now": op.now},
                COUNT,
            )

    @staticmethod
    def _namespaces(op: ops.Namespaces) -> Script:
        params: dict[str, Any] = {"now": op.now}
        where = prefix_sql(op.prefix, params, _mark)
        rows = yield (
            f"SELECT DISTINCT s.namespace FROM {{items}} AS s WHERE {where} AND {_VISIBLE} ORDER BY 1",
            params,
            ALL,
        )
        return [found[0] for found in rows]

    @staticmethod
    def _purge(op: ops.Purge) -> Script:
        count = yield (
            "DELETE FROM {items} WHERE expires_at IS NOT NULL AND expires_at <= %(now)s",
            {"now": op.now},
            COUNT,
        )
        return int(count)

    @staticmethod
    def _search(op: ops.Search) -> Script:
        rows = yield (*search_query(op, _SEARCH), ALL)
        return [Row(*found) for found in rows]
