"""
The command line as a new user meets it (issue 25): read-only files and directories are read and never written,
a missing file says so, read-only commands create nothing (no SQLite file, table or ``-wal``; no PostgreSQL schema
or table), ``demo`` on PostgreSQL and its follow-up commands, ``serve`` without ``--db``, ``delete``'s confirmation,
``log``, ``show --key messages`` as a transcript, plurals and scores, and ``--help`` without haystack.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from persistence.harness import postgres_dsn, postgres_schema

import haystack_state_cli
from cli.test_cli import Run, assert_fails, console_script, follow_ups, run
from haystack_state import SQLiteCheckpointer
from haystack_state._cli_text import plural, score_text
from haystack_state.cli import main, short_ids
from haystack_state.demo import QUESTIONS
from haystack_state.persistence import replace
from haystack_state.persistence.sqlite import connect_read_only

PROG = "haystack-state"
ENV = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"}
__all__ = ["postgres_dsn", "postgres_schema"]  # fixtures


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of a folder with its size and modification time: what a write would change."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def demo_db(folder: Path, *extra: str) -> Path:
    """A database with a one-turn demo thread ``research`` and one store item, folded into the main file."""
    db = folder / "demo.db"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["demo", "--db", str(db), "--turns", "1", *extra]) == 0
        assert main(["store", "put", "users.u1", "m1", '{"text": "likes green tea"}', "--db", str(db)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["demo.db"]  # no -wal or -shm left
    return db


def checkpoints(db: Path, thread: str) -> int:
    with SQLiteCheckpointer(db, read_only=True) as checkpointer:
        return len(checkpointer.history(thread))


READS = [
    ["threads", "{db}"],
    ["show", "{db}", "research"],
    ["show", "{db}", "research", "--key", "messages"],
    ["history", "{db}", "research"],
    ["diff", "{db}", "research", "{first}", "{head}"],
    ["log", "{db}", "research"],
    ["log", "{db}", "research", "--at", "{first}", "--json"],
    ["store", "get", "users.u1", "m1", "--db", "{db}"],
    ["store", "search", "users", "--query", "tea", "--db", "{db}"],
    ["store", "namespaces", "--db", "{db}"],
]
WRITES = [
    ["prune", "{db}", "--keep-last", "1"],
    ["delete", "{db}", "research", "--yes"],
    ["store", "delete", "users.u1", "m1", "--db", "{db}"],
    ["store", "put", "users.u1", "m2", "{{}}", "--db", "{db}"],
    ["demo", "--db", "{db}", "--turns", "1"],
]


def _args(command: list[str], db: Path) -> list[str]:
    with SQLiteCheckpointer(db, read_only=True) as checkpointer:
        history = checkpointer.history("research")
    shorts = short_ids(history)
    return [
        a.format(db=db, first=shorts[history[-1].checkpoint_id], head=shorts[history[0].checkpoint_id]) for a in command
    ]


def _name(command: list[str]) -> str:
    return " ".join(word for word in command[:3] if not word.startswith("{") and word not in ("users.u1", "research"))


# --- read-only files and directories -------------------------------------------------------------------------------


@pytest.fixture
def read_only_file(tmp_path: Path) -> Iterator[Path]:
    db = demo_db(tmp_path)
    db.chmod(0o444)
    yield db
    db.chmod(0o644)


@pytest.mark.parametrize("command", READS, ids=_name)
def test_a_read_only_file_is_read_by_every_read_command(
    command: list[str], read_only_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = files(read_only_file.parent)
    result = run(capsys, *_args(command, read_only_file))
    assert result.code == 0, result.err
    assert result.out and result.err == ""
    assert files(read_only_file.parent) == before  # nothing written, no -wal or -shm left


@pytest.mark.parametrize("command", WRITES, ids=_name)
def test_a_read_only_file_is_not_changed_and_the_error_says_read_only(
    command: list[str], read_only_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its mode lets nobody write it: refused even for root, who could.
    before = files(read_only_file.parent)
    args = _args(command, read_only_file)
    name = f"{command[0]} {command[1]}" if command[0] == "store" else command[0]
    message = f"{read_only_file} is read-only (no write permission on the file): '{PROG} {name}' cannot change it"
    assert_fails(run(capsys, *args), f"{PROG}: error: {message}")
    assert files(read_only_file.parent) == before


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "ro"
    folder.mkdir()
    db = demo_db(folder)
    folder.chmod(0o555)
    yield db
    folder.chmod(0o755)


@pytest.mark.parametrize("command", READS, ids=_name)
def test_a_file_in_a_read_only_directory_is_read_by_every_read_command(
    command: list[str], read_only_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = files(read_only_folder.parent)
    result = run(capsys, *_args(command, read_only_folder))
    assert result.code == 0, result.err
    assert files(read_only_folder.parent) == before


def test_a_write_in_a_read_only_directory_says_read_only(
    read_only_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root may write in a read-only directory; test_as_an_unprivileged_user checks it as nobody")
    folder = read_only_folder.parent
    message = (
        f"{read_only_folder} is in a read-only directory ({folder}): '{PROG} prune' cannot change it (SQLite writes "
        "demo.db-wal and demo.db-shm beside the file)"
    )
    assert_fails(run(capsys, "prune", str(read_only_folder), "--keep-last", "1"), f"{PROG}: error: {message}")


def test_read_commands_open_sqlite_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What root's permissions cannot show: each read command opens the file read-only, and only that way."""
    import haystack_state._cli_open as opening

    db = demo_db(tmp_path)
    opened: list[tuple[str, bool]] = []

    class Checkpointer(SQLiteCheckpointer):
        def __init__(self, path: Any, **kwargs: Any) -> None:
            opened.append(("checkpointer", kwargs.get("read_only", False)))
            super().__init__(path, **kwargs)

    class Store(opening.SQLiteStore):
        def __init__(self, path: Any, **kwargs: Any) -> None:
            opened.append(("store", kwargs.get("read_only", False)))
            super().__init__(path, **kwargs)

    monkeypatch.setattr(opening, "SQLiteCheckpointer", Checkpointer)
    monkeypatch.setattr(opening, "SQLiteStore", Store)
    for command in READS:
        opened.clear()
        assert run(capsys, *_args(command, db)).code == 0
        assert opened and all(read_only for _, read_only in opened), (command, opened)


