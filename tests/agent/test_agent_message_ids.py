"""
Message ids in Python: every message an Agent run writes has ``meta["id"]`` (its input, the system prompt, each model
reply, each tool result), a message that came with an id keeps it, the caller's messages are not changed, the ids are
stored with the thread, a streamed reply's chunks carry its id, and ``update_state`` edits a message by its id.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ChatRole

from haystack_state import Agent, InMemoryCheckpointer, SQLiteCheckpointer, tool
from haystack_state.agent._message_ids import SYSTEM_PROMPT_ID_PREFIX
from haystack_state.agent.events import ModelChunk, ModelReply, RunFinished
from haystack_state.persistence import Checkpointer
from haystack_state.testing import ScriptedChatGenerator


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def make(script: list[Any], checkpointer: Checkpointer | None = None) -> Agent:
    return Agent(
        ScriptedChatGenerator(script=script),
        tools=[lookup],
        system_prompt="Be brief.",
        checkpointer=checkpointer,
    )


def ids(messages: list[ChatMessage]) -> list[str]:
    return [m.meta["id"] for m in messages]


@pytest.mark.parametrize("mode", ["run", "run_async"])
def test_every_message_of_a_run_gets_an_id(mode: str) -> None:
    agent = make([[("lookup", {"query": "tea"}), ("lookup", {"query": "milk"})], "done"])
    given = ChatMessage.from_user("find tea and milk")
    result = agent.run([given]) if mode == "run" else asyncio.run(agent.run_async([given]))
    messages = result["messages"]
    assert [m.role for m in messages] == [
        ChatRole.SYSTEM,
        ChatRole.USER,
        ChatRole.ASSISTANT,
        ChatRole.TOOL,
        ChatRole.TOOL,
        ChatRole.ASSISTANT,
    ]
    assert all(isinstance(i, str) and i for i in ids(messages))
    assert len(set(ids(messages))) == len(messages)
    assert messages[0].meta["id"].startswith(SYSTEM_PROMPT_ID_PREFIX)
    assert not any(i.startswith(SYSTEM_PROMPT_ID_PREFIX) for i in ids(messages[1:]))
    assert result["last_message"].meta["id"] == messages[-1].meta["id"]
    assert given.meta == {}  # the caller's message is not changed: the state holds a copy with the id
    assert messages[2].meta["finish_reason"] == "tool_calls"  # the reply's own meta is kept beside its id


def test_a_message_with_an_id_keeps_it() -> None:
    reply = ChatMessage.from_assistant("as scripted", meta={"id": "model-said-so"})
    agent = make([reply])
    system = ChatMessage.from_system("My own rules.", meta={"id": "rules-1"})
    given = ChatMessage.from_user("hi", meta={"id": "client-1", "source": "web"})
    result = agent.run([system, given])
    assert ids(result["messages"]) == ["rules-1", "client-1", "model-said-so"]
    assert result["messages"][1].meta == {"id": "client-1", "source": "web"}
    assert reply.meta == {"id": "model-said-so"}


def test_the_scripts_replies_are_not_changed_and_each_run_has_its_own_ids() -> None:
    reply = ChatMessage.from_assistant("the same reply")
    first = make([reply]).run([ChatMessage.from_user("a")])["messages"]
    second = make([reply]).run([ChatMessage.from_user("a")])["messages"]
    assert reply.meta == {}
    assert not set(ids(first)) & set(ids(second))


def test_ids_do_not_follow_the_applications_random_seed() -> None:
    random.seed(7)
    first = make(["x"]).run([ChatMessage.from_user("a")])["messages"]
    random.seed(7)
    second = make(["x"]).run([ChatMessage.from_user("a")])["messages"]
    assert not set(ids(first)) & set(ids(second))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_ids_are_stored_with_the_thread(kind: str, tmp_path: Any) -> None:
    checkpointer: Checkpointer = InMemoryCheckpointer() if kind == "memory" else SQLiteCheckpointer(tmp_path / "t.db")
    agent = make([[("lookup", {"query": "tea"})], "done", "again"], checkpointer)
    first = agent.run([ChatMessage.from_user("tea?")], thread_id="t")["messages"]
    assert ids(agent.get_state("t").values["messages"]) == ids(first)
    second = make(["again"], checkpointer).run([ChatMessage.from_user("more")], thread_id="t")["messages"]
    assert ids(second)[: len(first)] == ids(first)
    assert len(set(ids(second))) == len(second) == len(first) + 2
    checkpointer.close()


def test_a_streamed_reply_carries_its_id_in_every_chunk() -> None:
    agent = make([[("lookup", {"query": "tea"})], "a longer answer in several chunks"])
    events = list(agent.stream([ChatMessage.from_user("tea?")]))
    replies = {e.step: e.message.meta["id"] for e in events if isinstance(e, ModelReply)}
    chunks: dict[int, set[str | None]] = {}
    for event in events:
        if isinstance(event, ModelChunk):
            chunks.setdefault(event.step, set()).add(event.message_id)
    assert len(replies) == 2
    assert chunks == {step: {reply_id} for step, reply_id in replies.items()}
    final = next(e for e in events if isinstance(e, RunFinished))
    assert final.to_dict()["outputs"]["last_message"]["meta"]["id"] == replies[2]


def test_update_state_edits_a_message_by_its_id() -> None:
    checkpointer = InMemoryCheckpointer()
    agent = make(["first answer"], checkpointer)
    messages = agent.run([ChatMessage.from_user("q")], thread_id="t")["messages"]
    answer_id = messages[-1].meta["id"]
    edited = ChatMessage.from_assistant("corrected answer", meta={"id": answer_id})
    agent.update_state("t", {"messages": [edited, ChatMessage.from_user("follow-up")]})
    after = agent.get_state("t").values["messages"]
    assert [m.text for m in after] == ["Be brief.", "q", "corrected answer", "follow-up"]
    assert ids(after)[:3] == ids(messages) and after[3].meta["id"] not in ids(messages)
    assert checkpointer.history("t")[0].changed_keys == ("messages",)
    # a message without an id is only appended
    agent.update_state("t", {"messages": ChatMessage.from_user("one more")})
    assert [m.text for m in agent.get_state("t").values["messages"]][-2:] == ["follow-up", "one more"]
