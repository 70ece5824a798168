"""
An Agent's retries over HTTP: a served agent whose tool fails twice with a connection error, then succeeds; the
retried call is in the ``metadata.retries`` of the thread's history, as LangGraph's SDK client reads it.
"""

from __future__ import annotations

from typing import Any

from langgraph_sdk import get_sync_client

from haystack_state import Agent, RetryPolicy, tool
from haystack_state.server import create_app
from haystack_state.testing import ScriptedChatGenerator
from server.conftest import Backend, LiveServer


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
    app = create_app({"agent": agent}, poll_interval=0.05)
    with LiveServer(app) as live, get_sync_client(url=live.url, api_key=None) as client:
        thread_id = client.threads.create()["thread_id"]
        values: Any = client.runs.wait(thread_id, "agent", input={"messages": [{"type": "human", "content": "go"}]})
        assert [m["content"] for m in values["messages"] if m["type"] == "tool"] == ["page a"]
        history = client.threads.get_history(thread_id, limit=50)
        retries = [entry for state in history for entry in state["metadata"].get("retries", [])]
        assert retries == [
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
