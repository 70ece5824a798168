"""
The ``haystack-state`` command line (the console script): every command's arguments, parsed with the standard
library alone. A command's modules (haystack-state's, and so haystack's) are imported only when it runs, so
``haystack-state --help`` and ``haystack-state COMMAND --help`` answer at once. This module sits outside the
``haystack_state`` package because importing anything inside it imports the package, and the package imports haystack;
it is the one place that imports lazily.

The commands run in :mod:`haystack_state.cli` (``demo``, ``threads``, ``show``, ``history``, ``diff``, ``log``,
``delete``, ``prune``), :mod:`haystack_state.store._cli` (``store``) and :mod:`haystack_state.server.cli` (``serve``,
whose options that module declares: the command line is handed to it as it is).

``--json`` (anywhere on the line) prints JSON on stdout and nothing else; ``--version`` prints the version. Bad
arguments exit with code 2, a problem with code 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["DEFAULT_DB", "DEMO_QUESTIONS", "PROG", "build_parser", "main"]

PROG = "haystack-state"
DEFAULT_DB = "haystack_state_demo.db"
#: How many questions the demo asks at most: ``len(haystack_state.demo.QUESTIONS)`` (a test checks they agree).
DEMO_QUESTIONS = 4
_SERVE = "serve"
_SERVE_HELP = "serve agents over the Agent Protocol, with a thread inspector at /ui"
_DB_HELP = "a SQLite file, or a postgresql:// URL"
_SCHEMA_HELP = "the PostgreSQL schema of the tables (default: public)"


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        import importlib.metadata

        try:
            version = importlib.metadata.version("haystack-state")
        except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
            version = "unknown"
        print(f"{PROG} {version}")
        parser.exit()


def _number(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if high is not None and not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def _turns(text: str) -> int:
    return _number(text, 1, DEMO_QUESTIONS)


def _positive(text: str) -> int:
    return _number(text, 1)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def _thread_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a thread id cannot be empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    """
    The command-line parser, with one sub-command per job (``--json``, accepted anywhere, is taken out before).

    :returns: The parser.
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the haystack-state demo, and inspect and tidy the threads of agents.",
        epilog=f"Start with '{PROG} demo': it prints the commands that look at the thread it wrote.",
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON (and nothing else) on stdout")
    database = argparse.ArgumentParser(add_help=False, parents=[common])
    database.add_argument("db", metavar="DB", help=_DB_HELP)
    database.add_argument("--schema", default="public", help=_SCHEMA_HELP)
    thread = argparse.ArgumentParser(add_help=False, parents=[database])
    thread.add_argument("thread", metavar="THREAD", help="the thread id")

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="run an offline multi-turn research assistant on a new thread",
        description="Run an offline research assistant (a scripted model, two tools) for a few turns on a new "
        "thread, print what each checkpoint changed, and the commands that look at the thread again.",
    )
    demo.add_argument(
        "--db", default=DEFAULT_DB, metavar="PATH|URL", help=f"{_DB_HELP} (default: {DEFAULT_DB}, created if missing)"
    )
    demo.add_argument("--schema", default="public", help=_SCHEMA_HELP)
    demo.add_argument(
        "--thread",
        type=_thread_name,
        metavar="NAME",
        help="the new thread's id (default: research, or research-2, ... if that is taken)",
    )
    demo.add_argument(
        "--turns", type=_turns, default=DEMO_QUESTIONS, metavar="N", help=f"questions to ask, 1-{DEMO_QUESTIONS}"
    )

    commands.add_parser("threads", parents=[database], help="list the threads of a database")

    show = commands.add_parser("show", parents=[thread], help="show a thread's state, key by key")
    show.add_argument("--at", metavar="CHECKPOINT", help="a checkpoint id (or its short id); the head by default")
    show.add_argument("--key", metavar="KEY", help="print this key's value only (a conversation as a transcript)")

    log = commands.add_parser(
        "log",
        parents=[thread],
        help="print a thread's conversation as a transcript",
        description="Print a thread's conversation: each message with its short id and role, tool calls with their "
        "arguments, tool results (errors marked FAILED; long results cut, --json gives them whole).",
    )
    log.add_argument("--at", metavar="CHECKPOINT", help="a checkpoint id (or its short id); the head by default")

    history = commands.add_parser("history", parents=[thread], help="list a thread's checkpoints, newest first")
    history.add_argument("--limit", type=_positive, metavar="N", help="the newest N checkpoints only")

    diff = commands.add_parser("diff", parents=[thread], help="what changed from checkpoint A to checkpoint B")
    diff.add_argument("a", metavar="A", help="the earlier checkpoint id (or its short id)")
    diff.add_argument("b", metavar="B", help="the later checkpoint id (or its short id)")

    delete = commands.add_parser(
        "delete",
        parents=[thread],
        help="delete a thread and its checkpoints (asks first)",
        description="Delete a thread and all its checkpoints. On a terminal it asks first; without one (a script, "
        "a pipe) it needs --yes.",
    )
    delete.add_argument("-y", "--yes", action="store_true", help="delete without asking")

    prune = commands.add_parser(
        "prune",
        parents=[database],
        help="remove old checkpoints (never a head or an interrupted one) and expired threads",
    )
    prune.add_argument("--thread", metavar="THREAD", help="this thread only (default: every thread)")
    prune.add_argument("--keep-last", type=_positive, metavar="N", help="keep the newest N checkpoints of a thread")
    prune.add_argument("--older-than", type=_seconds, metavar="SECONDS", help="keep checkpoints younger than this")

    serve = commands.add_parser(_SERVE, help=_SERVE_HELP, add_help=False)  # parsed by haystack_state.server.cli
    serve.add_argument("arguments", nargs=argparse.REMAINDER)
    _add_store_commands(commands, common)
    return parser


