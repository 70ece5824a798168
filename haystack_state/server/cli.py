"""
``haystack-state serve``: serve agents over the Agent Protocol (with the thread inspector at ``/ui``).

::

    haystack-state serve my_app:agent [more_app:other ...] [--db threads.db | --db postgresql://...]
                         [--host 127.0.0.1] [--port 8123] [--auth-keys keys.txt] [--cors-origin ORIGIN ...]

Each target is ``module:attribute``, the module imported from the working directory. The attribute is an Agent
(served under the attribute's name), a dict of agents (name -> Agent), or a callable that takes the checkpointer
(or None without ``--db``) and returns either. ``--db`` names the database of the threads: a SQLite file or a
PostgreSQL URL (several ``serve`` processes on one PostgreSQL database share the runs). An Agent without
checkpointer is served with the ``--db`` one.

``--auth-keys FILE`` (or the ``HAYSTACK_STATE_API_KEYS`` environment variable, holding the lines themselves) gives
``key=user`` lines: each request then needs a key (``x-api-key`` or ``Authorization: Bearer``) and sees its user's
threads only. The file wins over the variable. ``--cors-origin`` names the browser origins that may call the server;
without it, any origin may on a loopback address and none elsewhere.

This module loads without the ``server`` extra: the server is imported when the command runs.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from haystack_state.agent import Agent
from haystack_state.errors import HaystackStateError
from haystack_state.persistence.base import Checkpointer

if TYPE_CHECKING:
    from fastapi import FastAPI

    from haystack_state.server._context import Auth

__all__ = [
    "API_KEYS_VARIABLE",
    "ServeError",
    "add_serve_command",
    "build_app",
    "load_agents",
    "open_checkpointer",
    "serve",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8123
API_KEYS_VARIABLE = "HAYSTACK_STATE_API_KEYS"


class ServeError(HaystackStateError, ValueError):
    """``serve`` cannot start: a target that does not import or is not an agent, a bad ``--db`` or ``--auth-keys``."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def add_serve_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
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
    command.add_argument(
        "--max-concurrent-runs",
        type=_positive_int,
        default=32,
        metavar="N",
        help="runs this process executes at once (default: 32)",
    )
    command.add_argument(
        "--max-pending-runs",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="runs waiting in the queue (default: 1000)",
    )
    command.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=1024 * 1024,
        metavar="N",
        help="largest request body (default: 1 MiB)",
    )
    command.add_argument(
        "--max-messages", type=_positive_int, default=100, metavar="N", help="most messages per request (default: 100)"
    )
    command.add_argument(
        "--poll-interval",
        type=_positive_seconds,
        default=0.2,
        metavar="S",
        help="queue polling, in seconds (default: 0.2)",
    )
    command.add_argument(
        "--lease-seconds",
        type=_positive_seconds,
        default=30.0,
        metavar="S",
        help="how long a run whose worker died stays claimed before another process resumes it (default: 30; at "
        "least 3 polls)",
    )
    command.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=3,
        metavar="N",
        help="how many times a run is started, resumptions after a dead worker included, before it fails (default: 3)",
    )
    command.add_argument(
        "--auth-keys",
        metavar="FILE",
        help=f"require API keys: key=user lines (# comments); or set {API_KEYS_VARIABLE} to the lines. The file wins "
        "over the variable. Each user sees only their own threads",
    )
    command.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="a browser origin allowed to call the server, as http://localhost:3000, or '*' for any (repeatable; "
        "default: any on a loopback --host, none elsewhere)",
    )
    command.add_argument("--log-level", default="warning", help="uvicorn's log level (default: warning)")
    command.set_defaults(handler=serve)
    return command


def open_checkpointer(db: str, schema: str = "public", lease_ttl: float = 30.0) -> Checkpointer:
    """
    The checkpointer of ``--db``: PostgreSQL for a ``postgresql://`` URL (its tables in ``schema``), else a SQLite
    file.

    :param lease_ttl: How long a run's lease on its thread lasts unless renewed: ``serve`` gives its
        ``--lease-seconds``, so that a run resumed after its worker stopped finds the thread free as soon as the
        queue hands it over.
    :raises ServeError: If the database cannot be opened.
    """
    try:
        if db.startswith(("postgresql://", "postgres://")):
            from haystack_state.persistence.postgres import PostgresCheckpointer

            return PostgresCheckpointer(db, schema=schema, lease_ttl=lease_ttl)
        from haystack_state.persistence.sqlite import SQLiteCheckpointer

        return SQLiteCheckpointer(db, lease_ttl=lease_ttl)
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
            value: object = getattr(module, attribute)
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


