"""
The ``haystack-state`` command: run the offline demo, and look into the threads of a SQLite checkpoint file.

- ``haystack-state demo [--db PATH] [--turns N]``: a multi-turn research assistant, printing each step's changes;
- ``haystack-state threads DB``: one line per thread;
- ``haystack-state show DB THREAD [--at CHECKPOINT]``: the state at the head (or a checkpoint), key by key;
- ``haystack-state history DB THREAD``: the thread's checkpoints, newest first;
- ``haystack-state diff DB THREAD A B``: what changed from checkpoint A to checkpoint B.

Each takes ``--json`` (JSON on stdout and nothing else). The read commands need no schema: they show the stored
values. A problem (a missing file, an unknown thread or checkpoint) is one line on stderr and exit code 1; bad
arguments exit with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_state.agent.session import pending_tool_calls
from haystack_state.demo import QUESTIONS, describe_change, item_summary, run_demo
from haystack_state.display import summarize
from haystack_state.errors import CheckpointError, CheckpointNotFoundError, HaystackStateError, ThreadNotFoundError
from haystack_state.persistence.records import CheckpointMeta, ThreadInfo
from haystack_state.persistence.sqlite import THREADS, SQLiteCheckpointer
from haystack_state.server.cli import add_serve_command
from haystack_state.state import State
from haystack_state.values import to_jsonable

__all__ = ["main", "build_parser"]

PROG = "haystack-state"
DEFAULT_DB = "haystack_state_demo.db"


class CliError(Exception):
    """A problem to report as one line on stderr, with exit code 1."""


# --- reading a database ------------------------------------------------------------------------------------------


@contextmanager
def _open(path: str) -> Iterator[SQLiteCheckpointer]:
    """Open an existing checkpoint file without creating or migrating anything."""
    file = Path(path)
    if not file.is_file():
        raise CliError(f"no such file: {path}" if not file.exists() else f"not a file: {path}")
    try:
        with closing(sqlite3.connect(file.resolve().as_uri() + "?mode=ro", uri=True)) as conn:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (THREADS,)).fetchone()
    except sqlite3.DatabaseError as error:
        if "not a database" in str(error):
            raise CliError(f"{path} is not a haystack-state database ({error})") from None
        raise CliError(f"cannot read {path}: {error}") from None
    if found is None:
        raise CliError(f"{path} is not a haystack-state database (it has no {THREADS} table)")
    with SQLiteCheckpointer(file) as checkpointer:
        yield checkpointer


def _history(checkpointer: SQLiteCheckpointer, db: str, thread_id: str) -> list[CheckpointMeta]:
    try:
        return checkpointer.history(thread_id)
    except ThreadNotFoundError:
        raise CliError(f"no thread '{thread_id}' in {db} (list them with: {PROG} threads {db})") from None


def _resolve(history: list[CheckpointMeta], thread_id: str, reference: str) -> CheckpointMeta:
    """Find a checkpoint by its id or a unique prefix of it."""
    found = [meta for meta in history if meta.checkpoint_id.startswith(reference)] if reference else []
    exact = [meta for meta in found if meta.checkpoint_id == reference]
    if exact or len(found) == 1:
        return (exact or found)[0]
    if found:
        raise CliError(f"checkpoint '{reference}' is ambiguous in thread '{thread_id}': {len(found)} ids start with it")
    raise CliError(
        f"thread '{thread_id}' has no checkpoint '{reference}' (list them with: {PROG} history DB {thread_id})"
    )


def _values(checkpointer: SQLiteCheckpointer, meta: CheckpointMeta) -> dict[str, Any]:
    try:
        return checkpointer.get(meta.thread_id, meta.checkpoint_id).values
    except (ThreadNotFoundError, CheckpointNotFoundError) as error:  # deleted while we read
        raise CliError(str(error)) from None


# --- rendering ---------------------------------------------------------------------------------------------------


def _time(moment: dt.datetime) -> str:
    """``2025-01-31 12:00:00 UTC``: stored times are UTC."""
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _jsonable(value: Any) -> Any:
    """A JSON-safe rendering of a stored value (objects not JSON-native become their ``str``)."""
    return json.loads(json.dumps(to_jsonable(value), ensure_ascii=False, default=str))


def _size(value: Any) -> int:
    """The UTF-8 bytes of a value's JSON rendering, as ``State.size()`` measures it."""
    return len(json.dumps(to_jsonable(value), ensure_ascii=False, default=str).encode("utf-8"))


def _type_name(value: Any) -> str:
    """``str``, ``dict``, ``list[ChatMessage]``, ``list[dict | str]``: the stored value's type."""
    if isinstance(value, list | tuple | set | frozenset):
        kinds = sorted({type(item).__name__ for item in value})
        base = type(value).__name__ if type(value) in (list, tuple, set, frozenset) else "list"
        return f"{base}[{' | '.join(kinds)}]" if kinds else base
    return "dict" if isinstance(value, dict) else type(value).__name__


