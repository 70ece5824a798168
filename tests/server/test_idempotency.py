"""
``Idempotency-Key`` on run creation, through LangGraph's SDK client (its ``headers=``), on SQLite and PostgreSQL: a
retried submission answers the same run (created, waited for or streamed) and runs nothing twice; the same key with
another request is a 409 that writes nothing; keys are per user and per thread's request; a bad key is a 422.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client

from haystack_state import Agent, tool
from haystack_state.server import create_app
from haystack_state.testing import ScriptedChatGenerator
from server.conftest import Backend, LiveServer

pytestmark = pytest.mark.slow


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def make(backend: Backend, calls: list[str], gate: threading.Event | None = None) -> Agent:
    @tool
    def charge(amount: int) -> str:
        """Charge an amount."""
        if gate is not None:
            gate.wait(10)
        calls.append(f"charge {amount}")
        return f"charged {amount}"

    script = [[("charge", {"amount": 5})], "Charged."] * 4
    return Agent(ScriptedChatGenerator(script=script), tools=[charge], checkpointer=backend.checkpointer())


def test_a_retried_submission_answers_the_same_run_and_runs_nothing_twice(backend: Backend) -> None:
    calls: list[str] = []
    app = create_app({"agent": make(backend, calls)}, poll_interval=0.05)
    with LiveServer(app) as live, get_sync_client(url=live.url, api_key=None) as client:
        thread_id = client.threads.create()["thread_id"]
        key = {"Idempotency-Key": "order-1"}
        first = client.runs.wait(thread_id, "agent", input=human("charge me"), headers=key)
        again = client.runs.wait(thread_id, "agent", input=human("charge me"), headers=key)
        assert again == first and calls == ["charge 5"]
        assert len(client.runs.list(thread_id)) == 1

        created = client.runs.create(thread_id, "agent", input=human("and again"), headers={"Idempotency-Key": "o-2"})
        retried = client.runs.create(thread_id, "agent", input=human("and again"), headers={"Idempotency-Key": "o-2"})
        assert retried["run_id"] == created["run_id"]
        client.runs.join(thread_id, created["run_id"])
        assert calls == ["charge 5", "charge 5"]

        parts = list(client.runs.stream(thread_id, "agent", input=human("a third"), headers={"Idempotency-Key": "o-3"}))
        replayed = list(
            client.runs.stream(thread_id, "agent", input=human("a third"), headers={"Idempotency-Key": "o-3"})
        )
        assert [p.event for p in replayed] == [p.event for p in parts] and replayed[-1].data == parts[-1].data
        assert replayed[0].data["run_id"] == parts[0].data["run_id"]
        assert calls == ["charge 5"] * 3 and len(client.runs.list(thread_id)) == 3


def test_a_retry_while_the_run_is_still_running_joins_it(backend: Backend) -> None:
    calls: list[str] = []
    gate = threading.Event()
    app = create_app({"agent": make(backend, calls, gate)}, poll_interval=0.05)
    with LiveServer(app) as live, get_sync_client(url=live.url, api_key=None) as client:
        thread_id = client.threads.create()["thread_id"]
        key = {"Idempotency-Key": "slow-1"}
        run = client.runs.create(thread_id, "agent", input=human("charge"), headers=key)
        # the thread is busy: without the key this would be a 409 (multitask_strategy "reject")
        again = client.runs.create(thread_id, "agent", input=human("charge"), headers=key)
        assert again["run_id"] == run["run_id"] and again["status"] in ("pending", "running")

        waited: list[Any] = []

        def wait() -> None:
            waited.append(
                client.runs.wait(thread_id, "agent", input=human("and wait"), headers={"Idempotency-Key": "w"})
            )

        gate.set()
        client.runs.join(thread_id, run["run_id"])
        gate.clear()
        first, second = threading.Thread(target=wait), threading.Thread(target=wait)
        first.start()
        first.join(0.5)
        second.start()
        second.join(0.5)
        assert first.is_alive() and second.is_alive()  # both wait for one run: neither failed, nor was refused
        gate.set()
        first.join(30)
        second.join(30)
        assert len(waited) == 2 and waited[0] == waited[1]
        assert waited[0]["messages"][-1]["content"] == "Charged."
        assert calls == ["charge 5", "charge 5"]  # the created run's, and one for the two waits
        assert len(client.runs.list(thread_id)) == 2


def test_the_same_key_with_another_request_is_a_conflict_that_writes_nothing(backend: Backend) -> None:
    calls: list[str] = []
    app = create_app({"agent": make(backend, calls)}, poll_interval=0.05)
    with LiveServer(app) as live, get_sync_client(url=live.url, api_key=None) as client:
        thread_id = client.threads.create()["thread_id"]
        other = client.threads.create()["thread_id"]
        key = {"Idempotency-Key": "k"}
        first = client.runs.wait(thread_id, "agent", input=human("charge me"), headers=key)
        state = client.threads.get_state(thread_id)
        for attempt in (
            lambda: client.runs.wait(thread_id, "agent", input=human("charge me twice"), headers=key),
            lambda: client.runs.wait(other, "agent", input=human("charge me"), headers=key),
            lambda: client.runs.create(thread_id, "agent", input=human("charge me"), headers=key),
        ):
            with pytest.raises(httpx.HTTPStatusError) as refused:
                attempt()
            assert refused.value.response.status_code == 409
            assert "Idempotency-Key 'k' was used for run" in refused.value.response.text
        assert client.threads.get_state(thread_id) == state and client.threads.get_state(other)["values"] in ({}, None)
        assert calls == ["charge 5"] and first["messages"][-1]["content"] == "Charged."
        assert len(client.runs.list(thread_id)) == 1 and client.runs.list(other) == []


def test_a_key_that_is_not_printable_text_is_refused_naming_the_header(backend: Backend) -> None:
    app = create_app({"agent": make(backend, [])}, poll_interval=0.05)
    with LiveServer(app) as live:
        thread_id = httpx.post(f"{live.url}/threads", json={}).json()["thread_id"]
        for key in ("", "x" * 256, "tab\there"):
            answer = httpx.post(
                f"{live.url}/threads/{thread_id}/runs/wait",
                json={"assistant_id": "agent", "input": human("hi")},
                headers={"Idempotency-Key": key},
            )
            assert answer.status_code == 422, (key, answer.text)
            assert "Idempotency-Key" in answer.text
        assert httpx.get(f"{live.url}/threads/{thread_id}/runs").json() == []
