"""
Text is checked at the edge: every field of a request that takes text, sent a lone surrogate (JSON's ``"\\ud800"``
escape without its pair), is refused with a 422 naming the field, before anything is written, and the user's search
still works. NUL characters are refused where the databases cannot store or query them (thread metadata, which
PostgreSQL queries as jsonb, thread ids, path and query parameters) and kept elsewhere. Text stored before these
checks reads back repaired: the thread is listed, read and run again.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from server.conftest import Backend, Served

pytestmark = pytest.mark.slow

BAD = "\ud800"  # json.dumps writes it as the escape "\ud800", as a client would send it


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def run(body: dict[str, Any]) -> dict[str, Any]:
    return {"assistant_id": "agent", "input": human("hi"), **body}


# (method, path, body, the field named). ``{t}`` is a thread of the user's, with checkpoints and a run.
CASES: list[tuple[str, str, Any, str]] = [
    # threads
    ("POST", "/threads", {"thread_id": f"x{BAD}"}, "thread_id"),
    ("POST", "/threads", {"metadata": {"k": f"v{BAD}"}}, "metadata.k"),
    ("POST", "/threads", {"metadata": {f"k{BAD}": 1}}, "metadata"),
    ("POST", "/threads", {"metadata": {"k": [{"deep": ["ok", f"{BAD}"]}]}}, "metadata.k.0.deep.1"),
    ("PATCH", "/threads/{t}", {"metadata": {"k": BAD}}, "metadata.k"),
    ("POST", "/threads/search", {"metadata": {"k": BAD}}, "metadata.k"),
    ("POST", "/threads/search", {"metadata": {BAD: "v"}}, "metadata"),
    ("POST", "/threads/search", {"ids": [BAD]}, "ids.0"),
    ("POST", "/threads/search", {"select": [f"values{BAD}"]}, "select.0"),
    ("POST", "/threads/count", {"metadata": {"k": {"nested": BAD}}}, "metadata.k.nested"),
    # state updates
    ("POST", "/threads/{t}/state", {"values": human(f"hi {BAD}")}, "values.messages.0.content"),
    ("POST", "/threads/{t}/state", {"values": {"notes": ["ok", BAD]}}, "values.notes.1"),
    ("POST", "/threads/{t}/state", {"values": {"topic": f"a{BAD}b"}}, "values.topic"),
    ("POST", "/threads/{t}/state", {"values": {BAD: 1}}, "values"),
    ("POST", "/threads/{t}/state", {"values": {"topic": "x"}, "as_node": BAD}, "as_node"),
    ("POST", "/threads/{t}/history", {"metadata": {"k": BAD}}, "metadata.k"),
    ("POST", "/threads/{t}/history", {"before": BAD}, "before"),
    ("POST", "/threads/{t}/state/checkpoint", {"checkpoint": {"checkpoint_id": BAD}}, "checkpoint.checkpoint_id"),
    # run input: message content, names, ids, tool calls; other keys
    (
        "POST",
        "/threads/{t}/runs/wait",
        run({"input": {"messages": [{"type": "human", "content": [{"type": "text", "text": BAD}]}]}}),
        "input.messages.0.content.0.text",
    ),
    (
        "POST",
        "/threads/{t}/runs/wait",
        run({"input": {"messages": [{"type": "human", "content": "hi", "name": BAD}]}}),
        "input.messages.0.name",
    ),
    (
        "POST",
        "/threads/{t}/runs/wait",
        run({"input": {"messages": [{"type": "human", "content": "hi", "id": f"m-{BAD}"}]}}),
        "input.messages.0.id",
    ),
    (
        "POST",
        "/threads/{t}/runs/wait",
        run(
            {
                "input": {
                    "messages": [
                        {"type": "ai", "content": "", "tool_calls": [{"name": "remember", "args": {"text": BAD}}]}
                    ]
                }
            }
        ),
        "input.messages.0.tool_calls.0.args.text",
    ),
    (
        "POST",
        "/threads/{t}/runs/wait",
        run({"input": {"messages": [{"type": "tool", "content": BAD, "tool_call_id": "c1", "name": "remember"}]}}),
        "input.messages.0.content",
    ),
    ("POST", "/threads/{t}/runs/wait", run({"input": {"topic": BAD}}), "input.topic"),
    # run metadata, config, context, command, assistant, checkpoint; every run route
    ("POST", "/threads/{t}/runs/wait", run({"metadata": {"m": BAD}}), "metadata.m"),
    ("POST", "/threads/{t}/runs/wait", run({"config": {"configurable": {"x": BAD}}}), "config.configurable.x"),
    ("POST", "/threads/{t}/runs/wait", run({"context": {"c": [BAD]}}), "context.c.0"),
    ("POST", "/threads/{t}/runs/wait", {"assistant_id": "agent", "command": {"resume": BAD}}, "command.resume"),
    ("POST", "/threads/{t}/runs/wait", {"assistant_id": BAD, "input": human("hi")}, "assistant_id"),
    ("POST", "/threads/{t}/runs/wait", run({"checkpoint_id": BAD}), "checkpoint_id"),
    ("POST", "/threads/{t}/runs", run({"input": human(BAD)}), "input.messages.0.content"),
    ("POST", "/threads/{t}/runs/stream", run({"input": human(BAD)}), "input.messages.0.content"),
    ("POST", "/runs/wait", run({"input": human(BAD)}), "input.messages.0.content"),
    ("POST", "/runs/stream", run({"metadata": {BAD: 1}}), "metadata"),
    # the store: namespaces, keys, values, filters
    ("PUT", "/store/items", {"namespace": [f"n{BAD}"], "key": "k", "value": {"x": 1}}, "namespace.0"),
    ("PUT", "/store/items", {"namespace": ["n"], "key": f"k{BAD}", "value": {"x": 1}}, "key"),
    ("PUT", "/store/items", {"namespace": ["n"], "key": "k", "value": {"x": ["a", BAD]}}, "value.x.1"),
    ("PUT", "/store/items", {"namespace": ["n"], "key": "k", "value": {BAD: 1}}, "value"),
    ("PUT", "/store/items", {"namespace": ["n"], "key": "k", "value": {"x": 1}, "index": [BAD]}, "index.0"),
    ("DELETE", "/store/items", {"namespace": ["n"], "key": BAD}, "key"),
    ("POST", "/store/items/search", {"namespace_prefix": [BAD]}, "namespace_prefix.0"),
    ("POST", "/store/items/search", {"filter": {"x": {"$eq": BAD}}}, "filter.x.$eq"),
    ("POST", "/store/items/search", {"query": f"find {BAD}"}, "query"),
    ("POST", "/store/namespaces", {"prefix": [BAD]}, "prefix.0"),
    ("POST", "/store/namespaces", {"suffix": [BAD]}, "suffix.0"),
    # assistants
    ("POST", "/assistants/search", {"name": BAD}, "name"),
    ("POST", "/assistants/search", {"metadata": {"k": BAD}}, "metadata.k"),
    ("POST", "/assistants/count", {"graph_id": BAD}, "graph_id"),
]


def _seed(http: Any) -> tuple[str, str]:
    thread_id = http.post("/threads", json={"metadata": {"tag": "kept"}}).json()["thread_id"]
    assert http.post(f"/threads/{thread_id}/runs/wait", json=run({"input": human("note first")})).is_success
    assert http.put("/store/items", json={"namespace": ["n"], "key": "k", "value": {"x": "kept"}}).status_code == 204
    other = http.post("/threads", json={"metadata": {"tag": "other"}}).json()["thread_id"]
    return thread_id, other


def _world(http: Any, thread_id: str) -> dict[str, Any]:
    """Everything a request could have written, as the user reads it."""
    return {
        "threads": http.post("/threads/search", json={"limit": 100}).json(),
        "count": http.post("/threads/count", json={}).json(),
        "state": http.get(f"/threads/{thread_id}/state").json(),
        "history": http.post(f"/threads/{thread_id}/history", json={"limit": 100}).json(),
        "runs": http.get(f"/threads/{thread_id}/runs").json(),
        "items": http.post("/store/items/search", json={"limit": 100}).json(),
        "namespaces": http.post("/store/namespaces", json={}).json(),
    }


def test_every_field_that_takes_text_refuses_a_lone_surrogate_and_writes_nothing(served: Served) -> None:
    http = served.http()
    thread_id, other = _seed(http)
    before = _world(http, thread_id)
    assert len(before["threads"]) == 2 and len(before["history"]) >= 2 and before["items"]["items"]
    for method, path, body, field in CASES:
        content = json.dumps(body)
        assert "\\ud800" in content
        response = http.request(
            method, path.format(t=thread_id), content=content, headers={"content-type": "application/json"}
        )
        case = f"{method} {path} {content}"
        assert response.status_code == 422, (case, response.text)
        answer = response.json()
        assert answer["param"] == field, (case, answer)
        assert answer["errors"] == [{"field": field, "message": answer["errors"][0]["message"]}], case
        assert "lone surrogate '\\ud800'" in answer["detail"] and "not valid Unicode" in answer["detail"], case
        assert _world(http, thread_id) == before, case
    found = http.post("/threads/search", json={"metadata": {"tag": "kept"}}).json()
    assert [t["thread_id"] for t in found] == [thread_id]
    assert {t["thread_id"] for t in http.post("/threads/search", json={}).json()} == {thread_id, other}
    assert http.post(f"/threads/{thread_id}/runs/wait", json=run({"input": human("still usable")})).is_success


def test_lone_surrogates_as_raw_bytes_and_numbers_json_has_not_are_refused_too(served: Served) -> None:
    http = served.http()
    thread_id, _ = _seed(http)
    before = _world(http, thread_id)
    headers = {"content-type": "application/json"}
    cases = [
        (b'{"metadata": {"k": "\xed\xa0\x80"}}', "metadata.k", "lone surrogate"),  # UTF-8 of U+D800, as sent raw
        (b'{"metadata": {"k": NaN}}', "metadata.k", "NaN is not a JSON number"),
        (b'{"metadata": {"k": [1, -Infinity]}}', "metadata.k.1", "-Infinity is not a JSON number"),
    ]
    for content, field, problem in cases:
        response = http.post("/threads", content=content, headers=headers)
        assert response.status_code == 422 and response.json()["param"] == field, response.text
        assert problem in response.json()["detail"]
    response = http.post(f"/threads/{thread_id}/state", content=b'{"values": {"notes": [Infinity]}}', headers=headers)
    assert response.status_code == 422 and response.json()["param"] == "values.notes.0"
    assert _world(http, thread_id) == before


def test_nul_in_a_metadata_filter_key_is_refused_on_every_database(served: Served) -> None:
    http = served.http()
    thread_id, _ = _seed(http)
    before = _world(http, thread_id)
    for path in ("/threads/search", "/threads/count"):
        response = http.post(path, json={"metadata": {"a\x00b": 1}})
        assert response.status_code == 422, response.text
        answer = response.json()
        assert answer["param"] == "metadata" and "key 'a\\x00b'" in answer["detail"] and "NUL" in answer["detail"]
    cases = [
        ("POST", "/threads/search", {"metadata": {"k": "x\x00"}}, "metadata.k"),
        ("POST", "/threads/search", {"ids": ["a\x00"]}, "ids.0"),
        ("POST", "/threads", {"metadata": {"k": {"x\x00": 1}}}, "metadata.k"),
        ("POST", "/threads", {"thread_id": "t\x00"}, "thread_id"),
        ("PATCH", f"/threads/{thread_id}", {"metadata": {"k": "\x00"}}, "metadata.k"),
    ]
    for method, path, body, field in cases:
        response = http.request(method, path, json=body)
        assert response.status_code == 422 and response.json()["param"] == field, (path, body, response.text)
    for path, field in [
        ("/threads/a%00b", "thread_id"),
        (f"/threads/{thread_id}/state/a%00", "checkpoint_id"),
        (f"/threads/{thread_id}/runs?status=x%00", "status"),
        ("/store/items?key=k%00&namespace=n", "key"),
    ]:
        response = http.get(path)
        assert response.status_code == 422 and response.json()["param"] == field, (path, response.text)
    assert _world(http, thread_id) == before
    # NUL is kept where it can be stored: in state values and store values.
    assert http.post(f"/threads/{thread_id}/state", json={"values": {"notes": ["a\x00b"]}}).is_success
    assert http.get(f"/threads/{thread_id}/state").json()["values"]["notes"] == ["first", "a\x00b"]
    assert http.put("/store/items", json={"namespace": ["n"], "key": "z", "value": {"x": "\x00"}}).status_code == 204
    assert [t["thread_id"] for t in http.post("/threads/search", json={"metadata": {"tag": "kept"}}).json()] == [
        thread_id
    ]


def _sql(backend: Backend, query: str, params: tuple[Any, ...]) -> None:
    """Run a write straight on the server's database, bypassing every check."""
    if backend.name == "sqlite":
        conn = sqlite3.connect(str(backend.path))
        try:
            conn.execute(query.replace("{schema}.", "").replace("%s", "?"), params)
            conn.commit()
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(str(backend.dsn), autocommit=True) as conn:
        conn.execute(query.replace("{schema}", f'"{backend.schema}"'), params)


