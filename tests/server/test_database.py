"""
The server's tables as units of work (``Work``): each table method is one transaction, awaited on the event loop or
run with ``result()`` from a thread, the same on SQLite and PostgreSQL. On PostgreSQL the loop awaits them on async
connections of its own (no worker thread), and a read survives PostgreSQL dropping those connections.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from haystack_state.server._database import (
    Change,
    PostgresDatabase,
    Rows,
    SQLiteDatabase,
    UniqueViolation,
    Work,
    database_for,
)
from haystack_state.server._records import Idempotency, RunRecord, now_text
from haystack_state.server._storage import ServerStorage


def _run(thread_id: str, run_id: str, status: str = "pending", strategy: str = "enqueue") -> RunRecord:
    at = now_text()
    return RunRecord(run_id, thread_id, "agent", "me", status, strategy, {}, {}, None, None, at, at)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_work_is_the_same_awaited_on_the_loop_or_run_from_a_thread(backend: Any) -> None:
    storage = ServerStorage(database_for(backend.checkpointer()))
    try:
        made = storage.create_thread("t-1", "me", {"topic": "bees"}).result()

        async def main() -> tuple[Any, Any, Any]:
            again = await storage.create_thread("t-1", "me", {}, if_exists="do_nothing")
            taken = await storage.create_thread("t-1", "someone-else", {})
            return again, taken, await storage.get_thread("t-1", "me")

        again, taken, found = asyncio.run(main())
        assert made is not None and again == made and found == made
        assert found.metadata == {"topic": "bees"} and found.status == "idle"
        assert taken is None  # another owner's id
        assert storage.get_thread("t-1", "someone-else").result() is None
    finally:
        storage.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_failed_work_writes_nothing_and_a_unique_refusal_is_ours(backend: Any) -> None:
    storage = ServerStorage(database_for(backend.checkpointer()))
    database = storage.database
    try:
        storage.create_thread("t-1", "me", {}).result()

        def insert_twice() -> Any:
            yield Change("UPDATE {threads} SET status = 'busy' WHERE thread_id = 't-1'")
            yield Change(
                "INSERT INTO {threads} (thread_id, owner, assistant_id, metadata, status, created_at, updated_at) "
                "VALUES ('t-1', 'me', NULL, '{}', 'idle', 'x', 'x')"
            )

        with pytest.raises(UniqueViolation) as caught:
            asyncio.run(_awaited(Work(database, insert_twice, write=True)))
        assert caught.value.__cause__ is not None  # the driver's error, chained
        record = storage.get_thread("t-1", "me").result()
        assert record is not None and record.status == "idle"  # the transaction's first write was rolled back
        refused = Work(database, insert_twice, write=True, on_unique=lambda: "refused")
        assert refused.result() == "refused"
        assert storage.get_thread("t-1", "me").result().status == "idle"  # type: ignore[union-attr]
    finally:
        storage.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_racing_submissions_with_one_idempotency_key_make_one_run(backend: Any) -> None:
    storage = ServerStorage(database_for(backend.checkpointer()))
    try:
        storage.create_thread("t-1", "me", {}).result()
        key = Idempotency("key-1", "digest")

        async def main() -> list[RunRecord]:
            return list(
                await asyncio.gather(
                    *(storage.create_run(_run("t-1", f"run-{i}"), idempotency=key) for i in range(4))  # type: ignore[arg-type]
                )
            )

        runs = asyncio.run(main())
        assert len({run.run_id for run in runs}) == 1
        assert sum(not run.replayed for run in runs) == 1
        stored = storage.list_runs("t-1", "me").result()
        assert [run.run_id for run in stored] == [runs[0].run_id]
    finally:
        storage.close()


async def _awaited(work: Work[Any]) -> Any:
    return await work


@pytest.mark.postgres
def test_the_loop_awaits_postgresql_on_its_own_connections_not_the_thread_pool(
    postgres_dsn: str, postgres_schema: str
) -> None:
    database = PostgresDatabase(postgres_dsn, schema=postgres_schema)
    storage = ServerStorage(database)
    try:
        storage.create_thread("t-1", "me", {}).result()
        database._pool.close()  # the sync pool, which a thread's result() uses, is gone

        async def main() -> Any:
            await storage.create_thread("t-2", "me", {"n": 1})
            found = await storage.get_thread("t-2", "me")
            await database.aclose_loop()
            return found

        found = asyncio.run(main())
        assert found is not None and found.metadata == {"n": 1}
    finally:
        database._loops.finish()


@pytest.mark.postgres
def test_a_read_survives_postgresql_dropping_the_loops_connections(postgres_dsn: str, postgres_schema: str) -> None:
    storage = ServerStorage(PostgresDatabase(postgres_dsn, schema=postgres_schema))
    database = storage.database
    assert isinstance(database, PostgresDatabase)
    try:
        storage.create_thread("t-1", "me", {}).result()

        async def main() -> Any:
            await asyncio.gather(*(storage.get_thread("t-1", "me") for _ in range(3)))  # a few connections open
            connections = database._loops.of_running_loop()
            pids = [conn.info.backend_pid for conn in connections.idle]
            assert pids
            with psycopg.connect(postgres_dsn, autocommit=True) as admin:
                for pid in pids:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            found = await storage.get_thread("t-1", "me")
            rows = await database.read("SELECT COUNT(*) FROM {threads}")
            await database.aclose_loop()
            return found, rows

        found, rows = asyncio.run(main())
        assert found is not None and found.thread_id == "t-1"
        assert rows == [(1,)]
    finally:
        storage.close()


@pytest.mark.postgres
def test_a_work_cancelled_mid_statement_leaves_no_busy_connection_behind(
    postgres_dsn: str, postgres_schema: str
) -> None:
    database = PostgresDatabase(postgres_dsn, schema=postgres_schema, max_connections=1)
    storage = ServerStorage(database)
    try:

        async def main() -> Any:
            slow = asyncio.ensure_future(_awaited(database.read("SELECT pg_sleep(30)")))
            await asyncio.sleep(0.5)  # the statement is running on the loop's only connection
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            rows = await asyncio.wait_for(_awaited(database.read("SELECT 1")), timeout=10)
            found = await storage.create_thread("t-1", "me", {})
            await database.aclose_loop()
            return rows, found

        rows, found = asyncio.run(main())
        assert rows == [(1,)] and found is not None
    finally:
        storage.close()


def test_an_operation_that_is_not_the_tables_is_refused_by_name(tmp_path: Any) -> None:
    storage = ServerStorage(SQLiteDatabase(str(tmp_path / "server.db")))
    try:

        def stray() -> Any:
            yield "SELECT 1"

        with pytest.raises(TypeError, match="Not an operation on the server's tables: 'SELECT 1'"):
            Work(storage.database, stray, write=False).result()
        assert storage.database.read("SELECT 1").result() == [(1,)]
        assert Work(storage.database, lambda: (yield Rows("SELECT 2")), write=False).result() == [(2,)]
    finally:
        storage.close()


def test_a_read_on_the_loop_that_meets_a_locked_new_file_waits_for_it_in_a_thread(tmp_path: Any) -> None:
    """
    The first connection the loop opens on a file switches it to WAL; when another process holds the file (here a
    connection in an exclusive transaction), the read is done in a worker thread, which waits for the lock, instead
    of failing with "database is locked".
    """
    import sqlite3

    path = str(tmp_path / "server.db")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE kept (x)")
    other.execute("BEGIN EXCLUSIVE")
    database = SQLiteDatabase(path, timeout=10.0)
    try:

        async def main() -> Any:
            asyncio.get_running_loop().call_later(0.3, other.execute, "COMMIT")
            return await database.read("SELECT 1")

        assert asyncio.run(main()) == [(1,)]
        other.close()
        check = sqlite3.connect(path)
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        check.close()
    finally:
        database.close()
        other.close()
