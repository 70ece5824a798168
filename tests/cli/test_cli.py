"""
The ``haystack-state`` command: the offline demo, and the read commands (``threads``, ``show``, ``history``,
``diff``) on the SQLite file the demo writes, in text and ``--json``; every failure is one line on stderr, a
non-zero exit code, and a database left as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from persistence.harness import postgres_dsn, postgres_schema

from haystack_state import SQLiteCheckpointer, State
from haystack_state.cli import main, short_ids
from haystack_state.demo import QUESTIONS, SCHEMA
from haystack_state.persistence.records import CheckpointMeta

PROG = "haystack-state"
__all__ = ["postgres_dsn", "postgres_schema"]  # fixtures


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    def json(self) -> Any:
        return json.loads(self.out)


def _files(folder: Path) -> dict[str, str]:
    """Every file of a folder with the SHA-256 of its content."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def run(capsys: pytest.CaptureFixture[str], *args: str, unchanged: Path | None = None) -> Run:
    """Run ``main(args)`` in-process; with ``unchanged``, assert the command left that folder's files as they were."""
    before = _files(unchanged) if unchanged is not None else None
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    if unchanged is not None:
        assert _files(unchanged) == before, f"{args} changed the files of {unchanged}"
    return Run(code, captured.out, captured.err)


def follow_ups(result: Run) -> list[str]:
    """The commands a demo printed to look at its thread again (without their comments)."""
    lines = result.lines
    return [line.split("  # ")[0].strip() for line in lines[lines.index("Look at it again with:") + 1 :]]


def assert_fails(result: Run, message: str, code: int = 1) -> None:
    """One line on stderr saying what went wrong (after argparse's usage, for bad arguments), nothing on stdout."""
    assert result.code == code
    assert result.out == ""
    lines = result.err.splitlines()
    assert lines[-1] == message
    if code == 1:
        assert len(lines) == 1
    assert "Traceback" not in result.err


@dataclass(frozen=True)
class Demo:
    """A database written by ``haystack-state demo`` (all turns), with its thread's records."""

    folder: Path
    db: Path
    thread: str
    history: list[CheckpointMeta]  # newest first

    @property
    def head(self) -> str:
        return self.history[0].checkpoint_id

    def first(self, source: str) -> CheckpointMeta:
        """The thread's oldest checkpoint from ``source``."""
        return next(meta for meta in reversed(self.history) if meta.source == source)

    def values(self, checkpoint_id: str | None = None) -> dict[str, Any]:
        with SQLiteCheckpointer(self.db) as checkpointer:
            return checkpointer.get(self.thread, checkpoint_id).values


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    folder = tmp_path_factory.mktemp("demo")
    db = folder / "research.db"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["demo", "--db", str(db), "--json"]) == 0
    thread = json.loads(out.getvalue())["thread_id"]
    with SQLiteCheckpointer(db) as checkpointer:
        history = checkpointer.history(thread)
    return Demo(folder, db, thread, history)


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


# --- demo ----------------------------------------------------------------------------------------------------------


