"""
Durable checkpoints of agent state: a safe JSON codec and checkpointers (in memory, SQLite, PostgreSQL).

:class:`PostgresCheckpointer` is imported lazily (``from haystack_state.persistence import PostgresCheckpointer``),
so that this package works without the ``postgres`` extra (it is left out of ``__all__`` for the same reason).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from haystack_state.persistence._registry import register_type, registered_names
from haystack_state.persistence._serde import checkpointer_from_dict
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.codec import decode, dumps, encode, loads
from haystack_state.persistence.delta import Delta, Source, delete, extend, new_checkpoint_id, replace
from haystack_state.persistence.memory import InMemoryCheckpointer
from haystack_state.persistence.records import (
    Checkpoint,
    CheckpointMeta,
    CheckpointMetadata,
    Lease,
    LeaseHolder,
    PruneResult,
    ThreadInfo,
)
from haystack_state.persistence.sqlite import SQLiteCheckpointer

if TYPE_CHECKING:
    from haystack_state.persistence.postgres import PostgresCheckpointer as PostgresCheckpointer

__all__ = [
    "Checkpoint",
    "CheckpointMeta",
    "CheckpointMetadata",
    "Checkpointer",
    "Delta",
    "InMemoryCheckpointer",
    "Lease",
    "LeaseHolder",
    "PruneResult",
    "SQLiteCheckpointer",
    "Source",
    "ThreadInfo",
    "checkpointer_from_dict",
    "decode",
    "delete",
    "dumps",
    "encode",
    "extend",
    "loads",
    "new_checkpoint_id",
    "register_type",
    "registered_names",
    "replace",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresCheckpointer":
        from haystack_state.persistence.postgres import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
