"""Leases, TTLs, pruning, history pages and snapshots: the contract on the in-memory, SQLite and PostgreSQL backends."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from haystack.dataclasses import ChatMessage

from haystack_state.errors import (
    CheckpointNotFoundError,
    ThreadBusyError,
    ThreadConflictError,
    ThreadNotFoundError,
)
from haystack_state.persistence import Checkpointer, CheckpointMeta, extend, replace
from haystack_state.persistence.ops import ReadChain

if TYPE_CHECKING:
    from persistence.harness import Harness


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def commit_all(cp: Checkpointer, thread_id: str, deltas: list[dict[str, Any]], **kwargs: Any) -> list[CheckpointMeta]:
    metas: list[CheckpointMeta] = []
    head = cp.head(thread_id)
    for step, delta in enumerate(deltas):
        meta = cp.commit(
            thread_id, parent_id=head, expected_head=head, delta=delta, step=step, source="update", **kwargs
        )
        metas.append(meta)
        head = meta.checkpoint_id
    return metas


def message(i: int) -> ChatMessage:
    return ChatMessage.from_user(f"message {i} " + "x" * 200)


# --- leases -----------------------------------------------------------------------------------------------------


def test_a_live_lease_refuses_other_owners_and_names_the_holder(backend: Harness) -> None:
    cp = backend.make()
    other = backend.make() if backend.persistent else cp
    thread = new_thread()
    lease = cp.acquire_lease(thread, owner="worker-a")
    assert lease.owner == "worker-a" and lease.expires_at > dt.datetime.now(dt.UTC)
    with pytest.raises(ThreadBusyError) as busy:
        other.acquire_lease(thread, owner="worker-b")
    assert busy.value.holder == "worker-a" and abs(busy.value.expires_at - lease.expires_at) < dt.timedelta(seconds=1)
    assert "worker-a" in str(busy.value) and thread in str(busy.value)
    assert isinstance(busy.value, ThreadConflictError)
    assert cp.acquire_lease(thread, owner="worker-a").owner == "worker-a"  # one's own lease is renewed
    assert other.read_lease(thread) is not None
    assert cp.release_lease(lease)
    assert other.read_lease(thread) is None
    assert other.acquire_lease(thread, owner="worker-b").owner == "worker-b"


def test_hold_thread_takes_the_lease_and_reads_the_head_as_it_is_once_held(backend: Harness) -> None:
    cp = backend.make()
    other = backend.make() if backend.persistent else cp
    thread, empty = new_thread(), new_thread()
    first = commit_all(cp, thread, [{"x": replace(1)}, {"x": replace(2)}])[-1]
    lease, head = cp.hold_thread(thread, owner="worker-a")
    assert head == first.checkpoint_id and lease.owner == "worker-a"
    assert other.read_lease(thread) == lease
    with pytest.raises(ThreadBusyError) as busy:
        other.hold_thread(thread, owner="worker-b")
    assert busy.value.holder == "worker-a" and thread in str(busy.value)
    assert other.read_lease(thread) == lease  # the refused holder took nothing
    assert cp.release_lease(lease)
    # a commit that lands between a load and the hold shows in the head the hold reads
    moved = other.commit(
        thread, parent_id=first.checkpoint_id, expected_head=first.checkpoint_id, delta={"x": replace(3)},
        step=2, source="update",
    )  # fmt: skip
    lease_b, head_b = other.hold_thread(thread, owner="worker-b")
    assert head_b == moved.checkpoint_id and cp.read_lease(thread) == lease_b

    async def held_async() -> tuple[object, str | None]:
        return await cp.ahold_thread(empty, owner="worker-c")

    lease_c, head_c = asyncio.run(held_async())
    assert head_c is None and other.read_lease(empty) == lease_c  # a thread that does not exist yet has no head
    with pytest.raises(ValueError, match="thread_id"):
        cp.hold_thread(5)  # type: ignore[arg-type]


def test_open_thread_reads_the_live_lease_and_the_head_together(backend: Harness) -> None:
    cp = backend.make()
    other = backend.make() if backend.persistent else cp
    thread, missing = new_thread(), new_thread()
    metas = commit_all(cp, thread, [{"x": replace(1)}, {"log": extend(["a", "b"])}])
    assert other.open_thread(missing) == (None, None)
    lease, checkpoint = other.open_thread(thread)
    assert lease is None and checkpoint is not None
    assert checkpoint.checkpoint_id == metas[-1].checkpoint_id and checkpoint.values == {"x": 1, "log": ["a", "b"]}
    assert checkpoint.values == other.get(thread).values and checkpoint.meta == other.get(thread).meta
    held = cp.acquire_lease(thread, owner="worker-a")
    assert other.open_thread(thread) == (held, None)  # a live holder: the head is not read
    cp.acquire_lease(missing, owner="worker-b", ttl=0.05)
    time.sleep(0.1)
    assert other.open_thread(missing) == (None, None)  # an expired lease holds nothing

    async def opened() -> tuple[object, object]:
        return await other.aopen_thread(thread, read_only=True)

    assert asyncio.run(opened()) == (held, None)
    cp.release_lease(held)
    lease, checkpoint = asyncio.run(opened())
    assert lease is None and checkpoint is not None and checkpoint.values["log"] == ["a", "b"]
    with pytest.raises(ValueError, match="thread_id"):
        cp.open_thread(5)  # type: ignore[arg-type]


def test_an_expired_lease_is_taken_over_and_its_holder_cannot_commit(backend: Harness) -> None:
    cp = backend.make()
    thread = new_thread()
    first = commit_all(cp, thread, [{"x": replace(1)}])[0]
    dead = cp.acquire_lease(thread, owner="crashed", ttl=0.05)
    time.sleep(0.1)
    assert cp.read_lease(thread) is None  # expired: nobody holds the thread
    taker = cp.acquire_lease(thread, owner="taker")
    with pytest.raises(ThreadBusyError, match="taker"):
        cp.commit(
            thread, parent_id=first.checkpoint_id, expected_head=first.checkpoint_id, delta={"x": replace(2)},
            step=1, source="update", lease=dead,
        )  # fmt: skip
    with pytest.raises(ThreadBusyError, match="lost"):
        cp.renew_lease(dead)
    assert cp.get(thread).values == {"x": 1}  # nothing written by the dead holder
    cp.commit(
        thread, parent_id=first.checkpoint_id, expected_head=first.checkpoint_id, delta={"x": replace(3)},
        step=1, source="update", lease=taker,
    )  # fmt: skip
    assert cp.get(thread).values == {"x": 3}
    assert cp.renew_lease(taker).expires_at >= taker.expires_at


def test_lease_arguments_are_checked(checkpointer: Checkpointer) -> None:
    with pytest.raises(ValueError, match="positive"):
        checkpointer.acquire_lease("t", ttl=0)
    with pytest.raises(ValueError, match="thread_id"):
        checkpointer.acquire_lease(5)  # type: ignore[arg-type]


# --- async twins ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_async_methods_read_and_write_what_the_sync_ones_do(backend: Harness) -> None:
    cp = backend.make()
    thread = new_thread()

    async def scenario() -> None:
        first = await cp.acommit(
            thread, parent_id=None, expected_head=None, delta={"log": extend([1])}, step=0, source="input"
        )
        second = await cp.acommit(
            thread, parent_id=first.checkpoint_id, expected_head=first.checkpoint_id, delta={"log": extend([2])},
            step=1, source="update",
        )  # fmt: skip
        assert await cp.ahead(thread) == second.checkpoint_id
        assert (await cp.aget(thread)).values == {"log": [1, 2]}
        assert (await cp.aget(thread, first.checkpoint_id)).values == {"log": [1]}
        assert [m.checkpoint_id for m in await cp.ahistory(thread)] == [second.checkpoint_id, first.checkpoint_id]
        assert [m.checkpoint_id for m in await cp.ahistory(thread, limit=1)] == [second.checkpoint_id]
        assert thread in [info.thread_id for info in await cp.alist_threads()]
        lease = await cp.aacquire_lease(thread)
        assert (await cp.aread_lease(thread)) is not None
        await cp.arenew_lease(lease)
        assert await cp.arelease_lease(lease)
        with pytest.raises(ThreadConflictError):
            await cp.acommit(
                thread, parent_id=first.checkpoint_id, expected_head=first.checkpoint_id, delta={}, step=2,
                source="update",
            )  # fmt: skip
        assert (await cp.aprune(thread, keep_last=1)).checkpoints_deleted == 1
        await cp.adelete_thread(thread)
        assert await cp.ahead(thread) is None

    asyncio.run(scenario())
    assert cp.head(thread) is None
    asyncio.run(cp.aclose())


# --- history pages ----------------------------------------------------------------------------------------------


def test_history_pages_from_newest_to_oldest(checkpointer: Checkpointer) -> None:
    cp, thread = checkpointer, new_thread()
    metas = commit_all(cp, thread, [{"x": replace(i)} for i in range(7)])
    newest_first = [m.checkpoint_id for m in reversed(metas)]
    pages: list[list[str]] = []
    before = None
    while True:
        page = [m.checkpoint_id for m in cp.history(thread, limit=3, before=before)]
        if not page:
            break
        pages.append(page)
        before = page[-1]
    assert pages == [newest_first[0:3], newest_first[3:6], newest_first[6:7]]
    assert [m.checkpoint_id for m in cp.history(thread)] == newest_first
    with pytest.raises(CheckpointNotFoundError):
        cp.history(thread, before="no-such-checkpoint")
    with pytest.raises(ValueError, match="limit"):
        cp.history(thread, limit=0)
    with pytest.raises(ThreadNotFoundError):
        cp.history(new_thread(), limit=3)


# --- TTL and prune ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_expired_thread_is_invisible_then_pruned(backend: Harness) -> None:
    cp = backend.make()
    kept, doomed = new_thread(), new_thread()
    commit_all(cp, kept, [{"x": replace(1)}])
    commit_all(cp, doomed, [{"x": replace(1)}, {"x": replace(2)}])
    cp.set_ttl(doomed, 0.05)
    time.sleep(0.1)
    reader = backend.make() if backend.persistent else cp
    assert reader.head(doomed) is None
    with pytest.raises(ThreadNotFoundError):
        reader.get(doomed)
    with pytest.raises(ThreadNotFoundError):
        reader.history(doomed)
    assert doomed not in [info.thread_id for info in reader.list_threads()]
    result = cp.prune()
    assert result.threads_deleted == [doomed] and result.checkpoints_deleted == 0
    assert cp.get(kept).values == {"x": 1}
    # A new run may start the id afresh.
    commit_all(cp, doomed, [{"y": replace(1)}])
    assert cp.get(doomed).values == {"y": 1}
    with pytest.raises(ThreadNotFoundError):
        cp.set_ttl(new_thread(), 10)
    with pytest.raises(ValueError, match="TTL"):
        cp.set_ttl(kept, -1)


@pytest.mark.slow
def test_a_thread_ttl_is_counted_from_its_last_commit(backend: Harness) -> None:
    cp = backend.make(thread_ttl=0.4)
    thread = new_thread()
    commit_all(cp, thread, [{"x": replace(1)}])
    time.sleep(0.25)
    commit_all(cp, thread, [{"x": replace(2)}])  # refreshes the expiry
    time.sleep(0.25)
    assert cp.get(thread).values == {"x": 2}
    time.sleep(0.3)
    assert cp.head(thread) is None


@pytest.mark.slow
def test_pruned_threads_read_exactly_as_before_at_every_kept_checkpoint(backend: Harness) -> None:
    cp = backend.make(snapshot_min_bytes=10**9)  # no snapshots of its own: pruning must write what it needs
    thread = new_thread()
    deltas: list[dict[str, Any]] = []
    for i in range(30):
        delta: dict[str, Any] = {"messages": extend([message(i)])}
        if i % 7 == 3:
            delta["status"] = replace({"at": i})
        if i == 11:
            delta["scratch"] = replace([1, 2])
        if i == 17:
            delta["scratch"] = {"op": "delete"}
        deltas.append(delta)
    metas = commit_all(cp, thread, deltas)
    # A fork from an old checkpoint, and an interrupted checkpoint in the middle.
    fork = cp.commit(
        thread, parent_id=metas[5].checkpoint_id, expected_head=metas[-1].checkpoint_id,
        delta={"messages": extend([message(99)])}, step=6, source="update", metadata={"interrupted": True},
    )  # fmt: skip
    everything = [*metas, fork]
    before = {m.checkpoint_id: cp.get(thread, m.checkpoint_id).values for m in everything}
    result = cp.prune(thread, keep_last=8)
    assert result.checkpoints_deleted > 0 and result.snapshots_written >= 1
    kept = {m.checkpoint_id for m in cp.history(thread)}
    assert fork.checkpoint_id in kept  # the head (and an interrupted checkpoint) always stay
    assert len(kept) == len(everything) - result.checkpoints_deleted
    fresh = backend.make(cache_size=0) if backend.persistent else cp
    for checkpoint_id in kept:
        assert fresh.get(thread, checkpoint_id).values == before[checkpoint_id]
    for checkpoint_id in set(before) - kept:
        with pytest.raises(CheckpointNotFoundError):
            fresh.get(thread, checkpoint_id)
    # The thread goes on as before.
    head = cp.head(thread)
    cp.commit(thread, parent_id=head, expected_head=head, delta={"messages": extend([message(100)])}, step=7,
              source="update")  # fmt: skip
    assert fresh.get(thread).values["messages"][-1] == message(100)


@pytest.mark.slow
def test_prune_by_age_keeps_young_checkpoints_and_skips_a_leased_thread(backend: Harness) -> None:
    cp = backend.make()
    old_thread, busy_thread = new_thread(), new_thread()
    old = commit_all(cp, old_thread, [{"x": replace(i)} for i in range(4)])
    commit_all(cp, busy_thread, [{"x": replace(i)} for i in range(4)])
    time.sleep(0.2)
    young = commit_all(cp, old_thread, [{"x": replace(10)}])
    lease = cp.acquire_lease(busy_thread, owner="live-run")
    result = cp.prune(older_than=dt.timedelta(seconds=0.1))
    assert result.threads_skipped == [busy_thread]
    assert [m.checkpoint_id for m in cp.history(old_thread)] == [young[0].checkpoint_id]
    assert len(cp.history(busy_thread)) == 4
    assert cp.get(old_thread).values == {"x": 10}
    assert all(m.checkpoint_id != old[0].checkpoint_id for m in cp.history(old_thread))
    cp.release_lease(lease)
    with pytest.raises(ValueError, match="keep_last"):
        cp.prune(keep_last=0)
    with pytest.raises(ValueError, match="older_than"):
        cp.prune(older_than=-1)


# --- snapshots --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_snapshots_bound_the_chain_a_cold_read_replays(backend: Harness) -> None:
    cp = backend.make(snapshot_min_bytes=2_000)
    thread = new_thread()
    metas = commit_all(cp, thread, [{"messages": extend([message(i)]), "n": replace(i)} for i in range(120)])
    reader = backend.make(cache_size=0) if backend.persistent else cp
    reader._cache.clear()
    fetched: list[int] = []
    execute = reader._execute

    def counting(op: Any) -> Any:
        result = execute(op)
        if isinstance(op, ReadChain):
            fetched.append(len(result))
        return result

    reader._execute = counting  # type: ignore[method-assign]
    values = reader.get(thread).values
    assert values["n"] == 119 and values["messages"] == [message(i) for i in range(120)]
    assert fetched and fetched[0] < 60  # from the last snapshot, not from the root
    for meta in metas[::17]:  # every checkpoint still reads as it was written
        assert reader.get(thread, meta.checkpoint_id).values["n"] == meta.step
    # Bytes per step stay flat: later steps write no more, on average, than early ones.
    if backend.persistent:
        early = sum(backend.row_bytes(cp, thread, m.checkpoint_id) for m in metas[10:60])
        late = sum(backend.row_bytes(cp, thread, m.checkpoint_id) for m in metas[70:120])
        assert late < 3 * early


# --- migrating a database written by the previous version --------------------------------------------------------


def test_a_version_1_database_is_migrated_and_reads_as_before(backend: Harness) -> None:
    if not backend.persistent:
        pytest.skip("no schema")
    import json

    if backend.name == "sqlite":
        import sqlite3

        from haystack_state.persistence.sqlite import MIGRATIONS

        conn = sqlite3.connect(backend.path)  # type: ignore[attr-defined]
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("CREATE TABLE haystack_state_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        conn.execute("INSERT INTO haystack_state_migrations VALUES (1, '2025-01-01T00:00:00+00:00')")
        conn.execute(
            "INSERT INTO haystack_state_threads VALUES ('old', 'c1', 1, '2025-01-01T00:00:00+00:00', "
            "'2025-01-01T00:00:00+00:00')"
        )
        conn.execute(
            "INSERT INTO haystack_state_checkpoints VALUES ('old', 'c1', 1, NULL, 0, 'tools', ?, ?, "
            "'2025-01-01T00:00:00+00:00', '{}', ?)",
            (json.dumps(["search"]), json.dumps(["x"]), json.dumps({"x": {"op": "replace", "value": 1}})),
        )
        conn.commit()
        conn.close()
    else:
        import psycopg
        from psycopg import sql

        from haystack_state.persistence.postgres import MIGRATIONS

        names = {
            name: sql.Identifier(backend.schema, f"haystack_state_{name}")  # type: ignore[attr-defined]
            for name in ("threads", "checkpoints", "migrations")
        }
        with psycopg.connect(backend.dsn, autocommit=True) as conn:  # type: ignore[attr-defined]
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(backend.schema)))  # type: ignore[attr-defined]
            for statement in MIGRATIONS[0]:
                conn.execute(sql.SQL(statement).format(**names))
            conn.execute(
                sql.SQL("CREATE TABLE {migrations} (version integer PRIMARY KEY, applied_at timestamptz)").format(
                    **names
                )
            )
            conn.execute(sql.SQL("INSERT INTO {migrations} VALUES (1, now())").format(**names))
            conn.execute(sql.SQL("INSERT INTO {threads} VALUES ('old', 'c1', 1, now(), now())").format(**names))
            conn.execute(
                sql.SQL(
                    "INSERT INTO {checkpoints} VALUES ('old', 'c1', 1, NULL, 0, 'tools', %s, %s, now(), '{{}}', %s)"
                ).format(**names),
                (["search"], ["x"], json.dumps({"x": {"op": "replace", "value": 1}})),
            )
    cp = backend.make()
    assert backend.migrations(cp) == list(range(1, len(MIGRATIONS) + 1))
    assert cp.get("old").values == {"x": 1}
    meta = cp.history("old")[0]
    assert meta.tool_names == ("search",) and meta.changed_keys == ("x",)
    commit_all(cp, "old", [{"x": replace(2)}])
    assert backend.make(cache_size=0).get("old").values == {"x": 2}


def test_a_version_2_sqlite_database_with_text_snapshots_reads_and_then_stores_them_compressed(tmp_path: Any) -> None:
    import json
    import sqlite3

    from haystack_state.persistence import SQLiteCheckpointer
    from haystack_state.persistence.sqlite import MIGRATIONS

    path = tmp_path / "v2.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE haystack_state_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    for version in (1, 2):
        for statement in MIGRATIONS[version - 1]:
            conn.execute(statement)
        conn.execute("INSERT INTO haystack_state_migrations VALUES (?, '2025-01-01T00:00:00+00:00')", (version,))
    conn.execute(
        "INSERT INTO haystack_state_threads (thread_id, head_id, last_seq, created_at, updated_at) "
        "VALUES ('old', 'c2', 2, '2025-01-01T00:00:00+00:00', '2025-01-01T00:00:00+00:00')"
    )
    rows = [
        ("c1", 1, None, {"xs": {"op": "extend", "items": [1, 2]}}, None),
        ("c2", 2, "c1", {"xs": {"op": "extend", "items": [3]}}, {"xs": [1, 2, 3], "note": "é"}),
    ]
    for checkpoint_id, seq, parent, delta, snapshot in rows:
        conn.execute(
            "INSERT INTO haystack_state_checkpoints VALUES ('old', ?, ?, ?, 0, 'tools', '[]', ?, "
            "'2025-01-01T00:00:00+00:00', '{}', ?, ?, 0, 0)",
            (
                checkpoint_id,
                seq,
                parent,
                json.dumps(list(delta)),
                json.dumps(delta),
                None if snapshot is None else json.dumps(snapshot, ensure_ascii=False),
            ),
        )
    conn.commit()
    conn.close()

    with SQLiteCheckpointer(path, cache_size=0, snapshot_min_bytes=0, snapshot_ratio=0.01) as cp:
        assert cp.get("old").values == {"xs": [1, 2, 3], "note": "é"}  # the TEXT snapshot, as version 2 wrote it
        assert cp.get("old", "c1").values == {"xs": [1, 2]}
        delta = {"xs": {"op": "extend", "items": [4]}}
        meta = cp.commit("old", parent_id="c2", expected_head="c2", delta=delta, step=1, source="tools")
    conn = sqlite3.connect(path)
    stored = conn.execute(
        "SELECT typeof(snapshot) FROM haystack_state_checkpoints WHERE checkpoint_id = ?", (meta.checkpoint_id,)
    ).fetchone()[0]
    versions = [r[0] for r in conn.execute("SELECT version FROM haystack_state_migrations ORDER BY 1")]
    conn.close()
    assert stored == "blob" and versions == list(range(1, len(MIGRATIONS) + 1))
    with SQLiteCheckpointer(path, cache_size=0) as cp:
        assert cp.get("old").values == {"xs": [1, 2, 3, 4], "note": "é"}
        assert cp.get("old", "c2").values == {"xs": [1, 2, 3], "note": "é"}


def test_a_snapshot_built_from_the_head_cache_equals_one_composed_from_the_rows(tmp_path: Any) -> None:
    import collections
    import sqlite3

    from haystack.dataclasses import ChatMessage, ToolCall

    from haystack_state.persistence import SQLiteCheckpointer, delete, extend
    from haystack_state.persistence.sqlite import unpack_snapshot

    call = ToolCall(tool_name="search", arguments={"q": "x", "n": [1, 2.5]}, id="c1")
    deltas: list[dict[str, Any]] = []
    for i in range(12):
        deltas.append({"messages": extend([ChatMessage.from_assistant(tool_calls=[call], meta={"i": i})])})
        deltas.append(
            {
                "messages": extend([ChatMessage.from_tool(f"result {i} é \U0001f600", origin=call)]),
                "counts": replace(collections.Counter({"a": i})),
                "pair": replace((i, "x")) if i % 3 else delete(),
                "tags": extend([{"i": i, "set": {i}}]),
            }
        )
    path = tmp_path / "snapshots.sqlite"
    settings: dict[str, Any] = {"snapshot_min_bytes": 0, "snapshot_ratio": 0.5}
    with SQLiteCheckpointer(path, **settings) as warm, SQLiteCheckpointer(path, cache_size=0, **settings) as cold:
        for cp, thread in ((warm, "warm"), (cold, "cold")):
            head = None
            for step, delta in enumerate(deltas):
                head = cp.commit(
                    thread, parent_id=head, expected_head=head, delta=delta, step=step, source="tools"
                ).checkpoint_id
        assert warm.get("warm").values == cold.get("cold").values
    conn = sqlite3.connect(path)
    snapshots = {
        thread: [
            unpack_snapshot(row[0])
            for row in conn.execute(
                "SELECT snapshot FROM haystack_state_checkpoints WHERE thread_id = ? ORDER BY seq", (thread,)
            )
        ]
        for thread in ("warm", "cold")
    }
    conn.close()
    assert sum(s is not None for s in snapshots["warm"]) >= 3
    assert snapshots["warm"] == snapshots["cold"]