def test_demo_prints_each_step_and_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with working_directory(tmp_path):
        result = run(capsys, "demo")
    assert result.code == 0, result.err
    db = tmp_path / "haystack_state_demo.db"  # the default file, in the working directory
    assert db.is_file()
    with SQLiteCheckpointer(db) as checkpointer:
        history = checkpointer.history("research")
        final = checkpointer.get("research").values
    lines = result.lines
    assert lines[0].startswith("Research assistant on thread 'research' in haystack_state_demo.db")
    for number, question in enumerate(QUESTIONS, start=1):
        assert f"Turn {number}. user: {question}" in lines
    # Each checkpoint prints its step, source and what it changed; appended items one per line.
    assert "  step  1 model messages  + assistant: calls search(query='honeybees tell flowers')" in lines
    assert "  step  1 tools messages  + tool: search returned" in result.out
    assert "                sources   + The waggle dance" in lines
    assert "                sources   + The round dance" in lines
    assert "                searches  + honeybees tell flowers" in lines
    assert "                notes     + Honeybees tell each other where flowers are with a waggle dance." in result.out
    # The run-scoped key is reset by the next turn's input checkpoint.
    assert "                searches  ['honeybees tell flowers'] -> unset  (reset: its scope is the run)" in lines
    assert "  assistant: Here is what I found: Honeybees usually fly 1 to 3 kilometres from the hive to find food." in (
        result.out
    )
    # The summary agrees with the database.
    counts = {source: sum(m.source == source for m in history) for source in ("input", "model", "tools")}
    expected = f"Thread 'research': {len(history)} checkpoints ({counts['input']} input, {counts['model']} model, "
    assert f"{expected}{counts['tools']} tools)." in lines
    sizes = State(SCHEMA, final).size()
    for key, size in sizes.items():
        assert f"  {key:<9} {size:>7,}" in lines
    # The commands to look at it again name the thread it wrote, and a diff of two different checkpoints.
    end_of_turn_1 = next(m for m in reversed(history) if m.source == "model" and m.step == 3)
    shorts = short_ids(history)
    assert follow_ups(result) == [
        "haystack-state log haystack_state_demo.db research",
        "haystack-state history haystack_state_demo.db research",
        "haystack-state show haystack_state_demo.db research",
        f"haystack-state diff haystack_state_demo.db research {shorts[end_of_turn_1.checkpoint_id]} "
        f"{shorts[history[0].checkpoint_id]}",
        "haystack-state threads haystack_state_demo.db",
    ]
    assert "  # what turns 2-4 changed" in lines[-2]
    assert result.err == ""


def test_demo_json_reports_every_turn_and_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "two.db"
    result = run(capsys, "demo", "--db", str(db), "--turns", "2", "--json")
    assert result.code == 0
    report = result.json()  # valid JSON and nothing else
    assert report["db"] == str(db)
    assert report["thread_id"] == "research"
    assert [turn["question"] for turn in report["turns"]] == list(QUESTIONS[:2])
    assert report["turns"][1]["answer"].startswith("Here is what I found: Honeybees usually fly")
    with SQLiteCheckpointer(db) as checkpointer:
        history = checkpointer.history("research")
        final = checkpointer.get("research").values
    listed = [entry["checkpoint_id"] for turn in report["turns"] for entry in turn["checkpoints"]]
    assert listed == [meta.checkpoint_id for meta in reversed(history)]  # every checkpoint, oldest first
    assert report["checkpoints"] == len(history)
    assert report["sizes"] == State(SCHEMA, final).size()
    first_tools = report["turns"][0]["checkpoints"][2]
    assert first_tools["source"] == "tools" and first_tools["tools"] == ["search"]
    assert {"key": "sources", "change": "+2 items", "added": ["The waggle dance", "The round dance"]} in (
        first_tools["changes"]
    )


def test_demo_on_an_existing_database_starts_a_new_thread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "again.db"
    assert run(capsys, "demo", "--db", str(db), "--turns", "1").code == 0
    with SQLiteCheckpointer(db) as checkpointer:
        first = checkpointer.history("research")
    result = run(capsys, "demo", "--db", str(db), "--turns", "1")
    assert result.code == 0
    assert "thread 'research-2'" in result.lines[0]
    assert all(" research-2" in command for command in follow_ups(result)[:-1])  # the commands read the new one
    with SQLiteCheckpointer(db) as checkpointer:
        assert checkpointer.history("research") == first  # the earlier thread is left alone
        assert sorted(t.thread_id for t in checkpointer.list_threads()) == ["research", "research-2"]


# --- threads -------------------------------------------------------------------------------------------------------