def _meta_json(meta: CheckpointMeta) -> dict[str, Any]:
    return {
        "checkpoint_id": meta.checkpoint_id,
        "parent_id": meta.parent_id,
        "step": meta.step,
        "source": meta.source,
        "tools": list(meta.tool_names),
        "created_at": meta.created_at.isoformat(),
        "changed_keys": list(meta.changed_keys),
    }


def _table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> list[str]:
    """Align rows into columns (the first row is the header); columns in ``right`` are right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


# --- commands ----------------------------------------------------------------------------------------------------

Output = Callable[[str], None]


def _cmd_demo(args: argparse.Namespace, out: Output) -> None:
    db = Path(args.db)
    if db.exists() and not db.is_file():
        raise CliError(f"not a file: {args.db}")
    if not db.parent.is_dir():
        raise CliError(f"no such directory: {db.parent}")
    try:
        result = run_demo(db, args.turns, echo=None if args.json else out)
    except CheckpointError as error:
        if not isinstance(error.__cause__, sqlite3.DatabaseError):
            raise
        raise CliError(f"{args.db} is not a haystack-state database ({error.__cause__})") from None
    if args.json:
        out(json.dumps({"db": args.db, **dataclasses.asdict(result)}, indent=2, ensure_ascii=False))


def _cmd_threads(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db) as checkpointer:
        threads = checkpointer.list_threads()
    if args.json:
        out(json.dumps([_thread_json(info) for info in threads], indent=2, ensure_ascii=False))
        return
    if not threads:
        out(f"no threads in {args.db}")
        return
    rows = [("THREAD", "HEAD", "CHECKPOINTS", "UPDATED")]
    rows += [(t.thread_id, t.head_id, str(t.checkpoint_count), _time(t.updated_at)) for t in threads]
    for line in _table(rows, right=[2]):
        out(line)


def _thread_json(info: ThreadInfo) -> dict[str, Any]:
    return {
        "thread_id": info.thread_id,
        "head_id": info.head_id,
        "checkpoint_count": info.checkpoint_count,
        "created_at": info.created_at.isoformat(),
        "updated_at": info.updated_at.isoformat(),
    }


def _cmd_show(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db) as checkpointer:
        history = _history(checkpointer, args.db, args.thread)
        meta = _resolve(history, args.thread, args.at) if args.at is not None else history[0]
        values = _values(checkpointer, meta)
    messages = values.get("messages")
    is_chat = isinstance(messages, list) and all(isinstance(m, ChatMessage) for m in messages)
    pending = pending_tool_calls(State({}, {"messages": messages}), meta) if is_chat else []
    keys = sorted(values, key=lambda key: -_size(values[key]))
    if args.json:
        document = {
            "thread_id": args.thread,
            "head": meta.checkpoint_id == history[0].checkpoint_id,
            **_meta_json(meta),
            "interrupted": bool(meta.metadata.get("interrupted")) and bool(pending),
            "keys": [
                {"key": k, "type": _type_name(values[k]), "size": _size(values[k]), "value": _jsonable(values[k])}
                for k in keys
            ],
            "pending_tool_calls": [{"id": c.id, "tool_name": c.tool_name, "arguments": c.arguments} for c in pending],
        }
        out(json.dumps(document, indent=2, ensure_ascii=False))
        return
    where = " (head)" if meta.checkpoint_id == history[0].checkpoint_id else ""
    out(f"thread      {args.thread}")
    out(f"checkpoint  {meta.checkpoint_id}{where}")
    out(f"step        {meta.step}, {meta.source}, {_time(meta.created_at)}")
    out("")
    rows = [("KEY", "TYPE", "BYTES", "VALUE")]
    rows += [(k, _type_name(values[k]), f"{_size(values[k]):,}", summarize(values[k], 50)) for k in keys]
    for line in _table(rows, right=[2]) if keys else ["(no values)"]:
        out(line)
    out("")
    if meta.metadata.get("interrupted") and pending:
        out("interrupted: waiting for Agent.resume")
    if not pending:
        out("pending tool calls: none")
        return
    out("pending tool calls:")
    for call in pending:
        out(f"  {call.id}  {call.tool_name}({json.dumps(call.arguments, ensure_ascii=False)})")


def _cmd_history(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db) as checkpointer:
        history = _history(checkpointer, args.db, args.thread)
    if args.json:
        out(json.dumps([_meta_json(meta) for meta in history], indent=2, ensure_ascii=False))
        return
    rows = [("CHECKPOINT", "PARENT", "STEP", "SOURCE", "TOOLS", "CREATED", "CHANGED KEYS")]
    for meta in history:
        rows.append(
            (
                meta.checkpoint_id,
                meta.parent_id or "-",
                str(meta.step),
                meta.source,
                ",".join(meta.tool_names) or "-",
                _time(meta.created_at),
                ", ".join(meta.changed_keys) or "-",
            )
        )
    for line in _table(rows, right=[2]):
        out(line)


def _cmd_diff(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db) as checkpointer:
        history = _history(checkpointer, args.db, args.thread)
        first, second = (_resolve(history, args.thread, ref) for ref in (args.a, args.b))
        before, after = _values(checkpointer, first), _values(checkpointer, second)
    keys = list(before) + [key for key in after if key not in before]
    changes: dict[str, dict[str, Any]] = {}
    for key in keys:
        old, new = before.get(key), after.get(key)
        if old != new:
            text, added = describe_change(old, new)
            changes[key] = (
                {"change": text, "added": added} if added is not None else {"change": text, "before": old, "after": new}
            )
    if args.json:
        document = {"thread_id": args.thread, "from": _meta_json(first), "to": _meta_json(second), "changes": {}}
        for key, change in changes.items():
            document["changes"][key] = {name: _jsonable(value) for name, value in change.items()}
        out(json.dumps(document, indent=2, ensure_ascii=False))
        return
    out(f"from  {first.checkpoint_id}  step {first.step}, {first.source}")
    out(f"to    {second.checkpoint_id}  step {second.step}, {second.source}")
    out("")
    if not changes:
        out("no changes")
    width = max((len(key) for key in changes), default=0)
    for key, change in changes.items():
        out(f"{key.ljust(width)}  {change['change']}")
        for item in change.get("added", []):
            out(f"{' ' * width}    + {item_summary(item)}")


# --- the parser --------------------------------------------------------------------------------------------------


def _turns(text: str) -> int:
    try:
        turns = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= turns <= len(QUESTIONS):
        raise argparse.ArgumentTypeError(f"must be between 1 and {len(QUESTIONS)}, got {turns}")
    return turns


def build_parser() -> argparse.ArgumentParser:
    """
    The command-line parser, with one sub-command per job.

    :returns: The parser.
    """
    parser = argparse.ArgumentParser(prog=PROG, description="Run the haystack-state demo and inspect agent threads.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print JSON (and nothing else) on stdout")

    demo = commands.add_parser(
        "demo", parents=[json_flag], help="run an offline multi-turn research assistant on a SQLite thread"
    )
    demo.add_argument("--db", default=DEFAULT_DB, metavar="PATH", help=f"the SQLite file (default: {DEFAULT_DB})")
    demo.add_argument(
        "--turns", type=_turns, default=len(QUESTIONS), metavar="N", help=f"questions to ask, 1-{len(QUESTIONS)}"
    )
    demo.set_defaults(handler=_cmd_demo)

    threads = commands.add_parser("threads", parents=[json_flag], help="list the threads of a database")
    threads.add_argument("db", metavar="DB", help="the SQLite checkpoint file")
    threads.set_defaults(handler=_cmd_threads)

    show = commands.add_parser("show", parents=[json_flag], help="show a thread's state, key by key")
    show.add_argument("db", metavar="DB", help="the SQLite checkpoint file")
    show.add_argument("thread", metavar="THREAD", help="the thread id")
    show.add_argument("--at", metavar="CHECKPOINT", help="a checkpoint id (or a unique prefix); the head by default")
    show.set_defaults(handler=_cmd_show)

    history = commands.add_parser("history", parents=[json_flag], help="list a thread's checkpoints, newest first")
    history.add_argument("db", metavar="DB", help="the SQLite checkpoint file")
    history.add_argument("thread", metavar="THREAD", help="the thread id")
    history.set_defaults(handler=_cmd_history)

    diff = commands.add_parser("diff", parents=[json_flag], help="what changed from checkpoint A to checkpoint B")
    diff.add_argument("db", metavar="DB", help="the SQLite checkpoint file")
    diff.add_argument("thread", metavar="THREAD", help="the thread id")
    diff.add_argument("a", metavar="A", help="the earlier checkpoint id (or a unique prefix)")
    diff.add_argument("b", metavar="B", help="the later checkpoint id (or a unique prefix)")
    diff.set_defaults(handler=_cmd_diff)

    add_serve_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``haystack-state`` command.

    :param argv: The arguments, without the program name; ``sys.argv[1:]`` if None.
    :returns: The exit code: 0 on success, 1 for a problem reported on stderr, 2 for bad arguments.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse has printed the usage and the error (or the help)
        return stop.code if isinstance(stop.code, int) else 1
    try:
        args.handler(args, print)
    except CliError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except HaystackStateError as error:  # unreadable stored data and the like: the first line says what
        print(f"{PROG}: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    except sqlite3.Error as error:  # a locked or read-only file, a full disk
        print(f"{PROG}: error: {args.db}: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # piped into a command that stopped reading (head): silence the final flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
