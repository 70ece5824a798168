"""
An Agent's retries over HTTP: a served agent whose tool fails twice with a connection error, then succeeds; the
retried call is in the ``metadata.retries`` of the thread's history, as LangGraph's SDK client reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from haystack import component
from haystack.dataclasses import ChatMessage
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from haystack_state import Agent, RetryPolicy, tool
from haystack_state.server import create_app
from haystack_state.testing import ScriptedChatGenerator
from server.conftest import Backend, LiveServer


@contextlib.contextmanager
def served(agent: Agent) -> Iterator[SyncLangGraphClient]:
    """The agent behind a live server, and a langgraph-sdk client of it."""
    app = create_app({"agent": agent}, poll_interval=0.05)
    with LiveServer(app) as live, get_sync_client(url=live.url, api_key=None) as client:
        yield client


def retries_in_history(client: SyncLangGraphClient, thread_id: str) -> list[dict[str, Any]]:
    """Every retry record in the thread's history (``metadata.retries`` of its checkpoints)."""
    return [
        entry
        for state in client.threads.get_history(thread_id, limit=50)
        for entry in state["metadata"].get("retries", [])
    ]


def test_the_retried_calls_are_in_the_thread_history(backend: Backend) -> None:
    attempts: list[str] = []

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        attempts.append(url)
        if len(attempts) < 3:
            raise ConnectionError(f"attempt {len(attempts)} failed")
        return f"page {url}"

    agent = Agent(
        ScriptedChatGenerator(script=[[("fetch", {"url": "a"})], "Done."]),
        tools=[fetch],
        checkpointer=backend.checkpointer(),
        retry_policy=RetryPolicy(3, initial_interval=0.01, jitter=False),
    )
    with served(agent) as client:
        thread_id = client.threads.create()["thread_id"]
        values: Any = client.runs.wait(thread_id, "agent", input={"messages": [{"type": "human", "content": "go"}]})
        assert [m["content"] for m in values["messages"] if m["type"] == "tool"] == ["page a"]
        assert retries_in_history(client, thread_id) == [
            {
                "kind": "tool",
                "tool_name": "fetch",
                "call_id": "call_1",
                "attempts": 3,
                "succeeded": True,
                "errors": ["ConnectionError: attempt 1 failed", "ConnectionError: attempt 2 failed"],
                "step": 1,
            }
        ]


def test_exhausted_budgets_are_recorded_where_the_run_failed(backend: Backend) -> None:
    """A tool that always fails goes back to the model as an error after its attempts; a model that always fails
    fails the run (status ``error``, the message naming the attempts) and both are in the thread's history."""

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        raise ConnectionError(f"{url} is down")

    class DownAfterOneReply:
        """Answers the first call from its script; every later call fails with a connection error."""

        def __init__(self, script: list[Any]) -> None:
            self.inner, self.calls = ScriptedChatGenerator(script=script), 0

        def _call(self) -> None:
            self.calls += 1
            if self.calls > 1:
                raise ConnectionError(f"model call {self.calls} failed")

        @component.output_types(replies=list[ChatMessage])
        def run(self, messages: list[ChatMessage], tools: Any = None, **kwargs: Any) -> dict[str, Any]:
            self._call()
            return self.inner.run(messages, tools=tools, **kwargs)

        @component.output_types(replies=list[ChatMessage])
        async def run_async(self, messages: list[ChatMessage], tools: Any = None, **kwargs: Any) -> dict[str, Any]:
            self._call()
            return await self.inner.run_async(messages, tools=tools, **kwargs)

    agent = Agent(
        component(DownAfterOneReply)(script=[[("fetch", {"url": "a"})]]),
        tools=[fetch],
        checkpointer=backend.checkpointer(),
        retry_policy=RetryPolicy(2, initial_interval=0.01, jitter=False),
    )
    with served(agent) as client:
        thread_id = client.threads.create()["thread_id"]
        run = client.runs.create(thread_id, "agent", input={"messages": [{"type": "human", "content": "go"}]})
        client.runs.join(thread_id, run["run_id"])
        finished = client.runs.get(thread_id, run["run_id"])
        assert finished["status"] == "error"
        state: Any = client.threads.get_state(thread_id)
        tool_messages = [m for m in state["values"]["messages"] if m["type"] == "tool"]
        assert [m["status"] for m in tool_messages] == ["error"] and "a is down" in tool_messages[0]["content"]
        retries = retries_in_history(client, thread_id)
        assert sorted(retries, key=lambda entry: entry["kind"]) == [
            {
                "kind": "model",
                "step": 2,
                "attempts": 2,
                "succeeded": False,
                "errors": ["ConnectionError: model call 2 failed", "ConnectionError: model call 3 failed"],
            },
            {
                "kind": "tool",
                "tool_name": "fetch",
                "call_id": "call_1",
                "attempts": 2,
                "succeeded": False,
                "errors": ["ConnectionError: a is down", "ConnectionError: a is down"],
                "step": 1,
            },
        ]
        assert "after 2 attempts" in client.threads.get_history(thread_id, limit=1)[0]["metadata"]["stopped"]
