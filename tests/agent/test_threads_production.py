"""Durable threads in production: typed values across runs, token usage across a crash, async thread reads."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from workers.harness import Harness

from haystack_state import Agent, AgentRunError, add, tool
from haystack_state.testing import ScriptedChatGenerator


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


@tool(outputs_to_state={"counts": {"source": "counts"}, "recent": {"source": "recent"}})
def count(word: str) -> dict[str, Any]:
    """
    Count a word.

    :param word: The word.
    """
    return {"counts": collections.Counter([word]), "recent": collections.deque([word])}


def test_a_counter_and_a_deque_keep_their_type_across_runs(store: Harness) -> None:
    cp = store.make()
    schema = {
        "counts": {"type": collections.Counter, "handler": add, "default": collections.Counter},
        "recent": {"type": collections.deque, "default": collections.deque},
    }
    script = [[("count", {"word": "bee"})], "one", [("count", {"word": "bee"})], "two"]
    agent = Agent(ScriptedChatGenerator(script=script), tools=[count], state_schema=schema, checkpointer=cp)
    agent.run(user("count"), thread_id="t")
    fresh = Agent(ScriptedChatGenerator(script=script[2:]), tools=[count], state_schema=schema,
                  checkpointer=store.make() if store.persistent else cp)  # fmt: skip
    result = fresh.run(user("again"), thread_id="t")  # failed with "expects Counter, got FrozenDict" before
    assert result["counts"] == collections.Counter(bee=2) and type(result["counts"]) is collections.Counter
    snapshot = fresh.get_state("t")
    assert (
        type(snapshot.values["counts"]) is collections.Counter and type(snapshot.values["recent"]) is collections.deque
    )


def test_token_usage_after_a_resume_includes_what_the_run_spent_before_it_stopped(store: Harness) -> None:
    from haystack.dataclasses import ToolCall

    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}

    def policy(messages: list[ChatMessage], tools: Any) -> ChatMessage:
        if not any(m.is_from("tool") for m in messages):
            call = ToolCall(tool_name="count", arguments={"word": "x"}, id="c1")
            return ChatMessage.from_assistant(tool_calls=[call], meta={"usage": usage})
        return ChatMessage.from_assistant("done", meta={"usage": usage})

    schema = {"counts": {"type": collections.Counter, "handler": add}, "recent": {"type": collections.deque}}

    def agent_on(checkpointer: Any) -> Agent:
        return Agent(
            ScriptedChatGenerator(policy=policy),
            tools=[count],
            state_schema=schema,
            checkpointer=checkpointer,
            interrupt_before=["count"],
        )

    cp = store.make()
    stopped = agent_on(cp).run(user("go"), thread_id="t")
    assert stopped["exit_reason"] == "interrupted" and stopped["token_usage"] == usage
    resumed = agent_on(store.make() if store.persistent else cp).resume("t", {"c1": "approve"})
    assert resumed["exit_reason"] == "text"
    assert resumed["token_usage"] == {key: 2 * value for key, value in usage.items()}


def test_a_failed_stopped_record_still_raises_the_agent_run_error(store: Harness, caplog: Any) -> None:
    cp = store.make()

    def policy(messages: list[ChatMessage], tools: Any) -> ChatMessage:
        head = cp.head("t")  # someone commits to the thread behind the run's back, then the model fails
        from haystack_state.persistence import replace

        cp.commit("t", parent_id=head, expected_head=head, delta={"note": replace("x")}, step=9, source="update")
        raise RuntimeError("the model is down")

    agent = Agent(ScriptedChatGenerator(policy=policy), state_schema={"note": {"type": str}}, checkpointer=cp)
    with pytest.raises(AgentRunError, match="model is down"):  # not KeyError: "Attempt to overwrite 'thread' ..."
        agent.run(user("go"), thread_id="t")
    assert "could not record on thread 't' that the run stopped" in caplog.text
    assert cp.read_lease("t") is None


def test_get_state_and_get_history_async(store: Harness) -> None:
    cp = store.make()
    agent = Agent(ScriptedChatGenerator(script=["hi", "again"]), checkpointer=cp)

    async def scenario() -> None:
        first = await agent.run_async(user("hello"), thread_id="t")
        await agent.run_async(user("more"), thread_id="t")
        snapshot = await agent.get_state_async("t")
        assert [m.text for m in snapshot.values["messages"]] == ["hello", "hi", "more", "again"]
        history = await agent.get_history_async("t")
        assert history == agent.get_history("t")
        page = await agent.get_history_async("t", limit=2, before=history[1].checkpoint_id)
        assert page == history[2:4]
        assert first["checkpoint_id"] in [meta.checkpoint_id for meta in history]

    asyncio.run(scenario())
    asyncio.run(cp.aclose())
