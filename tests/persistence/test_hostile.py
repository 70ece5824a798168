"""
Hostile data and failing drivers: nothing a model, a damaged row or a driver does wedges a thread. Each case is a
clear error (naming the thread, the checkpoint and the field or operation) or a correct result, and the thread stays
usable with nothing committed lost. On the in-memory, SQLite and PostgreSQL backends where they apply.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    CodecError,
)
from haystack_state.persistence import Checkpointer, CheckpointMeta, SQLiteCheckpointer, extend, replace

if TYPE_CHECKING:
    from persistence.harness import Harness

# Any text but lone surrogates, which commits refuse (tests/persistence/test_bad_text_rows.py).
HOSTILE_TEXT = "nul\x00here, \ufffd replacement, \u2028 separators, \ud7ff and \ue000 and emoji \U0001f600"


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def commit_all(cp: Checkpointer, thread_id: str, deltas: list[dict[str, Any]], **kwargs: Any) -> list[CheckpointMeta]:
    metas: list[CheckpointMeta] = []
    head = cp.head(thread_id)
    for step, delta in enumerate(deltas):
        meta = cp.commit(
            thread_id, parent_id=head, expected_head=head, delta=delta, step=step, source="tools", **kwargs
        )
        metas.append(meta)
        head = meta.checkpoint_id
    return metas


# --- any text the model can produce -----------------------------------------------------------------------------


def test_nul_and_unusual_text_are_stored_in_every_field_and_read_back_exactly(backend: Harness) -> None:
    cp = backend.make()
    thread = new_thread()
    call = ToolCall(tool_name=HOSTILE_TEXT, arguments={HOSTILE_TEXT: HOSTILE_TEXT}, id=HOSTILE_TEXT)
    reply = ChatMessage.from_assistant(HOSTILE_TEXT, tool_calls=[call])
    result = ChatMessage.from_tool(HOSTILE_TEXT, origin=call)
    metas = commit_all(
        cp,
        thread,
        [{"messages": extend([reply, result]), HOSTILE_TEXT: replace({HOSTILE_TEXT: [HOSTILE_TEXT]})}],
        tool_names=[HOSTILE_TEXT, "plain"],
        metadata={HOSTILE_TEXT: HOSTILE_TEXT},
    )
    reader = backend.make(cache_size=0) if backend.persistent else cp
    checkpoint = reader.get(thread)
    assert checkpoint.values["messages"] == [reply, result]
    assert checkpoint.values[HOSTILE_TEXT] == {HOSTILE_TEXT: [HOSTILE_TEXT]}
    meta = reader.history(thread)[0]
    assert meta.tool_names == (HOSTILE_TEXT, "plain")
    assert meta.metadata == {HOSTILE_TEXT: HOSTILE_TEXT}
    assert set(meta.changed_keys) == {"messages", HOSTILE_TEXT}
    assert meta == metas[0] or meta.checkpoint_id == metas[0].checkpoint_id
    commit_all(reader, thread, [{"messages": extend([ChatMessage.from_user("still usable")])}])
    assert reader.get(thread).values["messages"][-1].text == "still usable"


@pytest.mark.slow
def test_hostile_text_in_concurrent_async_commits_is_stored_exactly(backend: Harness) -> None:
    """The async commits of concurrent runs (one group commit on PostgreSQL, new threads and appends) store it too."""
    cp = backend.make()
    threads = [new_thread() for _ in range(4)]
    call = ToolCall(tool_name=HOSTILE_TEXT, arguments={HOSTILE_TEXT: HOSTILE_TEXT}, id=HOSTILE_TEXT)
    messages = [ChatMessage.from_assistant(HOSTILE_TEXT, tool_calls=[call]), ChatMessage.from_tool(HOSTILE_TEXT, call)]

    async def run(thread_id: str) -> None:
        head = None
        for message in messages:
            meta = await cp.acommit(
                thread_id, parent_id=head, expected_head=head, delta={"messages": extend([message])}, step=0,
                source="tools", tool_names=[HOSTILE_TEXT], metadata={HOSTILE_TEXT: [HOSTILE_TEXT]},
            )  # fmt: skip
            head = meta.checkpoint_id

    async def main() -> None:
        await asyncio.gather(*(run(thread_id) for thread_id in threads))

    asyncio.run(main())
    reader = backend.make(cache_size=0) if backend.persistent else cp
    for thread_id in threads:
        assert reader.get(thread_id).values["messages"] == messages
        assert all(meta.tool_names == (HOSTILE_TEXT,) for meta in reader.history(thread_id))
        assert all(meta.metadata == {HOSTILE_TEXT: [HOSTILE_TEXT]} for meta in reader.history(thread_id))


# --- thread ids -------------------------------------------------------------------------------------------------


BAD_IDS = [
    (5, "must be a string"),
    (None, "must be a string"),
    ("", "is empty"),
    ("a\x00b", "NUL"),
    ("a\ud800b", "surrogate"),
    ("x" * 1001, "at most 1,000 characters"),
    ("\U0001f600" * 600, "bytes"),
]


@pytest.mark.parametrize(("thread_id", "problem"), BAD_IDS, ids=[problem for _, problem in BAD_IDS])
def test_thread_ids_every_backend_cannot_store_alike_are_one_clear_value_error(
    checkpointer: Checkpointer, thread_id: Any, problem: str
) -> None:
    calls = [
        lambda: checkpointer.head(thread_id),
        lambda: checkpointer.get(thread_id),
        lambda: checkpointer.history(thread_id),
        lambda: checkpointer.delete_thread(thread_id),
        *([lambda: checkpointer.prune(thread_id, keep_last=1)] if thread_id is not None else []),  # None: all
        lambda: checkpointer.set_ttl(thread_id, 5),
        lambda: checkpointer.acquire_lease(thread_id),
        lambda: checkpointer.commit(
            thread_id, parent_id=None, expected_head=None, delta={"x": replace(1)}, step=0, source="input"
        ),
        lambda: asyncio.run(checkpointer.aget(thread_id)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=problem) as raised:
            call()
        assert not isinstance(raised.value, CheckpointError)
    assert checkpointer.list_threads() == []


def test_an_int_thread_id_is_refused_by_the_agent_too(checkpointer: Checkpointer) -> None:
    from haystack_state import Agent
    from haystack_state.testing import ScriptedChatGenerator

    agent = Agent(ScriptedChatGenerator(script=["hi"]), checkpointer=checkpointer)
    agent.run([ChatMessage.from_user("hi")], thread_id="5")
    for call in (
        lambda: agent.get_state(5),  # type: ignore[arg-type]
        lambda: agent.get_history(5),  # type: ignore[arg-type]
        lambda: agent.update_state(5, {}),  # type: ignore[arg-type]
        lambda: agent.run([], thread_id=5),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="must be a string"):
            call()


def test_checkpoint_ids_that_cannot_exist_are_not_found(checkpointer: Checkpointer) -> None:
    thread = new_thread()
    commit_all(checkpointer, thread, [{"x": replace(1)}])
    for bad in ("a\x00b", "a\ud800", "x" * 5000):
        with pytest.raises(CheckpointNotFoundError):
            checkpointer.get(thread, bad)
        with pytest.raises(CheckpointNotFoundError):
            checkpointer.history(thread, before=bad)


# --- damaged rows -----------------------------------------------------------------------------------------------


def _set(backend: Harness, cp: Checkpointer, thread: str, checkpoint_id: str, column: str, value: Any) -> None:
    table = "haystack_state_checkpoints"
    if backend.name == "sqlite":
        backend._sql(  # type: ignore[attr-defined]
            cp,
            f"UPDATE {table} SET {column} = ? WHERE thread_id = ? AND checkpoint_id = ?",
            (value, thread, checkpoint_id),
        )
    else:
        backend._sql(  # type: ignore[attr-defined]
            cp,
            f"UPDATE {{schema}}.{table} SET {column} = %s WHERE thread_id = %s AND checkpoint_id = %s",
            (value, thread, checkpoint_id),
        )


CORRUPT_FIELDS = [
    ("tool_names", '"search"', ("sqlite", "postgres")),  # a quoted string is not its characters
    ("tool_names", "[1, 2]", ("sqlite", "postgres")),
    ("changed_keys", "{}", ("sqlite", "postgres")),
    ("created_at", "yesterday", ("sqlite",)),
    ("created_at", "2025-01-01T00:00:00", ("sqlite",)),  # no UTC offset
    ("step", "three", ("sqlite",)),
    ("step", -1, ("sqlite", "postgres")),
    ("source", "oracle", ("sqlite", "postgres")),
]


@pytest.mark.parametrize(
    ("column", "value", "backends"), CORRUPT_FIELDS, ids=[f"{c}={v!r}" for c, v, _ in CORRUPT_FIELDS]
)
def test_a_corrupt_record_field_names_the_thread_checkpoint_and_field(
    backend: Harness, column: str, value: Any, backends: tuple[str, ...]
) -> None:
    if backend.name not in backends:
        pytest.skip(f"{backend.name} cannot store that value in {column}")
    cp = backend.make()
    thread = new_thread()
    metas = commit_all(cp, thread, [{"x": replace(1)}, {"x": replace(2)}], tool_names=["search"])
    _set(backend, cp, thread, metas[0].checkpoint_id, column, value)
    fresh = backend.make()
    with pytest.raises(CheckpointError) as raised:
        fresh.history(thread)
    for name in (thread, metas[0].checkpoint_id, column):
        assert name in str(raised.value)
    assert fresh.get(thread).values == {"x": 2}  # the head's record is sound: the thread stays usable


def test_a_parent_cycle_with_a_corrupt_sequence_counter_is_an_error_not_a_hang(backend: Harness) -> None:
    if not backend.persistent:
        pytest.skip("needs stored rows to corrupt")
    cp = backend.make()
    thread = new_thread()
    metas = commit_all(cp, thread, [{"n": extend([i])} for i in range(5)])
    _set(backend, cp, thread, metas[1].checkpoint_id, "parent_id", metas[3].checkpoint_id)
    threads = "haystack_state_threads"
    if backend.name == "sqlite":
        backend._sql(cp, f"UPDATE {threads} SET last_seq = 9000000000 WHERE thread_id = ?", (thread,))  # type: ignore[attr-defined]
    else:
        backend._sql(cp, f"UPDATE {{schema}}.{threads} SET last_seq = 9000000000 WHERE thread_id = %s", (thread,))  # type: ignore[attr-defined]
    fresh = backend.make(cache_size=0)
    with pytest.raises(CheckpointError, match="cycle") as raised:
        fresh.get(thread)
    assert thread in str(raised.value)


def test_two_adjacent_broken_deltas_are_not_joined_into_one(backend: Harness) -> None:
    if not backend.persistent:
        pytest.skip("needs stored rows to corrupt")
    cp = backend.make()
    thread = new_thread()
    metas = commit_all(cp, thread, [{"a": replace(i)} for i in range(4)])
    backend.corrupt(cp, thread, metas[1].checkpoint_id, "delta", '{"a":{"op":"replace","value":[1')
    backend.corrupt(cp, thread, metas[2].checkpoint_id, "delta", "2]}}")
    with pytest.raises(CodecError) as raised:
        backend.make(cache_size=0).get(thread)
    assert metas[1].checkpoint_id in str(raised.value)
    assert backend.make(cache_size=0).get(thread, metas[0].checkpoint_id).values == {"a": 0}


# --- the SQLite file --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_deleted_or_replaced_sqlite_file_is_reported_not_acknowledged(tmp_path: Path, how: str) -> None:
    path = tmp_path / "threads.sqlite"
    cp = SQLiteCheckpointer(path)
    thread = new_thread()
    metas = commit_all(cp, thread, [{"x": replace(1)}])
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    if how == "replaced":
        SQLiteCheckpointer(path).close()
    with pytest.raises(CheckpointStorageError, match=how):
        cp.commit(
            thread, parent_id=metas[0].checkpoint_id, expected_head=metas[0].checkpoint_id, delta={"x": replace(2)},
            step=1, source="update",
        )  # fmt: skip
    cp.close()


def test_a_sqlite_driver_error_is_wrapped_naming_the_thread_and_operation(tmp_path: Path) -> None:
    cp = SQLiteCheckpointer(tmp_path / "threads.sqlite")
    thread = new_thread()
    metas = commit_all(cp, thread, [{"x": replace(1)}])
    with cp._raw_connection() as conn:  # every pooled connection refuses writes, as a read-only file would
        conn.execute("PRAGMA query_only = ON")
    with pytest.raises(CheckpointStorageError) as raised:
        cp.commit(
            thread, parent_id=metas[0].checkpoint_id, expected_head=metas[0].checkpoint_id, delta={"x": replace(2)},
            step=1, source="update",
        )  # fmt: skip
    assert f"commit to thread '{thread}'" in str(raised.value) and "readonly" in str(raised.value)
    assert raised.value.__cause__ is not None
    with cp._raw_connection() as conn:
        conn.execute("PRAGMA query_only = OFF")
    assert cp.get(thread).values == {"x": 1}
    cp.close()


def test_a_read_only_sqlite_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite"
    with SQLiteCheckpointer(path) as cp:
        commit_all(cp, "t", [{"x": replace(1)}])
    os.chmod(path, 0o444)
    with SQLiteCheckpointer(path, read_only=True) as reader:
        assert reader.get("t").values == {"x": 1}
        with pytest.raises(CheckpointStorageError, match="commit to thread 't'"):
            commit_all(reader, "t", [{"x": replace(2)}])


# --- PostgreSQL connections -------------------------------------------------------------------------------------


def _terminate_pool(cp: Any) -> int:
    """Terminate the server side of every connection in the checkpointer's pools (as a restart or a proxy would)."""
    import psycopg

    pids = []
    pool = cp._pool
    held = [pool.getconn() for _ in range(pool.get_stats()["pool_size"])]
    pids = [conn.info.backend_pid for conn in held]
    for conn in held:
        pool.putconn(conn)
    with psycopg.connect(cp._dsn, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return len(pids)


@pytest.mark.postgres
def test_a_dead_pooled_connection_is_retried_before_anything_runs(backend: Harness) -> None:
    if backend.name != "postgres":
        pytest.skip("PostgreSQL only")
    cp = backend.make()
    thread = new_thread()
    metas = commit_all(cp, thread, [{"x": replace(1)}])
    assert _terminate_pool(cp) >= 1
    assert backend.make().get(thread).values == {"x": 1}
    cp._cache.clear()
    assert cp.get(thread).values == {"x": 1}  # a read retried on a fresh connection
    _terminate_pool(cp)
    meta = cp.commit(
        thread, parent_id=metas[0].checkpoint_id, expected_head=metas[0].checkpoint_id, delta={"x": replace(2)},
        step=1, source="update",
    )  # fmt: skip
    assert [m.checkpoint_id for m in cp.history(thread)] == [meta.checkpoint_id, metas[0].checkpoint_id]
    _terminate_pool(cp)
    assert cp.acquire_lease(thread).thread_id == thread


@pytest.mark.slow
@pytest.mark.postgres
def test_dead_async_connections_are_retried_and_each_grouped_commit_applies_once(backend: Harness) -> None:
    """The connections of the event loop die between two rounds of grouped commits (a server restart, a proxy)."""
    if backend.name != "postgres":
        pytest.skip("PostgreSQL only")
    import psycopg

    cp = backend.make()
    threads = [new_thread() for _ in range(8)]

    async def kill_loop_connections() -> None:
        connections = cp._async_connections()
        pids = [conn.info.backend_pid for conn in connections.open]
        assert pids
        with psycopg.connect(cp._dsn, autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    async def main() -> None:
        roots = await asyncio.gather(
            *(
                cp.acommit(t, parent_id=None, expected_head=None, delta={"x": replace(0)}, step=0, source="input")
                for t in threads
            )
        )
        await kill_loop_connections()
        await asyncio.gather(
            *(
                cp.acommit(
                    t,
                    parent_id=r.checkpoint_id,
                    expected_head=r.checkpoint_id,
                    delta={"x": replace(1)},
                    step=1,
                    source="tools",
                )
                for t, r in zip(threads, roots, strict=True)
            )
        )
        await kill_loop_connections()
        lease, head = await cp.ahold_thread(threads[0], owner="after-restart")
        assert head == (await cp.ahead(threads[0]))
        assert await cp.arelease_lease(lease)

    asyncio.run(main())
    reader = backend.make(cache_size=0)
    for thread in threads:
        assert reader.get(thread).values == {"x": 1}
        assert [meta.step for meta in reader.history(thread)] == [1, 0]  # each commit applied once
