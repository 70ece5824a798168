"""
Long-term memory: a :class:`Store` of namespaced items that outlives threads (in memory, SQLite, PostgreSQL), with
full-text search, filters, TTLs and optional semantic search.

:class:`PostgresStore` is imported lazily (``from haystack_state.store import PostgresStore``), so that this package
works without the ``postgres`` extra (it is left out of ``__all__`` for the same reason).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from haystack_state.store._serde import store_from_dict
from haystack_state.store.base import Store
from haystack_state.store.memory import InMemoryStore
from haystack_state.store.records import Item
from haystack_state.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from haystack_state.store.postgres import PostgresStore as PostgresStore

__all__ = ["InMemoryStore", "Item", "SQLiteStore", "Store", "store_from_dict"]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from haystack_state.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