def test_a_read_only_connection_cannot_write_and_leaves_nothing(tmp_path: Path) -> None:
    db = demo_db(tmp_path)
    before = files(tmp_path)
    for mode in (0o644, 0o444):
        db.chmod(mode)
        with contextlib.closing(connect_read_only(db)) as conn:
            assert conn.execute("SELECT count(*) FROM haystack_state_threads").fetchone() == (1,)
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                conn.execute("CREATE TABLE typo (x)")
        assert files(tmp_path) == before
    missing = tmp_path / "missing.db"
    with pytest.raises(FileNotFoundError):
        connect_read_only(missing)
    assert not missing.exists()
    db.chmod(0o644)


_DRIVER = """
import contextlib, io, json, sys
import haystack_state_cli
results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = haystack_state_cli.main(argv)
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


@pytest.mark.slow
def test_as_an_unprivileged_user(capsys: pytest.CaptureFixture[str]) -> None:
    """Real permissions: a file nobody else may write, in a directory nobody else may write, read as nobody."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run as nobody (without root, the chmod tests see real permissions)")
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    # (CI's virtual environment lives in a directory only root may enter: then nobody cannot import haystack)
    if subprocess.run([*as_nobody, "-c", "import haystack_state"], env=ENV, capture_output=True).returncode:
        pytest.skip("nobody cannot run this interpreter or import the project and haystack")
    folder = Path(tempfile.mkdtemp(prefix="hs-cli-"))
    try:
        folder.chmod(0o755)  # root's: nobody may read it, not write in it
        db = demo_db(folder)  # root's, mode 644: nobody may read it, not write it
        reads = [_args(command, db) for command in READS]
        writes = [_args(command, db) for command in WRITES[:3]]
        before = files(folder)
        done = subprocess.run(
            [*as_nobody, "-c", _DRIVER], input=json.dumps(reads + writes), env=ENV, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)
        for argv, (code, out, err) in zip(reads, results, strict=False):
            assert code == 0 and out and err == "", (argv, err)
        for argv, (code, out, err) in zip(writes, results[len(reads) :], strict=True):
            assert code == 1 and out == "" and "is read-only (no write permission on the file)" in err, (argv, err)
        assert files(folder) == before
    finally:
        shutil.rmtree(folder)


