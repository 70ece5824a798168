"""
The long-term memory store's contract, on every backend (in memory, SQLite, PostgreSQL in a fresh schema): items
round-trip through the codec, namespaces are isolated, hostile input is refused (or stored exactly) and leaves the
store as it was, search ranks by text or by embeddings, filters and pages mean the same everywhere, TTLs expire,
the async twins match, driver errors are wrapped, and settings serialize.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack import component
from haystack.core.serialization import allow_deserialization_module
from haystack.dataclasses import ChatMessage
from persistence.harness import postgres_dsn, postgres_schema

from haystack_state import SQLiteCheckpointer
from haystack_state.errors import StoreError, StoreInputError
from haystack_state.store import InMemoryStore, Item, SQLiteStore, Store, store_from_dict

__all__ = ["postgres_dsn", "postgres_schema"]  # fixtures
allow_deserialization_module(__name__)  # lets store_from_dict rebuild the embedder component defined here

NS = ("users", "u1", "memories")
VOCABULARY = ("coffee", "tea", "cake", "rain", "sun")


@component
class KeywordEmbedder:
    """A deterministic text embedder: one dimension per word of a small vocabulary, counting its occurrences."""

    def __init__(self, vocabulary: list[str] | None = None) -> None:
        self.vocabulary = list(vocabulary or VOCABULARY)

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, Any]:
        words = text.lower().split()
        return {"embedding": [float(words.count(word)) for word in self.vocabulary]}


class Backend:
    """Makes stores of one backend on shared storage."""

    def __init__(self, name: str, path: Path, dsn: str | None = None, schema: str | None = None) -> None:
        self.name, self.path, self.dsn, self.schema = name, path, dsn, schema
        self.opened: list[Store] = []

    def make(self, **kwargs: Any) -> Store:
        store: Store
        if self.name == "memory":
            store = InMemoryStore(**kwargs)
        elif self.name == "sqlite":
            store = SQLiteStore(self.path, **kwargs)
        else:
            from haystack_state.store import PostgresStore

            store = PostgresStore(self.dsn or "", schema=self.schema or "public", **kwargs)
        self.opened.append(store)
        return store

    def sql(self, store: Store, query: str) -> None:
        """Run a statement on the store's database (to break it)."""
        if self.name == "sqlite":
            assert isinstance(store, SQLiteStore)
            with store._raw_connection() as conn:
                conn.execute(query)
        else:
            from haystack_state.store.postgres import PostgresStore

            assert isinstance(store, PostgresStore)
            with store._raw_connection() as conn:
                conn.execute(query.replace("haystack_state_store", f'"{self.schema}".haystack_state_store'))


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "postgres":
        made = Backend(
            "postgres", tmp_path, request.getfixturevalue("postgres_dsn"), request.getfixturevalue("postgres_schema")
        )
    else:
        made = Backend(request.param, tmp_path / "store.db")
    yield made
    for store in made.opened:
        store.close()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.make()


def keys(items: list[Item]) -> list[str]:
    return [item.key for item in items]


# --- items ----------------------------------------------------------------------------------------------------


def test_an_item_round_trips_with_the_codecs_types(store: Store) -> None:
    when = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    value = {"text": "likes tea", "when": when, "pair": (1, 2), "tags": {"a"}, "msg": ChatMessage.from_user("hi")}
    store.put(NS, "pref", value)
    item = store.get(NS, "pref")
    assert item is not None
    assert (item.namespace, item.key, item.value, item.score) == (NS, "pref", value, None)
    assert item.created_at == item.updated_at and item.created_at.tzinfo is not None
    item.value["text"] = "changed by the caller"
    again = store.get(NS, "pref")
    assert again is not None and again.value["text"] == "likes tea"


def test_a_put_replaces_the_value_and_keeps_created_at(store: Store) -> None:
    store.put(NS, "k", {"v": 1})
    first = store.get(NS, "k")
    time.sleep(0.01)
    store.put(NS, "k", {"v": 2})
    second = store.get(NS, "k")
    assert first is not None and second is not None
    assert second.value == {"v": 2}
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    assert keys(store.search(NS)) == ["k"]


def test_get_and_delete_of_missing_items(store: Store) -> None:
    assert store.get(NS, "nothing") is None
    assert store.delete(NS, "nothing") is False
    store.put(NS, "k", {"v": 1})
    assert store.delete(NS, "k") is True
    assert store.get(NS, "k") is None
    assert store.search(NS) == []
    assert store.list_namespaces() == []


