"""
Stream modes, cancelling running runs and resuming, through LangGraph's own SDK against a real server, on SQLite and
on PostgreSQL: ``values``, ``updates``, ``messages-tuple``, ``custom`` and ``events``, one at a time
and several at once (v1 and v2 stream parts), joined streams, a client that disconnects and joins again, cancel with
``interrupt`` and ``rollback``, and ``command.resume`` over a stream.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError

from haystack_state import Agent, tool
from haystack_state.runtime import RunContext
from haystack_state.server import create_app
from haystack_state.testing import ScriptedChatGenerator
from server.conftest import Backend, LiveServer, Served


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def contents(values: dict[str, Any]) -> list[Any]:
    """The conversation's contents without the system prompt."""
    return [m["content"] for m in values["messages"] if m["type"] != "system"]


def wait_for_input(client: Any, thread_id: str, text: str, timeout: float = 30) -> None:
    """Wait until a run has committed its input (it is then calling the model)."""
    deadline = time.monotonic() + timeout
    while contents(client.threads.get_state(thread_id)["values"] or {"messages": []})[-1:] != [text]:
        assert time.monotonic() < deadline, f"the run did not commit {text!r}"
        time.sleep(0.02)


@pytest.mark.slow
def test_values_after_each_checkpoint(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("note tea"), stream_mode="values"))
    assert [p.event for p in parts] == ["metadata"] + ["values"] * 4  # input, tool call, tool result, answer
    steps = [contents(p.data) for p in parts[1:]]
    assert steps[0] == ["note tea"]
    assert steps[1][-1] == "" and parts[2].data["messages"][-1]["tool_calls"][0]["name"] == "remember"
    assert steps[2][-1] == '{"note": "tea"}' and "notes" not in parts[2].data and parts[3].data["notes"] == ["tea"]
    assert steps[3][-1] == 'Done: {"note": "tea"}'
    assert parts[-1].data == client.threads.get_state(thread_id)["values"]  # the last values are the thread's


@pytest.mark.slow
def test_updates_name_the_checkpoint_source(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "agent", input={**human("hi"), "topic": "drinks"})
    parts = list(client.runs.stream(thread_id, "agent", input=human("note tea"), stream_mode="updates"))
    updates = [p.data for p in parts[1:]]
    assert [p.event for p in parts[1:]] == ["updates"] * 4
    assert [next(iter(u)) for u in updates] == ["input", "model", "tools", "model"]
    assert [m["content"] for m in updates[0]["input"]["messages"]] == ["note tea"]  # appended items only
    assert updates[1]["model"]["messages"][0]["tool_calls"][0]["args"] == {"text": "tea"}
    tools = updates[2]["tools"]
    assert tools["notes"] == ["tea"] and tools["messages"][0]["type"] == "tool"
    assert [m["content"] for m in updates[3]["model"]["messages"]] == ['Done: {"note": "tea"}']
    assert all("topic" not in next(iter(u.values())) for u in updates)  # unchanged keys are not sent


