"""
``haystack-state store``: read and edit a long-term memory store from the shell.

::

    haystack-state store put NAMESPACE KEY VALUE --db DB [--ttl SECONDS]
    haystack-state store get NAMESPACE KEY --db DB
    haystack-state store search [PREFIX] --db DB [--query TEXT] [--filter JSON] [--limit N] [--offset N]
    haystack-state store delete NAMESPACE KEY --db DB
    haystack-state store namespaces --db DB [--prefix P] [--suffix S] [--max-depth N] [--limit N] [--offset N]

A namespace is written with dots, ``users.u1.memories`` (labels cannot contain one); VALUE and ``--filter`` are JSON
objects. ``--db`` is a SQLite file or a ``postgresql://`` URL (``--schema`` names the PostgreSQL schema). Only
``put`` creates a SQLite file; the other commands refuse a missing one. ``--json`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from haystack_state.errors import StoreInputError
from haystack_state.store.base import Store
from haystack_state.store.records import Item

__all__ = ["add_store_commands", "open_store"]


def _namespace(text: str) -> tuple[str, ...]:
    return tuple(text.split(".")) if text else ()


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise StoreInputError(f"{what} is not valid JSON: {error}.") from None
    if not isinstance(value, dict):
        raise StoreInputError(f"{what} must be a JSON object, got {type(value).__name__}.")
    return value


def open_store(db: str, schema: str = "public", *, create: bool = False) -> Store:
    """
    The store of ``--db``: PostgreSQL for a ``postgresql://`` URL (its table in ``schema``), else a SQLite file.

    :param create: Whether a missing SQLite file may be created.
    :raises StoreInputError: For a missing SQLite file (without ``create``).
    """
    if db.startswith(("postgresql://", "postgres://")):
        from haystack_state.store.postgres import PostgresStore

        return PostgresStore(db, schema=schema)
    from haystack_state.store.sqlite import SQLiteStore

    if not create and not os.path.exists(db):
        raise StoreInputError(f"{db}: no such file (only 'store put' creates one).")
    return SQLiteStore(db)


def _show(item: Item) -> str:
    data = item.to_dict()
    score = f"  score={item.score:.4g}" if item.score is not None else ""
    return f"{'.'.join(item.namespace)}  {item.key}  {json.dumps(data['value'], ensure_ascii=False)}{score}"


def _put(args: argparse.Namespace, store: Store, out: Callable[..., Any]) -> None:
    namespace = _namespace(args.namespace)
    store.put(namespace, args.key, _json_object(args.value, "VALUE"), ttl=args.ttl)
    item = store.get(namespace, args.key)
    assert item is not None
    out(json.dumps(item.to_dict(), ensure_ascii=False) if args.json else f"put {_show(item)}")


def _get(args: argparse.Namespace, store: Store, out: Callable[..., Any]) -> None:
    namespace = _namespace(args.namespace)
    item = store.get(namespace, args.key)
    if item is None:
        raise StoreInputError(f"No item with key {args.key!r} in namespace {namespace!r}.")
    out(json.dumps(item.to_dict(), ensure_ascii=False) if args.json else _show(item))


def _search(args: argparse.Namespace, store: Store, out: Callable[..., Any]) -> None:
    found = store.search(
        _namespace(args.prefix),
        query=args.query,
        filter=_json_object(args.filter, "--filter") if args.filter else None,
        limit=args.limit,
        offset=args.offset,
    )
    if args.json:
        out(json.dumps([item.to_dict() for item in found], ensure_ascii=False))
    else:
        for item in found:
            out(_show(item))


def _delete(args: argparse.Namespace, store: Store, out: Callable[..., Any]) -> None:
    namespace = _namespace(args.namespace)
    if not store.delete(namespace, args.key):
        raise StoreInputError(f"No item with key {args.key!r} in namespace {namespace!r}.")
    out(json.dumps({"deleted": True}) if args.json else f"deleted {'.'.join(namespace)}  {args.key}")


def _namespaces(args: argparse.Namespace, store: Store, out: Callable[..., Any]) -> None:
    found = store.list_namespaces(
        prefix=_namespace(args.prefix) if args.prefix else None,
        suffix=_namespace(args.suffix) if args.suffix else None,
        max_depth=args.max_depth,
        limit=args.limit,
        offset=args.offset,
    )
    if args.json:
        out(json.dumps([list(namespace) for namespace in found], ensure_ascii=False))
    else:
        for namespace in found:
            out(".".join(namespace))


def _run(action: Callable[[argparse.Namespace, Store, Callable[..., Any]], None]) -> Callable[..., None]:
    def handler(args: argparse.Namespace, out: Callable[..., Any] = print) -> None:
        with open_store(args.db, args.schema, create=action is _put) as store:
            action(args, store, out)

    return handler


def add_store_commands(subparsers: Any) -> argparse.ArgumentParser:
    """
    Add the ``store`` command and its sub-commands (``put``, ``get``, ``search``, ``delete``, ``namespaces``).

    :param subparsers: What ``parser.add_subparsers()`` returned.
    :returns: The ``store`` parser.
    """
    command: argparse.ArgumentParser = subparsers.add_parser("store", help="read and edit a long-term memory store")
    actions = command.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", required=True, metavar="PATH|URL", help="a SQLite file or a postgresql:// URL")
    db.add_argument("--schema", default="public", help="the PostgreSQL schema (default: public)")

    put = actions.add_parser("put", parents=[db], help="store a JSON object under a namespace and key")
    put.add_argument("namespace", metavar="NAMESPACE", help="dotted, for example users.u1.memories")
    put.add_argument("key", metavar="KEY")
    put.add_argument("value", metavar="VALUE", help="a JSON object")
    put.add_argument("--ttl", type=float, metavar="SECONDS", help="expire the item after this long")
    put.set_defaults(handler=_run(_put))

    get = actions.add_parser("get", parents=[db], help="print one item")
    get.add_argument("namespace", metavar="NAMESPACE")
    get.add_argument("key", metavar="KEY")
    get.set_defaults(handler=_run(_get))

    search = actions.add_parser("search", parents=[db], help="search items under a namespace prefix")
    search.add_argument("prefix", nargs="?", default="", metavar="PREFIX", help="dotted (default: every namespace)")
    search.add_argument("--query", metavar="TEXT", help="rank by relevance to this text")
    search.add_argument("--filter", metavar="JSON", help='equality or operators: {"kind": "note", "n": {"$gt": 1}}')
    search.add_argument("--limit", type=int, default=10, metavar="N")
    search.add_argument("--offset", type=int, default=0, metavar="N")
    search.set_defaults(handler=_run(_search))

    delete = actions.add_parser("delete", parents=[db], help="delete one item")
    delete.add_argument("namespace", metavar="NAMESPACE")
    delete.add_argument("key", metavar="KEY")
    delete.set_defaults(handler=_run(_delete))

    namespaces = actions.add_parser("namespaces", parents=[db], help="list the namespaces that hold items")
    namespaces.add_argument("--prefix", metavar="PREFIX")
    namespaces.add_argument("--suffix", metavar="SUFFIX")
    namespaces.add_argument("--max-depth", type=int, metavar="N")
    namespaces.add_argument("--limit", type=int, default=100, metavar="N")
    namespaces.add_argument("--offset", type=int, default=0, metavar="N")
    namespaces.set_defaults(handler=_run(_namespaces))
    return command