# --- missing files and files without tables ------------------------------------------------------------------------


@pytest.mark.parametrize("command", READS + WRITES[:3], ids=_name)
def test_a_missing_file_says_it_does_not_exist_and_is_not_created(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.db"
    args = [a.format(db=missing, first="x", head="y") for a in command]
    assert_fails(run(capsys, *args), f"{PROG}: error: {missing} does not exist")
    assert list(tmp_path.iterdir()) == []


def test_store_reads_of_a_file_without_a_store_create_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "threads.db"
    with SQLiteCheckpointer(db) as checkpointer:
        checkpointer.commit("t", parent_id=None, expected_head=None, delta={"n": replace(1)}, step=0, source="update")
    before = files(tmp_path)
    message = (
        f"{db} holds no memory store (it has no haystack_state_store table; 'haystack-state store put' creates one)"
    )
    for action in (["namespaces"], ["search"], ["get", "a", "b"], ["delete", "a", "b"]):
        assert_fails(run(capsys, "store", *action, "--db", str(db)), f"{PROG}: error: {message}")
    assert files(tmp_path) == before


# --- PostgreSQL: a mistyped schema creates nothing ---------------------------------------------------------------


def _schemas(dsn: str, *names: str) -> list[str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        query = "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s) ORDER BY 1"
        return [row[0] for row in conn.execute(query, (list(names),))]


def _tables(dsn: str, schema: str) -> list[str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        query = "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1"
        return [row[0] for row in conn.execute(query, (schema,))]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_mistyped_schema_creates_nothing(
    postgres_dsn: str, postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = f"{postgres_schema}_typo"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["demo", "--db", postgres_dsn, "--schema", postgres_schema, "--turns", "1"]) == 0
    commands = [
        ["threads", postgres_dsn],
        ["show", postgres_dsn, "research"],
        ["history", postgres_dsn, "research"],
        ["log", postgres_dsn, "research"],
        ["diff", postgres_dsn, "research", "a", "b"],
        ["prune", postgres_dsn, "--keep-last", "1"],
        ["delete", postgres_dsn, "research", "--yes"],
    ]
    for command in commands:
        result = run(capsys, *command, "--schema", typo)
        assert result.code == 1 and result.out == "", command
        assert result.err.startswith(f"{PROG}: error: schema '{typo}' does not exist in {postgres_dsn} (schemas ")
        assert postgres_schema in result.err  # the schema that holds threads is named
    for action in (["namespaces"], ["search"], ["get", "a", "b"], ["delete", "a", "b"]):
        result = run(capsys, "store", *action, "--db", postgres_dsn, "--schema", typo)
        assert result.code == 1 and f"schema '{typo}' does not exist in {postgres_dsn}" in result.err
    assert _schemas(postgres_dsn, typo) == []


@pytest.mark.postgres
def test_a_schema_without_tables_gets_none(
    postgres_dsn: str, postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(postgres_schema)))
    result = run(capsys, "threads", postgres_dsn, "--schema", postgres_schema)
    assert result.code == 1
    assert result.err.startswith(
        f"{PROG}: error: schema '{postgres_schema}' of {postgres_dsn} holds no haystack-state threads (it has no "
        "haystack_state_threads table; "
    )
    result = run(capsys, "store", "search", "--db", postgres_dsn, "--schema", postgres_schema)
    assert result.code == 1 and "holds no memory store" in result.err and "store put' creates one" in result.err
    assert _tables(postgres_dsn, postgres_schema) == []


@pytest.mark.slow
@pytest.mark.postgres
def test_hints_and_messages_keep_the_schema(
    postgres_dsn: str, postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["demo", "--db", postgres_dsn, "--schema", postgres_schema, "--turns", "1"]) == 0
    assert_fails(
        run(capsys, "show", postgres_dsn, "nobody", "--schema", postgres_schema),
        f"{PROG}: error: no thread 'nobody' in schema '{postgres_schema}' of {postgres_dsn} (list them with: {PROG} "
        f"threads {postgres_dsn} --schema {postgres_schema})",
    )
    bad = run(capsys, "show", postgres_dsn, "research", "--at", "zzzzzzzz", "--schema", postgres_schema)
    assert f"(list them with: {PROG} history {postgres_dsn} research --schema {postgres_schema})" in bad.err
    assert run(capsys, "delete", postgres_dsn, "research", "--schema", postgres_schema, "-y").code == 0
    empty = run(capsys, "threads", postgres_dsn, "--schema", postgres_schema)
    assert empty.lines == [f"no threads in schema '{postgres_schema}' of {postgres_dsn}"]


# --- demo --------------------------------------------------------------------------------------------------------


def _run_follow_ups(capsys: pytest.CaptureFixture[str], result: Run) -> list[Run]:
    """Run each command a demo printed, as printed."""
    import shlex

    done = []
    for command in follow_ups(result):
        words = shlex.split(command)
        assert words[0] == PROG
        done.append(run(capsys, *words[1:]))
        assert done[-1].code == 0, (command, done[-1].err)
    return done


@pytest.mark.slow
@pytest.mark.postgres
def test_demo_on_postgresql(postgres_dsn: str, postgres_schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "demo", "--db", postgres_dsn, "--schema", postgres_schema, "--turns", "2")
    assert result.code == 0, result.err
    assert result.lines[0].startswith(f"Research assistant on thread 'research' in schema '{postgres_schema}' of ")
    commands = follow_ups(result)
    assert commands[0] == f"{PROG} log {postgres_dsn} research --schema {postgres_schema}"
    assert all(command.endswith(f"--schema {postgres_schema}") for command in commands)
    log = _run_follow_ups(capsys, result)[0]
    assert f"user       {QUESTIONS[1]}" in log.out
    report = run(capsys, "demo", "--db", postgres_dsn, "--schema", postgres_schema, "--turns", "1", "--json").json()
    assert report["db"] == postgres_dsn and report["schema"] == postgres_schema
    assert report["thread_id"] == "research-2"


@pytest.mark.slow
def test_demo_with_one_turn_suggests_a_diff_of_two_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "one.db"
    result = run(capsys, "demo", "--db", str(db), "--turns", "1")
    with SQLiteCheckpointer(db) as checkpointer:
        history = checkpointer.history("research")
    shorts = short_ids(history)
    diff = next(line for line in result.lines if f"{PROG} diff" in line)
    first, head = shorts[history[-1].checkpoint_id], shorts[history[0].checkpoint_id]
    assert diff.split("  # ")[0].split()[-2:] == [first, head] and first != head
    assert diff.endswith("# what the agent did in turn 1")
    changed = _run_follow_ups(capsys, result)[3]
    assert "no changes" not in changed.out and "notes     +1 item" in changed.lines


def test_demo_thread_names_the_thread_and_a_taken_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "named.db"
    first = run(capsys, "demo", "--db", str(db), "--turns", "1", "--thread", "bees")
    assert first.code == 0 and first.lines[0].startswith("Research assistant on thread 'bees' in ")
    assert all(" bees" in command for command in follow_ups(first)[:-1])
    assert_fails(
        run(capsys, "demo", "--db", str(db), "--turns", "1", "--thread", "bees"),
        f"{PROG}: error: thread 'bees' already exists in {db}, and the demo writes a new thread: pick another "
        f"--thread, or delete it first ({PROG} delete {db} bees)",
    )
    second = run(capsys, "demo", "--db", str(db), "--turns", "1")  # the default is free: research
    assert "thread 'research'" in second.lines[0]
    third = run(capsys, "demo", "--db", str(db), "--turns", "1")
    assert "thread 'research-2'" in third.lines[0]
    assert third.lines[1] == (
        "(a thread 'research' is there already: each run writes a new thread; --thread NAME names it)"
    )
    assert all(done.out for done in _run_follow_ups(capsys, third))  # each printed command reads research-2


def test_demo_questions_match_the_parser() -> None:
    assert len(QUESTIONS) == haystack_state_cli.DEMO_QUESTIONS


# --- serve without --db --------------------------------------------------------------------------------------------


def test_serve_without_db_says_that_db_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("fastapi")
    module = f"serve_target_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from haystack_state import Agent\n"
        "from haystack_state.testing import ScriptedChatGenerator\n"
        "agent = Agent(ScriptedChatGenerator(['hello']))\n"
    )
    monkeypatch.chdir(tmp_path)
    try:
        result = run(capsys, "serve", f"{module}:agent")
    finally:
        sys.modules.pop(module, None)
    assert_fails(
        result,
        f"{PROG}: error: agent 'agent' has no checkpointer to keep its threads in: add --db threads.db (a SQLite "
        "file, created if missing) or --db postgresql://...",
    )


# --- delete asks first -------------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    """A stdin that is a terminal, with the user's answer typed in."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("answer", "deleted"), [("y\n", True), ("YES\n", True), ("n\n", False), ("\n", False), ("", False)]
)
def test_delete_asks_on_a_terminal(
    answer: str, deleted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = demo_db(tmp_path)
    count = checkpoints(db, "research")
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    result = run(capsys, "delete", str(db), "research")
    question = f"Delete thread 'research' and its {count} checkpoints? [y/N] "
    assert result.err.startswith(question)
    with SQLiteCheckpointer(db, read_only=True) as checkpointer:
        assert (checkpointer.head("research") is None) == deleted
    if deleted:
        assert result.code == 0 and result.out == f"deleted thread 'research' ({count} checkpoints)\n"
    else:
        assert result.code == 1 and result.out == ""
        kept = f"{PROG}: not deleting thread 'research' and its {count} checkpoints: the answer was not yes"
        assert result.err.splitlines()[-1].endswith(kept)


def test_delete_without_a_terminal_needs_yes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = demo_db(tmp_path)
    before = files(tmp_path)
    count = checkpoints(db, "research")
    for json_flag in ([], ["--json"]):
        assert_fails(
            run(capsys, "delete", str(db), "research", *json_flag),
            f"{PROG}: error: not deleting thread 'research' and its {count} checkpoints: stdin is not a terminal to "
            "ask for a confirmation on; --yes (-y) deletes it without asking",
        )
    assert files(tmp_path) == before
    deleted = run(capsys, "delete", str(db), "research", "--yes", "--json")
    assert deleted.json() == {"deleted": "research", "checkpoints": count} and deleted.err == ""


@pytest.mark.slow
def test_delete_asks_on_a_real_terminal(tmp_path: Path) -> None:
    """The installed script, its stdin a pseudo-terminal: the question on stderr, the answer typed in."""
    db = demo_db(tmp_path)
    leader, follower = pty.openpty()
    try:
        os.write(leader, b"y\n")
        done = subprocess.run(
            [*console_script(), "delete", str(db), "research"],
            stdin=follower,
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("Delete thread 'research' and its ")
    assert done.stdout.startswith("deleted thread 'research' (")
    with SQLiteCheckpointer(db, read_only=True) as checkpointer:
        assert checkpointer.list_threads() == []


# --- log and show --key messages -----------------------------------------------------------------------------------


def _conversation(db: Path) -> list[Any]:
    """A thread ``chat`` whose conversation has a tool call, a failed result and a long result."""
    from haystack.dataclasses import ChatMessage, ToolCall

    lookup = ToolCall(tool_name="lookup", arguments={"city": "Zürich", "days": 2}, id="call_a")
    fetch = ToolCall(tool_name="fetch", arguments={"url": "https://example.org"}, id="call_b")
    messages = [
        ChatMessage.from_system("Be brief.", meta={"id": "00000000-0000-4000-8000-00000000a001"}),
        ChatMessage.from_user("Weather in Zürich?", meta={"id": "00000000-0000-4000-8000-00000000a002"}),
        ChatMessage.from_assistant(tool_calls=[lookup, fetch], meta={"id": "00000000-0000-4000-8000-00000000a003"}),
        ChatMessage.from_tool(
            "the service is down", lookup, error=True, meta={"id": "00000000-0000-4000-8000-00000000a004"}
        ),
        ChatMessage.from_tool("x" * 1000, fetch, meta={"id": "00000000-0000-4000-8000-00000000a005"}),
        ChatMessage.from_assistant("I could not find out.\nSorry."),  # stored without an id
    ]
    with SQLiteCheckpointer(db) as checkpointer:
        first = checkpointer.commit(
            "chat",
            parent_id=None,
            expected_head=None,
            delta={"messages": replace(messages[:2])},
            step=0,
            source="input",
        )
        checkpointer.commit(
            "chat",
            parent_id=first.checkpoint_id,
            expected_head=first.checkpoint_id,
            delta={"messages": replace(messages)},
            step=1,
            source="model",
        )
    return messages


def test_log_prints_the_conversation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "chat.db"
    _conversation(db)
    with SQLiteCheckpointer(db) as checkpointer:
        history = checkpointer.history("chat")
    shorts = short_ids(history)
    head, first = history[0], history[-1]
    text = run(capsys, "log", str(db), "chat")
    assert text.code == 0, text.err
    lines = text.lines
    assert lines[0] == (
        f"thread 'chat' at checkpoint {shorts[head.checkpoint_id]} (head), step 1, "
        f"{head.created_at:%Y-%m-%d %H:%M:%S} UTC: 6 messages"
    )
    assert lines[1] == ""
    assert lines[2:7] == [
        "0000a001 system     Be brief.",
        "0000a002 user       Weather in Zürich?",
        '0000a003 assistant  calls lookup(city="Zürich", days=2)  [call_a]',
        '                    calls fetch(url="https://example.org")  [call_b]',
        "0000a004 tool       lookup [call_a] FAILED: the service is down",
    ]
    assert lines[7].startswith("0000a005 tool       fetch [call_b] returned: xxx")
    assert lines[-3].endswith("xxx... (760 more characters; --json shows all)")  # 240 shown of 1000
    assert lines[-2:] == ["-        assistant  I could not find out.", "                    Sorry."]  # no id stored
    assert max(len(line) for line in lines) <= 100
    earlier = run(capsys, "log", str(db), "chat", "--at", shorts[first.checkpoint_id])
    assert earlier.lines[0].startswith(f"thread 'chat' at checkpoint {shorts[first.checkpoint_id]}, step 0")
    assert earlier.lines[0].endswith(": 2 messages") and len(earlier.lines) == 4

    document = run(capsys, "log", str(db), "chat", "--json").json()
    assert document["checkpoint_id"] == head.checkpoint_id and document["head"] is True
    records = document["messages"]
    assert [r["role"] for r in records] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert records[2]["tool_calls"] == [
        {"id": "call_a", "tool_name": "lookup", "arguments": {"city": "Zürich", "days": 2}},
        {"id": "call_b", "tool_name": "fetch", "arguments": {"url": "https://example.org"}},
    ]
    assert records[3]["tool_result"] == {
        "call_id": "call_a",
        "tool_name": "lookup",
        "arguments": {"city": "Zürich", "days": 2},
        "result": "the service is down",
        "error": True,
    }
    assert records[4]["tool_result"]["result"] == "x" * 1000  # whole
    assert records[5]["id"] == "chat-m5" and records[5]["text"] == "I could not find out.\nSorry."


def test_show_key_messages_is_the_transcript(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "chat.db"
    messages = _conversation(db)
    log = run(capsys, "log", str(db), "chat")
    shown = run(capsys, "show", str(db), "chat", "--key", "messages")
    assert shown.code == 0 and shown.out == log.out
    raw = run(capsys, "show", str(db), "chat", "--key", "messages", "--json").json()
    assert raw["type"] == "list[ChatMessage]" and raw["value"][1] == messages[1].to_dict()


def test_log_of_a_thread_without_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "plain.db"
    with SQLiteCheckpointer(db) as checkpointer:
        meta = checkpointer.commit(
            "t", parent_id=None, expected_head=None, delta={"n": replace(1)}, step=0, source="update"
        )
        checkpointer.commit(
            "odd",
            parent_id=None,
            expected_head=None,
            delta={"messages": replace(["hi"])},
            step=0,
            source="update",
        )
    assert_fails(
        run(capsys, "log", str(db), "t"),
        f"{PROG}: error: thread 't' has no messages at checkpoint {meta.checkpoint_id} (keys: n)",
    )
    assert_fails(
        run(capsys, "log", str(db), "odd"),
        f"{PROG}: error: the messages of thread 'odd' are list[str], not chat messages (see them with: {PROG} show "
        f"{db} odd --key messages --json)",
    )


# --- words and numbers -------------------------------------------------------------------------------------------


def test_plurals_and_scores() -> None:
    assert [plural(n, "snapshot") for n in (0, 1, 2)] == ["0 snapshots", "1 snapshot", "2 snapshots"]
    assert plural(1, "expired thread") == "1 expired thread"
    assert [score_text(s) for s in (0.000001, 0.8234, 12.345, 1234.5, 0.0, -0.25, 1.0)] == [
        "0.000001",
        "0.823",
        "12.3",
        "1234",
        "0",
        "-0.25",
        "1",
    ]


def test_the_commands_count_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "counts.db"
    with SQLiteCheckpointer(db, snapshot_min_bytes=0) as checkpointer:
        head = None
        for i in range(3):
            meta = checkpointer.commit(
                "t", parent_id=head, expected_head=head, delta={"n": replace(i)}, step=i, source="update"
            )
            head = meta.checkpoint_id
    pruned = run(capsys, "prune", str(db), "--keep-last", "1")
    assert pruned.lines[0] in {
        "removed 2 checkpoints, wrote 1 snapshot, deleted 0 expired threads",
        "removed 2 checkpoints, wrote 0 snapshots, deleted 0 expired threads",
    }
    assert run(capsys, "delete", str(db), "t", "-y").out == "deleted thread 't' (1 checkpoint)\n"
    found = run(capsys, "store", "put", "a", "k", '{"text": "green tea"}', "--db", str(db))
    assert found.code == 0
    searched = run(capsys, "store", "search", "--query", "tea", "--db", str(db))
    score = searched.out.split("score=")[1].strip()
    assert "e" not in score and float(score) > 0


# --- --help --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--help"], ["show", "--help"], ["log", "--help"], ["store", "search", "--help"]])
def test_help_imports_no_haystack(args: list[str]) -> None:
    """``--help`` answers from the parser alone (the time is measured by benchmarks/bench_cli.py, not here)."""
    script = (
        "import sys, haystack_state_cli\n"
        f"code = haystack_state_cli.main({args!r})\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('haystack', 'haystack_state'))\n"
        "print(code, loaded, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=60)
    assert done.stderr.strip() == "0 []"
    assert done.stdout.startswith(f"usage: {PROG}")


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "--help")
    assert result.code == 0
    listed = [line.split()[0] for line in result.lines if line.startswith("    ") and not line.startswith("     ")]
    expected = ["demo", "threads", "show", "log", "history", "diff", "delete", "prune", "serve", "store"]
    assert listed == expected
    delete = run(capsys, "delete", "--help")
    assert "-y, --yes" in delete.out and "without one (a script, a pipe) it needs --yes" in " ".join(delete.out.split())
