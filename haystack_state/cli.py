"""
The ``haystack-state`` commands that run the offline demo and look into (and tidy) the threads of a checkpoint
store: a SQLite file or a ``postgresql://`` URL (with ``--schema``). The command line is parsed by
:mod:`haystack_state_cli`, the console script, which imports this module only when a command runs (so ``--help``
answers at once); :func:`main` here runs the same command line.

- ``demo``: a multi-turn research assistant on a new thread, printing each step's changes and the commands to look
  at it again;
- ``threads``, ``history``, ``diff``, and ``show`` and ``log`` (in :mod:`haystack_state._cli_state`): read a
  database; they never write nor create anything (a file, a schema, a table, a ``-wal`` file), and read a read-only
  file or a file in a read-only directory (see :mod:`haystack_state._cli_open`);
- ``delete`` (asks first, unless ``--yes``) and ``prune``: change a database; a read-only one is an error saying so;
- ``store ...``: a long-term memory store (see :mod:`haystack_state.store._cli`); ``serve``: see
  :mod:`haystack_state.server.cli`.

A problem (a missing file, an unknown thread or checkpoint) is one line on stderr naming the file, schema, thread or
option at fault, and exit code 1; bad arguments exit with code 2.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any

import haystack_state_cli
from haystack_state._cli_open import (
    CliError,
    checkpoint_values,
    find_checkpoint,
    is_postgres,
    open_checkpointer,
    thread_history,
    where,
)
from haystack_state._cli_state import run_log, run_show
from haystack_state._cli_text import (
    PROG,
    SHORT_ID,
    WIDTH,
    Output,
    clip,
    command_line,
    jsonable,
    meta_json,
    plural,
    short_ids,
    shorten,
    table,
    time_text,
)
from haystack_state.demo import DemoResult, describe_change, item_summary, run_demo
from haystack_state.errors import HaystackStateError
from haystack_state.persistence.records import ThreadInfo
from haystack_state.store import _cli as store_cli

__all__ = ["CliError", "build_parser", "main", "run_command", "short_ids"]

#: The parser (built by the console script's module, without importing haystack).
build_parser = haystack_state_cli.build_parser


class Declined(CliError):
    """The user answered no: nothing was done (exit code 1, without ``error:``)."""


def _name(args: argparse.Namespace) -> str:
    """``haystack-state prune``: the command, as messages name it."""
    return f"'{PROG} {args.command}'"


# --- demo ----------------------------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace, out: Output) -> None:
    with open_checkpointer(args.db, schema=args.schema, access="create", command=_name(args)) as checkpointer:
        if args.thread is not None and checkpointer.head(args.thread) is not None:
            delete = command_line("delete", args.db, args.thread, schema=args.schema)
            raise CliError(
                f"thread '{args.thread}' already exists in {where(args.db, args.schema)}, and the demo writes a new "
                f"thread: pick another --thread, or delete it first ({delete})"
            )
        echo = None if args.json else out
        result = run_demo(checkpointer, args.turns, echo, thread_id=args.thread, where=where(args.db, args.schema))
    if args.json:
        schema = {"schema": args.schema} if is_postgres(args.db) else {}
        out(json.dumps({"db": args.db, **schema, **dataclasses.asdict(result)}, indent=2, ensure_ascii=False))
        return
    _next_steps(args, result, out)


def _next_steps(args: argparse.Namespace, result: DemoResult, out: Output) -> None:
    """The commands that look at the thread the demo wrote, with its name and two of its checkpoints."""
    turns = [[entry["checkpoint_id"] for entry in turn["checkpoints"]] for turn in result.turns]
    shorts = shorten([checkpoint for turn in turns for checkpoint in turn])
    head = turns[-1][-1]
    if len(turns) == 1:
        start, change = turns[0][0], "what the agent did in turn 1"
    else:
        start = turns[0][-1]  # the end of turn 1
        change = "what turn 2 changed" if len(turns) == 2 else f"what turns 2-{len(turns)} changed"
    db, thread, schema = args.db, result.thread_id, args.schema
    commands = [
        (command_line("log", db, thread, schema=schema), "the conversation"),
        (command_line("history", db, thread, schema=schema), "its checkpoints, newest first"),
        (command_line("show", db, thread, schema=schema), "its state, key by key"),
    ]
    if start != head:
        commands.append((command_line("diff", db, thread, shorts[start], shorts[head], schema=schema), change))
    every = "every thread in the schema" if is_postgres(db) else "every thread in the file"
    commands.append((command_line("threads", db, schema=schema), every))
    width = max(len(command) for command, _ in commands)
    out("Look at it again with:")
    for command, what in commands:
        out(f"  {command.ljust(width)}  # {what}")


# --- the read commands ---------------------------------------------------------------------------------------------


def _cmd_threads(args: argparse.Namespace, out: Output) -> None:
    with open_checkpointer(args.db, schema=args.schema) as checkpointer:
        threads = checkpointer.list_threads()
    if args.json:
        out(json.dumps([_thread_json(info) for info in threads], indent=2, ensure_ascii=False))
        return
    if not threads:
        out(f"no threads in {where(args.db, args.schema)}")
        return
    rows = [("THREAD", "HEAD", "CHECKPOINTS", "UPDATED")]
    rows += [(t.thread_id, t.head_id, str(t.checkpoint_count), time_text(t.updated_at)) for t in threads]
    for line in table(rows, right=[2]):
        out(line)


def _thread_json(info: ThreadInfo) -> dict[str, Any]:
    return {
        "thread_id": info.thread_id,
        "head_id": info.head_id,
        "checkpoint_count": info.checkpoint_count,
        "created_at": info.created_at.isoformat(),
        "updated_at": info.updated_at.isoformat(),
    }


def _cmd_history(args: argparse.Namespace, out: Output) -> None:
    with open_checkpointer(args.db, schema=args.schema) as checkpointer:
        history = thread_history(checkpointer, args, args.limit)
        everything = history if args.limit is None else thread_history(checkpointer, args)
    children = collections.Counter(meta.parent_id for meta in everything)
    forks = {meta.checkpoint_id for meta in everything if meta.parent_id is not None and children[meta.parent_id] > 1}
    if args.json:
        records = [{**meta_json(meta), "fork": meta.checkpoint_id in forks} for meta in history]
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
                clip(",".join(meta.tool_names) or "-", 16),
                meta.created_at.strftime("%m-%d %H:%M:%S"),
                "fork" if meta.checkpoint_id in forks else "",
                changed,
            )
        )
    for line in table(rows, right=[2]):
        out(clip(line, WIDTH))
    if forks:
        out(f"fork: the checkpoint starts a branch (its parent has other children); {len(forks)} in this thread")
    if summaries:
        out("context_summary (a-b): the checkpoint wrote a new summary of messages a to b, sent instead of them")


def _cmd_diff(args: argparse.Namespace, out: Output) -> None:
    with open_checkpointer(args.db, schema=args.schema) as checkpointer:
        history = thread_history(checkpointer, args)
        first, second = (find_checkpoint(history, args, ref) for ref in (args.a, args.b))
        before, after = checkpoint_values(checkpointer, first), checkpoint_values(checkpointer, second)
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
        document = {"thread_id": args.thread, "from": meta_json(first), "to": meta_json(second), "changes": {}}
        for key, change in changes.items():
            document["changes"][key] = {name: jsonable(value) for name, value in change.items()}
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


# --- the commands that change a database --------------------------------------------------------------------------


def _cmd_delete(args: argparse.Namespace, out: Output) -> None:
    with open_checkpointer(args.db, schema=args.schema, access="write", command=_name(args)) as checkpointer:
        count = len(thread_history(checkpointer, args))
        what = f"thread '{args.thread}' and its {plural(count, 'checkpoint')}"
        if not args.yes:
            _confirm(f"Delete {what}?", f"not deleting {what}", "--yes (-y) deletes it without asking")
        checkpointer.delete_thread(args.thread)
    if args.json:
        out(json.dumps({"deleted": args.thread, "checkpoints": count}, ensure_ascii=False))
        return
    out(f"deleted thread '{args.thread}' ({plural(count, 'checkpoint')})")


def _confirm(question: str, refused: str, option: str) -> None:
    """
    Ask a yes/no question on the terminal (on stderr, so that stdout keeps only the output).

    :raises CliError: Without a terminal to ask on.
    :raises Declined: If the answer is not yes.
    """
    try:
        interactive = sys.stdin is not None and sys.stdin.isatty()
    except ValueError:  # a closed stdin
        interactive = False
    if not interactive:
        raise CliError(f"{refused}: stdin is not a terminal to ask for a confirmation on; {option}")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):  # end of input: finish the prompt's line
        print(file=sys.stderr)
    if answer.strip().lower() not in ("y", "yes"):
        raise Declined(f"{refused}: the answer was not yes")


def _cmd_prune(args: argparse.Namespace, out: Output) -> None:
    with open_checkpointer(args.db, schema=args.schema, access="write", command=_name(args)) as checkpointer:
        if args.thread is not None:
            thread_history(checkpointer, args, 1)
        result = checkpointer.prune(args.thread, keep_last=args.keep_last, older_than=args.older_than)
    if args.json:
        out(json.dumps(dataclasses.asdict(result), indent=2, ensure_ascii=False))
        return
    skipped = len(result.threads_skipped)
    out(
        f"removed {plural(result.checkpoints_deleted, 'checkpoint')}, "
        f"wrote {plural(result.snapshots_written, 'snapshot')}, "
        f"deleted {plural(len(result.threads_deleted), 'expired thread')}"
        + (f", skipped {plural(skipped, 'busy thread')}" if skipped else "")
    )
    if result.checkpoints_deleted and not is_postgres(args.db):
        out(f"the space is reused by later commits; to shrink the file: sqlite3 {args.db} VACUUM")


# --- running a command -----------------------------------------------------------------------------------------------

#: The function that runs each command (``store``'s runs its own actions).
HANDLERS: dict[str, Callable[[argparse.Namespace, Output], None]] = {
    "demo": _cmd_demo,
    "threads": _cmd_threads,
    "show": run_show,
    "history": _cmd_history,
    "diff": _cmd_diff,
    "log": run_log,
    "delete": _cmd_delete,
    "prune": _cmd_prune,
    "store": store_cli.run,
}


def run_command(args: argparse.Namespace) -> int:
    """
    Run a parsed command (see :func:`haystack_state_cli.build_parser`), reporting a problem as one line on stderr.

    :param args: The parsed arguments.
    :returns: The exit code: 0 on success, 1 for a problem, 130 when interrupted.
    """
    try:
        HANDLERS[args.command](args, print)
    except Declined as answer:
        print(f"{PROG}: {answer}", file=sys.stderr)
        return 1
    except CliError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except HaystackStateError as error:  # unreadable stored data and the like: the first line says what
        print(f"{PROG}: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    except sqlite3.Error as error:  # a locked file, a full disk
        print(f"{PROG}: error: {getattr(args, 'db', '')}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # piped into a command that stopped reading (head): silence the final flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``haystack-state`` command (as the console script does).

    :param argv: The arguments, without the program name; ``sys.argv[1:]`` if None.
    :returns: The exit code: 0 on success, 1 for a problem reported on stderr, 2 for bad arguments.
    """
    return haystack_state_cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