def test_threads(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    with SQLiteCheckpointer(demo.db) as checkpointer:
        [info] = checkpointer.list_threads()
    text = run(capsys, "threads", str(demo.db), unchanged=demo.folder)
    assert text.code == 0
    assert text.lines[0].split() == ["THREAD", "HEAD", "CHECKPOINTS", "UPDATED"]
    assert text.lines[1].split() == [
        demo.thread,
        demo.head,
        str(len(demo.history)),
        *info.updated_at.strftime("%Y-%m-%d %H:%M:%S UTC").split(),
    ]
    assert len(text.lines) == 2

    listed = run(capsys, "threads", str(demo.db), "--json", unchanged=demo.folder).json()
    assert listed == [
        {
            "thread_id": demo.thread,
            "head_id": demo.head,
            "checkpoint_count": len(demo.history),
            "created_at": info.created_at.isoformat(),
            "updated_at": info.updated_at.isoformat(),
        }
    ]


def test_threads_of_an_empty_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "empty.db"
    SQLiteCheckpointer(db).close()
    assert run(capsys, "threads", str(db), unchanged=tmp_path).lines == [f"no threads in {db}"]
    assert run(capsys, "threads", str(db), "--json", unchanged=tmp_path).json() == []


# --- history -------------------------------------------------------------------------------------------------------


def test_history_lists_checkpoints_newest_first(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    text = run(capsys, "history", str(demo.db), demo.thread, unchanged=demo.folder)
    assert text.code == 0
    header = ["CHECKPOINT", "PARENT", "STEP", "SOURCE", "TOOLS", "CREATED", "FORK", "CHANGED", "KEYS"]
    assert text.lines[0].split() == header
    assert max(len(line) for line in text.lines) <= 100
    rows = text.lines[1:]
    assert len(rows) == len(demo.history)
    shorts = short_ids(demo.history)
    assert len(set(shorts.values())) == len(demo.history)  # unique within the thread
    assert all(len(short) >= 8 and meta.endswith(short) for meta, short in shorts.items())
    for row, meta in zip(rows, demo.history, strict=True):
        cells = row.split()
        assert cells[:5] == [
            shorts[meta.checkpoint_id],
            shorts[meta.parent_id] if meta.parent_id else "-",
            str(meta.step),
            meta.source,
            ",".join(meta.tool_names) or "-",
        ]
        assert row.endswith(", ".join(meta.changed_keys)) or row.endswith("...")
    assert rows[-1].split()[1] == "-"  # the first checkpoint has no parent
    limited = run(capsys, "history", str(demo.db), demo.thread, "--limit", "3", unchanged=demo.folder)
    assert [line.split() for line in limited.lines[1:]] == [row.split() for row in rows[:3]]

    records = run(capsys, "history", str(demo.db), demo.thread, "--json", unchanged=demo.folder).json()
    assert [r["checkpoint_id"] for r in records] == [m.checkpoint_id for m in demo.history]
    tools = next(r for r in records if r["source"] == "tools")
    meta = next(m for m in demo.history if m.checkpoint_id == tools["checkpoint_id"])
    assert tools == {
        "fork": False,
        "checkpoint_id": meta.checkpoint_id,
        "parent_id": meta.parent_id,
        "step": meta.step,
        "source": "tools",
        "tools": list(meta.tool_names),
        "created_at": meta.created_at.isoformat(),
        "changed_keys": list(meta.changed_keys),
    }


# --- show ----------------------------------------------------------------------------------------------------------


def test_show_the_head(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    values = demo.values()
    sizes = State(SCHEMA, values).size()  # the CLI measures without the schema, and must agree
    text = run(capsys, "show", str(demo.db), demo.thread, unchanged=demo.folder)
    assert text.code == 0
    assert text.lines[:3] == [
        f"thread      {demo.thread}",
        f"checkpoint  {demo.head} (head)",
        f"step        {demo.history[0].step}, model, {demo.history[0].created_at:%Y-%m-%d %H:%M:%S} UTC",
    ]
    table = text.lines[4 : 5 + len(values)]
    assert table[0].split() == ["KEY", "TYPE", "BYTES", "VALUE"]
    assert [row.split()[0] for row in table[1:]] == list(sizes)  # largest first
    rows = {row.split()[0]: row.split() for row in table[1:]}
    assert rows["messages"][:4] == [
        "messages",
        "list[ChatMessage]",
        f"{sizes['messages']:,}",
        str(len(values["messages"])),
    ]
    assert rows["notes"][:3] == ["notes", "list[str]", f"{sizes['notes']:,}"]
    assert rows["sources"][1] == "list[dict]"
    assert text.lines[-1] == "pending tool calls: none"

    shown = run(capsys, "show", str(demo.db), demo.thread, "--json", unchanged=demo.folder).json()
    assert shown["thread_id"] == demo.thread and shown["checkpoint_id"] == demo.head and shown["head"] is True
    assert shown["interrupted"] is False and shown["pending_tool_calls"] == []
    assert {k["key"]: k["size"] for k in shown["keys"]} == sizes
    keys = {k["key"]: k for k in shown["keys"]}
    assert keys["notes"]["value"] == values["notes"]
    assert keys["messages"]["value"][1] == {**values["messages"][1].to_dict()}
    assert keys["messages"]["type"] == "list[ChatMessage]"


def test_show_an_earlier_checkpoint_with_pending_tool_calls(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    # The first model checkpoint holds the reply that calls search; its results are committed by the next one.
    model = demo.first("model")
    text = run(capsys, "show", str(demo.db), demo.thread, "--at", model.checkpoint_id, unchanged=demo.folder)
    assert text.code == 0
    assert text.lines[1] == f"checkpoint  {model.checkpoint_id}"  # not the head
    assert text.lines[-2:] == ["pending tool calls:", '  call_1  search({"query": "honeybees tell flowers"})']

    shown = run(capsys, "show", str(demo.db), demo.thread, "--at", model.checkpoint_id, "--json").json()
    assert shown["head"] is False and shown["step"] == model.step and shown["source"] == "model"
    assert shown["pending_tool_calls"] == [
        {"id": "call_1", "tool_name": "search", "arguments": {"query": "honeybees tell flowers"}}
    ]
    assert [k["key"] for k in shown["keys"]] == ["messages"]  # nothing else was set yet


def test_show_takes_a_unique_prefix_of_a_checkpoint_id(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    target = demo.first("tools").checkpoint_id
    text = run(capsys, "show", str(demo.db), demo.thread, "--at", target[:-1], unchanged=demo.folder)
    assert text.lines[1] == f"checkpoint  {target}"


# --- diff ----------------------------------------------------------------------------------------------------------


def test_diff_shows_what_changed_from_a_to_b(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    start = demo.first("tools")  # after the first search
    before, after = demo.values(start.checkpoint_id), demo.values()
    text = run(capsys, "diff", str(demo.db), demo.thread, start.checkpoint_id, demo.head, unchanged=demo.folder)
    assert text.code == 0
    assert text.lines[0] == f"from  {start.checkpoint_id}  step {start.step}, tools"
    assert text.lines[1] == f"to    {demo.head}  step {demo.history[0].step}, model"
    added = len(after["messages"]) - len(before["messages"])
    assert f"messages  +{added} items" in text.lines
    assert "sources   +2 items" in text.lines
    assert "            + How far bees fly for food" in text.lines  # the appended items, one a line
    assert "notes     +3 items" in text.lines  # an unset key that gets items is appended to
    assert "searches  ['honeybees tell flowers'] -> unset" in text.lines

    report = run(capsys, "diff", str(demo.db), demo.thread, start.checkpoint_id, demo.head, "--json").json()
    assert report["from"]["checkpoint_id"] == start.checkpoint_id and report["to"]["checkpoint_id"] == demo.head
    changes = report["changes"]
    assert sorted(changes) == ["messages", "notes", "searches", "sources"]
    assert changes["notes"] == {"change": "+3 items", "added": after["notes"]}
    assert changes["searches"] == {
        "change": "['honeybees tell flowers'] -> unset",
        "before": before["searches"],
        "after": None,
    }
    assert changes["sources"]["added"] == after["sources"][2:]
    assert changes["messages"]["added"] == [m.to_dict() for m in after["messages"][len(before["messages"]) :]]


def test_diff_backwards_and_of_a_checkpoint_with_itself(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    start = demo.first("tools").checkpoint_id
    backwards = run(capsys, "diff", str(demo.db), demo.thread, demo.head, start, unchanged=demo.folder)
    assert "notes     3 items -> unset" in backwards.lines
    report = run(capsys, "diff", str(demo.db), demo.thread, demo.head, start, "--json").json()
    assert report["changes"]["sources"]["before"] == demo.values()["sources"]
    assert report["changes"]["sources"]["after"] == demo.values(start)["sources"]

    same = run(capsys, "diff", str(demo.db), demo.thread, start, start, unchanged=demo.folder)
    assert same.lines[-1] == "no changes"
    assert run(capsys, "diff", str(demo.db), demo.thread, start, start, "--json").json()["changes"] == {}


# --- failures ------------------------------------------------------------------------------------------------------

READ_COMMANDS = [
    ["threads", "{db}"],
    ["show", "{db}", "{thread}"],
    ["history", "{db}", "{thread}"],
    ["diff", "{db}", "{thread}", "{head}", "{head}"],
]


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda command: command[0])
def test_a_missing_file_is_one_line_and_is_not_created(
    command: list[str], json_flag: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.db"
    args = [a.format(db=missing, thread="research", head="x") for a in command] + json_flag
    assert_fails(run(capsys, *args, unchanged=tmp_path), f"{PROG}: error: {missing} does not exist")
    assert not missing.exists()


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda command: command[0])
def test_a_file_that_is_not_a_database(command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 100)
    args = [a.format(db=text_file, thread="research", head="x") for a in command]
    result = run(capsys, *args, unchanged=tmp_path)
    assert_fails(result, f"{PROG}: error: {text_file} is not a haystack-state database (file is not a database)")

    other = tmp_path / "other.db"  # a SQLite database of something else: no tables are added to it
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE things (name TEXT)")
        conn.commit()
    args = [a.format(db=other, thread="research", head="x") for a in command]
    result = run(capsys, *args, unchanged=tmp_path)
    assert_fails(
        result, f"{PROG}: error: {other} is not a haystack-state database (it has no haystack_state_threads table)"
    )

    folder = tmp_path / "folder.db"
    folder.mkdir()
    args = [a.format(db=folder, thread="research", head="x") for a in command]
    assert_fails(run(capsys, *args, unchanged=tmp_path), f"{PROG}: error: {folder} is not a file")


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize("command", READ_COMMANDS[1:], ids=lambda command: command[0])
def test_an_unknown_thread(
    command: list[str], json_flag: list[str], demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(db=demo.db, thread="nobody", head=demo.head) for a in command] + json_flag
    message = f"{PROG}: error: no thread 'nobody' in {demo.db} (list them with: {PROG} threads {demo.db})"
    assert_fails(run(capsys, *args, unchanged=demo.folder), message)


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize(
    "args",
    [["show", "--at", "{bad}"], ["diff", "{bad}", "{head}"], ["diff", "{head}", "{bad}"]],
    ids=["show-at", "diff-a", "diff-b"],
)
def test_an_unknown_checkpoint(
    args: list[str], json_flag: list[str], demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = "01234567-89ab-7def-8123-456789abcdef"
    command, *rest = args
    full = [command, str(demo.db), demo.thread, *(a.format(bad=bad, head=demo.head) for a in rest), *json_flag]
    message = f"{PROG}: error: thread '{demo.thread}' has no checkpoint '{bad}' (list them with: {PROG} history "
    message += f"{demo.db} {demo.thread})"
    assert_fails(run(capsys, *full, unchanged=demo.folder), message)


def test_an_ambiguous_checkpoint_prefix(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = demo.head[:4]  # ids of one thread, made within a minute, share their first digits
    count = sum(m.checkpoint_id.startswith(prefix) for m in demo.history)
    result = run(capsys, "show", str(demo.db), demo.thread, "--at", prefix, unchanged=demo.folder)
    message = (
        f"{PROG}: error: checkpoint '{prefix}' is ambiguous in thread '{demo.thread}': {count} ids start or end with it"
    )
    assert_fails(result, message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], f"{PROG}: error: the following arguments are required: COMMAND"),
        (["frobnicate"], f"{PROG}: error: argument COMMAND: invalid choice: 'frobnicate'"),
        (["show", "{db}"], f"{PROG} show: error: the following arguments are required: THREAD"),
        (["diff", "{db}", "research", "a"], f"{PROG} diff: error: the following arguments are required: B"),
        (["history", "{db}", "research", "--jsn"], f"{PROG}: error: unrecognized arguments: --jsn"),
        (
            ["demo", "--turns", "9"],
            f"{PROG} demo: error: argument --turns: must be between 1 and {len(QUESTIONS)}, got 9",
        ),
        (["demo", "--turns", "two"], f"{PROG} demo: error: argument --turns: not a number: 'two'"),
    ],
    ids=["no-command", "unknown-command", "show-no-thread", "diff-no-b", "unknown-flag", "turns-range", "turns-nan"],
)
def test_bad_arguments_exit_2_with_the_usage(
    args: list[str], message: str, demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    with working_directory(demo.folder):  # the demo's default file would land here: it must not
        result = run(capsys, *(a.format(db=demo.db) for a in args), unchanged=demo.folder)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("usage: haystack-state")
    assert result.err.splitlines()[-1].startswith(message)


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "--help")
    assert result.code == 0
    for command in ("demo", "threads", "show", "history", "diff"):
        assert command in result.out


def test_demo_in_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "nowhere" / "demo.db"
    assert_fails(
        run(capsys, "demo", "--db", str(target), unchanged=tmp_path),
        f"{PROG}: error: '{PROG} demo' cannot create {target}: no such directory: {target.parent}",
    )


def test_demo_on_a_file_that_is_not_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 100)
    result = run(capsys, "demo", "--db", str(text_file), "--json", unchanged=tmp_path)
    assert_fails(result, f"{PROG}: error: {text_file} is not a haystack-state database (file is not a database)")


# --- the installed command -----------------------------------------------------------------------------------------


def console_script() -> list[str]:
    """The ``haystack-state`` script installed next to this interpreter, or ``python -m haystack_state_cli``."""
    script = Path(sys.executable).parent / ("haystack-state.exe" if os.name == "nt" else "haystack-state")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "haystack_state_cli"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher",
    [
        console_script(),
        [sys.executable, "-m", "haystack_state_cli"],
        [sys.executable, "-m", "haystack_state.cli"],
    ],
    ids=["script", "entry-module", "package-module"],
)
def test_the_installed_command(launcher: list[str], demo: Demo) -> None:
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"}
    before = _files(demo.folder)
    done = subprocess.run(
        [*launcher, "history", str(demo.db), demo.thread, "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert [r["checkpoint_id"] for r in json.loads(done.stdout)] == [m.checkpoint_id for m in demo.history]

    failed = subprocess.run(
        [*launcher, "show", str(demo.db), "nobody"], capture_output=True, text=True, env=env, timeout=60
    )
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.splitlines() == [
        f"{PROG}: error: no thread 'nobody' in {demo.db} (list them with: {PROG} threads {demo.db})"
    ]
    assert _files(demo.folder) == before


# --- issue 14: stores, keys, forks, deleting and pruning ----------------------------------------------------------


def _forked_store(path: Path) -> tuple[str, list[str]]:
    """A thread with a fork: ids oldest first (the fork's last)."""
    from haystack_state.persistence import replace

    with SQLiteCheckpointer(path) as cp:
        ids: list[str] = []
        head = None
        for i in range(4):
            head = cp.commit("t", parent_id=head, expected_head=head, delta={"n": replace(i)}, step=i, source="update")
            ids.append(head.checkpoint_id)
            head = head.checkpoint_id  # type: ignore[assignment]
        fork = cp.commit("t", parent_id=ids[1], expected_head=ids[-1], delta={"n": replace(9)}, step=2, source="update")
        ids.append(fork.checkpoint_id)
    return "t", ids


def test_history_marks_forks_and_show_prints_one_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "forked.db"
    thread, ids = _forked_store(db)
    text = run(capsys, "history", str(db), thread, unchanged=tmp_path)
    marked = [line.split()[0] for line in text.lines[1:] if " fork " in f" {line} "]
    shorts = short_ids([type("M", (), {"checkpoint_id": i})() for i in ids])  # type: ignore[misc]
    assert sorted(marked) == sorted([shorts[ids[2]], shorts[ids[4]]])  # both children of the fork point
    assert text.lines[-1].startswith("fork:")
    as_json = run(capsys, "--json", "history", str(db), thread).json()  # --json before the command
    assert {r["checkpoint_id"] for r in as_json if r["fork"]} == {ids[2], ids[4]}
    assert run(capsys, "show", str(db), thread, "--key", "n", unchanged=tmp_path).out == "9\n"
    assert run(capsys, "show", "--json", str(db), thread, "--key", "n", "--at", shorts[ids[0]]).json() == {
        "key": "n",
        "type": "int",
        "size": 1,
        "value": 0,
    }
    missing = run(capsys, "show", str(db), thread, "--key", "nope")
    assert_fails(missing, f"{PROG}: error: thread 't' has no value for key 'nope' at checkpoint {ids[4]} (keys: n)")


def test_delete_and_prune(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "forked.db"
    thread, _ = _forked_store(db)
    pruned = run(capsys, "prune", str(db), "--keep-last", "2", "--json").json()
    assert pruned["checkpoints_deleted"] == 3 and pruned["threads_deleted"] == []
    assert "VACUUM" in run(capsys, "prune", str(db), "--keep-last", "1").out
    with SQLiteCheckpointer(db) as cp:
        assert cp.get(thread).values == {"n": 9}
        assert len(cp.history(thread)) == 1
    assert run(capsys, "delete", str(db), thread, "--yes").out == "deleted thread 't' (1 checkpoint)\n"
    assert_fails(
        run(capsys, "delete", str(db), thread, "--yes"),
        f"{PROG}: error: no thread 't' in {db} (list them with: {PROG} threads {db})",
    )
    assert_fails(
        run(capsys, "prune", str(db), "--keep-last", "0"),
        f"{PROG} prune: error: argument --keep-last: must be at least 1, got 0",
        code=2,
    )


def test_a_read_only_file_is_read_without_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "forked.db"
    thread, ids = _forked_store(db)
    with SQLiteCheckpointer(db) as cp, cp._raw_connection() as conn:  # fold the WAL in: the file holds the data
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    db.chmod(0o444)
    text = run(capsys, "show", str(db), thread, "--key", "n", unchanged=folder)
    assert text.out == "9\n"
    assert not Path(f"{db}-wal").exists()
    assert run(capsys, "history", str(db), thread, "--json", unchanged=folder).json()[0]["checkpoint_id"] == ids[-1]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"{PROG} ")


@pytest.mark.postgres
def test_a_postgresql_url_is_opened(
    postgres_dsn: str, postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from haystack_state.persistence import replace
    from haystack_state.persistence.postgres import PostgresCheckpointer

    with PostgresCheckpointer(postgres_dsn, schema=postgres_schema) as cp:
        cp.commit("pg", parent_id=None, expected_head=None, delta={"n": replace(5)}, step=0, source="update")
    listed = run(capsys, "threads", postgres_dsn, "--schema", postgres_schema, "--json").json()
    assert [t["thread_id"] for t in listed] == ["pg"]
    assert run(capsys, "show", postgres_dsn, "pg", "--schema", postgres_schema, "--key", "n").out == "5\n"
    assert run(capsys, "delete", postgres_dsn, "pg", "--schema", postgres_schema, "-y").code == 0
    assert run(capsys, "threads", postgres_dsn, "--schema", postgres_schema, "--json").json() == []
