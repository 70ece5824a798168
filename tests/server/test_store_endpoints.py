"""
The Agent Protocol's store endpoints, driven by LangGraph's own SDK (``client.store``) against the app served by
uvicorn on 127.0.0.1, on SQLite and on PostgreSQL: items round-trip, search ranks and filters, namespaces list, the
default store lives in the checkpointer's database, bad requests are 422s naming the field (nothing written), and
with ``auth`` no user ever sees, changes or deletes another user's items.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph_sdk.errors import NotFoundError

from haystack_state.server import api_key_auth
from haystack_state.store import SQLiteStore, Store
from server.conftest import Backend, Served

pytestmark = pytest.mark.slow

NS = ["users", "u1", "memories"]


def open_store(backend: Backend) -> Store:
    """The backend's database opened as a store, directly (not through the server)."""
    if backend.name == "sqlite":
        return SQLiteStore(str(backend.path))
    from haystack_state.store.postgres import PostgresStore

    return PostgresStore(str(backend.dsn), schema=str(backend.schema))


def test_put_get_search_list_and_delete_through_the_sdk(served: Served, backend: Backend) -> None:
    client = served.client()
    client.store.put_item(NS, key="tea", value={"text": "likes green tea", "n": 1})
    client.store.put_item(NS, key="nuts", value={"text": "allergic to nuts", "n": 2})
    client.store.put_item(["users", "u2", "memories"], key="tea", value={"text": "tea tea tea", "n": 3})

    item: Any = client.store.get_item(NS, key="tea")
    assert (item["namespace"], item["key"], item["value"]) == (NS, "tea", {"text": "likes green tea", "n": 1})
    assert item["created_at"] == item["updated_at"]

    ranked = client.store.search_items(["users"], query="tea")["items"]
    assert [(i["namespace"][1], i["key"]) for i in ranked] == [("u2", "tea"), ("u1", "tea")]  # "tea" 3 times first
    assert all(isinstance(i["score"], float) for i in ranked)
    filtered = client.store.search_items(["users"], filter={"n": {"$gte": 2}}, limit=1, offset=1)["items"]
    assert [(i["namespace"], i["value"]["n"]) for i in filtered] == [(NS, 2)]
    assert client.store.search_items(["users", "u1"], query="tea")["items"][0]["key"] == "tea"

    listed = client.store.list_namespaces(prefix=["users"])["namespaces"]
    assert listed == [NS, ["users", "u2", "memories"]]
    assert client.store.list_namespaces(max_depth=2)["namespaces"] == [["users", "u1"], ["users", "u2"]]
    assert client.store.list_namespaces(suffix=["memories"], limit=1, offset=1)["namespaces"] == [
        ["users", "u2", "memories"]
    ]

    client.store.put_item(NS, key="tea", value={"text": "prefers coffee now"})
    assert client.store.get_item(NS, key="tea")["value"] == {"text": "prefers coffee now"}
    client.store.delete_item(NS, key="tea")
    with pytest.raises(NotFoundError):
        client.store.get_item(NS, key="tea")
    with pytest.raises(NotFoundError):
        client.store.delete_item(NS, key="tea")

    with open_store(backend) as store:  # the default store is the checkpointer's database
        direct = store.get(tuple(NS), "nuts")
        assert direct is not None and direct.value == {"text": "allergic to nuts", "n": 2}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"namespace": ["a.b"], "key": "k", "value": {}}, "namespace"),
        ({"namespace": [], "key": "k", "value": {}}, "namespace"),
        ({"namespace": ["a", ""], "key": "k", "value": {}}, "namespace"),
        ({"namespace": ["a"], "key": "", "value": {}}, "key"),
        ({"namespace": ["a"], "key": "k", "value": {"__type__": "x"}}, "value"),
        ({"namespace": ["a"], "key": "k", "value": [1]}, "value"),
        ({"namespace": ["a"], "key": "k", "value": {}, "ttl": -1}, "ttl"),
        ({"namespace": ["a"], "key": "k", "value": {}, "extra": 1}, "extra"),
    ],
)
def test_bad_puts_are_422s_naming_the_field_and_write_nothing(served: Served, body: dict[str, Any], field: str) -> None:
    http = served.http()
    answer = http.put("/store/items", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["param"] == field
    assert http.post("/store/namespaces", json={}).json() == {"namespaces": []}


def test_bad_searches_are_422s(served: Served) -> None:
    http = served.http()
    answer = http.post("/store/items/search", json={"namespace_prefix": ["a"], "filter": {"n": {"$regex": "x"}}})
    assert answer.status_code == 422 and answer.json()["param"] == "filter" and "$regex" in answer.json()["detail"]
    answer = http.post("/store/items/search", json={"limit": 0})
    assert answer.status_code == 422 and answer.json()["param"] == "limit"
    answer = http.get("/store/items", params={"key": "k"})
    assert answer.status_code == 422 and answer.json()["param"] == "namespace"


def test_users_never_see_each_others_items(serve: Any, backend: Backend) -> None:
    served: Served = serve(auth=api_key_auth({"key-a": "alice", "key-b": "bob.smith"}))
    alice, bob = served.client(api_key="key-a"), served.client(api_key="key-b")
    alice.store.put_item(NS, key="secret", value={"text": "alice's diary"})
    bob.store.put_item(["notes"], key="mine", value={"text": "bob's note"})

    with pytest.raises(NotFoundError):
        bob.store.get_item(NS, key="secret")
    assert bob.store.search_items([], query="diary")["items"] == []
    assert bob.store.search_items(["users"])["items"] == []
    assert bob.store.list_namespaces()["namespaces"] == [["notes"]]
    with pytest.raises(NotFoundError):
        bob.store.delete_item(NS, key="secret")
    bob.store.put_item(NS, key="secret", value={"text": "overwritten?"})  # bob's own item, beside alice's

    assert alice.store.get_item(NS, key="secret")["value"] == {"text": "alice's diary"}
    assert [i["value"]["text"] for i in alice.store.search_items([])["items"]] == ["alice's diary"]
    assert alice.store.list_namespaces()["namespaces"] == [NS]
    assert bob.store.get_item(NS, key="secret")["value"] == {"text": "overwritten?"}
    assert served.http().post("/store/items/search", json={}).status_code == 401  # no key: refused

    with open_store(backend) as store:  # namespaces record their owner
        assert store.list_namespaces() == [
            ("owners", "alice", *NS),
            ("owners", "bob%2Esmith", "notes"),
            ("owners", "bob%2Esmith", *NS),
        ]


def test_a_given_store_is_served(serve: Any, tmp_path: Any) -> None:
    with SQLiteStore(tmp_path / "memories.db") as store:
        store.put(("shared",), "k", {"text": "given"})
        served: Served = serve(store=store)
        client = served.client()
        assert client.store.get_item(["shared"], key="k")["value"] == {"text": "given"}
        client.store.put_item(["shared"], key="k2", value={"v": 2})
        found = store.get(("shared",), "k2")
        assert found is not None and found.value == {"v": 2}