def test_a_sqlite_store_persists_and_shares_a_file_with_a_checkpointer(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with SQLiteCheckpointer(path) as checkpointer, SQLiteStore(path) as first:
        first.put(NS, "k", {"text": "persisted"})
        assert checkpointer.list_threads() == []
    with SQLiteStore(path) as second:
        item = second.get(NS, "k")
        assert item is not None and item.value == {"text": "persisted"}
        assert keys(second.search((), query="persisted")) == ["k"]


# --- namespaces -----------------------------------------------------------------------------------------------


def test_namespaces_are_isolated(store: Store) -> None:
    store.put(("users", "u1"), "k", {"text": "one coffee"})
    store.put(("users", "u10"), "k", {"text": "ten coffee"})
    store.put(("users", "u1", "deep"), "k", {"text": "deep coffee"})
    one = store.get(("users", "u1"), "k")
    assert one is not None and one.value == {"text": "one coffee"}
    assert sorted(i.namespace for i in store.search(("users", "u1"))) == [("users", "u1"), ("users", "u1", "deep")]
    assert [i.namespace for i in store.search(("users", "u10"), query="coffee")] == [("users", "u10")]
    assert store.search(("users", "u")) == []  # a prefix is whole labels, not characters
    store.delete(("users", "u1"), "k")
    ten = store.get(("users", "u10"), "k")
    assert ten is not None and ten.value == {"text": "ten coffee"}


def test_list_namespaces(store: Store) -> None:
    for namespace in [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "c", "f"), ("z",)]:
        store.put(namespace, "k", {"v": 1})
    assert store.list_namespaces() == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "c", "f"),
        ("z",),
    ]
    assert store.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i")]
    assert store.list_namespaces(prefix=("a", "b"), max_depth=3) == [("a", "b", "c"), ("a", "b", "d")]
    assert store.list_namespaces(suffix=("f",)) == [("a", "c", "f")]
    assert store.list_namespaces(max_depth=1) == [("a",), ("z",)]
    assert store.list_namespaces(limit=2, offset=1) == [("a", "b", "d", "e"), ("a", "b", "d", "i")]
    assert store.list_namespaces(prefix=("a", "x")) == []


# --- hostile input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "key", "value", "named"),
    [
        ((), "k", {}, "empty"),
        ("users", "k", {}, "'users'"),
        (("users", ""), "k", {}, "label 1"),
        (("us.ers",), "k", {}, "'us.ers'"),
        (("a\x00b",), "k", {}, "NUL"),
        (("a", 3), "k", {}, "int"),
        (("x" * 300,), "k", {}, "longer"),
        (NS, "", {}, "key ''"),
        (NS, "a\x00b", {}, "NUL"),
        (NS, 7, {}, "key 7"),
        (NS, "k", ["not", "a", "dict"], "must be a dict"),
        (NS, "k", {"conn": sqlite3.connect(":memory:")}, "Connection"),
        (NS, "k", {3: "int key"}, "field 3"),
        (NS, "k", {"__type__": "dict"}, "reserved"),
    ],
)
def test_bad_input_is_refused_by_name_and_changes_nothing(
    store: Store, namespace: Any, key: Any, value: Any, named: str
) -> None:
    store.put(NS, "kept", {"v": 1})
    with pytest.raises(StoreInputError, match=named) as raised:
        store.put(namespace, key, value)
    assert isinstance(raised.value, ValueError)
    assert keys(store.search(())) == ["kept"] and store.list_namespaces() == [NS]


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get(("a.b",), "k"),
        lambda s: s.delete(NS, ""),
        lambda s: s.search(("a", ""), query="x"),
        lambda s: s.search(NS, limit=0),
        lambda s: s.search(NS, offset=-1),
        lambda s: s.search(NS, limit=True),
        lambda s: s.search(NS, filter={"n": {"$regex": "x"}}),
        lambda s: s.search(NS, filter={"n": {"$gt": [1]}}),
        lambda s: s.search(NS, filter=["n"]),
        lambda s: s.search(NS, query=3),
        lambda s: s.list_namespaces(max_depth=0),
        lambda s: s.list_namespaces(prefix=("a.b",)),
        lambda s: s.put(NS, "k", {"v": 1}, ttl=-1),
        lambda s: s.put(NS, "k", {"v": 1}, ttl=float("nan")),
        lambda s: s.put(NS, "k", {"v": 1}, index="text"),
    ],
)
def test_bad_arguments_are_input_errors(store: Store, call: Any) -> None:
    with pytest.raises(StoreInputError):
        call(store)
    assert store.list_namespaces() == []


