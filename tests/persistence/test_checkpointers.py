"""The contract every checkpointer honours, run against the in-memory, SQLite and PostgreSQL backends."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from haystack.dataclasses import ChatMessage, Document, ToolCall

from haystack_state.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CodecError,
    ThreadConflictError,
    ThreadNotFoundError,
)
from haystack_state.persistence import Checkpointer, CheckpointMeta, delete, extend, replace
from haystack_state.persistence.delta import materialize
from haystack_state.persistence.ops import ReadChain

if TYPE_CHECKING:
    from persistence.harness import Harness


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def commit_all(cp: Checkpointer, thread_id: str, deltas: list[dict[str, Any]], **kwargs: Any) -> list[CheckpointMeta]:
    """Commit a linear chain of deltas; return the records, oldest first."""
    metas: list[CheckpointMeta] = []
    head = cp.head(thread_id)
    for step, delta in enumerate(deltas):
        meta = cp.commit(
            thread_id, parent_id=head, expected_head=head, delta=delta, step=step, source="update", **kwargs
        )
        metas.append(meta)
        head = meta.checkpoint_id
    return metas


class Unencodable:
    pass


# --- basic contract ------------------------------------------------------------------------------------------------


def test_commit_get_head_and_history(checkpointer: Checkpointer) -> None:
    cp, thread = checkpointer, new_thread()
    assert cp.head(thread) is None
    user = ChatMessage.from_user("What is the weather?")
    first = cp.commit(
        thread, parent_id=None, expected_head=None, delta={"messages": extend([user])}, step=0, source="input"
    )
    call = ToolCall(tool_name="weather", arguments={"city": "Berlin"}, id="c1")
    second = cp.commit(
        thread,
        parent_id=first.checkpoint_id,
        expected_head=first.checkpoint_id,
        delta={"messages": extend([ChatMessage.from_assistant(tool_calls=[call])])},
        step=1,
        source="model",
        metadata={"pending_tool_calls": [call], "reason": None},
    )
    third = cp.commit(
        thread,
        parent_id=second.checkpoint_id,
        expected_head=second.checkpoint_id,
        delta={"messages": extend([ChatMessage.from_tool("sunny", origin=call)]), "city": replace("Berlin")},
        step=2,
        source="tools",
        tool_names=["weather"],
    )

    assert cp.head(thread) == third.checkpoint_id
    assert first.checkpoint_id < second.checkpoint_id < third.checkpoint_id
    head = cp.get(thread)
    assert head.meta == third
    assert head.values == {
        "messages": [user, ChatMessage.from_assistant(tool_calls=[call]), ChatMessage.from_tool("sunny", origin=call)],
        "city": "Berlin",
    }

    history = cp.history(thread)
    assert history == [third, second, first]
    assert [m.parent_id for m in history] == [second.checkpoint_id, first.checkpoint_id, None]
    assert [(m.step, m.source, m.tool_names) for m in history] == [
        (2, "tools", ("weather",)),
        (1, "model", ()),
        (0, "input", ()),
    ]
    assert history[0].changed_keys == ("messages", "city")
    assert history[1].metadata == {"pending_tool_calls": [call], "reason": None}
    assert all(m.created_at.tzinfo is not None and m.created_at.utcoffset() == dt.timedelta(0) for m in history)
    assert history[2].created_at <= history[1].created_at <= history[0].created_at


def test_materialization_applies_extend_replace_and_delete(checkpointer: Checkpointer) -> None:
    deltas: list[dict[str, Any]] = [
        {"items": extend([1, 2]), "name": replace("a"), "doc": replace(Document(content="d", meta={"k": (1, 2)}))},
        {"items": extend([]), "name": delete(), "tags": extend({"x"}), "gone": delete()},
        {"items": replace(["fresh"]), "count": replace(0)},
        {"items": extend([3]), "count": replace(1), "tags": delete()},
        {"tags": extend(["y"]), "doc": delete(), "nested": replace({"a": [1, {"b": b"\x00"}], 2: (3,)})},
    ]
    thread = new_thread()
    commit_all(checkpointer, thread, deltas)
    assert checkpointer.get(thread).values == {
        "items": ["fresh", 3],
        "count": 1,
        "tags": ["y"],
        "nested": {"a": [1, {"b": b"\x00"}], 2: (3,)},
    }


@pytest.mark.slow
def test_time_travel_reads_every_checkpoint_exactly(checkpointer: Checkpointer) -> None:
    thread = new_thread()
    deltas: list[dict[str, Any]] = []
    for i in range(30):
        delta: dict[str, Any] = {"log": extend([f"entry {i}"])}
        if i % 3 == 0:
            delta["last"] = replace(i)
        if i % 7 == 6:
            delta["log"] = replace([f"reset {i}"])
        if i % 10 == 9:
            delta["last"] = delete()
        deltas.append(delta)
    metas = commit_all(checkpointer, thread, deltas)
    checkpointer.get(thread)  # warm the head cache: past reads must not use it
    for index in [0, 5, 6, 13, 29, 9, 10, 0]:
        assert checkpointer.get(thread, metas[index].checkpoint_id).values == materialize(deltas[: index + 1])
    assert checkpointer.get(thread).values == materialize(deltas)


def test_fork_from_a_past_checkpoint_leaves_the_old_branch_intact(checkpointer: Checkpointer) -> None:
    cp, thread = checkpointer, new_thread()
    a, b, c = commit_all(cp, thread, [{"log": extend(["a"])}, {"log": extend(["b"])}, {"log": extend(["c"])}])
    fork = cp.commit(
        thread,
        parent_id=b.checkpoint_id,
        expected_head=c.checkpoint_id,
        delta={"log": extend(["d"]), "forked": replace(True)},
        step=2,
        source="update",
    )
    assert cp.head(thread) == fork.checkpoint_id
    assert fork.parent_id == b.checkpoint_id
    assert cp.get(thread).values == {"log": ["a", "b", "d"], "forked": True}
    assert cp.get(thread, c.checkpoint_id).values == {"log": ["a", "b", "c"]}
    assert cp.get(thread, a.checkpoint_id).values == {"log": ["a"]}
    assert [m.checkpoint_id for m in cp.history(thread)] == [
        fork.checkpoint_id,
        c.checkpoint_id,
        b.checkpoint_id,
        a.checkpoint_id,
    ]

    # The old branch can still be continued, but only by a writer that knows the current head.
    with pytest.raises(ThreadConflictError):
        cp.commit(thread, parent_id=c.checkpoint_id, expected_head=c.checkpoint_id, delta={}, step=3, source="update")
    e = cp.commit(
        thread,
        parent_id=c.checkpoint_id,
        expected_head=fork.checkpoint_id,
        delta={"log": extend(["e"])},
        step=3,
        source="update",
    )
    assert cp.get(thread).values == {"log": ["a", "b", "c", "e"]}
    assert cp.get(thread, fork.checkpoint_id).values == {"log": ["a", "b", "d"], "forked": True}
    assert len(cp.history(thread)) == 5 and cp.head(thread) == e.checkpoint_id


def test_returned_values_are_fresh_copies(checkpointer: Checkpointer) -> None:
    thread = new_thread()
    commit_all(checkpointer, thread, [{"log": extend([{"n": 1}]), "meta": replace({"a": [1]})}])
    values = checkpointer.get(thread).values
    values["log"].append("mutated")
    values["log"][0]["n"] = 99
    values["meta"]["a"].append(2)
    assert checkpointer.get(thread).values == {"log": [{"n": 1}], "meta": {"a": [1]}}


# --- conflicts and concurrency -------------------------------------------------------------------------------------


def test_conflicts_are_detected_and_write_nothing(checkpointer: Checkpointer) -> None:
    cp, thread = checkpointer, new_thread()
    a, b = commit_all(cp, thread, [{"x": replace(1)}, {"x": replace(2)}])
    before = cp.history(thread)

    with pytest.raises(ThreadConflictError, match="another run committed first"):
        cp.commit(
            thread,
            parent_id=a.checkpoint_id,
            expected_head=a.checkpoint_id,
            delta={"x": replace(3)},
            step=2,
            source="update",
        )
    with pytest.raises(ThreadConflictError, match="already exists"):
        cp.commit(thread, parent_id=None, expected_head=None, delta={"x": replace(3)}, step=0, source="input")
    with pytest.raises(ThreadConflictError, match="does not exist"):
        cp.commit(
            new_thread(), parent_id=a.checkpoint_id, expected_head=a.checkpoint_id, delta={}, step=0, source="input"
        )
    with pytest.raises(CheckpointNotFoundError):
        cp.commit(
            thread, parent_id="no-such-checkpoint", expected_head=b.checkpoint_id, delta={}, step=2, source="update"
        )
    with pytest.raises(CheckpointError, match="needs a parent_id"):
        cp.commit(thread, parent_id=None, expected_head=b.checkpoint_id, delta={}, step=2, source="update")

    assert cp.history(thread) == before
    assert cp.get(thread).values == {"x": 2}
    assert [t.thread_id for t in cp.list_threads()] == [thread]


def _race(writers: list[Checkpointer], thread: str, parent: str | None) -> list[str]:
    """Let the writers commit to the thread at the same moment, all expecting ``parent`` as the head."""
    barrier = threading.Barrier(len(writers))
    outcomes: list[str] = []

    def write(cp: Checkpointer, index: int) -> None:
        barrier.wait()
        try:
            cp.commit(
                thread, parent_id=parent, expected_head=parent, delta={"who": replace(index)}, step=1, source="update"
            )
            outcomes.append("won")
        except ThreadConflictError:
            outcomes.append("conflict")
        except Exception as error:  # reported by the caller's assertion, not lost in the thread
            outcomes.append(repr(error))

    threads = [threading.Thread(target=write, args=(cp, i)) for i, cp in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return sorted(outcomes)


@pytest.mark.slow
def test_racing_writers_on_one_thread_exactly_one_wins(backend: Harness) -> None:
    first = backend.make()
    # Two threads sharing one checkpointer; with persistent storage also two checkpointers (as two processes).
    pairs = [[first, first]] + ([[first, backend.make()]] if backend.persistent else [])
    for writers in pairs:
        for _ in range(5):
            thread = new_thread()
            assert _race(writers, thread, None) == ["conflict", "won"]  # both create the thread
            head = first.head(thread)
            assert _race(writers, thread, head) == ["conflict", "won"]  # both append to the same head
            assert _race(writers * 2, thread, first.head(thread)) == ["conflict", "conflict", "conflict", "won"]
            history = first.history(thread)
            assert len(history) == 3 and history[1].parent_id == head
            assert writers[1].get(thread).meta == first.get(thread).meta == history[0]


def test_writers_of_different_threads_all_succeed(checkpointer: Checkpointer) -> None:
    errors: list[BaseException] = []
    threads_ids = [new_thread() for _ in range(4)]

    def work(thread: str) -> None:
        try:
            commit_all(checkpointer, thread, [{"log": extend([i])} for i in range(15)])
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=work, args=(t,)) for t in threads_ids]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert errors == []
    for thread in threads_ids:
        assert checkpointer.get(thread).values == {"log": list(range(15))}


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_writers_wait_only_for_writers_of_the_same_thread(postgres_dsn: str, postgres_schema: str) -> None:
    from psycopg import sql

    from haystack_state.persistence.postgres import PostgresCheckpointer

    with PostgresCheckpointer(postgres_dsn, schema=postgres_schema) as cp:
        locked, other = new_thread(), new_thread()
        (locked_head,) = commit_all(cp, locked, [{"x": replace(1)}])
        commit_all(cp, other, [{"x": replace(1)}])
        finished: list[str] = []

        def append(thread: str) -> None:
            commit_all(cp, thread, [{"x": replace(2)}])
            finished.append(thread)

        lock = sql.SQL("SELECT 1 FROM {} WHERE thread_id = %s FOR UPDATE").format(
            sql.Identifier(postgres_schema, "haystack_state_threads")
        )
        with cp._raw_connection() as conn:  # another transaction holds the row lock of one thread
            conn.execute(lock, (locked,))
            blocked = threading.Thread(target=append, args=(locked,))
            free = threading.Thread(target=append, args=(other,))
            blocked.start()
            free.start()
            free.join(timeout=10)
            blocked.join(timeout=0.5)
            assert finished == [other], "a commit to another thread waited, or one to the locked thread did not"
        blocked.join(timeout=10)
        assert finished == [other, locked]
        assert cp.get(locked).meta.parent_id == locked_head.checkpoint_id


# --- threads -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_list_and_delete_threads(checkpointer: Checkpointer) -> None:
    cp = checkpointer
    assert cp.list_threads() == []
    one, two = new_thread(), new_thread()
    commit_all(cp, one, [{"x": replace(1)}, {"x": replace(2)}])
    metas = commit_all(cp, two, [{"x": replace(1)}])
    infos = {info.thread_id: info for info in cp.list_threads()}
    assert set(infos) == {one, two}
    assert infos[one].checkpoint_count == 2 and infos[two].head_id == metas[0].checkpoint_id
    assert infos[two].created_at == metas[0].created_at == infos[two].updated_at
    assert cp.list_threads()[0].thread_id == two  # most recently updated first

    cp.delete_thread(one)
    assert [info.thread_id for info in cp.list_threads()] == [two]
    assert cp.head(one) is None
    with pytest.raises(ThreadNotFoundError):
        cp.get(one)
    with pytest.raises(ThreadNotFoundError):
        cp.delete_thread(one)
    # The id can be used again for a brand-new thread.
    commit_all(cp, one, [{"y": replace(1)}])
    assert cp.get(one).values == {"y": 1} and len(cp.history(one)) == 1


def test_unknown_threads_and_checkpoints(checkpointer: Checkpointer) -> None:
    cp, thread = checkpointer, new_thread()
    with pytest.raises(ThreadNotFoundError, match=thread):
        cp.get(thread)
    with pytest.raises(ThreadNotFoundError):
        cp.history(thread)
    commit_all(cp, thread, [{"x": replace(1)}])
    with pytest.raises(CheckpointNotFoundError, match="nope") as raised:
        cp.get(thread, "nope")
    assert isinstance(raised.value, KeyError) and raised.value.thread_id == thread


# --- failures write nothing; corrupt data is reported --------------------------------------------------------------


@pytest.mark.slow
def test_an_unencodable_value_raises_naming_its_key_and_writes_nothing(checkpointer: Checkpointer) -> None:
    cp, thread = checkpointer, new_thread()
    bad = {
        "messages": extend([ChatMessage.from_user("hi")]),
        "documents": extend([Document(content="a"), Document(content="b", meta={"x": Unencodable()})]),
    }
    with pytest.raises(CodecError) as raised:
        cp.commit(thread, parent_id=None, expected_head=None, delta=bad, step=0, source="input")
    message = str(raised.value)
    assert "State key 'documents'" in message and "documents[1].meta['x']" in message and "Unencodable" in message
    assert cp.head(thread) is None and cp.list_threads() == []

    (first,) = commit_all(cp, thread, [{"log": extend([1])}])
    with pytest.raises(CodecError, match=r"metadata\['why'\]"):
        cp.commit(
            thread,
            parent_id=first.checkpoint_id,
            expected_head=first.checkpoint_id,
            delta={},
            step=1,
            source="update",
            metadata={"why": Unencodable()},
        )
    with pytest.raises(ValueError, match="source"):
        cp.commit(
            thread, parent_id=first.checkpoint_id, expected_head=first.checkpoint_id, delta={}, step=1, source="nope"
        )
    with pytest.raises(ValueError, match="'log'"):
        cp.commit(
            thread,
            parent_id=first.checkpoint_id,
            expected_head=first.checkpoint_id,
            delta={"log": {"op": "append"}},
            step=1,
            source="update",
        )
    assert cp.history(thread) == [first]
    assert cp.get(thread).values == {"log": [1]}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("column", "text", "expected"),
    [
        ("delta", '{"log": {"op": "extend", "items": [1', "not valid JSON"),
        ("delta", '{"log": {"op": "truncate"}}', "expected an operation"),
        ("delta", '{"log": {"op": "extend", "items": [{"__type__": "os.system", "data": "rm -rf /"}]}}', "os.system"),
        ("metadata", '{"__type__": "subprocess.Popen", "data": {}}', "subprocess.Popen"),
    ],
)
def test_corrupt_rows_raise_naming_the_thread_and_checkpoint(
    backend: Harness, column: str, text: str, expected: str
) -> None:
    cp = backend.make(cache_size=0)
    thread = new_thread()
    metas = commit_all(cp, thread, [{"log": extend([i])} for i in range(4)])
    broken = metas[1].checkpoint_id
    backend.corrupt(cp, thread, broken, column, text)
    read = cp.history if column == "metadata" else cp.get
    with pytest.raises(CodecError) as raised:
        read(thread)
    message = str(raised.value)
    assert f"Thread '{thread}'" in message and f"checkpoint '{broken}'" in message and expected in message
    assert isinstance(raised.value, CheckpointError)
    if column == "delta":  # checkpoints before the corrupt one stay readable
        assert cp.get(thread, metas[0].checkpoint_id).values == {"log": [0]}


def test_extending_a_non_list_is_reported_at_read(backend: Harness) -> None:
    cp, thread = backend.make(cache_size=0), new_thread()
    metas = commit_all(cp, thread, [{"x": replace(1)}, {"x": extend([2])}])
    with pytest.raises(CheckpointError, match=f"checkpoint '{metas[1].checkpoint_id}'.*'x'"):
        cp.get(thread)
    assert cp.get(thread, metas[0].checkpoint_id).values == {"x": 1}


# --- durability and schema -----------------------------------------------------------------------------------------


def test_a_new_instance_sees_everything(backend: Harness) -> None:
    if not backend.persistent:
        pytest.skip("the in-memory checkpointer keeps nothing across instances")
    thread = new_thread()
    with backend.make() as writer:
        metas = commit_all(writer, thread, [{"log": extend([ChatMessage.from_user(str(i))])} for i in range(5)])
        fork = writer.commit(
            thread,
            parent_id=metas[2].checkpoint_id,
            expected_head=metas[4].checkpoint_id,
            delta={"log": extend(["fork"])},
            step=3,
            source="update",
        )
        history = writer.history(thread)
        threads = writer.list_threads()
    reader = backend.make()
    assert reader.head(thread) == fork.checkpoint_id
    assert reader.history(thread) == history
    assert reader.list_threads() == threads
    assert reader.get(thread).values == {
        "log": [ChatMessage.from_user("0"), ChatMessage.from_user("1"), ChatMessage.from_user("2"), "fork"]
    }
    assert reader.get(thread, metas[4].checkpoint_id).values == {
        "log": [ChatMessage.from_user(str(i)) for i in range(5)]
    }


def test_migrations_are_idempotent(backend: Harness) -> None:
    if not backend.persistent:
        pytest.skip("the in-memory checkpointer has no schema")
    first = backend.make()
    thread = new_thread()
    commit_all(first, thread, [{"x": replace(1)}])
    second = backend.make()
    third = backend.make()
    if backend.name == "sqlite":
        from haystack_state.persistence.sqlite import MIGRATIONS
    else:
        from haystack_state.persistence.postgres import MIGRATIONS
    assert backend.migrations(first) == backend.migrations(third) == list(range(1, len(MIGRATIONS) + 1))
    assert second.get(thread).values == {"x": 1}


def test_closed_checkpointer_refuses_work(backend: Harness) -> None:
    with backend.make() as cp:
        commit_all(cp, new_thread(), [{"x": replace(1)}])
    cp.close()  # idempotent
    with pytest.raises(CheckpointError, match="closed"):
        cp.list_threads()


# --- storage grows with the change, not with the thread ------------------------------------------------------------


@pytest.mark.slow
def test_bytes_written_per_step_stay_flat(backend: Harness) -> None:
    cp, thread = backend.make(), new_thread()
    steps, window = 800, 100
    head: str | None = None
    row_bytes: dict[int, int] = {}
    storage: dict[int, int | None] = {}
    for step in range(1, steps + 1):
        if step in (window, 2 * window, steps - window):
            storage[step] = backend.storage_bytes(cp)
        item = ChatMessage.from_user(f"{step:05d} " + "x" * 1000)
        head = cp.commit(
            thread, parent_id=head, expected_head=head, delta={"messages": extend([item])}, step=step, source="tools"
        ).checkpoint_id
        if step in (10, steps):
            row_bytes[step] = backend.row_bytes(cp, thread, head)
    storage[steps] = backend.storage_bytes(cp)

    assert row_bytes[steps] <= 1.1 * row_bytes[10], (
        f"step {steps} wrote {row_bytes[steps]} B, step 10 {row_bytes[10]} B"
    )
    early, late = storage[2 * window], storage[steps]
    if early is not None and late is not None:
        grew_early = early - (storage[window] or 0)
        grew_late = late - (storage[steps - window] or 0)
        assert grew_late <= 2 * grew_early, f"{window} steps grew storage by {grew_early} B early, {grew_late} B late"

    values = cp.get(thread).values
    assert len(values["messages"]) == steps and values["messages"][-1].text.startswith(f"{steps:05d}")
    if backend.persistent:  # a cold reader materializes the whole chain once, exactly
        assert backend.make().get(thread).values == values


@pytest.mark.slow
def test_reading_the_head_only_fetches_new_checkpoints(backend: Harness) -> None:
    cp = backend.make()
    fetched: list[int] = []
    execute = cp._execute

    def counting(op: Any) -> Any:
        result = execute(op)
        if isinstance(op, ReadChain):
            fetched.append(len(result))
        return result

    cp._execute = counting  # type: ignore[method-assign]
    thread = new_thread()
    metas = commit_all(cp, thread, [{"log": extend([i])} for i in range(50)])
    assert cp.get(thread).values == {"log": list(range(50))}
    assert fetched == []  # the commits kept the head's state: no chain read at all
    if backend.persistent:
        other = backend.make()
        commit_all(other, thread, [{"log": extend([50, 51])}, {"log": extend([52])}])
        assert cp.get(thread).values == {"log": list(range(53))}
        assert fetched == [2]  # only the two checkpoints written by the other instance
    fetched.clear()
    assert cp.get(thread, metas[9].checkpoint_id).values == {"log": list(range(10))}
    assert fetched == [10]


# --- backend specifics ---------------------------------------------------------------------------------------------


def test_sqlite_in_memory_database_is_shared_by_threads() -> None:
    from haystack_state.persistence import SQLiteCheckpointer

    with SQLiteCheckpointer(":memory:") as cp:
        thread = new_thread()
        commit_all(cp, thread, [{"log": extend([0])}])
        assert _race([cp, cp], thread, cp.head(thread)) == ["conflict", "won"]
        assert len(cp.history(thread)) == 2


def test_sqlite_uses_wal_and_refuses_a_newer_schema(tmp_path: Any) -> None:
    from haystack_state.persistence import SQLiteCheckpointer

    path = tmp_path / "state.sqlite"
    with SQLiteCheckpointer(path) as cp, cp._raw_connection() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("INSERT INTO haystack_state_migrations VALUES (99, 'future')")
    with pytest.raises(CheckpointError, match="version 99, newer"):
        SQLiteCheckpointer(path)


def _open_together(kind: str, path: str, barrier: Any, results: Any) -> None:
    from haystack_state.persistence import SQLiteCheckpointer
    from haystack_state.store import SQLiteStore

    barrier.wait()
    try:
        (SQLiteCheckpointer if kind == "checkpointer" else SQLiteStore)(path).close()
        results.put("opened")
    except Exception as exc:
        results.put(str(exc))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["checkpointer", "store"])
def test_sqlite_processes_that_open_one_new_file_together_all_open_it(tmp_path: Any, kind: str) -> None:
    """
    Worker processes starting together on a new file all switch it to WAL; SQLite calls no busy handler for that
    switch, and one of eight used to fail with "database is locked" about once in ten starts.
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")
    processes = 8
    for start in range(12):
        path = str(tmp_path / f"{start}.sqlite")
        barrier, results = context.Barrier(processes), context.Queue()
        workers = [
            context.Process(target=_open_together, args=(kind, path, barrier, results)) for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        assert outcomes == ["opened"] * processes, f"start {start}: {outcomes}"


def test_a_sqlite_pool_dropped_without_close_closes_its_connections(tmp_path: Any) -> None:
    """
    A checkpointer, store or server nobody closes (an Agent in a Haystack pipeline) closes its SQLite connections
    when it is collected, rather than leaving them to their own finalizers, which Python 3.13 reports as a
    ``ResourceWarning: unclosed database`` (an error under ``-W error``).
    """
    import gc
    import sqlite3

    from haystack_state._db.sqlite import SQLitePool

    pool = SQLitePool(str(tmp_path / "dropped.sqlite"), timeout=5.0)
    with pool.connection(write=True) as conn, pool.connection(inline=True) as inline:
        conn.execute("CREATE TABLE t (x)")
    del pool
    gc.collect()
    for left in (conn, inline):
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            left.execute("SELECT 1")

    closed = SQLitePool(str(tmp_path / "closed.sqlite"), timeout=5.0)
    closed.close()
    with closed.connection() as again:  # a closed pool opens connections again when asked
        assert again.execute("SELECT 1").fetchone() == (1,)
    closed.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        again.execute("SELECT 1")


@pytest.mark.postgres
def test_postgres_borrows_a_given_pool_without_closing_it(postgres_dsn: str, postgres_schema: str) -> None:
    from psycopg_pool import ConnectionPool

    from haystack_state.persistence.postgres import PostgresCheckpointer

    with ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=True) as pool:  # connections not in autocommit
        with PostgresCheckpointer(pool=pool, schema=postgres_schema) as cp:
            thread = new_thread()
            first, _ = commit_all(cp, thread, [{"log": extend([1])}, {"log": extend([2])}])
            assert cp.get(thread).values == {"log": [1, 2]}
            with pytest.raises(ThreadConflictError):
                stale = first.checkpoint_id
                cp.commit(thread, parent_id=stale, expected_head=stale, delta={}, step=2, source="update")
        assert not pool.closed
        with PostgresCheckpointer(pool=pool, schema=postgres_schema) as again:
            assert again.get(thread).values == {"log": [1, 2]}
        with pytest.raises(ValueError, match="either conninfo or pool"):
            PostgresCheckpointer(postgres_dsn, pool=pool)


def test_postgres_module_without_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes "import psycopg" fail, as if it were not installed
    monkeypatch.delitem(sys.modules, "haystack_state.persistence.postgres", raising=False)
    with pytest.raises(ImportError, match=r'pip install "haystack-state\[postgres\]"'):
        importlib.import_module("haystack_state.persistence.postgres")