def _add_store_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    store = commands.add_parser(
        "store",
        help="read and edit a long-term memory store",
        description="Read and edit a long-term memory store. A namespace is dotted (users.u1.memories); values and "
        "filters are JSON objects. Only 'put' creates a database, schema or table; get, search and namespaces only "
        "read.",
    )
    actions = store.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    db = argparse.ArgumentParser(add_help=False, parents=[common])
    db.add_argument("--db", required=True, metavar="PATH|URL", help=_DB_HELP)
    db.add_argument("--schema", default="public", help=_SCHEMA_HELP)

    put = actions.add_parser("put", parents=[db], help="store a JSON object under a namespace and key")
    put.add_argument("namespace", metavar="NAMESPACE", help="dotted, for example users.u1.memories")
    put.add_argument("key", metavar="KEY")
    put.add_argument("value", metavar="VALUE", help="a JSON object")
    put.add_argument("--ttl", type=float, metavar="SECONDS", help="expire the item after this long")

    get = actions.add_parser("get", parents=[db], help="print one item")
    get.add_argument("namespace", metavar="NAMESPACE")
    get.add_argument("key", metavar="KEY")

    search = actions.add_parser("search", parents=[db], help="search items under a namespace prefix")
    search.add_argument("prefix", nargs="?", default="", metavar="PREFIX", help="dotted (default: every namespace)")
    search.add_argument("--query", metavar="TEXT", help="rank by relevance to this text")
    search.add_argument("--filter", metavar="JSON", help='equality or operators: {"kind": "note", "n": {"$gt": 1}}')
    search.add_argument("--limit", type=int, default=10, metavar="N")
    search.add_argument("--offset", type=int, default=0, metavar="N")

    delete = actions.add_parser("delete", parents=[db], help="delete one item")
    delete.add_argument("namespace", metavar="NAMESPACE")
    delete.add_argument("key", metavar="KEY")

    namespaces = actions.add_parser("namespaces", parents=[db], help="list the namespaces that hold items")
    namespaces.add_argument("--prefix", metavar="PREFIX")
    namespaces.add_argument("--suffix", metavar="SUFFIX")
    namespaces.add_argument("--max-depth", type=int, metavar="N")
    namespaces.add_argument("--limit", type=int, default=100, metavar="N")
    namespaces.add_argument("--offset", type=int, default=0, metavar="N")


def _exit_code(stop: SystemExit) -> int:
    """The exit code of argparse's exit (after a usage error, ``--help`` or ``--version``)."""
    return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1


def _serve(arguments: list[str]) -> int:
    """``serve``: its parser and its work are :mod:`haystack_state.server.cli`'s."""
    from haystack_state.server.cli import main as serve

    try:
        return serve(arguments)
    except SystemExit as stop:
        return _exit_code(stop)


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``haystack-state`` command.

    :param argv: The arguments, without the program name; ``sys.argv[1:]`` if None.
    :returns: The exit code: 0 on success, 1 for a problem reported on stderr, 2 for bad arguments.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    # --json anywhere on the line: before or after the command, or among its arguments.
    as_json = "--json" in arguments
    arguments = [argument for argument in arguments if argument != "--json"]
    if arguments[:1] == [_SERVE]:
        return _serve(arguments)
    try:
        args = build_parser().parse_args(arguments)
    except SystemExit as stop:  # argparse has printed the usage and the error (or the help)
        return _exit_code(stop)
    if args.command == _SERVE:  # options before the command
        return _serve(arguments[arguments.index(_SERVE) :])
    args.json = as_json
    from haystack_state.cli import run_command  # the command runs: now import haystack-state

    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
