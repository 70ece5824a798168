"""Rebuilding a store from its serialised settings, for ``Agent.from_dict`` and Pipeline YAML."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from haystack.core.errors import DeserializationError

from haystack_state.store.base import Store
from haystack_state.store.embed import index_from_dict
from haystack_state.store.memory import InMemoryStore
from haystack_state.store.sqlite import SQLiteStore

__all__ = ["store_from_dict"]

_MEMORY = f"{InMemoryStore.__module__}.InMemoryStore"
_SQLITE = f"{SQLiteStore.__module__}.SQLiteStore"
_POSTGRES = "haystack_state.store.postgres.PostgresStore"


def store_from_dict(data: Mapping[str, Any]) -> Store:
    """
    Rebuild a store from ``Store.to_dict`` output. Only this package's stores are rebuilt: the type is looked up in a
    fixed list, never imported by name.

    :param data: ``{"type": ..., "init_parameters": {...}}``.
    :returns: The store (an in-memory one is empty).
    :raises DeserializationError: For an unknown type or malformed data.
    """
    kind = data.get("type") if isinstance(data, Mapping) else None
    params = data.get("init_parameters", {}) if isinstance(data, Mapping) else None
    if not isinstance(params, Mapping):
        raise DeserializationError(f"A serialized store needs 'type' and 'init_parameters', got {data!r}.")
    params = dict(params)
    if isinstance(params.get("index"), Mapping):
        params["index"] = index_from_dict(params["index"])
    if kind == _MEMORY:
        return InMemoryStore(**params)
    if kind == _SQLITE:
        return SQLiteStore(**params)
    if kind == _POSTGRES:
        from haystack_state.store.postgres import PostgresStore  # the optional extra

        return PostgresStore.from_init_parameters(params)
    raise DeserializationError(f"Unknown store type {kind!r}; known: {', '.join((_MEMORY, _SQLITE, _POSTGRES))}.")