def test_text_stored_before_the_checks_reads_back_repaired_and_every_list_lists_it(
    serve: Callable[..., Served], backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    first = serve().http()
    thread_id, other = _seed(first)
    # As the server answered before text was checked: a lone surrogate stored (as its JSON escape) in a message of
    # the thread's last checkpoint, in its checkpoint metadata, and in the thread's own metadata.
    _sql(
        backend,
        "UPDATE {schema}.haystack_state_checkpoints SET delta = replace(delta, %s, %s), "
        "metadata = %s WHERE thread_id = %s",
        ("Done: ", "Done \\ud800: ", '{"note":"\\udc80"}', thread_id),
    )
    _sql(
        backend,
        "UPDATE {schema}.haystack_state_server_threads SET metadata = %s WHERE thread_id = %s",
        ('{"tag":"kept","bad":"x\\ud800y"}', thread_id),
    )
    http = serve().http()  # a fresh process's view: nothing cached
    with caplog.at_level(logging.WARNING):
        thread = http.get(f"/threads/{thread_id}")
        state = http.get(f"/threads/{thread_id}/state")
        history = http.post(f"/threads/{thread_id}/history", json={})
        listed = http.post("/threads/search", json={})
        filtered = http.post("/threads/search", json={"metadata": {"tag": "kept"}})
        counted = http.post("/threads/count", json={"metadata": {"tag": "kept"}})
    for response in (thread, state, history, listed, filtered, counted):
        assert response.status_code == 200, response.text
    assert thread.json()["metadata"] == {"tag": "kept", "bad": "x\ufffdy"}
    texts = [m["content"] for m in state.json()["values"]["messages"]]
    assert texts[-1] == 'Done \ufffd: {"note": "first"}'
    assert {h["metadata"].get("note") for h in history.json()} >= {"\ufffd"}
    assert {t["thread_id"] for t in listed.json()} == {thread_id, other}
    assert [t["thread_id"] for t in filtered.json()] == [thread_id] and counted.json() == 1
    warned = [r.getMessage() for r in caplog.records if "not valid Unicode" in r.getMessage()]
    assert any(thread_id in message and "thread metadata" in message for message in warned), warned
    assert any(thread_id in message and "delta" in message for message in warned), warned
    # The thread goes on: a new run, and the metadata written again is stored repaired.
    assert http.post(f"/threads/{thread_id}/runs/wait", json=run({"input": human("again")})).is_success
    assert http.patch(f"/threads/{thread_id}", json={"metadata": {"more": 1}}).is_success
    metadata = http.get(f"/threads/{thread_id}").json()["metadata"]
    assert (metadata["tag"], metadata["bad"], metadata["more"]) == ("kept", "x\ufffdy", 1)


def test_metadata_no_database_can_query_never_fails_a_search(
    serve: Callable[..., Served], backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows the server wrote before the checks (NaN; NUL, which PostgreSQL's jsonb refuses) are matched in Python."""
    http = serve().http()
    ids = [http.post("/threads", json={"metadata": {"tag": "x", "i": i}}).json()["thread_id"] for i in range(5)]
    stored = ['{"tag":"x","i":1,"n":NaN}', '{"tag":"x","i":3,"z":"a\\u0000b"}', '{"tag":"y","n":Infinity}']
    for thread_id, text in zip((ids[1], ids[3], ids[4]), stored, strict=True):
        _sql(
            backend,
            "UPDATE {schema}.haystack_state_server_threads SET metadata = %s WHERE thread_id = %s",
            (text, thread_id),
        )
    with caplog.at_level(logging.WARNING):
        everything = http.post("/threads/search", json={"limit": 10}).json()
        tagged = http.post("/threads/search", json={"metadata": {"tag": "x"}, "sort_by": "thread_id"}).json()
        paged = [
            t["thread_id"]
            for offset in range(0, 4, 2)
            for t in http.post(
                "/threads/search",
                json={
                    "metadata": {"tag": "x"},
                    "sort_by": "thread_id",
                    "sort_order": "asc",
                    "limit": 2,
                    "offset": offset,
                },
            ).json()
        ]
        assert http.post("/threads/count", json={"metadata": {"tag": "x"}}).json() == 4
        assert http.post("/threads/count", json={"metadata": {"tag": "y"}}).json() == 1
    assert len(everything) == 5
    assert sorted(t["thread_id"] for t in tagged) == sorted(ids[:4])
    assert [t["thread_id"] for t in tagged] == sorted(ids[:4], reverse=True)
    assert paged == sorted(ids[:4])
