"""
Applying a backend's append-only list of migrations (the checkpointers' and the stores', on SQLite and PostgreSQL):
the schema version is the number of migrations applied; each pending one runs, in one transaction, and is recorded.
A read-only open applies none: it reads the recorded version (:func:`sqlite_version`, :func:`postgres_version`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from haystack_state._db.sqlite import enter_wal

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from haystack_state._db.sqlite import SQLitePool

__all__ = [
    "SQLiteSchema",
    "check_postgres_version",
    "migrate_postgres",
    "migrate_sqlite",
    "postgres_schemas_with",
    "postgres_version",
    "sqlite_version",
]

#: Builds the error for a database whose schema is newer than this code: ``(current, supported) -> error``.
NewerError = Callable[[int, int], Exception]


def migrate_sqlite(
    conn: sqlite3.Connection, table: str, migrations: Sequence[Sequence[str]], newer: NewerError
) -> None:
    """
    Apply the pending migrations in one transaction; concurrent constructions are serialized by SQLite.

    :param conn: A connection outside any transaction.
    :param table: The table recording the applied versions.
    :param migrations: The statements of each migration, in order.
    :param newer: The error for a schema newer than ``len(migrations)``.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        current = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {table}").fetchone()[0]
        if current > len(migrations):
            raise newer(current, len(migrations))
        for version in range(current + 1, len(migrations) + 1):
            for statement in migrations[version - 1]:
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO {table} (version, applied_at) VALUES (?, ?)",
                (version, dt.datetime.now(dt.UTC).isoformat()),
            )
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def migrate_postgres(
    conn: psycopg.Connection[Any],
    lock: str,
    schema_sql: sql.Composed,
    q: Callable[[str], sql.Composed],
    migrations: Sequence[Sequence[str]],
    newer: NewerError,
) -> None:
    """
    Apply the pending migrations in one transaction, under an advisory lock (so concurrent constructions wait).

    :param conn: A psycopg connection.
    :param lock: The advisory lock's name.
    :param schema_sql: The statement creating the schema if it does not exist.
    :param q: Formats a statement's ``{table}`` names (``{migrations}`` is the table recording the versions).
    :param migrations: The statements of each migration, in order.
    :param newer: The error for a schema newer than ``len(migrations)``.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
        conn.execute(schema_sql)
        conn.execute(q("CREATE TABLE IF NOT EXISTS {migrations} (version integer PRIMARY KEY, applied_at timestamptz)"))
        row = conn.execute(q("SELECT COALESCE(MAX(version), 0) FROM {migrations}")).fetchone()
        current = int(row[0]) if row is not None else 0
        if current > len(migrations):
            raise newer(current, len(migrations))
        for version in range(current + 1, len(migrations) + 1):
            for statement in migrations[version - 1]:
                conn.execute(q(statement))
            conn.execute(q("INSERT INTO {migrations} VALUES (%s, now())"), (version,))


def sqlite_version(conn: sqlite3.Connection, table: str) -> int:
    """
    The schema version a SQLite database records in ``table``, read without writing; 0 if it has no such table.

    :param conn: A connection (read-only is enough).
    :param table: The table recording the applied versions.
    """
    try:
        return int(conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # no such table
        return 0


def postgres_version(
    conn: psycopg.Connection[Any], schema: str, table: str, q: Callable[[str], sql.Composed]
) -> int | None:
    """
    The schema version recorded in ``schema``'s ``table``, read without writing: None if the schema does not exist,
    0 if it has no such table.

    :param conn: A psycopg connection (a read-only session is enough).
    :param schema: The PostgreSQL schema.
    :param table: The name of the table recording the applied versions.
    :param q: Formats ``{migrations}`` as that table's qualified name.
    """
    if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
        return None
    if conn.execute("SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s", (schema, table)).fetchone():
        row = conn.execute(q("SELECT COALESCE(MAX(version), 0) FROM {migrations}")).fetchone()
        return int(row[0]) if row is not None else 0
    return 0


def check_postgres_version(
    conn: psycopg.Connection[Any],
    q: Callable[[str], sql.Composed],
    migrations: Sequence[Sequence[str]],
    error: Callable[[str], Exception],
    *,
    schema: str,
    table: str,
    owner: str,
    holds: str,
) -> None:
    """
    For a read-only open: the schema must hold this version's tables (it cannot be migrated), else ``error``.

    :param conn: A psycopg connection (a read-only session is enough).
    :param q: Formats ``{migrations}`` as the qualified name of ``table``.
    :param migrations: The statements of each migration, in order.
    :param error: The owner's error class.
    :param schema: The PostgreSQL schema.
    :param table: The name of the table recording the applied versions.
    :param owner: The owner's class name, for the errors (``"PostgresStore"``).
    :param holds: What a schema of the owner holds, for the error of one at version 0 (``"no store (it has no
        haystack_state_store table)"``).
    """
    current = postgres_version(conn, schema, table, q)
    if current is None:
        raise error(f"The schema '{schema}' does not exist; a read-only {owner} creates nothing.")
    if current == 0:
        raise error(f"The schema '{schema}' holds {holds}; a read-only {owner} creates nothing.")
    if current != len(migrations):
        raise error(
            f"The schema '{schema}' is at version {current}, and this haystack-state reads version "
            f"{len(migrations)}; a read-only {owner} cannot migrate it (open it once without read_only to migrate it)."
        )


def postgres_schemas_with(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """
    The schemas of the database that hold a table of this name, sorted (to name the ones a mistyped schema meant).

    :param conn: A psycopg connection.
    :param table: The table's name.
    """
    return [
        row[0] for row in conn.execute("SELECT schemaname FROM pg_tables WHERE tablename = %s ORDER BY 1", (table,))
    ]


@dataclasses.dataclass(frozen=True)
class SQLiteSchema:
    """
    One table set's schema on SQLite (the checkpointer's, a store's): its migrations, and how its owner reports a
    file it cannot use.

    :param owner: The owner's class name, for the errors (``"SQLiteCheckpointer"``).
    :param table: The table recording the applied versions.
    :param migrations: The statements of each migration, in order (append-only).
    :param error: The owner's error class.
    :param subject: What the version is of, in ``is at {subject} version N`` (``"schema"``).
    :param newer_subject: The subject of the error for a newer schema (``"The database schema"``).
    :param missing: The error for a read-only file at version 0 (``{path}`` is replaced), or None to report it as
        any other version.
    """

    owner: str
    table: str
    migrations: Sequence[Sequence[str]]
    error: Callable[[str], Exception]
    subject: str = "schema"
    newer_subject: str = "The database schema"
    missing: str | None = None

    def open(self, pool: SQLitePool, *, read_only: bool) -> None:
        """
        Migrate the tables (WAL mode on), or for a read-only open check that they are at this version; on any error
        close the pool's connections. A file that is not a database is reported naming it.
        """
        try:
            with pool.connection() as conn:
                if read_only:
                    self.check(conn, pool.path)
                else:
                    enter_wal(conn, pool.timeout)
                    migrate_sqlite(conn, self.table, self.migrations, self.newer)
        except sqlite3.DatabaseError as exc:
            pool.close()
            raise self.error(f"{self.owner}: '{pool.path}' cannot be used as a database: {exc}.") from exc
        except BaseException:
            pool.close()
            raise

    def check(self, conn: sqlite3.Connection, path: str) -> None:
        """For a read-only open: the file must hold this version's tables (it cannot be migrated)."""
        current = sqlite_version(conn, self.table)
        if current == 0 and self.missing is not None:
            raise self.error(self.missing.format(path=path))
        if current != len(self.migrations):
            raise self.error(
                f"{self.owner}: '{path}' is at {self.subject} version {current}, and this haystack-state reads "
                f"version {len(self.migrations)}; a read-only file cannot be migrated (open it once writable to "
                "migrate it)."
            )

    def newer(self, current: int, supported: int) -> Exception:
        """The error for a schema newer than this code."""
        return self.error(
            f"{self.newer_subject} is at version {current}, newer than this haystack-state supports ({supported}); "
            "upgrade haystack-state."
        )
