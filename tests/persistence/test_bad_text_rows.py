"""
Text that cannot be stored (a lone surrogate, half of a UTF-16 pair) is refused before anything is written: a State
write and a checkpointer commit raise ``StateTypeError`` (``UnstorableTextError``) naming the key and where in the
value. Rows stored before that (written straight into SQLite or PostgreSQL) read back with U+FFFD in place of the bad
characters and a warning naming the thread, and never fail a read, a listing or a search: the checkpoint tables and
the server's thread table alike.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state import State, StateTypeError, UnstorableTextError
from haystack_state.persistence import Checkpointer, extend, replace
from haystack_state.server._database import Change, Database, PostgresDatabase, SQLiteDatabase, Work
from haystack_state.server._storage import ServerStorage

if TYPE_CHECKING:
    from persistence.harness import Harness

BAD = "\ud800"
persistent = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def warnings_about(caplog: pytest.LogCaptureFixture, thread_id: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and thread_id in record.getMessage()
    ]


# --- writes refuse it ----------------------------------------------------------------------------------------------


SCHEMA: dict[str, Any] = {
    "name": {"type": str},
    "notes": {"type": list[str]},
    "profile": {"type": dict[str, Any]},
    "docs": {"type": list[dict[str, Any]]},
}


@pytest.mark.parametrize(
    ("key", "value", "path"),
    [
        ("name", f"a{BAD}", ""),
        ("notes", ["ok", f"b{BAD}"], "[1]"),
        ("notes", f"c{BAD}", ""),  # one item appended
        ("profile", {"a": [1, {"deep": BAD}]}, "['a'][1]['deep']"),
        ("profile", {"a": {BAD: 1}}, "['a']"),
        ("docs", [{"title": "x"}, {"tags": ("t", BAD)}], "[1]['tags'][1]"),
        ("messages", [ChatMessage.from_user(f"hi {BAD}")], "[0]._content[0].text"),
        ("messages", ChatMessage.from_assistant("x", meta={"k": [BAD]}), "._meta['k'][0]"),
    ],
)
def test_a_state_write_with_a_lone_surrogate_names_the_key_and_changes_nothing(key: str, value: Any, path: str) -> None:
    state = State(SCHEMA, {"name": "kept", "notes": ["kept"], "profile": {"kept": 1}, "docs": []})
    state.set("messages", [ChatMessage.from_user("kept")])
    before, changes = state.to_dict(), state.peek_changes()
    writes = [lambda: state.set(key, value), lambda: state.update({"name": "new", key: value})]
    for write in writes:
        with pytest.raises(StateTypeError) as raised:
            write()
        error = raised.value
        assert isinstance(error, UnstorableTextError) and error.key == key and error.path == path
        assert f"State key '{key}' cannot hold the text" in str(error)
        assert "lone surrogate '\\ud800'" in str(error) and "not valid Unicode text" in str(error)
        assert state.to_dict() == before and state.peek_changes() == changes
    staged = state.stage()
    with pytest.raises(UnstorableTextError):
        staged.set(key, value)
    with pytest.raises(UnstorableTextError, match="State key 'name'"):
        State(SCHEMA, {"name": BAD})


def test_valid_text_of_every_kind_is_kept() -> None:
    text = "é \u2028 \ud7ff\ue000 \ufffd \U0001f600 nul\x00"
    state = State(SCHEMA)
    state.update({"name": text, "notes": [text], "profile": {text: text}, "docs": [{text: [text]}]})
    state.set("messages", [ChatMessage.from_user(text)])
    assert state.get("profile") == {text: text} and state.get("messages")[0].text == text


COMMITS: list[tuple[dict[str, Any], str | None, str, str]] = [
    (
        {"delta": {"messages": extend([ChatMessage.from_user("ok"), ChatMessage.from_user(f"a{BAD}")])}},
        "messages",
        "State key 'messages'",
        "[1]._content[0].text of the appended items",
    ),
    ({"delta": {"notes": replace({"a": [BAD]})}}, "notes", "State key 'notes'", "['a'][0]"),
    ({"delta": {"notes": replace({BAD: 1})}}, "notes", "State key 'notes'", ""),
    ({"delta": {f"k{BAD}": replace(1)}}, f"k{BAD}", "The name of state key 'k\\ud800'", ""),
    ({"delta": {"x": replace(1)}, "metadata": {"m": [BAD]}}, None, "The checkpoint metadata", "['m'][0]"),
    ({"delta": {"x": replace(1)}, "tool_names": ["ok", f"t{BAD}"]}, None, "The checkpoint's tool_names", "[1]"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("kwargs", "key", "subject", "path"), COMMITS, ids=[s for _, _, s, _ in COMMITS])
def test_a_commit_with_a_lone_surrogate_names_the_key_and_writes_nothing(
    checkpointer: Checkpointer, kwargs: dict[str, Any], key: str | None, subject: str, path: str
) -> None:
    fresh, existing = new_thread(), new_thread()
    head = checkpointer.commit(
        existing, parent_id=None, expected_head=None, delta={"x": replace(0)}, step=0, source="input"
    ).checkpoint_id

    def sync(thread_id: str, parent: str | None) -> None:
        checkpointer.commit(thread_id, parent_id=parent, expected_head=parent, step=1, source="tools", **kwargs)

    def in_async(thread_id: str, parent: str | None) -> None:
        asyncio.run(
            checkpointer.acommit(thread_id, parent_id=parent, expected_head=parent, step=1, source="tools", **kwargs)
        )

    for thread_id, parent in ((fresh, None), (existing, head)):
        for commit in (sync, in_async):
            with pytest.raises(StateTypeError) as raised:
                commit(thread_id, parent)
            error = raised.value
            assert isinstance(error, UnstorableTextError) and error.key == key and error.path == path
            message = str(error)
            assert message.startswith(f"{subject} cannot hold the text{' at ' + path if path else ''}: "), message
            assert "lone surrogate '\\ud800'" in message and "not valid Unicode text" in message
    assert [info.thread_id for info in checkpointer.list_threads()] == [existing]
    assert checkpointer.head(existing) == head and len(checkpointer.history(existing)) == 1


# --- rows stored before read back repaired --------------------------------------------------------------------------


def _commit_thread(cp: Checkpointer) -> tuple[str, str]:
    thread_id = new_thread()
    call = ToolCall(tool_name="search", arguments={"q": "hello"}, id="c1")
    meta = cp.commit(
        thread_id,
        parent_id=None,
        expected_head=None,
        delta={
            "messages": extend([ChatMessage.from_assistant("hello there", tool_calls=[call])]),
            "profile": replace({"kept": "hello"}),
        },
        step=0,
        source="model",
        tool_names=["search"],
        metadata={"note": "hello"},
    )
    return thread_id, meta.checkpoint_id


@pytest.mark.slow
@persistent
def test_a_lone_surrogate_written_straight_into_a_checkpoint_reads_back_replaced_with_a_warning(
    backend: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    writer = backend.make()
    thread_id, checkpoint_id = _commit_thread(writer)
    other, _ = _commit_thread(writer)
    # What the codec wrote before lone surrogates were refused: their JSON escapes, in values, keys and metadata.
    delta = backend._sql(  # type: ignore[attr-defined]
        writer,
        "SELECT delta FROM haystack_state_checkpoints WHERE thread_id = ?"
        if backend.name == "sqlite"
        else "SELECT delta FROM {schema}.haystack_state_checkpoints WHERE thread_id = %s",
        (thread_id,),
    )[0][0]
    delta = delta.replace("hello there", "hello \\ud800there").replace('"kept"', '"kept\\udfff"')
    backend.corrupt(writer, thread_id, checkpoint_id, "delta", delta)
    backend.corrupt(writer, thread_id, checkpoint_id, "metadata", '{"note":"\\udc80"}')
    reader = backend.make(cache_size=0)
    with caplog.at_level(logging.WARNING):
        values = reader.get(thread_id).values
        read_only = reader.get(thread_id, read_only=True).values
        history = reader.history(thread_id)
        listed = reader.list_threads()
    assert values["messages"][0].text == "hello \ufffdthere"
    assert values["profile"] == {"kept\ufffd": "hello"} == dict(read_only["profile"])
    assert history[0].metadata == {"note": "\ufffd"}
    assert {info.thread_id for info in listed} == {thread_id, other}
    warned = warnings_about(caplog, thread_id)
    assert any(checkpoint_id in w and "delta" in w and "U+FFFD" in w for w in warned), warned
    assert any(checkpoint_id in w and "metadata" in w for w in warned), warned
    assert not warnings_about(caplog, other)
    # The thread goes on from its repaired state.
    head = reader.commit(
        thread_id, parent_id=checkpoint_id, expected_head=checkpoint_id, delta={"notes": replace(["more"])}, step=1,
        source="tools",
    ).checkpoint_id  # fmt: skip
    assert reader.get(thread_id, head).values["messages"][0].text == "hello \ufffdthere"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_invalid_utf8_written_straight_into_sqlite_reads_back_replaced_with_a_warning(
    backend: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    writer = backend.make()
    thread_id, checkpoint_id = _commit_thread(writer)
    surrogate = "\ud800".encode("utf-8", "surrogatepass")  # the bytes another program would write for U+D800
    backend._sql(  # type: ignore[attr-defined]
        writer,
        "UPDATE haystack_state_checkpoints SET delta = CAST(replace(CAST(delta AS BLOB), CAST('there' AS BLOB), ?) "
        "AS TEXT), metadata = CAST(? AS TEXT) WHERE thread_id = ?",
        (b"th" + surrogate + b"ere", b'{"note":"x' + b"\xff" + b'"}', thread_id),
    )
    reader = backend.make(cache_size=0)
    with caplog.at_level(logging.WARNING):
        values = reader.get(thread_id).values
        history = reader.history(thread_id)
        listed = reader.list_threads()
    assert values["messages"][0].text == "hello th\ufffd\ufffd\ufffdere"
    assert history[0].metadata == {"note": "x\ufffd"}
    assert [info.thread_id for info in listed] == [thread_id]
    assert any(checkpoint_id in w and "delta" in w for w in warnings_about(caplog, thread_id))


# --- the server's thread table -------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[ServerStorage]:
    database: Database
    if request.param == "sqlite":
        database = SQLiteDatabase(str(tmp_path / "server.sqlite"))
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        database = PostgresDatabase(dsn, schema=request.getfixturevalue("postgres_schema"))
    made = ServerStorage(database)
    yield made
    made.close()


def _store_metadata(storage: ServerStorage, thread_id: str, text: Any) -> None:
    """Write a thread's metadata text straight into its row (as written before requests were checked)."""
    cast = "CAST(:m AS TEXT)" if isinstance(text, bytes) else ":m"
    query = f"UPDATE {{threads}} SET metadata = {cast} WHERE thread_id = :id"
    Work(storage.database, lambda: (yield Change(query, {"m": text, "id": thread_id})), write=True).result()


