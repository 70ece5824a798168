"""
``haystack-state serve``: serve agents over the Agent Protocol (with the thread inspector at ``/ui``).

::

    haystack-state serve my_app:agent [more_app:other ...] [--db threads.db | --db postgresql://...]
                         [--host 127.0.0.1] [--port 8123]

Each target is ``module:attribute``, the module imported from the working directory. The attribute is an Agent
(served under the attribute's name), a dict of agents (name -> Agent), or a callable that takes the checkpointer
(or None without ``--db``) and returns either. ``--db`` names the database of the threads: a SQLite file or a
PostgreSQL URL (several ``serve`` processes on one PostgreSQL database share the runs). An Agent without
checkpointer is served with the ``--db`` one.

This module loads without the ``server`` extra: the server is imported when the command runs.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from haystack_state.agent import Agent
from haystack_state.errors import HaystackStateError
from haystack_state.persistence.base import Checkpointer

__all__ = ["ServeError", "add_serve_command", "load_agents", "open_checkpointer", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8123


class ServeError(HaystackStateError, ValueError):
    """``serve`` cannot start: a target that does not import or is not an agent, a bad ``--db``."""


def add_serve_command(subparsers: Any) -> argparse.ArgumentParser:
    """
    Add the ``serve`` sub-command to a parser's sub-commands.

    :param subparsers: What ``parser.add_subparsers()`` returned.
    :returns: The ``serve`` parser (its handler is :func:`serve`).
    """
    command: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve agents over the Agent Protocol, with a thread inspector at /ui"
    )
    command.add_argument(
        "targets", nargs="+", metavar="MODULE:AGENT", help="an Agent, a dict of agents, or a factory(checkpointer)"
    )
    command.add_argument("--db", metavar="PATH|URL", help="the threads' database: a SQLite file or a postgresql:// URL")
    command.add_argument("--schema", default="public", help="the PostgreSQL schema of the tables (default: public)")
    command.add_argument("--host", default=DEFAULT_HOST, help=f"the address to bind (default: {DEFAULT_HOST})")
    command.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port (default: {DEFAULT_PORT})")
    command.add_argument("--max-concurrent-runs", type=int, default=32, metavar="N", help="runs executing at once")
    command.add_argument("--max-pending-runs", type=int, default=1000, metavar="N", help="runs waiting in the queue")
    command.add_argument("--max-body-bytes", type=int, default=1024 * 1024, metavar="N", help="largest request body")
    command.add_argument("--max-messages", type=int, default=100, metavar="N", help="most messages per request")
    command.add_argument("--poll-interval", type=float, default=0.2, metavar="S", help="queue polling, in seconds")
    command.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")
    command.set_defaults(handler=serve)
    return command


def open_checkpointer(db: str, schema: str = "public") -> Checkpointer:
    """
    The checkpointer of ``--db``: PostgreSQL for a ``postgresql://`` URL (its tables in ``schema``), else a SQLite
    file.

    :raises ServeError: If the database cannot be opened.
    """
    try:
        if db.startswith(("postgresql://", "postgres://")):
            from haystack_state.persistence.postgres import PostgresCheckpointer

            return PostgresCheckpointer(db, schema=schema)
        from haystack_state.persistence.sqlite import SQLiteCheckpointer

        return SQLiteCheckpointer(db)
    except (HaystackStateError, OSError, ImportError) as error:
        raise ServeError(f"--db {db}: {str(error).splitlines()[0]}") from error
    except Exception as error:  # a driver's connection error
        raise ServeError(f"--db {db}: cannot open the database: {error}") from error


def load_agents(targets: Sequence[str], checkpointer: Checkpointer | None) -> dict[str, Agent]:
    """
    Import the agents named by ``module:attribute`` targets.

    :param targets: The targets.
    :param checkpointer: The ``--db`` checkpointer, given to factories and to agents that have none.
    :returns: name -> Agent.
    :raises ServeError: For a target that does not import or does not give agents, or two agents of one name.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    agents: dict[str, Agent] = {}
    for target in targets:
        module_name, _, attribute = target.partition(":")
        if not module_name or not attribute:
            raise ServeError(f"'{target}': a target is module:attribute, for example my_app:agent")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ServeError(f"'{target}': cannot import {module_name}: {error}") from error
        try:
            value: Any = getattr(module, attribute)
        except AttributeError:
            raise ServeError(f"'{target}': {module_name} has no attribute '{attribute}'") from None
        if callable(value) and not isinstance(value, Agent):
            value = value(checkpointer)
        found = {attribute: value} if isinstance(value, Agent) else value
        if not isinstance(found, Mapping) or not all(isinstance(a, Agent) for a in found.values()):
            raise ServeError(f"'{target}' is not an Agent, a dict of agents or a factory of them")
        for name, agent in found.items():
            if name in agents:
                raise ServeError(f"two agents are named '{name}'; serve them from a dict with distinct names")
            agents[str(name)] = _with_checkpointer(str(name), agent, checkpointer)
    return agents


def _with_checkpointer(name: str, agent: Agent, checkpointer: Checkpointer | None) -> Agent:
    if checkpointer is None or agent.checkpointer is checkpointer:
        return agent
    if agent.checkpointer is not None:
        raise ServeError(f"agent '{name}' has a checkpointer of its own; drop --db, or build the agent without one")
    served = copy.copy(agent)  # the same agent, with the --db checkpointer
    served.checkpointer = checkpointer
    return served


def serve(args: argparse.Namespace, out: Callable[..., Any] = print) -> None:
    """
    Run the server until interrupted (the ``serve`` handler).

    :param args: The parsed arguments.
    :param out: Where to print the address.
    :raises ServeError: If the agents or the database cannot be loaded.
    """
    from haystack_state.server import EXTRA_HINT

    try:
        import uvicorn

        from haystack_state.server.app import create_app
        from haystack_state.server.context import Limits
    except ImportError as error:
        raise ServeError(f"{EXTRA_HINT} ({error})") from error
    checkpointer = open_checkpointer(args.db, args.schema) if args.db else None
    agents = load_agents(args.targets, checkpointer)
    try:
        limits = Limits(
            max_body_bytes=args.max_body_bytes,
            max_messages=args.max_messages,
            max_concurrent_runs=args.max_concurrent_runs,
            max_pending_runs=args.max_pending_runs,
        )
        app = create_app(
            agents, limits=limits, database=_database(checkpointer, args.db), poll_interval=args.poll_interval
        )
    except ValueError as error:
        raise ServeError(str(error)) from error
    out(f"Serving {', '.join(agents)} at http://{args.host}:{args.port} (the inspector is at /ui)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


def _database(checkpointer: Checkpointer | None, db: str | None) -> str | None:
    """``--db`` for create_app when the checkpointer hides its settings (a password in the URL), else None."""
    if checkpointer is None or db is None:
        return None
    try:
        checkpointer.init_parameters()
    except Exception:
        return db
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m haystack_state.server.cli serve ...``: the command on its own."""
    parser = argparse.ArgumentParser(prog="haystack-state")
    add_serve_command(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    try:
        args.handler(args, print)
    except HaystackStateError as error:
        print(f"haystack-state: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
