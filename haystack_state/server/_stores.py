"""
The server's long-term memory store: the one given to ``create_app(store=...)``, or by default a store on the
checkpointer's database (so ``haystack-state serve --db ...`` serves the store beside the threads), and how a user's
namespaces are kept apart from every other user's.
"""

from __future__ import annotations

from collections.abc import Sequence

from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.memory import InMemoryCheckpointer
from haystack_state.persistence.sqlite import SQLiteCheckpointer
from haystack_state.server._database import postgres_schema, postgres_settings
from haystack_state.store.base import Store
from haystack_state.store.memory import InMemoryStore
from haystack_state.store.sqlite import SQLiteStore

__all__ = ["OWNER_ROOT", "owned", "store_for", "unowned"]

#: With ``auth``, the items a user puts through the server live under ``(OWNER_ROOT, <user>, *namespace)``.
OWNER_ROOT = "owners"


def _user_label(user: str) -> str:
    """The user id as one namespace label: '%', '.' and NUL are percent-escaped (so distinct ids stay distinct)."""
    return user.replace("%", "%25").replace(".", "%2E").replace("\x00", "%00")


def owned(user: str, namespace: Sequence[str]) -> tuple[str, ...]:
    """The stored namespace of a user's namespace: under the user's own root ("" is the anonymous user: as is)."""
    return (OWNER_ROOT, _user_label(user), *namespace) if user else tuple(namespace)


def unowned(user: str, namespace: Sequence[str]) -> tuple[str, ...]:
    """The namespace a user sees for a stored one (see :func:`owned`)."""
    return tuple(namespace[2:]) if user else tuple(namespace)


def store_for(checkpointer: Checkpointer, database: str | None = None) -> Store:
    """
    A store on the checkpointer's database (or on ``database``: a SQLite path or a ``postgresql://`` URL).

    :raises ValueError: If the checkpointer's database cannot be found (pass ``database``, or a store).
    """
    name = type(checkpointer).__name__
    if database is not None:
        if database.startswith(("postgresql://", "postgres://")):
            from haystack_state.store.postgres import PostgresStore

            return PostgresStore(database, schema=postgres_schema(checkpointer))
        return SQLiteStore(database)
    if isinstance(checkpointer, InMemoryCheckpointer):
        return InMemoryStore()
    if isinstance(checkpointer, SQLiteCheckpointer):
        params = checkpointer.init_parameters()
        path = str(params["path"])
        return InMemoryStore() if path == ":memory:" else SQLiteStore(path, timeout=float(params.get("timeout", 30.0)))
    if name == "PostgresCheckpointer":
        from haystack_state.store.postgres import PostgresStore

        conninfo, schema = postgres_settings(
            checkpointer, " for its store", "create_app(..., store=PostgresStore(...)) or database='postgresql://...'"
        )
        return PostgresStore(conninfo, schema=schema)
    raise ValueError(f"The server cannot put a store beside a {name}; pass create_app(..., store=...).")
