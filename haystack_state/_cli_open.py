"""
How the ``haystack-state`` command opens a database: a SQLite file or a ``postgresql://`` URL (its tables in
``--schema``), for a checkpointer or a memory store, in one of three ways:

- ``read``: what is there, read-only. A missing file, a file or a schema without haystack-state's tables is an
  error naming it; nothing is created, migrated or left behind (no file, no schema, no ``-wal``);
- ``write``: what is there, to change it (``delete``, ``prune``, ``store delete``). The same checks, and a read-only
  file or directory is an error saying "read-only" before anything is tried;
- ``create``: where the command writes anew (``demo``, ``store put``): a missing file, schema or tables are created.

Then it finds a thread's checkpoints, and one of them by its id, short id or prefix, with errors that say how to
list what is there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from haystack_state._cli_text import command_line
from haystack_state._db.sqlite import connect_read_only
from haystack_state.errors import CheckpointError, CheckpointNotFoundError, StoreError, ThreadNotFoundError
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.persistence.sqlite import THREADS, SQLiteCheckpointer
from haystack_state.store.base import Store
from haystack_state.store.sqlite import ITEMS, SQLiteStore

__all__ = [
    "Access",
    "CliError",
    "checkpoint_values",
    "find_checkpoint",
    "is_postgres",
    "open_checkpointer",
    "open_store",
    "read_checkpoint",
    "thread_history",
    "where",
]

#: How a command uses its database (see the module's docstring).
Access = Literal["read", "write", "create"]

_STORE_HINT = "'haystack-state store put' creates one"
#: How many other schemas an error names.
_LISTED = 5


class CliError(Exception):
    """A problem to report as one line on stderr, with exit code 1."""


def is_postgres(target: str) -> bool:
    """Whether ``--db``/``DB`` is a PostgreSQL URL (else it is a SQLite file)."""
    return target.startswith(("postgresql://", "postgres://"))


def where(target: str, schema: str) -> str:
    """The database as messages name it: the file, or ``schema 'x' of URL``."""
    return f"schema '{schema}' of {target}" if is_postgres(target) else target


@contextlib.contextmanager
def open_checkpointer(
    target: str, *, schema: str = "public", access: Access = "read", command: str = "this command"
) -> Iterator[Checkpointer]:
    """
    Open the checkpointer of ``target`` for a command, closed on exit.

    :param target: A SQLite file or a PostgreSQL URL.
    :param schema: The PostgreSQL schema.
    :param access: ``read``, ``write`` or ``create`` (see the module's docstring).
    :param command: The command, as a read-only database's error names it.
    :raises CliError: For a database that cannot be used so, naming it and why.
    """
    if is_postgres(target):
        checkpointer: Checkpointer = _postgres_checkpointer(target, schema, access)
    else:
        file = Path(target)
        missing = "is not a haystack-state database (it has no {table} table)"
        _check_sqlite(file, target, access, command, THREADS, missing)
        try:
            checkpointer = SQLiteCheckpointer(file, read_only=access == "read")
        except CheckpointError as error:
            if isinstance(error.__cause__, sqlite3.DatabaseError):
                raise CliError(f"{target} is not a haystack-state database ({error.__cause__})") from None
            raise
    with checkpointer:
        yield checkpointer


def open_store(target: str, *, schema: str = "public", access: Access = "read", command: str = "this command") -> Store:
    """
    Open the memory store of ``target`` for a command (the caller closes it). The parameters and errors are
    :func:`open_checkpointer`'s.
    """
    if is_postgres(target):
        try:
            from haystack_state.store.postgres import PostgresStore
        except ImportError as error:
            raise CliError(str(error)) from None
        if access != "create":
            _check_schema(target, schema, "haystack_state_store", "memory store", f"; {_STORE_HINT}")
        return PostgresStore(target, schema=schema, read_only=access == "read", max_connections=1)
    file = Path(target)
    missing = f"holds no memory store (it has no {{table}} table; {_STORE_HINT})"
    _check_sqlite(file, target, access, command, ITEMS, missing)
    try:
        return SQLiteStore(file, read_only=access == "read")
    except StoreError as error:
        if isinstance(error.__cause__, sqlite3.DatabaseError):
            raise CliError(f"{target} is not a haystack-state database ({error.__cause__})") from None
        raise


# --- a thread's checkpoints -----------------------------------------------------------------------------------------


def thread_history(
    checkpointer: Checkpointer, args: argparse.Namespace, limit: int | None = None
) -> list[CheckpointMeta]:
    """The checkpoints of the thread ``args.thread``, newest first; an unknown thread is an error with a hint."""
    try:
        return checkpointer.history(args.thread, limit=limit)
    except ThreadNotFoundError:
        listing = command_line("threads", args.db, schema=args.schema)
        raise CliError(
            f"no thread '{args.thread}' in {where(args.db, args.schema)} (list them with: {listing})"
        ) from None


def find_checkpoint(history: list[CheckpointMeta], args: argparse.Namespace, reference: str) -> CheckpointMeta:
    """Find a checkpoint by its id, its short id (an end of it) or a unique prefix of it."""
    found = (
        [m for m in history if m.checkpoint_id.startswith(reference) or m.checkpoint_id.endswith(reference)]
        if reference
        else []
    )
    exact = [meta for meta in found if meta.checkpoint_id == reference]
    if exact or len(found) == 1:
        return (exact or found)[0]
    if found:
        raise CliError(
            f"checkpoint '{reference}' is ambiguous in thread '{args.thread}': {len(found)} ids start or end with it"
        )
    listing = command_line("history", args.db, args.thread, schema=args.schema)
    raise CliError(f"thread '{args.thread}' has no checkpoint '{reference}' (list them with: {listing})")


def checkpoint_values(checkpointer: Checkpointer, meta: CheckpointMeta) -> dict[str, Any]:
    """The state at a checkpoint."""
    try:
        return checkpointer.get(meta.thread_id, meta.checkpoint_id).values
    except (ThreadNotFoundError, CheckpointNotFoundError) as error:  # deleted while we read
        raise CliError(str(error)) from None


def read_checkpoint(args: argparse.Namespace) -> tuple[list[CheckpointMeta], CheckpointMeta, dict[str, Any]]:
    """The thread's checkpoints, the one ``--at`` names (the head by default), and its values."""
    with open_checkpointer(args.db, schema=args.schema) as checkpointer:
        history = thread_history(checkpointer, args)
        meta = find_checkpoint(history, args, args.at) if args.at is not None else history[0]
        return history, meta, checkpoint_values(checkpointer, meta)


# --- SQLite ------------------------------------------------------------------------------------------------------


def _check_sqlite(file: Path, target: str, access: Access, command: str, table: str, missing_table: str) -> None:
    """
    Check a SQLite file before it is opened: for ``create``, a file to write (or a folder to create it in); else an
    existing file holding ``table``, writable for ``write``.
    """
    if access == "create" and not file.exists():
        folder = file.parent
        if not folder.is_dir():
            raise CliError(f"{command} cannot create {target}: no such directory: {folder}")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise CliError(f"{command} cannot create {target}: its directory {folder} is read-only")
        return
    if not file.exists():
        raise CliError(f"{target} does not exist")
    if not file.is_file():
        raise CliError(f"{target} is not a file")
    if not os.access(file, os.R_OK):
        raise CliError(f"{target} cannot be read: permission denied")
    if access != "create":
        try:
            with contextlib.closing(connect_read_only(file)) as conn:
                query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
                found = conn.execute(query, (table,)).fetchone()
        except sqlite3.DatabaseError as error:
            if "not a database" in str(error):
                raise CliError(f"{target} is not a haystack-state database ({error})") from None
            raise CliError(f"cannot read {target}: {error}") from None
        if found is None:
            raise CliError(f"{target} {missing_table.format(table=table)}")
    if access != "read":
        _check_writable(file, target, command)


def _check_writable(file: Path, target: str, command: str) -> None:
    """
    A file to change: writable, in a folder where SQLite can write its ``-wal`` and ``-shm`` files. A file whose mode
    lets nobody write it counts as read-only even for root, who could.
    """
    if not file.stat().st_mode & 0o222 or not os.access(file, os.W_OK):
        raise CliError(f"{target} is read-only (no write permission on the file): {command} cannot change it")
    folder = file.resolve().parent
    beside = [Path(f"{file.resolve()}{end}") for end in ("-wal", "-shm")]
    if not os.access(folder, os.W_OK | os.X_OK) and not all(os.access(path, os.W_OK) for path in beside):
        raise CliError(
            f"{target} is in a read-only directory ({folder}): {command} cannot change it (SQLite writes "
            f"{file.name}-wal and {file.name}-shm beside the file)"
        )


# --- PostgreSQL --------------------------------------------------------------------------------------------------


def _postgres_checkpointer(target: str, schema: str, access: Access) -> Checkpointer:
    try:
        from haystack_state.persistence.postgres import PostgresCheckpointer
    except ImportError as error:
        raise CliError(str(error)) from None
    if access != "create":
        _check_schema(target, schema, "haystack_state_threads", "haystack-state threads")
    try:
        return PostgresCheckpointer(target, schema=schema, max_connections=1, read_only=access == "read")
    except CheckpointError:
        raise
    except Exception as error:  # a wrong URL, a server that does not answer
        raise CliError(f"cannot open {target}: {' '.join(str(error).split())}") from None


def _check_schema(target: str, schema: str, table: str, what: str, hint: str = "") -> None:
    """The schema must exist and hold ``table``; else say so, naming the schemas that hold it. Writes nothing."""
    import psycopg

    from haystack_state._db.migrations import postgres_schemas_with
    from haystack_state._db.postgres import read_only_conninfo

    try:
        with psycopg.connect(read_only_conninfo(target), autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None
            query = "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s"
            if exists and conn.execute(query, (schema, table)).fetchone() is not None:
                return
            others = postgres_schemas_with(conn, table)
    except psycopg.Error as error:
        raise CliError(f"cannot open {target}: {' '.join(str(error).split())}") from None
    shown = ", ".join(others[:_LISTED]) + (f" and {len(others) - _LISTED} more" if len(others) > _LISTED else "")
    holders = f"schemas with a {table} table: {shown}" if others else f"no schema has a {table} table"
    if not exists:
        raise CliError(f"schema '{schema}' does not exist in {target} ({holders}{hint})")
    raise CliError(f"schema '{schema}' of {target} holds no {what} (it has no {table} table; {holders}{hint})")
