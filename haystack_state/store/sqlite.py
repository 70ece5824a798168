"""
:class:`SQLiteStore`: a store in a SQLite file (stdlib ``sqlite3``, WAL mode), with full-text search by FTS5.

Items are rows of one table; their searchable text is in an FTS5 table (the ``porter unicode61`` tokenizer, so
"likes" finds "like"), ranked by BM25. The tables can share a file with a
:class:`~haystack_state.persistence.SQLiteCheckpointer` (their names differ, their migrations are counted apart).
Writes run in ``BEGIN IMMEDIATE`` transactions; connections are pooled, one per operation; the async methods run the
same operations on a small thread pool, so they never block the event loop (as the checkpointer does).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from haystack_state._db.migrations import SQLiteSchema
from haystack_state._db.sqlite import SQLitePool, transaction
from haystack_state.errors import StoreError
from haystack_state.store import ops
from haystack_state.store._search import Condition
from haystack_state.store._sql import COLUMNS, SearchSQL, prefix_sql, search_query
from haystack_state.store.base import Store
from haystack_state.store.records import Row

__all__ = ["MIGRATIONS", "SQLiteStore"]

ITEMS = "haystack_state_store"
FTS = "haystack_state_store_fts"
MIGRATIONS_TABLE = "haystack_state_store_migrations"

#: Append-only: the schema version is the number of migrations applied. Never edit or reorder an entry.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        f"""CREATE TABLE {ITEMS} (
            id INTEGER PRIMARY KEY,
            namespace TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            plain INTEGER NOT NULL,
            vector TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            ttl REAL,
            expires_at REAL,
            UNIQUE (namespace, key)
        )""",
        f"CREATE INDEX {ITEMS}_updated ON {ITEMS} (updated_at)",
        f"CREATE INDEX {ITEMS}_expires ON {ITEMS} (expires_at) WHERE expires_at IS NOT NULL",
        f"CREATE VIRTUAL TABLE {FTS} USING fts5(text, tokenize = 'porter unicode61 remove_diacritics 2')",
    ),
]

_VISIBLE = "(s.expires_at IS NULL OR s.expires_at > :now)"
_TYPES = {"str": "= 'text'", "number": "IN ('integer', 'real')", "true": "= 'true'", "false": "= 'false'"}


def _mark(name: str) -> str:
    return f":{name}"


def _condition_sql(index: int, condition: Condition, params: dict[str, Any]) -> str:
    """The SQL of one pushable condition on the row's JSON value."""
    path, name = f'$."{condition.field}"', f"c{index}"
    params[f"{name}p"] = path
    kind = f"json_type(s.value, :{name}p)"
    operand = condition.operand
    if operand is None:
        equal = f"{kind} = 'null'"
    elif isinstance(operand, bool):
        equal = f"{kind} {_TYPES['true' if operand else 'false']}"
    else:
        params[name] = operand
        test = _TYPES["str" if isinstance(operand, str) else "number"]
        sign = {"$eq": "=", "$ne": "=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[condition.op]
        equal = f"({kind} {test} AND json_extract(s.value, :{name}p) {sign} :{name})"
    return f"NOT COALESCE({equal}, 0)" if condition.op == "$ne" else f"COALESCE({equal}, 0)"


def _ranked(terms: Sequence[str], params: dict[str, Any]) -> tuple[str, str, str, str]:
    """A full-text query of the FTS5 table, each term quoted, ranked by ``bm25`` (lower is better)."""
    params["match"] = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
    return f"-bm25({FTS})", f"{FTS} JOIN {ITEMS} AS s ON s.id = {FTS}.rowid", f"{FTS} MATCH :match", f"bm25({FTS})"


#: A search's statement on SQLite.
_SEARCH = SearchSQL(_mark, _condition_sql, ITEMS, "s.plain = 0", "-1", "NULL", _ranked)


class SQLiteStore(Store):
    """
    A store backed by a SQLite file. Creates or migrates its tables on construction.

    :param path: The database file (created if missing; it may be a checkpointer's), or ``":memory:"``.
    :param timeout: How long a writer waits for another process's lock, in seconds.
    :param read_only: Open an existing file read-only (nothing is created or migrated; writes fail; see
        :func:`~haystack_state._db.sqlite.connect_read_only`). It must hold this version's store tables.
    :param kwargs: The settings of :class:`~haystack_state.store.base.Store` (``index``, ``embedder``,
        ``default_ttl``).
    """

    def __init__(self, path: str | Path, *, timeout: float = 30.0, read_only: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._path = str(path)
        self._timeout = timeout
        self._read_only = read_only
        self._connections = SQLitePool(self._path, timeout=timeout, read_only=read_only, threads="haystack-state-store")
        SCHEMA.open(self._connections, read_only=read_only)

    def init_parameters(self) -> dict[str, Any]:
        """The file's path and the settings: what rebuilds this store on the same database."""
        params: dict[str, Any] = {"path": self._path, "timeout": self._timeout}
        if self._read_only:
            params["read_only"] = True
        return {**params, **self._common_parameters()}

    # --- connections --------------------------------------------------------------------------------------------

    def _connection(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._connections.connection()

    def _execute(self, op: ops.Op) -> object:
        if isinstance(op, ops.WRITES):
            with self._connections.connection(write=True) as conn, transaction(conn, "BEGIN IMMEDIATE", inline=False):
                return self._write(conn, op)
        with self._connection() as conn:
            if isinstance(op, ops.Get):
                found = conn.execute(
                    f"SELECT {COLUMNS} FROM {ITEMS} AS s WHERE s.namespace = :ns AND s.key = :key AND {_VISIBLE}",
                    {"ns": op.namespace, "key": op.key, "now": op.now},
                ).fetchone()
                return Row(*found) if found is not None else None
            if isinstance(op, ops.Search):
                return self._search(conn, op)
            assert isinstance(op, ops.Namespaces)
            params: dict[str, Any] = {"now": op.now}
            where = prefix_sql(op.prefix, params, _mark)
            query = f"SELECT DISTINCT s.namespace FROM {ITEMS} AS s WHERE {where} AND {_VISIBLE} ORDER BY 1"
            return [found[0] for found in conn.execute(query, params)]

    async def _aexecute(self, op: ops.Op) -> object:
        return await self._connections.in_thread(self._execute, op)

    def _close(self) -> None:
        self._connections.close()

    # --- operations ---------------------------------------------------------------------------------------------

    def _write(self, conn: sqlite3.Connection, op: ops.Op) -> object:
        if isinstance(op, ops.Put):
            (row_id,) = conn.execute(
                f"INSERT INTO {ITEMS} AS s (namespace, key, value, plain, vector, created_at, updated_at, ttl, "
                "expires_at) VALUES (:ns, :key, :value, :plain, :vector, :now, :now, :ttl, :expires) "
                "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, plain = excluded.plain, "
                "vector = excluded.vector, updated_at = excluded.updated_at, ttl = excluded.ttl, "
                f"expires_at = excluded.expires_at, created_at = CASE WHEN {_VISIBLE} THEN s.created_at "
                "ELSE excluded.created_at END RETURNING id",
                {
                    "ns": op.namespace,
                    "key": op.key,
                    "value": op.value,
                    "plain": int(op.plain),
                    "vector": op.vector,
                    "now": op.now,
                    "ttl": op.ttl,
                    "expires": op.now + op.ttl if op.ttl is not None else None,
                },
            ).fetchone()
            conn.execute(f"DELETE FROM {FTS} WHERE rowid = ?", (row_id,))
            if op.text:
                conn.execute(f"INSERT INTO {FTS} (rowid, text) VALUES (?, ?)", (row_id, op.text))
            return None
        if isinstance(op, ops.Delete):
            found = conn.execute(
                f"SELECT s.id, {_VISIBLE} FROM {ITEMS} AS s WHERE s.namespace = :ns AND s.key = :key",
                {"ns": op.namespace, "key": op.key, "now": op.now},
            ).fetchone()
            if found is None:
                return False
            conn.execute(f"DELETE FROM {FTS} WHERE rowid = ?", (found[0],))
            conn.execute(f"DELETE FROM {ITEMS} WHERE id = ?", (found[0],))
            return bool(found[1])
        if isinstance(op, ops.Touch):
            conn.executemany(
                f"UPDATE {ITEMS} AS s SET expires_at = :now + ttl WHERE namespace = :ns AND key = :key "
                f"AND ttl IS NOT NULL AND {_VISIBLE}",
                [{"ns": ns, "key": key, "now": op.now} for ns, key in op.items],
            )
            return None
        assert isinstance(op, ops.Purge)
        expired = f"SELECT id FROM {ITEMS} WHERE expires_at IS NOT NULL AND expires_at <= :now"
        conn.execute(f"DELETE FROM {FTS} WHERE rowid IN ({expired})", {"now": op.now})
        return conn.execute(
            f"DELETE FROM {ITEMS} WHERE expires_at IS NOT NULL AND expires_at <= :now", {"now": op.now}
        ).rowcount

    def _search(self, conn: sqlite3.Connection, op: ops.Search) -> list[Row]:
        return [Row(*found) for found in conn.execute(*search_query(op, _SEARCH))]

    @contextmanager
    def _raw_connection(self) -> Iterator[sqlite3.Connection]:
        """Borrow a connection of the pool (for maintenance and tests); do not keep it."""
        with self._connection() as conn:
            yield conn


#: The store's tables on SQLite: their migrations and the errors of a file it cannot use.
SCHEMA = SQLiteSchema(
    "SQLiteStore",
    MIGRATIONS_TABLE,
    MIGRATIONS,
    StoreError,
    subject="store schema",
    newer_subject="The store's schema",
    missing=f"SQLiteStore: '{{path}}' holds no store (it has no {ITEMS} table); a read-only open creates none.",
)