def build_app(args: argparse.Namespace, out: Callable[..., Any] = print) -> FastAPI:
    """
    The app that ``serve`` runs, from its parsed arguments: the agents, the auth, CORS and the limits.

    :param args: The parsed arguments.
    :param out: Where to print notices (on ``sys.stderr``): an auth setting overridden, a server open to its network.
    :returns: The app (not running).
    :raises ServeError: If the agents, the database or the API keys cannot be loaded, or a setting is refused.
    """
    from haystack_state.server import EXTRA_HINT

    try:
        from haystack_state.server._app import create_app
        from haystack_state.server._context import Limits
        from haystack_state.server._cors import cors_for_host, cors_origins, is_loopback
    except ImportError as error:
        raise ServeError(f"{EXTRA_HINT} ({error})") from error
    if args.lease_seconds < 3 * args.poll_interval:
        raise ServeError(
            f"--lease-seconds {args.lease_seconds:g} is shorter than 3 polls (--poll-interval {args.poll_interval:g}): "
            "a worker renews its leases between polls, so its live runs would be taken from it"
        )
    auth = _auth(args, out)  # before the database opens: a bad key file is the quicker error
    try:
        cors = cors_origins(cors_for_host(args.host, args.cors_origin))
    except ValueError as error:
        raise ServeError(f"--cors-origin: {str(error).removeprefix('cors: ')}") from error
    if auth is None and not is_loopback(args.host):
        out(
            f"warning: serving on {args.host} without --auth-keys: whoever reaches it can read and run every thread",
            file=sys.stderr,
        )
    checkpointer = open_checkpointer(args.db, args.schema, args.lease_seconds) if args.db else None
    agents = load_agents(args.targets, checkpointer)
    unkept = [name for name, agent in agents.items() if agent.checkpointer is None]
    if unkept:
        raise ServeError(
            f"agent '{unkept[0]}' has no checkpointer to keep its threads in: add --db threads.db (a SQLite file, "
            "created if missing) or --db postgresql://..."
        )
    try:
        limits = Limits(
            max_body_bytes=args.max_body_bytes,
            max_messages=args.max_messages,
            max_concurrent_runs=args.max_concurrent_runs,
            max_pending_runs=args.max_pending_runs,
        )
        return create_app(
            agents,
            limits=limits,
            database=_database(checkpointer, args.db),
            poll_interval=args.poll_interval,
            lease_seconds=args.lease_seconds,
            max_attempts=args.max_attempts,
            auth=auth,
            cors=cors,
        )
    except ValueError as error:
        raise ServeError(str(error)) from error


def _auth(args: argparse.Namespace, out: Callable[..., Any]) -> Auth | None:
    """``api_key_auth`` over the keys of ``--auth-keys`` or else of ``$HAYSTACK_STATE_API_KEYS``; None for neither."""
    from haystack_state.server._auth import api_key_auth, parse_api_keys

    variable = os.environ.get(API_KEYS_VARIABLE)
    if args.auth_keys is not None:
        if variable is not None:
            out(f"note: --auth-keys {args.auth_keys} is used; {API_KEYS_VARIABLE} is ignored", file=sys.stderr)
        source = f"--auth-keys {args.auth_keys}"
        try:
            with open(args.auth_keys, encoding="utf-8-sig") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            raise ServeError(f"{source}: cannot read the file: {reason}") from error
    elif variable is not None:
        source, text = API_KEYS_VARIABLE, variable
    else:
        return None
    try:
        return api_key_auth(parse_api_keys(text, source=source))
    except ValueError as error:
        hint = f" ({API_KEYS_VARIABLE} holds the key=user lines; for a file, use --auth-keys)"
        raise ServeError(f"{error}{hint if source == API_KEYS_VARIABLE else ''}") from error


def serve(args: argparse.Namespace, out: Callable[..., Any] = print) -> None:
    """
    Run the server until interrupted (the ``serve`` handler).

    :param args: The parsed arguments.
    :param out: Where to print the address.
    :raises ServeError: If the agents, the database or the API keys cannot be loaded, or a setting is refused.
    """
    from haystack_state.server import EXTRA_HINT

    try:
        import uvicorn
    except ImportError as error:
        raise ServeError(f"{EXTRA_HINT} ({error})") from error
    app = build_app(args, out)
    server = app.state.server
    names = ", ".join(assistant.name for assistant in server.assistants)
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
    out(f"Serving {names} at http://{host}:{args.port} (the inspector is at /ui)", flush=True)
    settle_heap()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


#: The garbage collector's thresholds for a server (Python's are 700, 10, 10): see :func:`settle_heap`.
GC_THRESHOLDS = (20_000, 20, 20)


def settle_heap() -> None:
    """
    Tune the garbage collector for serving. What the process loaded (modules, the agents, the app) is kept out of
    the full collections, which otherwise walk all of it, a few times a minute under load, for a quarter second
    each: collected once, it is frozen (``gc.freeze``), so a full collection walks only what the requests made since
    (objects frozen are still freed when nothing refers to them; only a reference cycle among them would stay). And
    the young generation is collected every 20,000 allocations rather than 700: a run's objects, alive for its
    duration, were walked by a collection several times per run (a fifth of the server's CPU at 50 concurrent
    runs); most now die first. A collection then takes ~10 ms instead of ~0.5 ms, far less often.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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
