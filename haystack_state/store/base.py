"""
The abstract :class:`Store`: long-term memory that outlives threads, as namespaced key/value items with search.

The public API (``put``, ``get``, ``delete``, ``search``, ``list_namespaces``, ``purge_expired`` and their async
twins) is written once, as *flows*: generators that yield typed operations (:mod:`haystack_state.store.ops`) and
receive their results. Checking arguments, encoding values with the checkpoint codec, embedding, filtering, paging
and ranking by similarity live here; a backend only executes operations (``_execute`` / ``_aexecute``). A driver's
error is wrapped in :class:`~haystack_state.errors.StoreError` naming the operation, the namespace and the key.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import json
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any, TypeVar

from haystack.core.errors import SerializationError

from haystack_state._flows import FlowDriver
from haystack_state._text import repaired
from haystack_state.errors import CodecError, StoreError, StoreInputError
from haystack_state.persistence.codec import decode, from_json
from haystack_state.store import ops
from haystack_state.store._search import Condition, check_filter, cosine, index_text, matches, pushable, query_terms
from haystack_state.store.embed import Embedder
from haystack_state.store.records import (
    Item,
    Row,
    check_key,
    check_namespace,
    check_paging,
    check_prefix,
    check_ttl,
    encode_value,
    join_namespace,
    split_namespace,
)

__all__ = ["Flow", "Store"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class _Embed:
    """Not a storage operation: the flow asks its driver for the embeddings of these texts."""

    texts: tuple[str, ...]


Flow = Generator["ops.Op | _Embed", Any, T]
_CHUNK = 200  # rows fetched at a time when a filter is checked here


def _utc(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


class Store(FlowDriver):
    """
    Long-term memory shared by threads: JSON-like items (dicts) under a *namespace* (a tuple of strings such as
    ``("users", "u1", "memories")``) and a key, with full-text search, filters and, given an embedder, semantic
    search. Thread-safe; usable as a context manager (``with`` or ``async with``); every method has an async twin.

    :param index: Semantic search: ``{"embed": embedder, "dims": n, "fields": ["text", ...]}``. ``embed`` is a Haystack
        text embedder component or a function from texts to vectors; ``fields`` are the top-level fields whose text
        is embedded and indexed for full-text search (default: every string in the value). Similarity is cosine,
        computed in Python over the candidates of a search.
    :param embedder: Shorthand for ``index={"embed": embedder}``.
    :param default_ttl: The time to live of items put without ``ttl``, in seconds (None: they never expire).
    """

    def __init__(
        self, *, index: Mapping[str, Any] | None = None, embedder: Any = None, default_ttl: float | None = None
    ) -> None:
        if index is not None and embedder is not None:
            raise ValueError("Pass either index={'embed': ...} or embedder=..., not both.")
        if embedder is not None:
            index = {"embed": embedder}
        self._index = Embedder(index) if index is not None else None
        try:
            self.default_ttl = check_ttl(default_ttl, ("default_ttl",))
        except StoreInputError as error:
            raise ValueError(
                f"default_ttl must be a positive number of seconds or None, got {default_ttl!r}."
            ) from error
        self._closed = False

    # --- the public API -----------------------------------------------------------------------------------------

    def put(
        self,
        namespace: Sequence[str],
        key: str,
        value: Mapping[str, Any],
        *,
        ttl: float | dt.timedelta | None = None,
        index: bool | list[str] | None = None,
    ) -> None:
        """
        Store a value under a namespace and key, replacing any value there (its ``created_at`` is kept).

        :param namespace: The namespace, for example ``("users", "u1", "memories")``.
        :param key: The key.
        :param value: A dict; anything the checkpoint codec stores (JSON types, datetimes, haystack dataclasses,
            registered classes).
        :param ttl: Seconds until the item expires (restarted by reads with ``refresh_ttl``); ``default_ttl`` if None.
        :param index: False: leave the item out of text and semantic search; a list of fields: index those
            instead of the store's ``fields``.
        :raises StoreInputError: For a bad namespace, key, value or ttl; nothing is written.
        """
        self._drive(self._put_flow(namespace, key, value, ttl, index))

    async def aput(
        self,
        namespace: Sequence[str],
        key: str,
        value: Mapping[str, Any],
        *,
        ttl: float | dt.timedelta | None = None,
        index: bool | list[str] | None = None,
    ) -> None:
        """:meth:`put`, awaiting the storage."""
        await self._adrive(self._put_flow(namespace, key, value, ttl, index))

    def get(self, namespace: Sequence[str], key: str, *, refresh_ttl: bool = True) -> Item | None:
        """
        The item under a namespace and key, or None (also once it expired).

        :param refresh_ttl: Restart the item's TTL, if it has one.
        """
        return self._drive(self._get_flow(namespace, key, refresh_ttl))

    async def aget(self, namespace: Sequence[str], key: str, *, refresh_ttl: bool = True) -> Item | None:
        """:meth:`get`, awaiting the storage."""
        return await self._adrive(self._get_flow(namespace, key, refresh_ttl))

    def delete(self, namespace: Sequence[str], key: str) -> bool:
        """Delete an item. :returns: Whether there was one."""
        return self._drive(self._delete_flow(namespace, key))

    async def adelete(self, namespace: Sequence[str], key: str) -> bool:
        """:meth:`delete`, awaiting the storage."""
        return await self._adrive(self._delete_flow(namespace, key))

    def search(
        self,
        namespace_prefix: Sequence[str] = (),
        /,
        *,
        query: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = True,
    ) -> list[Item]:
        """
        The items under a namespace prefix (``()``: all), filtered, ranked and paged.

        With ``query``, items are ranked by relevance (``Item.score``, higher is better): by cosine similarity of
        embeddings when the store has an ``index``, else by full-text relevance (items without any query word are
        left out). Without it they come newest first.

        :param namespace_prefix: The namespaces to search: this one and those below it.
        :param query: Natural-language text to rank by.
        :param filter: ``{"field": value}`` equality on the value's top-level fields, or operators:
            ``{"field": {"$gte": 3}}`` (``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``).
        :param limit: How many items at most (1-10000).
        :param offset: How many matching items to skip.
        :param refresh_ttl: Restart the TTL of the items returned, for those that have one.
        :raises StoreInputError: For a bad prefix, filter or paging.
        """
        return self._drive(self._search_flow(namespace_prefix, query, filter, limit, offset, refresh_ttl))

    async def asearch(
        self,
        namespace_prefix: Sequence[str] = (),
        /,
        *,
        query: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = True,
    ) -> list[Item]:
        """:meth:`search`, awaiting the storage."""
        return await self._adrive(self._search_flow(namespace_prefix, query, filter, limit, offset, refresh_ttl))

    def list_namespaces(
        self,
        *,
        prefix: Sequence[str] | None = None,
        suffix: Sequence[str] | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """
        The namespaces that hold live items, sorted.

        :param prefix: Only namespaces starting with these labels.
        :param suffix: Only namespaces ending with these labels.
        :param max_depth: Cut longer namespaces to this many labels (duplicates are merged).
        :param limit: How many at most.
        :param offset: How many to skip.
        """
        return self._drive(self._namespaces_flow(prefix, suffix, max_depth, limit, offset))

    async def alist_namespaces(
        self,
        *,
        prefix: Sequence[str] | None = None,
        suffix: Sequence[str] | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """:meth:`list_namespaces`, awaiting the storage."""
        return await self._adrive(self._namespaces_flow(prefix, suffix, max_depth, limit, offset))

    def purge_expired(self) -> int:
        """Delete the items whose TTL has passed (reads ignore them already). :returns: How many."""
        return int(self._drive(self._one(ops.Purge(time.time()))))

    async def apurge_expired(self) -> int:
        """:meth:`purge_expired`, awaiting the storage."""
        return int(await self._adrive(self._one(ops.Purge(time.time()))))

    # --- settings and lifetime -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """
        Serialise the store's settings (never its data), so that an Agent holding it round-trips through
        ``to_dict``. Rebuild it with :func:`haystack_state.store.store_from_dict`.

        :raises SerializationError: If the store cannot be rebuilt from settings (for example a password).
        """
        return {"type": f"{type(self).__module__}.{type(self).__name__}", "init_parameters": self.init_parameters()}

    def init_parameters(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this store (see :meth:`to_dict`)."""
        raise SerializationError(f"{type(self).__name__} cannot be serialized.")

    def _common_parameters(self) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self._index is not None:
            params["index"] = self._index.to_dict()
        if self.default_ttl is not None:
            params["default_ttl"] = self.default_ttl
        return params

    def close(self) -> None:
        """Release the backend's resources. Idempotent; the store cannot be used afterwards."""
        if not self._closed:
            self._closed = True
            self._close()

    async def aclose(self) -> None:
        """Release the backend's resources, awaiting its async connections. Idempotent."""
        if not self._closed:
            await self._aclose()
            self.close()

    # --- the pair of methods a backend implements ---------------------------------------------------------------

    @abc.abstractmethod
    def _execute(self, op: ops.Op) -> object:
        """Execute one operation (one transaction) and return its result (see :mod:`~.ops`)."""

    def _close(self) -> None:
        """Release resources."""

    async def _aclose(self) -> None:
        """Release the event loop's connections; called by :meth:`aclose` before :meth:`close`."""

    # --- driving flows ------------------------------------------------------------------------------------------

    def _step(self, op: ops.Op | _Embed) -> object:
        if isinstance(op, _Embed):
            assert self._index is not None
            return self._index(op.texts)
        return self._execute(op)

    async def _astep(self, op: ops.Op | _Embed) -> object:
        if isinstance(op, _Embed):
            assert self._index is not None
            return await self._index.acall(op.texts)
        return await self._aexecute(op)

    def _storage_error(self, step: ops.Op | _Embed, exc: Exception) -> StoreError:
        what = "embedding" if isinstance(step, _Embed) else ops.describe(step)
        return StoreError(f"{type(self).__name__}: {what} failed: {type(exc).__name__}: {' '.join(str(exc).split())}")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{type(self).__name__} is closed.")

    # --- flows --------------------------------------------------------------------------------------------------

    def _put_flow(
        self, namespace: object, key: object, value: Any, ttl: object, index: bool | list[str] | None
    ) -> Flow[None]:
        labels = check_namespace(namespace)
        key = check_key(key, labels)
        encoded, text = encode_value(value, labels, key)
        seconds = check_ttl(ttl, labels, key) if ttl is not None else self.default_ttl
        if index is not None and index is not False and (isinstance(index, str) or not isinstance(index, list)):
            raise StoreInputError(f"index for key {key!r} in namespace {labels!r} must be False, a list or None.")
        fields = index if isinstance(index, list) else (self._index.fields if self._index is not None else None)
        decoded = dict(value)
        searchable = "" if index is False else index_text(decoded, fields)
        vector = None
        if self._index is not None and index is not False:
            (found,) = yield _Embed((searchable,))
            vector = json.dumps(found)
        del encoded
        yield ops.Put(
            join_namespace(labels), key, text, "\\u0000" not in text, searchable, vector, seconds, time.time()
        )

    def _get_flow(self, namespace: object, key: object, refresh_ttl: bool) -> Flow[Item | None]:
        labels = check_namespace(namespace)
        key = check_key(key, labels)
        now = time.time()
        row: Row | None = yield ops.Get(join_namespace(labels), key, now)
        if row is None:
            return None
        if refresh_ttl and row.ttl is not None:
            yield ops.Touch(((row.namespace, row.key),), now)
        return self._item(row)

    def _delete_flow(self, namespace: object, key: object) -> Flow[bool]:
        labels = check_namespace(namespace)
        key = check_key(key, labels)
        deleted: bool = yield ops.Delete(join_namespace(labels), key, time.time())
        return deleted

    def _search_flow(
        self, prefix: object, query: object, filter: object, limit: object, offset: object, refresh_ttl: bool
    ) -> Flow[list[Item]]:
        labels = check_prefix(prefix)
        conditions = check_filter(filter)
        limit, offset = check_paging(limit, offset)
        if query is not None and not isinstance(query, str):
            raise StoreInputError(f"query must be a string or None, got {type(query).__name__}.")
        now = time.time()
        joined = join_namespace(labels)
        pushed = tuple(c for c in conditions if pushable(c))
        if query and self._index is not None:
            (wanted,) = yield _Embed((query,))
            rows = yield ops.Search(joined, None, pushed, None, 0, True, now)
            items = self._ranked(rows, conditions, wanted)[offset : offset + limit]
        else:
            terms = tuple(query_terms(query)) if query else None
            if query and not terms:  # only punctuation: nothing can match
                return []
            items = yield from self._paged(joined, terms, conditions, pushed, limit, offset, now)
        if refresh_ttl and any(item[1].ttl is not None for item in items):
            yield ops.Touch(tuple((row.namespace, row.key) for _, row in items if row.ttl is not None), now)
        return [item for item, _ in items]

    def _paged(
        self,
        prefix: str,
        terms: tuple[str, ...] | None,
        conditions: list[Condition],
        pushed: tuple[Condition, ...],
        limit: int,
        offset: int,
        now: float,
    ) -> Generator[ops.Op, Any, list[tuple[Item, Row]]]:
        if not conditions:  # the database pages exactly
            rows = yield ops.Search(prefix, terms, (), limit, offset, False, now)
            return [(self._item(row), row) for row in rows]
        found: list[tuple[Item, Row]] = []
        skipped, start = 0, 0
        while len(found) < limit:
            size = max(_CHUNK, limit + offset - skipped)
            rows = yield ops.Search(prefix, terms, pushed, size, start, False, now)
            start += len(rows)
            for row in rows:
                item = self._item(row)
                if not matches(item.value, conditions):
                    continue
                if skipped < offset:
                    skipped += 1
                elif len(found) < limit:
                    found.append((item, row))
            if len(rows) < size:
                break
        return found

    def _ranked(self, rows: list[Row], conditions: list[Condition], wanted: list[float]) -> list[tuple[Item, Row]]:
        scored: list[tuple[float, Item, Row]] = []
        unscored: list[tuple[Item, Row]] = []
        for row in rows:
            item = self._item(row)
            if not matches(item.value, conditions):
                continue
            if row.vector is None:
                unscored.append((item, row))
                continue
            score = cosine(wanted, json.loads(row.vector))
            scored.append((score, dataclasses.replace(item, score=score), row))
        scored.sort(key=lambda entry: -entry[0])
        return [(item, row) for _, item, row in scored] + unscored

    def _namespaces_flow(
        self, prefix: object, suffix: object, max_depth: object, limit: object, offset: object
    ) -> Flow[list[tuple[str, ...]]]:
        head = check_prefix(prefix, "prefix")
        tail = check_prefix(suffix, "suffix")
        if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1):
            raise StoreInputError(f"max_depth must be a positive integer or None, got {max_depth!r}.")
        limit, offset = check_paging(limit, offset)
        joined: list[str] = yield ops.Namespaces(join_namespace(head), time.time())
        seen: dict[tuple[str, ...], None] = {}
        for text in joined:
            labels = split_namespace(text)
            if tail and labels[-len(tail) :] != tail:
                continue
            seen.setdefault(labels[:max_depth] if max_depth is not None else labels, None)
        return sorted(seen)[offset : offset + limit]

    def _item(self, row: Row) -> Item:
        namespace = split_namespace(row.namespace)
        try:
            data = repaired(from_json(row.value), row.value, thread_id=None, what=f"value of key {row.key!r}")
            value = decode(data, where=f"the value of key {row.key!r} in namespace {namespace!r}")
        except CodecError as error:
            raise StoreError(
                f"{type(self).__name__}: cannot read key {row.key!r} in namespace {namespace!r}: {error}"
            ) from error
        if not isinstance(value, dict):
            raise StoreError(
                f"{type(self).__name__}: the stored value of key {row.key!r} in namespace {namespace!r} is not a dict."
            )
        return Item(namespace, row.key, value, _utc(row.created_at), _utc(row.updated_at), row.score)
