"""
The checkpointer harnesses (one per backend, on real storage) and the PostgreSQL fixtures, importable as
``persistence.harness`` by every test (``tests/`` is on ``sys.path``); ``tests/conftest.py`` registers the fixtures
for the whole suite.

PostgreSQL tests use the server at ``HAYSTACK_STATE_POSTGRES_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``)
with a fresh schema per test, dropped afterwards. Without a server they are skipped, unless
``HAYSTACK_STATE_REQUIRE_POSTGRES=1`` (as in CI), where they fail.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from haystack_state.persistence import Checkpointer, InMemoryCheckpointer, SQLiteCheckpointer

POSTGRES_DSN = os.environ.get("HAYSTACK_STATE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("HAYSTACK_STATE_REQUIRE_POSTGRES") == "1"
COLUMNS = ("delta", "metadata")


class Harness:
    """Creates checkpointers of one backend on shared storage, and reaches into that storage for the tests."""

    name = "base"
    #: Whether a new checkpointer sees what an earlier one wrote (false for the in-memory backend).
    persistent = True

    def __init__(self) -> None:
        self._opened: list[Checkpointer] = []

    def make(self, **kwargs: Any) -> Checkpointer:
        checkpointer = self._make(**kwargs)
        self._opened.append(checkpointer)
        return checkpointer

    def _make(self, **kwargs: Any) -> Checkpointer:
        raise NotImplementedError

    def close_all(self) -> None:
        for checkpointer in self._opened:
            checkpointer.close()

    def corrupt(self, cp: Checkpointer, thread_id: str, checkpoint_id: str, column: str, text: str) -> None:
        """Overwrite the stored ``delta`` or ``metadata`` text of a checkpoint."""
        raise NotImplementedError

    def row_bytes(self, cp: Checkpointer, thread_id: str, checkpoint_id: str) -> int:
        """The bytes one checkpoint occupies in storage (its row)."""
        raise NotImplementedError

    def storage_bytes(self, cp: Checkpointer) -> int | None:
        """The total size of the storage (database pages), or None if it has no such notion."""
        return None

    def migrations(self, cp: Checkpointer) -> list[int]:
        """The schema versions recorded as applied."""
        return []


class MemoryHarness(Harness):
    name = "memory"
    persistent = False

    def _make(self, **kwargs: Any) -> Checkpointer:
        return InMemoryCheckpointer(**kwargs)

    def _row(self, cp: Checkpointer, thread_id: str, checkpoint_id: str) -> Any:
        assert isinstance(cp, InMemoryCheckpointer)
        return cp._threads[thread_id].rows[checkpoint_id]

    def corrupt(self, cp: Checkpointer, thread_id: str, checkpoint_id: str, column: str, text: str) -> None:
        assert isinstance(cp, InMemoryCheckpointer) and column in COLUMNS
        cp._replace_row(dataclasses.replace(self._row(cp, thread_id, checkpoint_id), **{column: text}))

    def row_bytes(self, cp: Checkpointer, thread_id: str, checkpoint_id: str) -> int:
        row = self._row(cp, thread_id, checkpoint_id)
        return len(row.delta.encode()) + len(row.metadata.encode())


class SQLiteHarness(Harness):
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def _make(self, **kwargs: Any) -> Checkpointer:
        return SQLiteCheckpointer(self.path, **kwargs)

    def _sql(self, cp: Checkpointer, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        assert isinstance(cp, SQLiteCheckpointer)
        with cp._raw_connection() as conn:
            return list(conn.execute(query, params).fetchall())

    def corrupt(self, cp: Checkpointer, thread_id: str, checkpoint_id: str, column: str, text: str) -> None:
        assert column in COLUMNS
        self._sql(
            cp,
            f"UPDATE haystack_state_checkpoints SET {column} = ? WHERE thread_id = ? AND checkpoint_id = ?",
            (text, thread_id, checkpoint_id),
        )

    def row_bytes(self, cp: Checkpointer, thread_id: str, checkpoint_id: str) -> int:
        query = (
            "SELECT length(CAST(delta AS BLOB)) + length(CAST(metadata AS BLOB)) + length(tool_names) "
            "+ length(changed_keys) + length(checkpoint_id) + coalesce(length(parent_id), 0) + length(thread_id) + 40 "
            "FROM haystack_state_checkpoints WHERE thread_id = ? AND checkpoint_id = ?"
        )
        return int(self._sql(cp, query, (thread_id, checkpoint_id))[0][0])

    def storage_bytes(self, cp: Checkpointer) -> int:
        pages = self._sql(cp, "PRAGMA page_count")[0][0]
        page_size = self._sql(cp, "PRAGMA page_size")[0][0]
        return int(pages * page_size)

    def migrations(self, cp: Checkpointer) -> list[int]:
        return [r[0] for r in self._sql(cp, "SELECT version FROM haystack_state_migrations ORDER BY version")]


class PostgresHarness(Harness):
    name = "postgres"

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.schema = schema

    def _make(self, **kwargs: Any) -> Checkpointer:
        from haystack_state.persistence.postgres import PostgresCheckpointer

        return PostgresCheckpointer(self.dsn, schema=self.schema, **kwargs)

    def _sql(self, cp: Checkpointer, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        from psycopg import sql

        from haystack_state.persistence.postgres import PostgresCheckpointer

        assert isinstance(cp, PostgresCheckpointer)
        with cp._raw_connection() as conn:
            cursor = conn.execute(sql.SQL(query).format(schema=sql.Identifier(self.schema)), params)
            return list(cursor.fetchall()) if cursor.description else []

    def corrupt(self, cp: Checkpointer, thread_id: str, checkpoint_id: str, column: str, text: str) -> None:
        assert column in COLUMNS
        self._sql(
            cp,
            f"UPDATE {{schema}}.haystack_state_checkpoints SET {column} = %s "
            "WHERE thread_id = %s AND checkpoint_id = %s",
            (text, thread_id, checkpoint_id),
        )

    def row_bytes(self, cp: Checkpointer, thread_id: str, checkpoint_id: str) -> int:
        query = (
            "SELECT pg_column_size(c.*) FROM {schema}.haystack_state_checkpoints AS c "
            "WHERE thread_id = %s AND checkpoint_id = %s"
        )
        return int(self._sql(cp, query, (thread_id, checkpoint_id))[0][0])

    def storage_bytes(self, cp: Checkpointer) -> int:
        query = (
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c JOIN pg_namespace AS n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'"
        )
        return int(self._sql(cp, query, (self.schema,))[0][0])

    def migrations(self, cp: Checkpointer) -> list[int]:
        return [r[0] for r in self._sql(cp, "SELECT version FROM {schema}.haystack_state_migrations ORDER BY 1")]


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """The DSN of a reachable PostgreSQL server; skips (or fails, if required) when there is none."""
    reason = None
    try:
        import psycopg
    except ImportError:
        reason = 'psycopg is not installed (pip install "haystack-state[postgres]")'
    else:
        try:
            with psycopg.connect(POSTGRES_DSN, connect_timeout=3):
                pass
        except psycopg.Error as error:
            reason = f"no PostgreSQL server answers at {POSTGRES_DSN}: {' '.join(str(error).split())}"
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(f"HAYSTACK_STATE_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(f"{reason} (set HAYSTACK_STATE_POSTGRES_DSN to point at a server)")
    return POSTGRES_DSN


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[str]:
    """A fresh, uniquely named schema, dropped after the test."""
    import psycopg
    from psycopg import sql

    name = f"hs_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def branch(cp: Checkpointer, thread_id: str) -> list[Any]:
    """The checkpoints from the thread's root to its head, oldest first."""
    by_id = {meta.checkpoint_id: meta for meta in cp.history(thread_id)}
    current: str | None = cp.head(thread_id)
    result = []
    while current is not None:
        result.append(by_id[current])
        current = by_id[current].parent_id
    return result[::-1]


def shape(cp: Checkpointer, thread_id: str) -> list[tuple[str, int, tuple[str, ...], tuple[str, ...]]]:
    """What each checkpoint of the thread's branch records: source, step, tools, changed keys."""
    return [(m.source, m.step, m.tool_names, m.changed_keys) for m in branch(cp, thread_id)]
