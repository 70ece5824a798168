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
``put`` creates a file, a schema or a table; ``get``, ``search`` and ``namespaces`` only read (a read-only file too),
and do not restart the TTL of the items they show; ``delete`` needs an existing, writable store. Scores print with 3
significant digits, in plain decimals. ``--json`` prints JSON. The arguments are parsed by :mod:`haystack_state_cli`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from haystack_state._cli_open import Access, open_store
from haystack_state._cli_text import Output, score_text
from haystack_state.errors import StoreInputError
from haystack_state.store.base import Store
from haystack_state.store.records import Item

__all__ = ["run"]


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


def _show(item: Item) -> str:
    data = item.to_dict()
    score = f"  score={score_text(item.score)}" if item.score is not None else ""
    return f"{'.'.join(item.namespace)}  {item.key}  {json.dumps(data['value'], ensure_ascii=False)}{score}"


def _put(args: argparse.Namespace, store: Store, out: Output) -> None:
    namespace = _namespace(args.namespace)
    store.put(namespace, args.key, _json_object(args.value, "VALUE"), ttl=args.ttl)
    item = store.get(namespace, args.key, refresh_ttl=False)
    assert item is not None
    out(json.dumps(item.to_dict(), ensure_ascii=False) if args.json else f"put {_show(item)}")


def _get(args: argparse.Namespace, store: Store, out: Output) -> None:
    namespace = _namespace(args.namespace)
    item = store.get(namespace, args.key, refresh_ttl=False)
    if item is None:
        raise StoreInputError(f"No item with key {args.key!r} in namespace {namespace!r}.")
    out(json.dumps(item.to_dict(), ensure_ascii=False) if args.json else _show(item))


def _search(args: argparse.Namespace, store: Store, out: Output) -> None:
    found = store.search(
        _namespace(args.prefix),
        query=args.query,
        filter=_json_object(args.filter, "--filter") if args.filter else None,
        limit=args.limit,
        offset=args.offset,
        refresh_ttl=False,
    )
    if args.json:
        out(json.dumps([item.to_dict() for item in found], ensure_ascii=False))
    else:
        for item in found:
            out(_show(item))


def _delete(args: argparse.Namespace, store: Store, out: Output) -> None:
    namespace = _namespace(args.namespace)
    if not store.delete(namespace, args.key):
        raise StoreInputError(f"No item with key {args.key!r} in namespace {namespace!r}.")
    out(json.dumps({"deleted": True}) if args.json else f"deleted {'.'.join(namespace)}  {args.key}")


def _namespaces(args: argparse.Namespace, store: Store, out: Output) -> None:
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


#: Each action, with how it uses the database.
ACTIONS: dict[str, tuple[Callable[[argparse.Namespace, Store, Output], None], Access]] = {
    "put": (_put, "create"),
    "get": (_get, "read"),
    "search": (_search, "read"),
    "delete": (_delete, "write"),
    "namespaces": (_namespaces, "read"),
}


def run(args: argparse.Namespace, out: Output = print) -> None:
    """
    Run a parsed ``store`` action on the store of ``--db``.

    :param args: The parsed arguments (``store_command`` names the action).
    :param out: Where to print.
    :raises CliError: For a database that cannot be used (missing, read-only, without a store).
    :raises StoreInputError: For bad input, or an item that is not there.
    """
    action, access = ACTIONS[args.store_command]
    command = f"'haystack-state store {args.store_command}'"
    with open_store(args.db, schema=args.schema, access=access, command=command) as store:
        action(args, store, out)