@pytest.mark.slow
def test_messages_stream_the_model_tokens(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    parts = list(
        client.runs.stream(thread_id, "agent", input=human("note a long cup of tea"), stream_mode="messages-tuple")
    )
    pairs = [p.data for p in parts[1:]]
    assert {p.event for p in parts[1:]} == {"messages"}
    assert all(len(pair) == 2 for pair in pairs)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for chunk, metadata in pairs:
        assert metadata["thread_id"] == thread_id and metadata["run_id"] == parts[0].data["run_id"]
        by_node.setdefault(metadata["langgraph_node"], []).append(chunk)
    call_chunks = [c for c in by_node["model"] if c["tool_call_chunks"]]
    assert call_chunks[0]["tool_call_chunks"][0]["name"] == "remember"
    arguments = "".join(c["tool_call_chunks"][0]["args"] for c in call_chunks)
    assert arguments.replace(" ", "") == '{"text":"alongcupoftea"}'
    answer = [c for c in by_node["model"] if c["id"] != call_chunks[0]["id"]]
    assert len(answer) > 2 and {c["type"] for c in answer} == {"AIMessageChunk"}  # streamed in several chunks
    assert "".join(c["content"] for c in answer) == 'Done: {"note": "a long cup of tea"}'
    assert answer[-1]["response_metadata"] == {"finish_reason": "stop"}
    [tool_message] = by_node["tools"]
    assert (
        tool_message["type"] == "tool" and tool_message["tool_call_id"] == call_chunks[0]["tool_call_chunks"][0]["id"]
    )
    v2 = list(client.runs.stream(thread_id, "agent", input=human("hi"), stream_mode="messages-tuple", version="v2"))
    assert [p["type"] for p in v2][1:] == ["messages"] * len(v2[1:])
    assert "".join(p["data"][0]["content"] for p in v2[1:]) == "echo: hi"


@pytest.mark.slow
def test_several_modes_at_once(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    modes = ["values", "updates", "messages-tuple", "events"]
    names = {"values", "updates", "messages", "events"}  # (messages-tuple's SSE event is "messages")
    parts = list(client.runs.stream(thread_id, "agent", input=human("hello"), stream_mode=modes))
    events = [p.event for p in parts]
    assert events[0] == "metadata" and set(events[1:]) == names
    assert events.index("updates") < events.index("messages")  # the input's update comes before the model speaks
    assert events[-2:] == ["values", "events"]  # the answer's values, then the run's last event
    native = [p.data["type"] for p in parts if p.event == "events"]
    assert native[0] == "run_started" and native[-1] == "run_finished" and "checkpoint_committed" in native
    assert parts[-1].data["outputs"]["last_message"]["content"][0]["text"] == "echo: hello"
    v2 = list(client.runs.stream(thread_id, "agent", input=human("again"), stream_mode=modes, version="v2"))
    assert {p["type"] for p in v2} == {"metadata", *names}
    last_values = [p for p in v2 if p["type"] == "values"][-1]
    assert last_values["ns"] == [] and last_values["interrupts"] == []
    assert contents(last_values["data"])[-1] == "echo: again"


@pytest.mark.slow
def test_unsupported_modes_are_refused(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    with pytest.raises(UnprocessableEntityError) as caught:
        list(client.runs.stream(thread_id, "agent", input=human("x"), stream_mode=["values", "tools"]))
    assert caught.value.body["param"] == "stream_mode"
    assert "['tools'] are not supported" in caught.value.body["detail"]
    assert client.runs.list(thread_id) == []  # nothing was queued


@pytest.mark.slow
def test_an_interrupt_ends_the_values_and_updates(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    parts = list(
        client.runs.stream(thread_id, "agent", input=human("email ada@ex.org"), stream_mode=["values", "updates"])
    )
    last_values = [p.data for p in parts if p.event == "values"][-1]
    [interrupt] = last_values["__interrupt__"]
    assert interrupt["value"]["action_requests"][0]["args"] == {"to": "ada@ex.org"}
    assert interrupt == client.threads.get_state(thread_id)["interrupts"][0]
    assert parts[-2].event == "updates" and parts[-2].data == {"__interrupt__": [interrupt]}
    v2 = list(client.runs.stream(thread_id, "agent", command={"resume": "approve"}, stream_mode="values", version="v2"))
    assert [p["interrupts"] for p in v2 if p["type"] == "values"][-1] == []
    assert contents(v2[-1]["data"])[-2:] == ["sent to ada@ex.org", "Done: sent to ada@ex.org"]
    assert client.threads.get(thread_id)["status"] == "idle"


@pytest.mark.slow
def test_join_a_background_run_in_some_of_its_modes(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, "agent", input=human("note milk"), stream_mode=["values", "updates"])
    updates = list(client.runs.join_stream(thread_id, run["run_id"], stream_mode="updates"))
    assert [p.event for p in updates] == ["metadata"] + ["updates"] * 4
    both = list(client.runs.join_stream(thread_id, run["run_id"]))
    assert [p.event for p in both].count("values") == 4 and [p.event for p in both].count("updates") == 4
    with pytest.raises(UnprocessableEntityError):  # a mode the run does not make
        list(client.runs.join_stream(thread_id, run["run_id"], stream_mode="messages"))


@pytest.mark.slow
def test_a_client_that_disconnects_can_join_again(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    body = {"assistant_id": "agent", "input": human("sleep 0.6"), "stream_mode": ["values", "messages-tuple"]}
    http = served.http()
    with http.stream("POST", f"/threads/{thread_id}/runs/stream", json=body) as response:
        run_id = response.headers["content-location"].rsplit("/", 1)[1]
        assert next(response.iter_lines()) == "event: metadata"
    assert client.runs.get(thread_id, run_id)["status"] == "running"  # hanging up did not stop it
    parts = list(client.runs.join_stream(thread_id, run_id))
    assert [p.event for p in parts][:2] == ["metadata", "values"]  # from the start
    assert "".join(p.data[0]["content"] for p in parts if p.event == "messages") == "slept 0.6"
    assert client.runs.get(thread_id, run_id)["status"] == "success"


@pytest.mark.slow
def test_cancel_a_running_run(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "agent", input=human("first"))
    run = client.runs.create(thread_id, "agent", input=human("sleep 30"))
    wait_for_input(client, thread_id, "sleep 30")
    client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert client.runs.get(thread_id, run["run_id"])["status"] == "interrupted"
    values = client.runs.join(thread_id, run["run_id"])  # the thread's state: what the run committed
    assert contents(values) == ["first", "echo: first", "sleep 30"]
    assert values == client.threads.get_state(thread_id)["values"]
    assert client.threads.get(thread_id)["status"] == "idle"
    client.runs.cancel(thread_id, run["run_id"])  # cancelling a finished run changes nothing
    values = client.runs.wait(thread_id, "agent", input=human("next"))  # the thread goes on
    assert contents(values)[-2:] == ["next", "echo: next"]


@pytest.mark.slow
def test_cancel_a_streamed_run_from_another_client(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    stream = client.runs.stream(thread_id, "agent", input=human("sleep 30"), stream_mode=["values", "updates"])
    metadata = next(stream)
    assert [next(stream).event, next(stream).event] == ["updates", "values"]  # the input; the model is thinking
    client.runs.cancel(thread_id, metadata.data["run_id"])
    assert list(stream) == []  # nothing more, and the stream ends
    assert client.runs.get(thread_id, metadata.data["run_id"])["status"] == "interrupted"


@pytest.mark.slow
def test_cancel_with_rollback_restores_the_thread(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    before = client.runs.wait(thread_id, "agent", input=human("first"))
    head = client.threads.get_state(thread_id)["checkpoint"]["checkpoint_id"]
    run = client.runs.create(thread_id, "agent", input={**human("sleep 30"), "topic": "tea"})
    wait_for_input(client, thread_id, "sleep 30")
    client.runs.cancel(thread_id, run["run_id"], wait=True, action="rollback")
    with pytest.raises(NotFoundError):  # the run is deleted
        client.runs.get(thread_id, run["run_id"])
    state = client.threads.get_state(thread_id)
    assert state["values"] == before and "topic" not in state["values"]
    assert state["metadata"]["rolled_back"] == {"run_id": run["run_id"], "to": head}
    pending = client.runs.create(thread_id, "agent", input=human("sleep 0.3"))
    queued = client.runs.create(thread_id, "agent", input=human("queued"), multitask_strategy="enqueue")
    client.runs.cancel(thread_id, queued["run_id"], action="rollback")  # a pending run is simply deleted
    with pytest.raises(NotFoundError):
        client.runs.get(thread_id, queued["run_id"])
    assert contents(client.runs.join(thread_id, pending["run_id"]))[-1] == "slept 0.3"


@pytest.mark.slow
def test_cancel_refuses_an_unknown_action(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    run = client.runs.create(thread_id, "agent", input=human("hi"))
    response = served.http().post(f"/threads/{thread_id}/runs/{run['run_id']}/cancel", params={"action": "explode"})
    assert response.status_code == 422 and response.json()["param"] == "action"
    client.runs.join(thread_id, run["run_id"])
    assert client.runs.get(thread_id, run["run_id"])["status"] == "success"


@pytest.mark.slow
def test_resume_through_a_background_run_and_its_joined_stream(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "agent", input=human("email eve@ex.org"))
    state = client.threads.get_state(thread_id)
    assert state["next"] == ["tools"] and state["tasks"][0]["interrupts"] == state["interrupts"]
    call_id = state["interrupts"][0]["value"]["action_requests"][0]["id"]
    run = client.runs.create(thread_id, "agent", command={"resume": {call_id: {"arguments": {"to": "bo@ex.org"}}}})
    parts = list(client.runs.join_stream(thread_id, run["run_id"]))
    assert parts[-1].event == "values"
    assert contents(parts[-1].data)[-1] == "Done: sent to bo@ex.org"
    assert client.runs.get(thread_id, run["run_id"])["status"] == "success"


@pytest.mark.slow
def test_stream_events_are_sent_as_they_happen(served: Served) -> None:
    """A stream's first values arrive while the model is still working (not buffered until the run ends)."""
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    stream = client.runs.stream(thread_id, "agent", input=human("sleep 2"))
    next(stream)
    first = next(stream)
    assert contents(first.data) == ["sleep 2"]
    assert client.runs.list(thread_id)[0]["status"] == "running"
    assert contents([p for p in stream][-1].data)[-1] == "slept 2"


@pytest.mark.slow
def test_plain_http_clients_get_server_sent_events(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    body = {"assistant_id": "agent", "input": human("hi"), "stream_mode": ["updates"]}
    response = served.http().post(f"/threads/{thread_id}/runs/stream", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("event: ") for line in response.text.splitlines() if line.startswith("event: ")]
    assert events == ["metadata", "updates", "updates"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_custom_events_from_a_tool(backend: Backend) -> None:
    @tool
    def progress(steps: int, ctx: RunContext) -> str:
        """Work in steps, reporting each."""
        for step in range(steps):
            ctx.emit("progress", {"step": step, "of": steps})
        return "worked"

    def policy(messages: list[ChatMessage], tools: Any) -> Any:
        last = messages[-1]
        return "finished" if last.tool_call_result is not None else [("progress", {"steps": 3})]

    agent = Agent(ScriptedChatGenerator(policy=policy), tools=[progress], checkpointer=backend.checkpointer())
    with LiveServer(create_app({"agent": agent})) as live, get_sync_client(url=live.url, api_key=None) as client:
        thread_id = client.threads.create()["thread_id"]
        parts = list(client.runs.stream(thread_id, "agent", input=human("go"), stream_mode=["custom", "updates"]))
    custom = [p.data for p in parts if p.event == "custom"]
    assert custom == [{"name": "progress", "data": {"step": step, "of": 3}} for step in range(3)]
    events = [p.event for p in parts]
    assert events.index("custom") < len(events) - 1 - events[::-1].index("updates")  # before the tools' update