@pytest.mark.slow
def test_a_lone_surrogate_in_a_stored_thread_record_reads_back_replaced_and_is_listed(
    storage: ServerStorage, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [f"t{i}-{uuid.uuid4().hex[:8]}" for i in range(3)]
    for thread_id in ids:
        storage.create_thread(thread_id, "me", {"tag": "x"}).result()
    storage.create_thread("someone-else", "you", {"tag": "x"}).result()
    _store_metadata(storage, ids[1], '{"tag":"x","note":"a\\ud800b","\\udc80":1}')
    with caplog.at_level(logging.WARNING):
        record = storage.get_thread(ids[1], "me").result()
        listed = storage.search_threads("me", limit=10).result()
        filtered = storage.search_threads("me", metadata={"tag": "x"}, sort_by="thread_id", sort_order="asc").result()
        counted = storage.count_threads("me", metadata={"tag": "x"}).result()
        matched = storage.search_threads("me", metadata={"note": "a\ufffdb"}).result()
    assert record is not None and record.metadata == {"tag": "x", "note": "a\ufffdb", "\ufffd": 1}
    assert {r.thread_id for r in listed} == set(ids)
    assert [r.thread_id for r in filtered] == sorted(ids) and counted == 3
    assert [r.thread_id for r in matched] == [ids[1]]  # matched on its repaired metadata
    warned = warnings_about(caplog, ids[1])
    assert warned and all("thread metadata" in w and "U+FFFD" in w for w in warned)
    storage.update_thread(ids[1], metadata={"more": 1}).result()  # written again: stored repaired
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = storage.get_thread(ids[1], "me").result()
    assert again is not None and again.metadata["note"] == "a\ufffdb" and not warnings_about(caplog, ids[1])


@pytest.mark.slow
def test_metadata_the_database_cannot_query_never_fails_a_search_or_a_count(
    storage: ServerStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """What the server wrote before requests were checked (NaN, Infinity; NUL, which PostgreSQL's jsonb refuses):
    matched in Python, and paged together with the database's matches."""
    ids = sorted(f"t{i}-{uuid.uuid4().hex[:8]}" for i in range(5))
    for i, thread_id in enumerate(ids):
        storage.create_thread(thread_id, "me", {"tag": "x", "i": i}).result()
    _store_metadata(storage, ids[1], '{"tag":"x","n":NaN}')
    _store_metadata(storage, ids[2], '{"tag":"x","z":"a\\u0000b"}')
    _store_metadata(storage, ids[3], '{"tag":"y","n":-Infinity}')
    with caplog.at_level(logging.WARNING):
        pages = [
            storage.search_threads(
                "me", metadata={"tag": "x"}, sort_by="thread_id", sort_order="asc", limit=2, offset=offset
            ).result()
            for offset in (0, 2, 4)
        ]
        counted = storage.count_threads("me", metadata={"tag": "x"}).result()
        other = storage.search_threads("me", metadata={"tag": "y"}).result()
        listed = storage.search_threads("me", limit=10).result()
    assert [[r.thread_id for r in page] for page in pages] == [[ids[0], ids[1]], [ids[2], ids[4]], []]
    assert counted == 4 and [r.thread_id for r in other] == [ids[3]] and len(listed) == 5
    assert pages[0][1].metadata == {"tag": "x", "n": None} and pages[1][0].metadata == {"tag": "x", "z": "a\x00b"}
    assert any("NaN" in w and "null" in w for w in warnings_about(caplog, ids[1]))


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
def test_metadata_that_is_not_json_reads_as_empty_and_never_fails_a_search(
    storage: ServerStorage, caplog: pytest.LogCaptureFixture
) -> None:
    storage.create_thread("t-bad", "me", {"tag": "x"}).result()
    storage.create_thread("t-good", "me", {"tag": "x"}).result()
    _store_metadata(storage, "t-bad", "{not json")
    with caplog.at_level(logging.WARNING):
        assert [r.thread_id for r in storage.search_threads("me", metadata={"tag": "x"}).result()] == ["t-good"]
        assert [r.metadata for r in storage.search_threads("me", sort_by="thread_id").result()] == [{"tag": "x"}, {}]
    assert any("not valid JSON" in w for w in warnings_about(caplog, "t-bad"))


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
def test_invalid_utf8_written_straight_into_the_sqlite_thread_table_is_read_and_listed(
    storage: ServerStorage, caplog: pytest.LogCaptureFixture
) -> None:
    storage.create_thread("t-bad", "me", {"tag": "x"}).result()
    storage.create_thread("t-good", "me", {"tag": "x"}).result()
    _store_metadata(storage, "t-bad", b'{"tag":"x","note":"a\xed\xa0\x80b"}')
    with caplog.at_level(logging.WARNING):
        listed = storage.search_threads("me", sort_by="thread_id").result()
        filtered = storage.search_threads("me", metadata={"tag": "x"}, sort_by="thread_id").result()
    assert [r.thread_id for r in listed] == [r.thread_id for r in filtered] == ["t-good", "t-bad"]
    assert listed[1].metadata == {"tag": "x", "note": "a\ufffd\ufffd\ufffdb"}
    assert warnings_about(caplog, "t-bad")
