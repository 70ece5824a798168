"""
Applying a backend's append-only list of migrations (the checkpointers' and the stores', on SQLite and PostgreSQL):
the schema version is the number of migrations applied; each pending one runs, in one transaction, and is recorded.
A read-only open applies none: it reads the recorded version (:func:`sqlite_version`, :func:`postgres_version`).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["migrate_postgres", "migrate_sqlite", "postgres_schemas_with", "postgres_version", "sqlite_version"]

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
    conn: Any,
    lock: str,
    schema_sql: Any,
    q: Callable[[str], Any],
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


def postgres_version(conn: Any, schema: str, table: str, q: Callable[[str], Any]) -> int | None:
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


def postgres_schemas_with(conn: Any, table: str) -> list[str]:
    """
    The schemas of the database that hold a table of this name, sorted (to name the ones a mistyped schema meant).

    :param conn: A psycopg connection.
    :param table: The table's name.
    """
    return [
        row[0] for row in conn.execute("SELECT schemaname FROM pg_tables WHERE tablename = %s ORDER BY 1", (table,))
    ]
