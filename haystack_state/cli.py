"""
The ``haystack-state`` command: run the offline demo, and look into (and tidy) the threads of a checkpoint store, a
SQLite file or a ``postgresql://`` URL (with ``--schema``).

- ``haystack-state demo [--db PATH] [--turns N]``: a multi-turn research assistant, printing each step's changes;
- ``haystack-state threads DB``: one line per thread;
- ``haystack-state show DB THREAD [--at CHECKPOINT] [--key KEY]``: the state at the head (or a checkpoint), key by
  key, or one key's value;
- ``haystack-state history DB THREAD [--limit N]``: the thread's checkpoints, newest first, with short ids and forks;
- ``haystack-state diff DB THREAD A B``: what changed from checkpoint A to checkpoint B;
- ``haystack-state delete DB THREAD``: delete a thread;
- ``haystack-state prune DB [--thread T] [--keep-last N] [--older-than SECONDS]``: remove old checkpoints and
  expired threads;
- ``haystack-state store put|get|search|delete|namespaces --db DB ...``: a long-term memory store (see
  :mod:`haystack_state.store.cli`).

``--json`` (anywhere on the line) prints JSON on stdout and nothing else; ``--version`` prints the version. The read
commands never write: a read-only SQLite file is opened read-only. They need no schema: they show the stored values.
A problem (a missing file, an unknown thread or checkpoint) is one line on stderr and exit code 1; bad arguments exit
with code 2.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import importlib.metadata
import json
import os
import sqlite3
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_state.agent.session import pending_tool_calls
from haystack_state.demo import QUESTIONS, describe_change, item_summary, run_demo
from haystack_state.display import summarize
from haystack_state.errors import CheckpointError, CheckpointNotFoundError, HaystackStateError, ThreadNotFoundError
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointMeta, ThreadInfo
from haystack_state.persistence.sqlite import THREADS, SQLiteCheckpointer
from haystack_state.server.cli import add_serve_command
from haystack_state.state import State
from haystack_state.store.cli import add_store_commands
from haystack_state.values import to_jsonable

__all__ = ["main", "build_parser"]

PROG = "haystack-state"
DEFAULT_DB = "haystack_state_demo.db"
#: The length of a short checkpoint id (the random end of the UUIDv7), and the width ``history`` fits in.
SHORT_ID = 8
WIDTH = 100


class CliError(Exception):
    """A problem to report as one line on stderr, with exit code 1."""


# --- reading a database ------------------------------------------------------------------------------------------


def _is_postgres(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


@contextmanager
def _open(target: str, *, schema: str = "public", write: bool = False) -> Iterator[Checkpointer]:
    """
    Open an existing checkpoint store: a PostgreSQL URL, or a SQLite file (read-only when the file is; never created
    or migrated by a read command).
    """
    if _is_postgres(target):
        try:
            from haystack_state.persistence.postgres import PostgresCheckpointer
        except ImportError as error:
            raise CliError(str(error)) from None
        try:
            checkpointer: Checkpointer = PostgresCheckpointer(target, schema=schema, max_connections=1)
        except Exception as error:  # a wrong URL, a server that does not answer
            raise CliError(f"cannot open {target}: {' '.join(str(error).split())}") from None
        with checkpointer:
            yield checkpointer
        return
    file = Path(target)
    if not file.is_file():
        raise CliError(f"no such file: {target}" if not file.exists() else f"not a file: {target}")
    immutable = not file.stat().st_mode & 0o222  # nobody may write it: SQLite creates no -wal or -shm beside it
    try:
        uri = file.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (THREADS,)).fetchone()
    except sqlite3.DatabaseError as error:
        if "not a database" in str(error):
            raise CliError(f"{target} is not a haystack-state database ({error})") from None
        raise CliError(f"cannot read {target}: {error}") from None
    if found is None:
        raise CliError(f"{target} is not a haystack-state database (it has no {THREADS} table)")
    read_only = not write and (immutable or not os.access(file, os.W_OK))
    with SQLiteCheckpointer(file, read_only=read_only) as checkpointer:
        yield checkpointer


def _history(checkpointer: Checkpointer, db: str, thread_id: str, limit: int | None = None) -> list[CheckpointMeta]:
    try:
        return checkpointer.history(thread_id, limit=limit)
    except ThreadNotFoundError:
        raise CliError(f"no thread '{thread_id}' in {db} (list them with: {PROG} threads {db})") from None


def short_ids(history: Sequence[CheckpointMeta]) -> dict[str, str]:
    """
    Short ids for a thread's checkpoints: the last 8 characters of each id (the random end of a UUIDv7), longer
    where two would be the same, so each is unique within the thread.

    :param history: The thread's checkpoints.
    :returns: id -> short id.
    """
    ids = [meta.checkpoint_id for meta in history]
    shorts: dict[str, str] = {}
    for length in range(SHORT_ID, max((len(i) for i in ids), default=SHORT_ID) + 1):
        pending = [i for i in ids if i not in shorts]
        counts = collections.Counter(i[-length:] for i in pending)
        for i in pending:
            if counts[i[-length:]] == 1 or length >= len(i):
                shorts[i] = i[-length:]
        if len(shorts) == len(ids):
            break
    return shorts


def _resolve(history: list[CheckpointMeta], thread_id: str, reference: str) -> CheckpointMeta:
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
            f"checkpoint '{reference}' is ambiguous in thread '{thread_id}': {len(found)} ids start or end with it"
        )
    raise CliError(
        f"thread '{thread_id}' has no checkpoint '{reference}' (list them with: {PROG} history DB {thread_id})"
    )


def _values(checkpointer: Checkpointer, meta: CheckpointMeta) -> dict[str, Any]:
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
    with _open(args.db, schema=args.schema) as checkpointer:
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
    with _open(args.db, schema=args.schema) as checkpointer:
        history = _history(checkpointer, args.db, args.thread)
        meta = _resolve(history, args.thread, args.at) if args.at is not None else history[0]
        values = _values(checkpointer, meta)
    if args.key is not None:
        _show_key(args, values, meta, out)
        return
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
            "context_summary": _summary_json(values.get("context_summary")),
            "pending_interrupts": _interrupts(meta) if pending or meta.metadata.get("interrupts") else [],
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
    summary = _summary_json(values.get("context_summary"))
    if summary is not None:
        start, end = summary["covers"]
        out(f"context summary: covers messages {start}-{end - 1} of {len(messages or [])} ({summary['tokens']} tokens)")
        for line in textwrap.wrap(summary["text"], WIDTH - 2) or [""]:
            out(f"  {line}")
        out("")
    requests = _interrupts(meta)
    if requests:
        out("interrupted: waiting for Agent.resume; pending interrupts:")
        for request in requests:
            value = request.get("value")
            shown = json.dumps(_jsonable(value), ensure_ascii=False) if value is not None else "-"
            out(f"  {request.get('id')}  {request.get('kind')}  {request.get('tool_name')}  {_clip(shown, 60)}")
        out("")
    if not pending:
        out("pending tool calls: none")
        return
    out("pending tool calls:")
    for call in pending:
        out(f"  {call.id}  {call.tool_name}({json.dumps(call.arguments, ensure_ascii=False)})")


def _interrupts(meta: CheckpointMeta) -> list[dict[str, Any]]:
    """The requests an interrupted checkpoint waits for (see ``ThreadSnapshot.interrupts``)."""
    if not meta.metadata.get("interrupted"):
        return []
    stored = meta.metadata.get("interrupts")
    if isinstance(stored, list):
        return [dict(r) for r in stored if isinstance(r, dict)]
    pending = meta.metadata.get("pending")
    return [{"id": str(i), "kind": "before", "call_id": i} for i in pending] if isinstance(pending, list) else []


def _summary_json(value: Any) -> dict[str, Any] | None:
    """A ``context_summary`` value (a ContextSummary, or its JSON form) as JSON, or None."""
    text = getattr(value, "text", None)
    covers = getattr(value, "covers", None)
    if isinstance(text, str) and covers is not None:
        return {"text": text, "covers": list(covers), "tokens": int(getattr(value, "tokens", 0))}
    return None


def _cmd_history(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db, schema=args.schema) as checkpointer:
        history = _history(checkpointer, args.db, args.thread, args.limit)
        everything = history if args.limit is None else _history(checkpointer, args.db, args.thread)
    children = collections.Counter(meta.parent_id for meta in everything)
    forks = {meta.checkpoint_id for meta in everything if meta.parent_id is not None and children[meta.parent_id] > 1}
    if args.json:
        records = [{**_meta_json(meta), "fork": meta.checkpoint_id in forks} for meta in history]
        out(json.dumps(records, indent=2, ensure_ascii=False))
        return
    shorts = short_ids(everything)
    rows = [("CHECKPOINT", "PARENT", "STEP", "SOURCE", "TOOLS", "CREATED", "FORK", "CHANGED KEYS")]
    summaries = 0
    for meta in history:
        covered = meta.metadata.get("context_summary")
        changed = ", ".join(meta.changed_keys) or "-"
        if isinstance(covered, dict) and isinstance(covered.get("covers"), list) and len(covered["covers"]) == 2:
            summaries += 1
            start, end = covered["covers"]
            changed = changed.replace("context_summary", f"context_summary ({start}-{end - 1})")
        rows.append(
            (
                shorts[meta.checkpoint_id],
                shorts.get(meta.parent_id or "", meta.parent_id[-SHORT_ID:] if meta.parent_id else "-"),
                str(meta.step),
                meta.source,
                _clip(",".join(meta.tool_names) or "-", 16),
                meta.created_at.strftime("%m-%d %H:%M:%S"),
                "fork" if meta.checkpoint_id in forks else "",
                changed,
            )
        )
    for line in _table(rows, right=[2]):
        out(_clip(line, WIDTH))
    if forks:
        out(f"fork: the checkpoint starts a branch (its parent has other children); {len(forks)} in this thread")
    if summaries:
        out("context_summary (a-b): the checkpoint wrote a new summary of messages a to b, sent instead of them")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _show_key(args: argparse.Namespace, values: dict[str, Any], meta: CheckpointMeta, out: Output) -> None:
    if args.key not in values:
        raise CliError(
            f"thread '{args.thread}' has no value for key '{args.key}' at checkpoint {meta.checkpoint_id} "
            f"(keys: {', '.join(sorted(values)) or 'none'})"
        )
    value = values[args.key]
    if args.json:
        document = {"key": args.key, "type": _type_name(value), "size": _size(value), "value": _jsonable(value)}
        out(json.dumps(document, indent=2, ensure_ascii=False))
        return
    rendered = _jsonable(value)
    out(rendered if isinstance(rendered, str) else json.dumps(rendered, indent=2, ensure_ascii=False))


def _cmd_delete(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db, schema=args.schema, write=True) as checkpointer:
        count = len(_history(checkpointer, args.db, args.thread))
        checkpointer.delete_thread(args.thread)
    if args.json:
        out(json.dumps({"deleted": args.thread, "checkpoints": count}, ensure_ascii=False))
        return
    out(f"deleted thread '{args.thread}' ({count} checkpoints)")


def _cmd_prune(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db, schema=args.schema, write=True) as checkpointer:
        if args.thread is not None:
            _history(checkpointer, args.db, args.thread, 1)
        result = checkpointer.prune(args.thread, keep_last=args.keep_last, older_than=args.older_than)
    if args.json:
        out(json.dumps(dataclasses.asdict(result), indent=2, ensure_ascii=False))
        return
    out(
        f"removed {result.checkpoints_deleted} checkpoints, wrote {result.snapshots_written} snapshots, deleted "
        f"{len(result.threads_deleted)} expired threads"
        + (f", skipped {len(result.threads_skipped)} busy threads" if result.threads_skipped else "")
    )
    if result.checkpoints_deleted and not _is_postgres(args.db):
        out(f"the space is reused by later commits; to shrink the file: sqlite3 {args.db} VACUUM")


def _cmd_diff(args: argparse.Namespace, out: Output) -> None:
    with _open(args.db, schema=args.schema) as checkpointer:
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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """
    The command-line parser, with one sub-command per job. ``--json`` is accepted anywhere on the line.

    :returns: The parser.
    """
    parser = argparse.ArgumentParser(prog=PROG, description="Run the haystack-state demo and inspect agent threads.")
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON (and nothing else) on stdout")
    store = argparse.ArgumentParser(add_help=False, parents=[common])
    store.add_argument("db", metavar="DB", help="a SQLite checkpoint file, or a postgresql:// URL")
    store.add_argument("--schema", default="public", help="the PostgreSQL schema (default: public)")

    demo = commands.add_parser(
        "demo", parents=[common], help="run an offline multi-turn research assistant on a SQLite thread"
    )
    demo.add_argument("--db", default=DEFAULT_DB, metavar="PATH", help=f"the SQLite file (default: {DEFAULT_DB})")
    demo.add_argument(
        "--turns", type=_turns, default=len(QUESTIONS), metavar="N", help=f"questions to ask, 1-{len(QUESTIONS)}"
    )
    demo.set_defaults(handler=_cmd_demo)

    threads = commands.add_parser("threads", parents=[store], help="list the threads of a database")
    threads.set_defaults(handler=_cmd_threads)

    show = commands.add_parser("show", parents=[store], help="show a thread's state, key by key")
    show.add_argument("thread", metavar="THREAD", help="the thread id")
    show.add_argument("--at", metavar="CHECKPOINT", help="a checkpoint id (or its short id); the head by default")
    show.add_argument("--key", metavar="KEY", help="print this key's value only")
    show.set_defaults(handler=_cmd_show)

    history = commands.add_parser("history", parents=[store], help="list a thread's checkpoints, newest first")
    history.add_argument("thread", metavar="THREAD", help="the thread id")
    history.add_argument("--limit", type=_positive, metavar="N", help="the newest N checkpoints only")
    history.set_defaults(handler=_cmd_history)

    diff = commands.add_parser("diff", parents=[store], help="what changed from checkpoint A to checkpoint B")
    diff.add_argument("thread", metavar="THREAD", help="the thread id")
    diff.add_argument("a", metavar="A", help="the earlier checkpoint id (or its short id)")
    diff.add_argument("b", metavar="B", help="the later checkpoint id (or its short id)")
    diff.set_defaults(handler=_cmd_diff)

    delete = commands.add_parser("delete", parents=[store], help="delete a thread and its checkpoints")
    delete.add_argument("thread", metavar="THREAD", help="the thread id")
    delete.set_defaults(handler=_cmd_delete)

    prune = commands.add_parser(
        "prune",
        parents=[store],
        help="remove old checkpoints (never a head or an interrupted one) and expired threads",
    )
    prune.add_argument("--thread", metavar="THREAD", help="this thread only (default: every thread)")
    prune.add_argument("--keep-last", type=_positive, metavar="N", help="keep the newest N checkpoints of a thread")
    prune.add_argument("--older-than", type=_seconds, metavar="SECONDS", help="keep checkpoints younger than this")
    prune.set_defaults(handler=_cmd_prune)

    add_serve_command(commands)
    add_store_commands(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("haystack-state")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``haystack-state`` command.

    :param argv: The arguments, without the program name; ``sys.argv[1:]`` if None.
    :returns: The exit code: 0 on success, 1 for a problem reported on stderr, 2 for bad arguments.
    """
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    # --json anywhere on the line: before or after the command, or among its arguments.
    as_json = "--json" in arguments
    arguments = [argument for argument in arguments if argument != "--json"]
    try:
        args = parser.parse_args(arguments)
        args.json = as_json
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
        print(f"{PROG}: error: {getattr(args, 'db', '')}: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # piped into a command that stopped reading (head): silence the final flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
