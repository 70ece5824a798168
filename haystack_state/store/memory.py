"""
:class:`InMemoryStore`: a store in this process's memory, for tests and single-process prototypes. Values are kept
as the codec's JSON text, like the database stores keep them, so what a read returns is always a fresh copy.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from haystack_state.store import ops
from haystack_state.store._search import bm25_scores
from haystack_state.store.base import Store
from haystack_state.store.records import Row

__all__ = ["InMemoryStore"]


@dataclasses.dataclass(slots=True)
class _StoredItem:
    value: str
    text: str
    vector: str | None
    created_at: float
    updated_at: float
    ttl: float | None
    expires_at: float | None

    def live(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now


def _under(namespace: str, prefix: str) -> bool:
    return not prefix or namespace == prefix or namespace.startswith(prefix + ".")


class InMemoryStore(Store):
    """
    A store in memory (lost when the process ends). Full-text search ranks with BM25 over the searched namespaces.

    :param kwargs: The settings of :class:`~haystack_state.store.base.Store` (``index``, ``embedder``,
        ``default_ttl``).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._items: dict[tuple[str, str], _StoredItem] = {}
        self._lock = threading.Lock()

    def init_parameters(self) -> dict[str, Any]:
        """The settings (an in-memory store is rebuilt empty)."""
        return self._common_parameters()

    def _execute(self, op: ops.Op) -> Any:
        with self._lock:
            if isinstance(op, ops.Put):
                return self._put(op)
            if isinstance(op, ops.Get):
                entry = self._items.get((op.namespace, op.key))
                return self._row(op.namespace, op.key, entry) if entry is not None and entry.live(op.now) else None
            if isinstance(op, ops.Delete):
                entry = self._items.pop((op.namespace, op.key), None)
                return entry is not None and entry.live(op.now)
            if isinstance(op, ops.Search):
                return self._search(op)
            if isinstance(op, ops.Touch):
                for pair in op.items:
                    found = self._items.get(pair)
                    if found is not None and found.ttl is not None and found.live(op.now):
                        found.expires_at = op.now + found.ttl
                return None
            if isinstance(op, ops.Namespaces):
                return sorted(
                    {ns for (ns, _), entry in self._items.items() if entry.live(op.now) and _under(ns, op.prefix)}
                )
            expired = [pair for pair, entry in self._items.items() if not entry.live(op.now)]
            for pair in expired:
                del self._items[pair]
            return len(expired)

    def _put(self, op: ops.Put) -> None:
        old = self._items.get((op.namespace, op.key))
        created = old.created_at if old is not None and old.live(op.now) else op.now
        expires = op.now + op.ttl if op.ttl is not None else None
        self._items[(op.namespace, op.key)] = _StoredItem(
            op.value, op.text, op.vector, created, op.now, op.ttl, expires
        )

    @staticmethod
    def _row(namespace: str, key: str, entry: _StoredItem, score: float | None = None, vectors: bool = False) -> Row:
        vector = entry.vector if vectors else None
        return Row(namespace, key, entry.value, entry.created_at, entry.updated_at, entry.ttl, score, vector)

    def _search(self, op: ops.Search) -> list[Row]:
        found = [
            (ns, key, entry) for (ns, key), entry in self._items.items() if entry.live(op.now) and _under(ns, op.prefix)
        ]
        if op.terms is not None:
            scores = bm25_scores([entry.text for _, _, entry in found], op.terms)
            ranked = [(score, *hit) for score, hit in zip(scores, found, strict=True) if score > 0]
            ranked.sort(key=lambda r: (-r[0], -r[3].updated_at, r[1], r[2]))
            rows = [self._row(ns, key, entry, score, op.vectors) for score, ns, key, entry in ranked]
        else:
            found.sort(key=lambda r: (-r[2].updated_at, r[0], r[1]))
            rows = [self._row(ns, key, entry, None, op.vectors) for ns, key, entry in found]
        end = None if op.limit is None else op.offset + op.limit
        return rows[op.offset : end]
