"""
The server's guarantees beyond the happy path: users see only their own threads (404, never 403), bad requests get
the spec's error shapes naming the field and write nothing, and every limit answers in the same shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from langgraph_sdk.errors import AuthenticationError, NotFoundError

from haystack_state.server import Limits, api_key_auth
from server.conftest import Served

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
KEYS = {"key-alice": "alice", "key-bob": "bob"}


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


@pytest.mark.slow
def test_users_see_only_their_own_threads(serve: Callable[..., Served]) -> None:
    served = serve(auth=api_key_auth(KEYS))
    alice, bob = served.client(api_key="key-alice"), served.client(api_key="key-bob")
    thread_id = alice.threads.create(metadata={"secret": 1})["thread_id"]
    alice.runs.wait(thread_id, "agent", input=human("hello"))
    run_id = alice.runs.list(thread_id)[0]["run_id"]
    attempts: list[Callable[[], Any]] = [
        lambda: bob.threads.get(thread_id),
        lambda: bob.threads.get_state(thread_id),
        lambda: bob.threads.get_history(thread_id),
        lambda: bob.threads.update_state(thread_id, {"topic": "mine"}),
        lambda: bob.threads.update(thread_id, metadata={"x": 1}),
        lambda: bob.threads.copy(thread_id),
        lambda: bob.threads.delete(thread_id),
        lambda: bob.runs.list(thread_id),
        lambda: bob.runs.get(thread_id, run_id),
        lambda: bob.runs.create(thread_id, "agent", input=human("mine now")),
        lambda: bob.runs.join(thread_id, run_id),
        lambda: bob.runs.cancel(thread_id, run_id),
        lambda: list(bob.runs.stream(thread_id, "agent", input=human("mine now"))),
    ]
    for attempt in attempts:
        with pytest.raises(httpx.HTTPStatusError) as caught:
            attempt()
        assert caught.value.response.status_code == 404, attempt
    with pytest.raises(httpx.HTTPStatusError) as caught:
        bob.runs.wait(thread_id, "agent", input=human("mine now"), if_not_exists="create")
    assert caught.value.response.status_code == 404  # the id is taken: not a thread of bob's, and not created
    assert bob.threads.search() == [] and bob.threads.count() == 0
    assert [t["thread_id"] for t in alice.threads.search()] == [thread_id]
    state = alice.threads.get_state(thread_id)
    assert [m["content"] for m in state["values"]["messages"]][-1] == "echo: hello" and "topic" not in state["values"]
    with pytest.raises(httpx.HTTPStatusError) as caught:
        bob.threads.create(thread_id=thread_id)
    assert caught.value.response.status_code == 409  # the same answer as for an id of one's own
    with pytest.raises(AuthenticationError):
        served.client().threads.search()
    assert served.http(headers={"Authorization": "Bearer key-bob"}).post("/threads/search", json={}).json() == []
    assert served.http(headers={"x-api-key": "wrong"}).post("/threads/search", json={}).status_code == 401


@pytest.mark.slow
@sqlite_only
def test_a_bad_request_names_the_field_and_writes_nothing(served: Served) -> None:
    http = served.http()
    thread_id = http.post("/threads", json={}).json()["thread_id"]
    assert http.post(f"/threads/{thread_id}/runs/wait", json={"assistant_id": "agent", "input": human("hi")}).is_success
    head = http.get(f"/threads/{thread_id}/state").json()["checkpoint"]
    cases = [
        (
            {"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": 1}]}},
            "input.messages.0.content",
        ),
        ({"assistant_id": "agent", "input": {"topic": 5}}, "input.topic"),
        ({"assistant_id": "agent", "input": {"nope": 5}}, "input.nope"),
        ({"assistant_id": "agent", "input": human("x"), "stream_mode": "tools"}, "stream_mode"),
        ({"assistant_id": "agent", "input": human("x"), "multitask_strategy": "replace"}, "multitask_strategy"),
        ({"assistant_id": "agent", "input": human("x"), "interrupt_before": ["send_email"]}, "interrupt_before"),
        ({"assistant_id": "agent", "input": human("x"), "surprise": 1}, "surprise"),
        ({"input": human("x")}, "assistant_id"),
        ({"assistant_id": "agent", "command": {"goto": "tools"}}, "command.goto"),
    ]
    for body, field in cases:
        for endpoint in ("runs", "runs/wait", "runs/stream"):
            response = http.post(f"/threads/{thread_id}/{endpoint}", json=body)
            assert response.status_code == 422, (body, response.text)
            error = response.json()
            assert error["param"] == field and field in error["detail"], error
    assert http.post("/threads", json={"metadata": "x"}).json()["param"] == "metadata"
    assert http.post("/threads/search", json={"limit": 0}).json()["param"] == "limit"
    assert http.post(f"/threads/{thread_id}/runs/wait", json={"assistant_id": "nobody"}).status_code == 404
    checkpoint = {"assistant_id": "agent", "input": human("x"), "checkpoint_id": "no-such-checkpoint"}
    assert http.post(f"/threads/{thread_id}/runs/wait", json=checkpoint).status_code == 404
    assert http.get(f"/threads/{thread_id}/state").json()["checkpoint"] == head
    assert len(http.get(f"/threads/{thread_id}/runs").json()) == 1
    assert http.post("/threads/search", json={}).json()[0]["thread_id"] == thread_id
    assert len(http.post("/threads/search", json={}).json()) == 1


@sqlite_only
def test_request_limits(serve: Callable[..., Served]) -> None:
    served = serve(limits=Limits(max_body_bytes=2000, max_messages=2))
    http = served.http()
    thread_id = http.post("/threads", json={}).json()["thread_id"]
    big = http.post(f"/threads/{thread_id}/runs/wait", json={"assistant_id": "agent", "input": human("x" * 3000)})
    assert big.status_code == 413 and "2000 bytes" in big.json()["detail"]
    many = {"messages": [{"type": "human", "content": str(i)} for i in range(3)]}
    response = http.post(f"/threads/{thread_id}/runs/wait", json={"assistant_id": "agent", "input": many})
    assert response.status_code == 422 and response.json()["param"] == "input.messages"
    assert "at most 2 messages" in response.json()["detail"]
    assert http.get(f"/threads/{thread_id}/runs").json() == []
    assert http.get(f"/threads/{thread_id}").json()["values"] is None


def _wait_running(http: httpx.Client, thread_id: str, run_id: str) -> None:
    deadline = time.monotonic() + 30
    while http.get(f"/threads/{thread_id}/runs/{run_id}").json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow
@sqlite_only
def test_run_limits(serve: Callable[..., Served]) -> None:
    served = serve(limits=Limits(max_concurrent_runs=1, max_pending_runs=1))
    http = served.http()
    busy, other, third = (http.post("/threads", json={}).json()["thread_id"] for _ in range(3))
    run = http.post(f"/threads/{busy}/runs", json={"assistant_id": "agent", "input": human("sleep 0.6")}).json()
    _wait_running(http, busy, run["run_id"])
    refused = http.post(f"/threads/{other}/runs/wait", json={"assistant_id": "agent", "input": human("hi")})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "maximum of 1 concurrent runs" in refused.json()["detail"]
    queued = http.post(f"/threads/{other}/runs", json={"assistant_id": "agent", "input": human("later")})
    assert queued.json()["status"] == "pending"  # background runs wait for a free worker instead
    full = http.post(f"/threads/{third}/runs", json={"assistant_id": "agent", "input": human("one too many")})
    assert full.status_code == 429 and "queue is full" in full.json()["detail"]
    assert http.get(f"/threads/{third}/runs").json() == []
    joined = http.get(f"/threads/{other}/runs/{queued.json()['run_id']}/join").json()
    assert joined["messages"][-1]["content"] == "echo: later"


@pytest.mark.slow
@sqlite_only
def test_a_thread_id_of_ones_own_choice_and_if_not_exists(served: Served) -> None:
    client = served.client()
    with pytest.raises(NotFoundError):
        client.runs.create("made-up", "agent", input=human("x"))
    values = client.runs.wait("made-up", "agent", input=human("x"), if_not_exists="create")
    assert values["messages"][-1]["content"] == "echo: x"
    assert client.threads.get("made-up")["status"] == "idle"


@pytest.mark.slow
@sqlite_only
def test_the_root_leads_to_the_inspector(served: Served) -> None:
    http = served.http()
    response = http.get("/", follow_redirects=True)
    assert response.status_code == 200 and "<title>haystack-state inspector</title>" in response.text
    assert http.get("/ok").json() == {"ok": True}
