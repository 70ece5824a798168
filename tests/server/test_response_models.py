"""
The OpenAPI document describes every answer: each route declares a response model
(``haystack_state.server._responses``), and the real answers of a served agent, read as plain JSON, validate against the
model the document names for their route and method, twice: with ``jsonschema`` against the document's own component
schema, and with the pydantic model, which must read the answer back whole (no key the model does not know, unless it
takes free-form keys). Answers of a request with ``select`` validate field by field. No route answers a bare free-form
object.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, TypeAdapter

from haystack_state.persistence import SQLiteCheckpointer
from haystack_state.server import _responses as models
from haystack_state.server import create_app
from server.agents import make_agent
from server.conftest import Served

JSON = "application/json"
REF = "#/components/schemas/"


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def _success(doc: dict[str, Any], path: str, method: str) -> tuple[str, dict[str, Any]]:
    """The documented success answer of a route: its status and its response object."""
    answers = doc["paths"][path][method.lower()]["responses"]
    (status,) = [status for status in answers if status.startswith("2")]
    return status, answers[status]


def _json_schema(doc: dict[str, Any], path: str, method: str, status: str | None = None) -> dict[str, Any]:
    answers = doc["paths"][path][method.lower()]["responses"]
    answer = answers[status] if status is not None else _success(doc, path, method)[1]
    return dict(answer["content"][JSON]["schema"])


def _python_type(schema: dict[str, Any]) -> Any:
    """The type of ``responses.py`` that a documented schema names (a model, a list or map of one, or int)."""
    if "$ref" in schema:
        model = getattr(models, schema["$ref"].removeprefix(REF))
        assert isinstance(model, type) and issubclass(model, BaseModel), schema
        return model
    if schema.get("type") == "array":
        return list[_python_type(schema["items"])]
    if schema.get("type") == "object":
        return dict[str, _python_type(schema["additionalProperties"])]
    assert schema.get("type") == "integer", schema
    return int


def _referenced(schema: dict[str, Any]) -> str | None:
    """The component a schema (or its items) refers to."""
    if "$ref" in schema:
        return str(schema["$ref"]).removeprefix(REF)
    return _referenced(schema["items"]) if schema.get("type") == "array" else None


def check(
    doc: dict[str, Any],
    path: str,
    method: str,
    answer: httpx.Response,
    *,
    selected: bool = False,
    status: str | None = None,
) -> Any:
    """
    Validate a real answer against the model its route documents.

    :param doc: The OpenAPI document.
    :param path: The route's path template, as the document writes it.
    :param method: The HTTP method.
    :param answer: The server's answer.
    :param selected: Whether the request had ``select`` (the answer holds only some of the model's fields).
    :param status: The documented status to check against (the route's success status by default).
    :returns: The answer's JSON.
    """
    expected = int(status or _success(doc, path, method)[0])
    assert answer.status_code == expected, answer.text
    assert answer.headers["content-type"] == JSON
    data = answer.json()
    schema = _json_schema(doc, path, method, status)
    components = copy.deepcopy(doc["components"])
    name = _referenced(schema)
    if selected:  # every field may be left out; each one present still follows its schema
        assert name is not None
        components["schemas"][name].pop("required", None)
    Draft202012Validator({**schema, "components": components}).validate(data)
    kind = _python_type(schema)
    if selected:
        model = getattr(models, str(name))
        for item in data if isinstance(data, list) else [data]:
            fields = {field.alias or key: field for key, field in model.model_fields.items()}
            assert set(item) <= set(fields), f"{path}: {sorted(set(item) - set(fields))} not in {model.__name__}"
            for key, value in item.items():
                TypeAdapter(fields[key].annotation).validate_python(value)
        return data
    adapter: TypeAdapter[Any] = TypeAdapter(kind)
    read = adapter.validate_python(data)
    assert adapter.dump_python(read, mode="json", by_alias=True, exclude_unset=True) == data, f"{method} {path}"
    return data


@pytest.mark.slow
def test_the_answers_follow_their_documented_models(served: Served) -> None:
    doc = served.app.openapi()
    http = served.http()

    check(doc, "/ok", "GET", http.get("/ok"))
    check(doc, "/info", "GET", http.get("/info"))

    # threads
    created = check(doc, "/threads", "POST", http.post("/threads", json={"metadata": {"user": "ada", "n": 1.5}}))
    thread_id = created["thread_id"]
    other = check(doc, "/threads", "POST", http.post("/threads", json={}))["thread_id"]
    check(doc, "/threads/{thread_id}", "GET", http.get(f"/threads/{other}"))
    check(doc, "/threads/{thread_id}/state", "GET", http.get(f"/threads/{other}/state"))  # no checkpoint yet
    wait = "/threads/{thread_id}/runs/wait"
    body = {"assistant_id": "agent", "input": human("note remember this")}
    check(doc, wait, "POST", http.post(f"/threads/{thread_id}/runs/wait", json=body))
    edited = check(
        doc,
        "/threads/{thread_id}/state",
        "POST",
        http.post(f"/threads/{thread_id}/state", json={"values": {"topic": "x"}}),
    )
    assert edited["checkpoint"]["thread_id"] == thread_id
    interrupted = http.post(
        f"/threads/{thread_id}/runs/wait", json={"assistant_id": "agent", "input": human("email ada@example.com")}
    )
    assert "__interrupt__" in check(doc, wait, "POST", interrupted)
    thread = check(doc, "/threads/{thread_id}", "GET", http.get(f"/threads/{thread_id}"))
    assert thread["status"] == "interrupted" and thread["interrupts"]
    patched = http.patch(f"/threads/{thread_id}", json={"metadata": {"topic": "mail"}})
    check(doc, "/threads/{thread_id}", "PATCH", patched)
    check(doc, "/threads/{thread_id}/copy", "POST", http.post(f"/threads/{thread_id}/copy"))
    check(doc, "/threads/search", "POST", http.post("/threads/search", json={}))
    narrow = http.post("/threads/search", json={"select": ["thread_id", "values", "interrupts"]})
    check(doc, "/threads/search", "POST", narrow, selected=True)
    check(doc, "/threads/count", "POST", http.post("/threads/count", json={}))

    state = check(doc, "/threads/{thread_id}/state", "GET", http.get(f"/threads/{thread_id}/state"))
    assert state["tasks"] and state["interrupts"] and state["metadata"]["source"]
    check(
        doc,
        "/threads/{thread_id}/state",
        "GET",
        http.get(f"/threads/{thread_id}/state", params={"select": ["values", "next"]}),
        selected=True,
    )
    history = check(doc, "/threads/{thread_id}/history", "POST", http.post(f"/threads/{thread_id}/history", json={}))
    assert len(history) > 2
    check(doc, "/threads/{thread_id}/history", "GET", http.get(f"/threads/{thread_id}/history", params={"limit": 2}))
    metas = http.post(f"/threads/{thread_id}/history", json={"select": ["checkpoint", "metadata"]})
    check(doc, "/threads/{thread_id}/history", "POST", metas, selected=True)
    first = history[-1]["checkpoint"]
    check(
        doc,
        "/threads/{thread_id}/state/{checkpoint_id}",
        "GET",
        http.get(f"/threads/{thread_id}/state/{first['checkpoint_id']}"),
    )
    at = http.post(f"/threads/{thread_id}/state/checkpoint", json={"checkpoint": first})
    check(doc, "/threads/{thread_id}/state/checkpoint", "POST", at)

    # runs
    run = check(
        doc,
        "/threads/{thread_id}/runs",
        "POST",
        http.post(f"/threads/{other}/runs", json=body | {"metadata": {"a": 1}}),
    )
    check(
        doc, "/threads/{thread_id}/runs/{run_id}/join", "GET", http.get(f"/threads/{other}/runs/{run['run_id']}/join")
    )
    check(doc, "/threads/{thread_id}/runs/{run_id}", "GET", http.get(f"/threads/{other}/runs/{run['run_id']}"))
    check(doc, "/threads/{thread_id}/runs", "GET", http.get(f"/threads/{other}/runs"))
    failed = http.post(f"/threads/{other}/runs/wait", json={"assistant_id": "agent", "input": human("fail")})
    assert set(check(doc, wait, "POST", failed)) == {"__error__"}
    check(doc, "/runs/wait", "POST", http.post("/runs/wait", json={"assistant_id": "agent", "input": human("hi")}))
    check(doc, "/runs", "POST", http.post("/runs", json={"assistant_id": "agent"}), status="422")  # never a 200
    check(doc, "/threads", "POST", http.post("/threads", json={"nope": 1}), status="422")

    # assistants
    check(doc, "/assistants/search", "POST", http.post("/assistants/search", json={}))
    check(doc, "/assistants/search", "POST", http.post("/assistants/search", json={"select": ["name"]}), selected=True)
    check(doc, "/assistants/count", "POST", http.post("/assistants/count", json={}))
    check(doc, "/assistants/{assistant_id}", "GET", http.get("/assistants/agent"))
    check(doc, "/assistants/{assistant_id}/schemas", "GET", http.get("/assistants/agent/schemas"))
    check(doc, "/assistants/{assistant_id}/graph", "GET", http.get("/assistants/agent/graph"))
    check(doc, "/assistants/{assistant_id}/subgraphs", "GET", http.get("/assistants/agent/subgraphs"))

    # store
    item = {"namespace": ["users", "ada"], "key": "k", "value": {"likes": "tea", "n": 2.5}}
    put = http.put("/store/items", json=item)
    assert put.status_code == 204 and put.content == b"" and _success(doc, "/store/items", "PUT")[0] == "204"
    got = check(doc, "/store/items", "GET", http.get("/store/items", params={"key": "k", "namespace": "users.ada"}))
    assert got["value"] == item["value"]
    check(doc, "/store/items/search", "POST", http.post("/store/items/search", json={"namespace_prefix": ["users"]}))
    scored = http.post("/store/items/search", json={"namespace_prefix": ["users"], "query": "tea"})
    assert "score" in check(doc, "/store/items/search", "POST", scored)["items"][0]
    check(doc, "/store/namespaces", "POST", http.post("/store/namespaces", json={}))


def _free_form(schema: dict[str, Any]) -> bool:
    """A schema that says nothing of its object's keys (or of its list's items)."""
    if "$ref" in schema:
        return False
    if schema.get("type") == "array":
        return _free_form(schema.get("items", {}))
    if schema.get("type") == "object" or not schema.get("type"):
        values = schema.get("additionalProperties")
        return not schema.get("properties") and not (isinstance(values, dict) and "$ref" in values)
    return False


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    checkpointer = SQLiteCheckpointer(tmp_path / "threads.db")
    try:
        return create_app({"agent": make_agent(checkpointer)}).openapi()
    finally:
        checkpointer.close()


def test_every_route_documents_its_answer(document: dict[str, Any]) -> None:
    kinds: dict[str, str] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            for status, answer in operation["responses"].items():
                content = answer.get("content", {})
                if JSON in content:
                    assert not _free_form(content[JSON]["schema"]), f"{where} {status} answers a free-form object"
            if path == "/runs" and method == "post":  # a background run needs a thread: always a 422
                assert list(operation["responses"]) == ["422"]
                continue
            status, answer = _success(document, path, method)
            content = answer.get("content", {})
            if status == "204":
                assert content == {}, where
                kinds[where] = "none"
            elif "text/event-stream" in content:
                assert list(content) == ["text/event-stream"], where
                kinds[where] = "events"
            else:
                assert list(content) == [JSON], where
                _python_type(content[JSON]["schema"])  # a model of responses.py (or a list or map of one, or int)
                kinds[where] = "json"
            if method != "get" or "{" in path:
                error = operation["responses"]["422"]["content"][JSON]["schema"]
                assert error == {"$ref": REF + "ErrorAnswer"}, where
    assert sorted(where for where, kind in kinds.items() if kind == "events") == [
        "GET /threads/{thread_id}/runs/{run_id}/stream",
        "POST /runs/stream",
        "POST /threads/{thread_id}/runs/stream",
    ]
    assert len([kind for kind in kinds.values() if kind == "json"]) >= 30
    assert "GET /ok" in kinds and "GET /info" in kinds
