"""
Live events: ``Agent.stream`` and ``Agent.stream_async`` yield typed events while the run goes on; their JSON forms;
replaying the ``StateChanged`` events gives the final state; a consumer that stops early cancels the run cleanly.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from haystack_state import Agent, AgentRunError, InMemoryCheckpointer, SQLiteCheckpointer, State, tool
from haystack_state.agent.events import (
    AgentEvent,
    CheckpointCommitted,
    Interrupted,
    ModelChunk,
    ModelReply,
    RunFailed,
    RunFinished,
    RunStarted,
    StateChanged,
    apply_state_changes,
)
from haystack_state.testing import ScriptedChatGenerator

SCHEMA = {
    "notes": {"type": list[str]},
    "count": {"type": int, "default": 0},
    "last": {"type": str},
}


@tool(outputs_to_state={"notes": {"source": "note"}, "last": {"source": "note"}})
def write(text: str) -> dict[str, str]:
    """Write a note."""
    return {"note": text}


@tool
def bump(state: State) -> str:
    """Count one more."""
    state.set("count", (state.get("count") or 0) + 1)
    return "bumped"


def user(text: str = "go") -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def make(script: list[Any], **kwargs: Any) -> Agent:
    return Agent(ScriptedChatGenerator(script=script), tools=[write, bump], state_schema=SCHEMA, **kwargs)


SCRIPT = [[("write", {"text": "a"}), ("bump", {})], [("write", {"text": "b"})], "done"]


def collect(agent: Agent, **kwargs: Any) -> list[AgentEvent]:
    return list(agent.stream(user(), **kwargs))


async def collect_async(agent: Agent, **kwargs: Any) -> list[AgentEvent]:
    return [event async for event in agent.stream_async(user(), **kwargs)]


def types(events: list[AgentEvent]) -> list[str]:
    return [event.type for event in events]


# --- the events ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_streams_its_events_in_order_ending_with_the_outputs_of_run(mode: str) -> None:
    agent = make(SCRIPT)
    events = collect(agent) if mode == "sync" else asyncio.run(collect_async(agent))

    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    assert [event.seq for event in events] == list(range(len(events)))
    assert len({event.run_id for event in events}) == 1
    assert all(a.time <= b.time for a, b in itertools.pairwise(events))
    replies = [event for event in events if isinstance(event, ModelReply)]
    assert [event.step for event in replies] == [1, 2, 3]
    assert replies[-1].message.text == "done"
    chunks = [event for event in events if isinstance(event, ModelChunk)]
    assert "".join(event.chunk.content for event in chunks if event.step == 3) == "done"
    assert {event.step for event in chunks} == {1, 2, 3}
    # every chunk of a step comes before that step's reply
    for reply in replies:
        assert all(event.seq < reply.seq for event in chunks if event.step == reply.step)
    outputs = events[-1].outputs  # type: ignore[attr-defined]
    reference = make(SCRIPT).run(user())
    assert outputs["notes"] == reference["notes"] == ["a", "b"]
    assert outputs["count"] == reference["count"] == 1
    assert outputs["exit_reason"] == "text"
    assert [m.text for m in outputs["messages"]] == [m.text for m in reference["messages"]]


def test_state_changes_name_the_key_and_the_operation() -> None:
    events = collect(make(SCRIPT))
    changes = [event for event in events if isinstance(event, StateChanged)]
    notes = [(event.op, event.items, event.value) for event in changes if event.key == "notes"]
    assert notes == [("replace", None, ["a"]), ("append", ["b"], None)]
    counts = [(event.op, event.value) for event in changes if event.key == "count"]
    assert counts == [("replace", 0), ("replace", 1)]  # the default, then the tool's write
    messages = [event for event in changes if event.key == "messages"]
    assert messages[0].op == "replace" and messages[0].value[0].text == "go"
    assert all(event.op == "append" for event in messages[1:])


def test_every_event_has_a_json_form_with_its_type() -> None:
    events = collect(make(SCRIPT, checkpointer=InMemoryCheckpointer()), thread_id="t")
    for event in events:
        data = event.to_dict()
        assert data["type"] == event.type
        assert {"run_id", "seq", "time", "thread_id"} <= data.keys()
        assert data["thread_id"] == "t"
        json.dumps(data)  # JSON-ready as it is
    kinds = Counter(types(events))
    assert kinds["checkpoint_committed"] == 6  # input, model/tools x2, model
    finished = events[-1].to_dict()
    assert finished["outputs"]["notes"] == ["a", "b"]
    assert finished["outputs"]["last_message"]["content"] == [{"text": "done"}]


def test_checkpoint_events_name_what_the_thread_stores() -> None:
    agent = make(SCRIPT, checkpointer=InMemoryCheckpointer())
    events = collect(agent, thread_id="t")
    committed = [event for event in events if isinstance(event, CheckpointCommitted)]
    history = list(reversed(list(agent.get_history("t"))))
    assert [(e.checkpoint_id, e.source, e.step) for e in committed] == [
        (meta.checkpoint_id, meta.source, meta.step) for meta in history
    ]
    # each checkpoint's changes are streamed before it is announced
    for event in committed:
        meta = next(meta for meta in history if meta.checkpoint_id == event.checkpoint_id)
        streamed = {e.key for e in events if isinstance(e, StateChanged) and e.seq < event.seq}
        assert set(meta.changed_keys) <= streamed


def test_an_interrupted_run_streams_its_pending_requests() -> None:
    agent = make([[("write", {"text": "a"})], "done"], checkpointer=InMemoryCheckpointer(), interrupt_before=["write"])
    events = collect(agent, thread_id="t")
    interrupted = [event for event in events if isinstance(event, Interrupted)]
    assert len(interrupted) == 1
    [request] = interrupted[0].requests
    assert request["tool_name"] == "write" and request["arguments"] == {"text": "a"} and request["kind"] == "before"
    assert events[-1].outputs["exit_reason"] == "interrupted"  # type: ignore[attr-defined]


def test_a_failed_run_streams_run_failed_then_raises() -> None:
    agent = Agent(ScriptedChatGenerator(script=[]), tools=[write], state_schema=SCHEMA)  # no reply to give
    seen: list[AgentEvent] = []
    with pytest.raises(AgentRunError):
        for event in agent.stream(user()):
            seen.append(event)
    assert isinstance(seen[-1], RunFailed) and seen[-1].error_type == "AgentRunError"
    assert not seen[-1].cancelled


def test_bad_inputs_raise_before_anything_streams() -> None:
    agent = make(SCRIPT, checkpointer=InMemoryCheckpointer())
    with pytest.raises(ValueError, match="unknown inputs"):
        agent.stream(user(), thread_id="t", nope=1)
    with pytest.raises(ValueError, match="unknown inputs"):
        asyncio.run(collect_async(agent, thread_id="t", nope=1))
    assert agent.checkpointer is not None and agent.checkpointer.head("t") is None


def test_run_makes_no_events() -> None:
    made: list[Any] = []
    original = AgentEvent.__init__

    def spy(self: AgentEvent, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    AgentEvent.__init__ = spy  # type: ignore[method-assign]
    try:
        make(SCRIPT).run(user())
    finally:
        AgentEvent.__init__ = original  # type: ignore[method-assign]
    assert made == []


# --- replaying the state changes --------------------------------------------------------------------------------

replies = st.lists(
    st.one_of(
        st.lists(
            st.one_of(
                st.builds(lambda t: ("write", {"text": t}), st.text("abc", min_size=1, max_size=3)),
                st.just(("bump", {})),
            ),
            min_size=1,
            max_size=3,
        ),
        st.just("text"),
    ),
    max_size=5,
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=replies, second=replies, threaded=st.booleans())
def test_replaying_the_state_changes_onto_the_start_gives_the_final_state(
    first: list[Any], second: list[Any], threaded: bool
) -> None:
    checkpointer = InMemoryCheckpointer()
    thread = {"thread_id": "t"} if threaded else {}
    agent = make([*first, "end of first", *second, "end of second"], checkpointer=checkpointer)
    agent.run(user("one"), **thread)
    start = dict(agent.get_state("t").values) if threaded else {"count": 0}
    events = list(agent.stream(user("two"), **thread))
    final = events[-1].outputs  # type: ignore[attr-defined]
    replayed = apply_state_changes(start, events)
    for key in ("notes", "count", "last"):
        assert replayed.get(key) == final.get(key)  # a key nothing set is left out of the outputs
    assert [m.text for m in replayed["messages"]] == [m.text for m in final["messages"]]
    if threaded:
        assert replayed == dict(agent.get_state("t").values)


# --- stopping early ---------------------------------------------------------------------------------------------


def test_breaking_out_cancels_the_run_and_the_thread_can_be_continued(tmp_path: Any) -> None:
    checkpointer = SQLiteCheckpointer(tmp_path / "threads.db")
    agent = make(SCRIPT, checkpointer=checkpointer)
    for event in agent.stream(user(), thread_id="t"):
        if isinstance(event, ModelReply) and event.step == 2:
            break  # the second reply is committed next... or not: the run stops before its next effect
    head = agent.get_state("t")
    # The run waits for the consumer before each effect: it stopped right after the reply the consumer saw, before
    # committing it. The first step stands; the second reply is asked for again when the thread is continued.
    assert head.values["notes"] == ["a"]
    assert head.values["messages"][-1].tool_call_result is not None
    agent = make(SCRIPT[1:], checkpointer=checkpointer)
    result = agent.run([], thread_id="t")
    assert result["notes"] == ["a", "b"] and result["count"] == 1
    assert result["exit_reason"] == "text"
    assert make(SCRIPT).run(user())["notes"] == result["notes"]


def test_breaking_out_of_an_async_stream_cancels_the_run_and_the_thread_can_be_continued() -> None:
    checkpointer = InMemoryCheckpointer()
    agent = make(SCRIPT, checkpointer=checkpointer)

    async def consume() -> None:
        async for event in agent.stream_async(user(), thread_id="t"):
            if isinstance(event, CheckpointCommitted) and event.source == "tools":
                break

    asyncio.run(consume())
    assert agent.get_state("t").values["notes"] == ["a"]
    result = agent.run([], thread_id="t")
    assert result["notes"] == ["a", "b"] and result["exit_reason"] == "text"
