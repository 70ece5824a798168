"""
The typed operations a store backend executes, each in one transaction.

:class:`~haystack_state.store.base.Store` checks and encodes the caller's arguments, computes embeddings, and turns
every public method into one of these; a backend implements ``_execute(op)`` (and ``_aexecute(op)``) over them.
Namespaces arrive joined with '.', values as JSON text, times as epoch seconds.
"""

from __future__ import annotations

import dataclasses

from haystack_state.store._search import Condition

__all__ = ["Delete", "Get", "Namespaces", "Op", "Purge", "Put", "Search", "Touch", "describe"]


@dataclasses.dataclass(frozen=True, slots=True)
class Put:
    """Insert or replace an item (``created_at`` is kept on replace, unless the old one had expired). Returns None."""

    namespace: str
    key: str
    value: str  # JSON text
    plain: bool  # whether the JSON holds no NUL escape (a database may then evaluate filters on it)
    text: str  # what full-text search indexes
    vector: str | None  # the embedding as JSON text, or None
    ttl: float | None
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Get:
    """The item's :class:`~haystack_state.store.records.Row`, or None (also when it expired)."""

    namespace: str
    key: str
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Delete:
    """Delete an item; returns whether a live one was there."""

    namespace: str
    key: str
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Search:
    """
    Live items under a namespace prefix (``""``: all), as rows, ordered by text relevance when ``terms`` are given
    (rows that match none of them are left out), else by ``updated_at``, newest first. The ``conditions`` are
    pushable ones (see :func:`~haystack_state.store._search.pushable`); a backend may apply them (to rows whose
    ``plain`` is true) or not: the store checks every row again. ``limit`` None means all rows. With ``vectors``,
    rows carry their stored embedding.
    """

    prefix: str
    terms: tuple[str, ...] | None
    conditions: tuple[Condition, ...]
    limit: int | None
    offset: int
    vectors: bool
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Touch:
    """Restart the TTL of these items (those that have one) from ``now``. Returns None."""

    items: tuple[tuple[str, str], ...]
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Namespaces:
    """The distinct joined namespaces of live items, under ``prefix`` (``""``: all), sorted."""

    prefix: str
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Purge:
    """Delete the expired items; returns how many."""

    now: float


Op = Put | Get | Delete | Search | Touch | Namespaces | Purge
WRITES = (Put, Delete, Touch, Purge)


def describe(op: Op) -> str:
    """What an operation does, for error messages: names the namespace and the key."""
    if isinstance(op, Put | Get | Delete):
        return f"{type(op).__name__.lower()} of key {op.key!r} in namespace {tuple(op.namespace.split('.'))!r}"
    if isinstance(op, Search):
        return f"search under namespace prefix {tuple(op.prefix.split('.')) if op.prefix else ()!r}"
    if isinstance(op, Namespaces):
        return "listing the namespaces"
    if isinstance(op, Touch):
        return "refreshing TTLs"
    return "purging expired items"
