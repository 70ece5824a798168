"""
LangGraph's own SDK (``langgraph-sdk``) against a real server, on SQLite and on PostgreSQL: assistants, threads,
state, history, runs (wait, stream, background, join, cancel of a pending run), and resuming an interrupted run.
Stream modes and cancelling running runs are in ``test_streams.py``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

from haystack_state import ThreadNotFoundError
from server.conftest import Served

pytestmark = pytest.mark.slow


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def texts(values: dict[str, Any]) -> list[Any]:
    """The conversation without the system prompt (the Agent keeps it as the first message)."""
    return [(m["type"], m["content"]) for m in values["messages"] if m["type"] != "system"]


def refused(call: Any, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """The status and the JSON error body of a call the server refuses (``runs.wait`` raises plain httpx errors)."""
    with pytest.raises(httpx.HTTPStatusError) as caught:
        call(*args, **kwargs)
    response = caught.value.response
    return response.status_code, response.json()


def wait_for_status(client: Any, thread_id: str, run_id: str, status: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = client.runs.get(thread_id, run_id)
        if run["status"] == status:
            return run
        assert time.monotonic() < deadline, f"run {run_id} stayed {run['status']}, expected {status}"
        time.sleep(0.02)


def test_assistants_are_the_served_agents(served: Served) -> None:
    client = served.client()
    found = client.assistants.search()
    assert [a["graph_id"] for a in found] == ["agent"]
    assistant = found[0]
    assert client.assistants.get(assistant["assistant_id"]) == assistant
    assert client.assistants.get("agent") == assistant  # by name (graph id) too
    assert assistant["description"] == "You are a test assistant."
    assert client.assistants.search(graph_id="other") == []
    with pytest.raises(NotFoundError):
        client.assistants.get("nobody")
    schemas = client.assistants.get_schemas("agent")
    assert set(schemas["state_schema"]["properties"]) == {"messages", "notes", "topic"}


def test_threads_create_get_search(served: Served) -> None:
    client = served.client()
    first = client.threads.create(metadata={"user": "ada", "kind": "a"})
    second = client.threads.create(metadata={"user": "bob", "kind": "a"}, thread_id="thread-two")
    assert second["thread_id"] == "thread-two"
    assert first["status"] == "idle" and first["values"] is None and first["interrupts"] == {}
    assert client.threads.create(thread_id="thread-two", if_exists="do_nothing") == second
    with pytest.raises(ConflictError):
        client.threads.create(thread_id="thread-two")
    assert client.threads.get(first["thread_id"])["metadata"] == {"user": "ada", "kind": "a"}
    with pytest.raises(NotFoundError):
        client.threads.get("no-such-thread")

    def ids(**filters: Any) -> list[str]:
        return [t["thread_id"] for t in client.threads.search(**filters)]

    assert ids(metadata={"user": "bob"}) == ["thread-two"]
    assert set(ids(metadata={"kind": "a"})) == {first["thread_id"], "thread-two"}
    assert ids(metadata={"kind": "a"}, sort_by="thread_id", sort_order="asc", limit=1, offset=1) == ["thread-two"]
    assert ids(status="interrupted") == []
    assert client.threads.count(metadata={"kind": "a"}) == 2
    updated = client.threads.update(first["thread_id"], metadata={"kind": "b"})
    assert updated["metadata"] == {"user": "ada", "kind": "b"}


def test_runs_wait_state_history_and_update(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    values = client.runs.wait(thread_id, "agent", input=human("hello"))
    assert texts(values) == [("human", "hello"), ("ai", "echo: hello")]
    values = client.runs.wait(thread_id, "agent", input={**human("note tea"), "topic": "drinks"})
    assert values["notes"] == ["tea"] and values["topic"] == "drinks"
    assert values["messages"][-2]["type"] == "tool" and values["messages"][-2]["content"] == '{"note": "tea"}'

    state = client.threads.get_state(thread_id)
    assert state["values"] == values and state["next"] == [] and state["interrupts"] == []
    head = state["checkpoint"]["checkpoint_id"]
    assert client.threads.get(thread_id)["values"] == values

    history = client.threads.get_history(thread_id, limit=3)
    assert history[0]["checkpoint"]["checkpoint_id"] == head
    assert len(history) == 3
    assert history[1]["checkpoint"]["checkpoint_id"] == history[0]["parent_checkpoint"]["checkpoint_id"]
    rest = client.threads.get_history(thread_id, limit=100, before=history[-1]["checkpoint"]["checkpoint_id"])
    everything = client.threads.get_history(thread_id, limit=100)
    assert [h["checkpoint"] for h in history + rest] == [h["checkpoint"] for h in everything]
    first = everything[-1]
    assert first["parent_checkpoint"] is None and first["metadata"]["source"] == "input"
    assert texts(first["values"]) == [("human", "hello")]
    at_first = client.threads.get_state(thread_id, checkpoint_id=first["checkpoint"]["checkpoint_id"])
    assert at_first["values"] == first["values"]

    update = client.threads.update_state(thread_id, {"topic": "tea", "notes": ["milk"]})
    after = client.threads.get_state(thread_id)
    assert after["checkpoint"]["checkpoint_id"] == update["checkpoint"]["checkpoint_id"]
    assert after["values"]["topic"] == "tea" and after["values"]["notes"] == ["tea", "milk"]
    assert after["metadata"]["source"] == "update"
    with pytest.raises(UnprocessableEntityError) as caught:
        client.threads.update_state(thread_id, {"topic": 3})
    assert caught.value.body["param"] == "values.topic"
    assert client.threads.get_state(thread_id)["checkpoint"] == after["checkpoint"]  # nothing was written


def test_update_state_before_the_first_run_seeds_the_thread(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    assert client.threads.get_state(thread_id)["values"] == {}
    client.threads.update_state(thread_id, {"topic": "tea", "messages": [{"type": "human", "content": "seeded"}]})
    values = client.runs.wait(thread_id, "agent", input=human("hi"))
    assert values["topic"] == "tea"
    assert texts(values) == [("human", "seeded"), ("human", "hi"), ("ai", "echo: hi")]


def test_stateless_runs(served: Served) -> None:
    client = served.client()
    values = client.runs.wait(None, "agent", input=human("hi"))
    assert [m["type"] for m in values["messages"]] == ["human", "ai"]  # the system prompt is not on the wire
    assert texts(values) == [("human", "hi"), ("ai", "echo: hi")]
    parts = list(client.runs.stream(None, "agent", input=human("yo")))
    assert [p.event for p in parts] == ["metadata", "values", "values"]  # after the input, after the reply
    assert texts(parts[-1].data) == [("human", "yo"), ("ai", "echo: yo")]
    assert client.threads.search() == []  # no thread was made


def test_a_failing_run_reports_its_error(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    with pytest.raises(Exception, match="the model is down"):
        client.runs.wait(thread_id, "agent", input=human("fail"))
    assert client.threads.get(thread_id)["status"] == "error"
    runs = client.runs.list(thread_id)
    assert [r["status"] for r in runs] == ["error"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("fail")))
    # The input was committed (values), the run failed and recorded that it stopped (values), then the error.
    assert [p.event for p in parts] == ["metadata", "values", "values", "error"]
    assert parts[-1].data["message"].endswith("the model is down")
    values = client.runs.wait(thread_id, "agent", input=human("better"))  # the thread goes on
    assert values["messages"][-1]["content"] == "echo: better"
    assert client.threads.get(thread_id)["status"] == "idle"


def test_background_runs_join_list_get(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, "agent", input=human("sleep 0.3"), metadata={"tag": "bg"})
    assert run["status"] in ("pending", "running") and run["metadata"] == {"tag": "bg"}
    assert client.threads.get(thread_id)["status"] == "busy"
    values = client.runs.join(thread_id, run["run_id"])
    assert values["messages"][-1]["content"] == "slept 0.3"
    assert client.runs.get(thread_id, run["run_id"])["status"] == "success"
    assert [r["run_id"] for r in client.runs.list(thread_id)] == [run["run_id"]]
    parts = list(client.runs.join_stream(thread_id, run["run_id"]))  # joining a finished run: from its start
    assert [p.event for p in parts] == ["metadata", "values", "values"] and parts[-1].data == values
    assert client.threads.get(thread_id)["status"] == "idle"


def test_multitask_reject_enqueue_and_cancel(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    first = client.runs.create(thread_id, "agent", input=human("sleep 0.5"))
    with pytest.raises(ConflictError):
        client.runs.create(thread_id, "agent", input=human("too soon"))
    second = client.runs.create(thread_id, "agent", input=human("queued"), multitask_strategy="enqueue")
    third = client.runs.create(thread_id, "agent", input=human("cancel me"), multitask_strategy="enqueue")
    assert client.runs.get(thread_id, third["run_id"])["status"] == "pending"
    client.runs.cancel(thread_id, third["run_id"])
    assert client.runs.get(thread_id, third["run_id"])["status"] == "interrupted"
    wait_for_status(client, thread_id, first["run_id"], "running")
    values = client.runs.join(thread_id, second["run_id"])
    assert [m["content"] for m in values["messages"] if m["type"] == "human"] == ["sleep 0.5", "queued"]
    statuses = {r["run_id"]: r["status"] for r in client.runs.list(thread_id)}
    assert statuses == {first["run_id"]: "success", second["run_id"]: "success", third["run_id"]: "interrupted"}


def test_interrupt_then_resume(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    values = client.runs.wait(thread_id, "agent", input=human("email ada@example.com"))
    [interrupt] = values["__interrupt__"]
    request = interrupt["value"]["action_requests"][0]
    assert request["name"] == "send_email" and request["args"] == {"to": "ada@example.com"}
    thread = client.threads.get(thread_id)
    assert thread["status"] == "interrupted" and thread["interrupts"] == {interrupt["id"]: [interrupt]}
    state = client.threads.get_state(thread_id)
    assert state["next"] == ["tools"] and state["interrupts"] == [interrupt]
    assert client.threads.search(status="interrupted")[0]["thread_id"] == thread_id
    status, _ = refused(client.runs.wait, thread_id, "agent", input=human("hello?"))  # new input while interrupted
    assert status == 409
    bad = {"resume": {"decisions": [{"type": "maybe"}]}}
    status, body = refused(client.runs.wait, thread_id, "agent", command=bad)
    assert (status, body["param"]) == (422, "command.resume.decisions.0")
    assert client.threads.get(thread_id)["status"] == "interrupted"

    edited = {"decisions": [{"type": "edit", "edited_action": {"name": "send_email", "args": {"to": "bo@ex.org"}}}]}
    values = client.runs.wait(thread_id, "agent", command={"resume": edited})
    assert "__interrupt__" not in values
    assert [m["content"] for m in values["messages"][-2:]] == ["sent to bo@ex.org", "Done: sent to bo@ex.org"]
    assert client.threads.get(thread_id)["status"] == "idle"

    client.runs.wait(thread_id, "agent", input=human("email eve@example.com"))
    run = client.runs.create(thread_id, "agent", command={"resume": "reject"})
    values = client.runs.join(thread_id, run["run_id"])
    assert values["messages"][-2]["status"] == "error"
    assert values["messages"][-1]["content"].startswith("Done: A human reviewer rejected")
    status, _ = refused(client.runs.wait, thread_id, "agent", command={"resume": "approve"})  # nothing to resume
    assert status == 409


def test_run_status_is_interrupted_for_a_run_that_stops_at_an_interrupt(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, "agent", input=human("email x@y.z"))
    client.runs.join(thread_id, run["run_id"])
    assert client.runs.get(thread_id, run["run_id"])["status"] == "interrupted"
    by_id = {call_id: "approve" for call_id in [client.threads.get_state(thread_id)["tasks"][0]["id"]]}
    interrupt_id = next(iter(by_id))
    values = client.runs.wait(thread_id, "agent", command={"resume": {interrupt_id: "approve"}})
    assert values["messages"][-1]["content"] == "Done: sent to x@y.z"


def test_copy_and_delete(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create(metadata={"owner": "me"})["thread_id"]
    client.runs.wait(thread_id, "agent", input=human("email a@b.c"))
    copy = client.threads.copy(thread_id)
    stamp = {"graph_id": "agent", "assistant_id": client.assistants.get("agent")["assistant_id"]}
    assert copy["thread_id"] != thread_id and copy["metadata"] == {"owner": "me", **stamp}
    assert copy["values"] == client.threads.get(thread_id)["values"]
    assert copy["status"] == "interrupted"  # the copy waits on the same interrupt
    values = client.runs.wait(copy["thread_id"], "agent", command={"resume": "approve"})
    assert values["messages"][-1]["content"] == "Done: sent to a@b.c"
    assert client.threads.get(thread_id)["status"] == "interrupted"  # the original is untouched
    client.threads.delete(thread_id)
    with pytest.raises(NotFoundError):
        client.threads.get(thread_id)
    with pytest.raises(ThreadNotFoundError):  # its checkpoints are gone too
        served.agent.get_state(thread_id)
    assert [t["thread_id"] for t in client.threads.search()] == [copy["thread_id"]]


def test_fork_from_a_checkpoint(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "agent", input=human("one"))
    client.runs.wait(thread_id, "agent", input=human("two"))
    first_answer = next(h for h in client.threads.get_history(thread_id, limit=100) if len(texts(h["values"])) == 2)
    values = client.runs.wait(
        thread_id, "agent", input=human("other"), checkpoint_id=first_answer["checkpoint"]["checkpoint_id"]
    )
    assert [c for _, c in texts(values)] == ["one", "echo: one", "other", "echo: other"]
    parents = [h["parent_checkpoint"] for h in client.threads.get_history(thread_id, limit=100)]
    fork_point = first_answer["checkpoint"]
    assert sum(1 for p in parents if p is not None and p["checkpoint_id"] == fork_point["checkpoint_id"]) == 2