HOSTILE = [
    "'; DROP TABLE haystack_state_store; --",
    'quote " and \\ backslash',
    "100%_wild*card?",
    "ünïcödé ✓ 🧠",
    "/slash/and:colon",
    "x" * 1000,
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_but_valid_names_and_values_are_stored_exactly(store: Store, text: str) -> None:
    label = text[:200]
    value = {"text": text, "nul": "a\x00b", "nested": {"k": [text, None, 1.5]}, text: text}
    store.put((label, "x"), text, value)
    store.put((label + "_other", "x"), text, {"other": True})
    item = store.get((label, "x"), text)
    assert item is not None and item.value == value and item.key == text
    assert [i.key for i in store.search((label,))] == [text]
    assert store.list_namespaces(prefix=(label,)) == [(label, "x")]
    assert [i.value for i in store.search((label,), filter={"nul": "a\x00b"})] == [value]
    assert [i.value for i in store.search((label,), filter={text: text})] == [value]
    assert store.delete((label, "x"), text) is True
    assert store.list_namespaces() == [(label + "_other", "x")]


# --- search ---------------------------------------------------------------------------------------------------


def test_text_search_ranks_by_relevance_and_leaves_out_what_does_not_match(store: Store) -> None:
    store.put(NS, "many", {"text": "coffee coffee coffee"})
    store.put(NS, "once", {"text": "a long note about rain and sun where coffee appears once among many words"})
    store.put(NS, "none", {"text": "tea and cake"})
    found = store.search(NS, query="Coffee!")
    assert keys(found) == ["many", "once"]
    assert all(item.score is not None for item in found)
    assert found[0].score is not None and found[1].score is not None and found[0].score > found[1].score
    both = store.search(NS, query="tea cake")
    assert keys(both) == ["none"]
    assert store.search(NS, query="espresso") == [] and store.search(NS, query="?!") == []


def test_text_search_covers_nested_strings_and_honours_index_false(store: Store) -> None:
    store.put(NS, "nested", {"notes": [{"body": "the umbrella is red"}], "n": 1})
    store.put(NS, "hidden", {"text": "umbrella"}, index=False)
    store.put(NS, "field", {"title": "umbrella", "body": "nothing"}, index=["body"])
    assert keys(store.search(NS, query="umbrella")) == ["nested"]
    assert keys(store.search(NS)) == ["field", "hidden", "nested"]  # unindexed items are still listed


def test_search_without_query_is_newest_first_and_pages(store: Store) -> None:
    for i in range(25):
        store.put(NS, f"k{i:02d}", {"i": i, "even": i % 2 == 0})
    newest_first = [f"k{i:02d}" for i in reversed(range(25))]
    pages = [keys(store.search(NS, limit=10, offset=offset)) for offset in (0, 10, 20, 30)]
    assert pages[0] + pages[1] + pages[2] == newest_first and pages[3] == []
    evens = [f"k{i:02d}" for i in reversed(range(0, 25, 2))]
    assert keys(store.search(NS, filter={"even": True}, limit=5, offset=3)) == evens[3:8]
    assert keys(store.search(NS, filter={"i": {"$gte": 20}}, limit=100)) == newest_first[:5]


def test_filters(store: Store) -> None:
    store.put(NS, "a", {"n": 1, "flag": True, "name": "ann", "tags": ["x"], "meta": {"k": 1}})
    store.put(NS, "b", {"n": 2.5, "flag": 1, "name": "bob", "none": None})
    store.put(NS, "c", {"n": "3", "flag": False, "name": "cy\x00", "tags": ["x", "y"]})

    def found(flt: dict[str, Any]) -> list[str]:
        return sorted(keys(store.search(NS, filter=flt)))

    assert found({"flag": True}) == ["a"]  # True is not 1
    assert found({"flag": 1}) == ["b"]
    assert found({"n": 1}) == ["a"] and found({"n": 1.0}) == ["a"] and found({"n": "3"}) == ["c"]
    assert found({"n": {"$gt": 1}}) == ["b"]  # "3" is a string: not compared with numbers
    assert found({"n": {"$gte": 1, "$lt": 2.5}}) == ["a"]
    assert found({"name": {"$gt": "b"}}) == ["b", "c"]
    assert found({"name": {"$ne": "ann"}}) == ["b", "c"]
    assert found({"none": None}) == ["b"]
    assert found({"none": {"$ne": None}}) == ["a", "c"]  # a missing field equals nothing
    assert found({"tags": ["x"]}) == ["a"] and found({"meta": {"k": 1}}) == ["a"]
    assert found({"name": "cy\x00"}) == ["c"]
    assert found({"missing": 1}) == []
    assert found({"flag": True, "n": 1}) == ["a"] and found({"flag": True, "n": 2.5}) == []


def test_semantic_search_ranks_by_cosine_similarity(backend: Backend) -> None:
    store = backend.make(index={"embed": KeywordEmbedder(), "dims": len(VOCABULARY), "fields": ["text"]})
    store.put(NS, "coffee", {"text": "coffee coffee cake", "kind": "drink"})
    store.put(NS, "tea", {"text": "tea tea", "kind": "drink"})
    store.put(NS, "weather", {"text": "rain sun cake", "kind": "weather"})
    store.put(NS, "skipped", {"text": "coffee"}, index=False)
    found = store.search(NS, query="coffee cake", limit=3)
    assert keys(found) == ["coffee", "weather", "tea"]
    assert [item.score for item in found] == pytest.approx([3 / 10**0.5, 1 / 6**0.5, 0.0])
    assert keys(store.search(NS, query="tea", filter={"kind": "drink"}, limit=1)) == ["tea"]
    assert keys(store.search(NS, query="coffee", offset=3)) == ["skipped"]  # without an embedding: last, no score


def test_an_embedder_with_the_wrong_dimension_is_a_store_error(backend: Backend) -> None:
    store = backend.make(index={"embed": KeywordEmbedder(), "dims": 3})
    with pytest.raises(StoreError, match="not 3"):
        store.put(NS, "k", {"text": "coffee"})
    assert store.search(NS) == []


# --- TTL ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_items_expire_after_their_ttl(store: Store) -> None:
    store.put(NS, "short", {"text": "fleeting"}, ttl=0.3)
    store.put(NS, "long", {"text": "lasting"}, ttl=dt.timedelta(hours=1))
    store.put(("other",), "kept", {"v": 1})
    assert sorted(keys(store.search(NS))) == ["long", "short"]
    time.sleep(0.6)
    assert store.get(NS, "short") is None
    assert keys(store.search(NS)) == ["long"] and store.search(NS, query="fleeting") == []
    assert store.delete(NS, "short") is False
    store.put(NS, "again", {"v": 1}, ttl=0.01)
    time.sleep(0.05)
    assert store.purge_expired() == 1
    assert store.list_namespaces() == [("other",), NS]


# --- async ----------------------------------------------------------------------------------------------------


def test_the_async_twins_take_the_same_parameters() -> None:
    for name in ("put", "get", "delete", "search", "list_namespaces", "purge_expired"):
        sync, twin = getattr(Store, name), getattr(Store, f"a{name}")
        assert inspect.iscoroutinefunction(twin)
        assert inspect.signature(sync).parameters.keys() == inspect.signature(twin).parameters.keys()


def test_the_async_twins(store: Store) -> None:
    async def scenario() -> None:
        await asyncio.gather(*(store.aput(NS, f"k{i}", {"text": f"note {i} about coffee"}) for i in range(5)))
        item = await store.aget(NS, "k3")
        assert item is not None and item.value == {"text": "note 3 about coffee"}
        assert len(await store.asearch(NS, query="coffee")) == 5
        assert await store.alist_namespaces() == [NS]
        assert await store.adelete(NS, "k3") is True
        assert await store.aget(NS, "k3") is None
        assert await store.apurge_expired() == 0
        await store.aclose()

    asyncio.run(scenario())
    with pytest.raises(StoreError, match="closed"):
        store.get(NS, "k1")


# --- errors and serialization ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)  # the in-memory store has no driver
def test_driver_errors_are_wrapped_with_the_cause(backend: Backend) -> None:
    store = backend.make()
    store.put(NS, "k", {"v": 1})
    backend.sql(store, "DROP TABLE haystack_state_store")
    with pytest.raises(StoreError, match=r"get of key 'k' in namespace \('users', 'u1', 'memories'\)") as raised:
        store.get(NS, "k")
    assert raised.value.__cause__ is not None and not isinstance(raised.value, StoreInputError)


def test_settings_round_trip_without_data(backend: Backend) -> None:
    store = backend.make(index={"embed": KeywordEmbedder(["coffee", "tea"]), "fields": ["text"]}, default_ttl=3600)
    store.put(NS, "k", {"text": "coffee"})
    data = store.to_dict()
    assert "coffee" not in str(data["init_parameters"].get("path", "")) and "'text': 'coffee'" not in str(data)
    rebuilt = store_from_dict(data)
    backend.opened.append(rebuilt)
    assert type(rebuilt) is type(store) and rebuilt.to_dict() == data
    found = rebuilt.get(NS, "k")
    assert (found is not None) == (backend.name != "memory")


def test_unknown_store_types_are_not_imported() -> None:
    from haystack.core.errors import DeserializationError

    with pytest.raises(DeserializationError, match="Unknown store type"):
        store_from_dict({"type": "os.system", "init_parameters": {}})


def test_a_store_with_a_lambda_embedder_refuses_to_serialize() -> None:
    from haystack.core.errors import SerializationError

    store = InMemoryStore(embedder=lambda texts: [[1.0] for _ in texts])
    store.put(NS, "k", {"text": "x"})
    assert store.search(NS, query="x")[0].score == pytest.approx(1.0)
    with pytest.raises(SerializationError, match="lambda"):
        store.to_dict()


def test_postgres_store_is_exported_lazily() -> None:
    import haystack_state.store as package

    assert "PostgresStore" not in package.__all__
    from haystack_state.store import PostgresStore

    assert issubclass(PostgresStore, Store)
