"""
No thread is ever wedged: after a run stops between the model's tool calls and their results (its process killed,
or the run cancelled), new messages over HTTP follow the Agent's ``on_unfinished_calls`` policy, chosen per run
with ``config={"configurable": {"on_unfinished_calls": ...}}`` as LangGraph clients send config, and a run with
``input`` null finishes the calls.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client

from server.conftest import Backend, Served, ServeProcess

pytestmark = pytest.mark.slow


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def conversation(values: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(type, content)`` of the messages, the system prompt left out."""
    return [(m["type"], m["content"]) for m in values["messages"] if m["type"] != "system"]


def calls_of(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines() if line] if log.exists() else []


def policy(value: str) -> dict[str, Any]:
    return {"configurable": {"on_unfinished_calls": value}}


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_after_a_crash_new_messages_follow_each_policy(backend: Backend, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    env = {"HAYSTACK_STATE_TEST_TOOL_LOG": str(log), "HAYSTACK_STATE_TEST_WORK_SECONDS": "60"}
    # One attempt per run: the killed runs are not resumed, so their threads stay unfinished.
    args = ["server.agents:serve_agents", *backend.serve_args, "--poll-interval", "0.05", "--max-attempts", "1"]
    server = ServeProcess(*args, env=env).wait_ready()
    try:
        with get_sync_client(url=server.url, api_key=None) as client:
            threads = {name: client.threads.create()["thread_id"] for name in ("finish", "close", "refuse", "null")}
            runs = {
                name: client.runs.create(thread_id, "agent", input=human(f"work {name}"))["run_id"]
                for name, thread_id in threads.items()
            }
            deadline = time.monotonic() + 30
            while len(calls_of(log)) < len(threads):
                assert time.monotonic() < deadline, "the tool calls did not start"
                time.sleep(0.02)
            os.kill(server.process.pid, signal.SIGKILL)
            server.stop()
    finally:
        server.stop()
    env["HAYSTACK_STATE_TEST_WORK_SECONDS"] = "0"
    server = ServeProcess(*args, env=env).wait_ready()
    try:
        with get_sync_client(url=server.url, api_key=None) as client:
            deadline = time.monotonic() + 30
            while any(client.runs.get(threads[n], r)["status"] == "running" for n, r in runs.items()):
                assert time.monotonic() < deadline, "the killed runs were not taken back"
                time.sleep(0.05)
            failed = client.runs.get(threads["finish"], runs["finish"])
            assert failed["status"] == "error" and "1 of 1 attempt" in failed["error"]
            assert failed["metadata"]["attempts"][0]["outcome"].startswith("its worker stopped")

            # The default after a crash: the pending call runs (again), then the new message is answered.
            values = client.runs.wait(threads["finish"], "agent", input=human("hi"))
            assert conversation(values)[1:] == [
                ("ai", ""),
                ("tool", "worked finish"),
                ("human", "hi"),
                ("ai", "echo: hi"),
            ], values
            assert calls_of(log).count("finish") == 2

            # close: the pending call is answered with an error saying its run stopped; it does not run.
            values = client.runs.wait(threads["close"], "agent", input=human("hi"), config=policy("close"))
            tool = [m for m in values["messages"] if m["type"] == "tool"]
            assert len(tool) == 1 and tool[0]["status"] == "error" and "was not run" in tool[0]["content"]
            assert conversation(values)[-2:] == [("human", "hi"), ("ai", "echo: hi")]
            assert calls_of(log).count("close") == 1

            # refuse: a 409 that names the HTTP ways out, and nothing is written.
            before = client.threads.get_state(threads["refuse"])
            with httpx.Client(base_url=server.url, timeout=30) as http:
                refused = http.post(
                    f"/threads/{threads['refuse']}/runs/wait",
                    json={"assistant_id": "agent", "input": human("hi"), "config": policy("refuse")},
                )
                assert refused.status_code == 409, refused.text
                detail = refused.json()["detail"]
                assert "input null" in detail and "on_unfinished_calls" in detail
                bad = http.post(
                    f"/threads/{threads['refuse']}/runs/wait",
                    json={"assistant_id": "agent", "input": human("hi"), "config": policy("later")},
                )
                assert bad.status_code == 422 and "on_unfinished_calls" in bad.json()["detail"]
            assert client.threads.get_state(threads["refuse"]) == before

            # input null: the way LangGraph clients continue a thread; the pending call runs.
            values = client.runs.wait(threads["null"], "agent", input=None)
            assert conversation(values)[-2:] == [("tool", "worked null"), ("ai", "Done: worked null")]
            # and then the thread takes new messages as usual
            values = client.runs.wait(threads["null"], "agent", input=human("hi"))
            assert conversation(values)[-1] == ("ai", "echo: hi")
    finally:
        server.stop()


def test_cancel_between_the_model_and_the_tools_then_a_new_message(
    serve: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("HAYSTACK_STATE_TEST_TOOL_LOG", str(log))
    monkeypatch.setenv("HAYSTACK_STATE_TEST_WORK_SECONDS", "1.5")
    served: Served = serve()
    client = served.client()
    for action in ("interrupt", "rollback"):
        thread_id = client.threads.create()["thread_id"]
        client.runs.wait(thread_id, "agent", input=human("hello"))
        run = client.runs.create(thread_id, "agent", input=human(f"work {action}"))
        deadline = time.monotonic() + 30
        while action not in calls_of(log):  # the model asked for the tool, which is running now
            assert time.monotonic() < deadline
            time.sleep(0.02)
        client.runs.cancel(thread_id, run["run_id"], wait=True, action=action)
        # The next message is answered at once: the thread is not wedged.
        values = client.runs.wait(thread_id, "agent", input=human("hi"))
        messages = conversation(values)
        assert messages[-2:] == [("human", "hi"), ("ai", "echo: hi")], messages
        if action == "interrupt":
            # The cancelled run's call is answered with an error (the user did not want it made), not run again.
            assert messages[:4] == [("human", "hello"), ("ai", "echo: hello"), ("human", "work interrupt"), ("ai", "")]
            tool = [m for m in values["messages"] if m["type"] == "tool"]
            assert len(tool) == 1 and "was cancelled" in tool[0]["content"] and tool[0]["status"] == "error"
        else:  # rolled back to where the run started: the cancelled turn is gone
            assert messages == [("human", "hello"), ("ai", "echo: hello"), ("human", "hi"), ("ai", "echo: hi")]
        assert calls_of(log).count(action) == 1
