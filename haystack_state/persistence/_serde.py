"""Rebuilding a checkpointer from its serialised settings, for ``Agent.from_dict`` and Pipeline YAML."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from haystack.core.errors import DeserializationError

from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.memory import InMemoryCheckpointer
from haystack_state.persistence.sqlite import SQLiteCheckpointer

__all__ = ["checkpointer_from_dict"]

_MEMORY = f"{InMemoryCheckpointer.__module__}.InMemoryCheckpointer"
_SQLITE = f"{SQLiteCheckpointer.__module__}.SQLiteCheckpointer"
_POSTGRES = "haystack_state.persistence.postgres.PostgresCheckpointer"


def checkpointer_from_dict(data: Mapping[str, Any]) -> Checkpointer:
    """
    Rebuild a checkpointer from ``Checkpointer.to_dict`` output. Only this package's checkpointers are rebuilt: the
    type is looked up in a fixed list, never imported by name.

    :param data: ``{"type": ..., "init_parameters": {...}}``.
    :returns: The checkpointer.
    :raises DeserializationError: For an unknown type or malformed data.
    """
    kind = data.get("type") if isinstance(data, Mapping) else None
    params = data.get("init_parameters", {}) if isinstance(data, Mapping) else None
    if not isinstance(params, Mapping):
        raise DeserializationError(f"A serialized checkpointer needs 'type' and 'init_parameters', got {data!r}.")
    if kind == _MEMORY:
        return InMemoryCheckpointer(**params)
    if kind == _SQLITE:
        return SQLiteCheckpointer(**params)
    if kind == _POSTGRES:
        from haystack_state.persistence.postgres import PostgresCheckpointer  # the optional extra

        return PostgresCheckpointer.from_init_parameters(dict(params))
    raise DeserializationError(
        f"Unknown checkpointer type {kind!r}; known: {', '.join((_MEMORY, _SQLITE, _POSTGRES))}."
    )
