"""
What LangGraph's clients read before they talk (``/info``, an assistant's graph), what they send (JSON bodies
without the JSON content type), and how they list conversations (thread metadata stamped with ``graph_id`` and
``assistant_id``), with ``langgraph-sdk`` and plain HTTP, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from typing import Any

import pytest

from haystack_state.server import create_app
from server.agents import make_agent
from server.conftest import Backend, LiveServer, Served

pytestmark = pytest.mark.slow


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def test_info_in_langgraphs_shape(served: Served) -> None:
    info = served.http().get("/info")
    assert info.status_code == 200
    body = info.json()
    assert body["version"] == version("haystack-state")
    assert body["flags"]["assistants"] is True and body["flags"]["crons"] is False


def test_the_agent_drawn_as_a_graph(served: Served) -> None:
    client = served.client()
    graph = client.assistants.get_graph("agent")
    assert [node["id"] for node in graph["nodes"]] == ["__start__", "model", "tools", "__end__"]
    edges = {(edge["source"], edge["target"]) for edge in graph["edges"]}
    assert edges == {
        ("__start__", "model"),
        ("model", "tools"),
        ("tools", "model"),
        ("model", "__end__"),
        ("tools", "__end__"),
    }
    assert client.assistants.get_graph("agent", xray=True) == graph
    assert client.assistants.get_subgraphs("agent") == {}
    assert served.http().get("/assistants/nobody/graph").status_code == 404


def test_every_run_stamps_its_graph_and_assistant_on_the_thread(served: Served) -> None:
    client = served.client()
    assistant_id = client.assistants.get("agent")["assistant_id"]
    mine = client.threads.create(metadata={"user": "ada"})["thread_id"]
    idle = client.threads.create()["thread_id"]  # never run: not a conversation of the graph yet
    client.runs.wait(mine, "agent", input=human("hi"))
    metadata = client.threads.get(mine)["metadata"]
    assert metadata == {"user": "ada", "graph_id": "agent", "assistant_id": assistant_id}
    found = [t["thread_id"] for t in client.threads.search(metadata={"graph_id": "agent"})]
    assert found == [mine] and idle not in found
    client.runs.create(mine, "agent", input=human("again"), multitask_strategy="enqueue")  # stamped once
    assert client.threads.get(mine)["metadata"] == metadata


def test_json_bodies_without_the_json_content_type(served: Served) -> None:
    http = served.http()
    thread_id = http.post("/threads", content=b"{}", headers={"content-type": "text/plain"}).json()["thread_id"]
    body = json.dumps({"assistant_id": "agent", "input": human("plain")}).encode()
    # as a browser's simple request sends it, and as a proxy that forwards the body without its headers does
    answered = http.post(f"/threads/{thread_id}/runs/wait", content=body, headers={"content-type": "text/plain"})
    assert answered.status_code == 200 and answered.json()["messages"][-1]["content"] == "echo: plain"
    bare = http.build_request("POST", f"/threads/{thread_id}/runs/wait", content=body)
    assert "content-type" not in bare.headers
    assert http.send(bare).json()["messages"][-1]["content"] == "echo: plain"
    refused = http.post(f"/threads/{thread_id}/runs/wait", content=b"not json", headers={"content-type": "text/plain"})
    assert refused.status_code == 422 and "JSON" in refused.text
    assert [m["content"] for m in http.get(f"/threads/{thread_id}/state").json()["values"]["messages"]] == [
        "plain",
        "echo: plain",
        "plain",
        "echo: plain",
    ]


def test_a_threads_runs_go_to_its_own_assistant(backend: Backend) -> None:
    checkpointer = backend.checkpointer()
    app = create_app({"agent": make_agent(checkpointer), "other": make_agent(checkpointer)}, poll_interval=0.05)
    with LiveServer(app) as live:
        import httpx

        with httpx.Client(base_url=live.url, timeout=30) as http:
            thread_id = http.post("/threads", json={}).json()["thread_id"]
            run = {"assistant_id": "agent", "input": human("hi")}
            assert http.post(f"/threads/{thread_id}/runs/wait", json=run).status_code == 200
            refused = http.post(f"/threads/{thread_id}/runs/wait", json={**run, "assistant_id": "other"})
            assert refused.status_code == 409 and "belongs to assistant 'agent'" in refused.json()["detail"]
            values = http.get(f"/threads/{thread_id}/state").json()["values"]
            assert [m["content"] for m in values["messages"]] == ["hi", "echo: hi"]  # nothing written
