"""
The pure parts of streaming and resuming: how Agent events become stream-mode events (``StreamTranslator``), and how
a ``command.resume`` value becomes ``Agent.resume``'s decisions and answers, including in-tool interrupts (answered
by interrupt id) that the SDK tests cannot reach until the Agent raises them.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, StreamingChunk, ToolCall

from haystack_state.agent.events import (
    AgentEvent,
    CheckpointCommitted,
    CustomEvent,
    Interrupted,
    ModelChunk,
    ModelReply,
    RunStarted,
    StateChanged,
)
from haystack_state.server.interrupts import interrupt_from_requests, resume_from_command
from haystack_state.server.streams import StreamTranslator, event_names
from haystack_state.server.wire import WireError

COMMON = {"run_id": "agent-run", "time": 0.0, "thread_id": "t"}


def events() -> list[Any]:
    """A run's events: input, a streamed reply with a tool call, the tool's result, a custom event, an interrupt."""
    numbers = itertools.count()

    def make(kind: type[AgentEvent], **fields: Any) -> AgentEvent:
        return kind(**COMMON, seq=next(numbers), **fields)

    call = ToolCall(tool_name="lookup", arguments={"q": "tea"}, id="c1")
    reply = ChatMessage.from_assistant(tool_calls=[call])
    tool_message = ChatMessage.from_tool("found", origin=call)
    question = {"id": "i1", "kind": "interrupt", "tool_name": "ask", "call_id": "c2", "value": "ok?"}
    return [
        make(RunStarted, checkpoint_id="cp0"),
        make(StateChanged, key="messages", op="append", items=[ChatMessage.from_user("hi")]),
        make(StateChanged, key="topic", op="replace", value="drinks"),
        make(CheckpointCommitted, checkpoint_id="cp1", step=0, source="input"),
        make(ModelChunk, step=1, chunk=StreamingChunk(content="Let me look")),
        make(ModelReply, step=1, message=reply),
        make(StateChanged, key="messages", op="append", items=[reply]),
        make(CheckpointCommitted, checkpoint_id="cp2", step=1, source="model"),
        make(CustomEvent, name="progress", data={"done": 1}),
        make(StateChanged, key="messages", op="append", items=[tool_message]),
        make(StateChanged, key="topic", op="reset"),
        make(CheckpointCommitted, checkpoint_id="cp3", step=1, source="tools"),
        make(Interrupted, requests=[question]),
    ]


def translate(modes: list[str], start: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    translator = StreamTranslator(modes, run_id="run-1", thread_id="t")
    if translator.needs_start_values:
        translator.start(start or {})
    return [item for event in events() for item in translator.translate(event)]


def test_values_apply_each_change_to_the_starting_state() -> None:
    start = {"messages": [{"type": "system", "content": "be brief"}], "notes": ["x"]}
    out = translate(["values"], start)
    assert [name for name, _ in out] == ["values"] * 4
    first, second, third, last = (data for _, data in out)
    assert [m["content"] for m in first["messages"]] == ["be brief", "hi"] and first["topic"] == "drinks"
    assert second["messages"][-1]["tool_calls"][0]["args"] == {"q": "tea"}
    assert "topic" not in third and third["messages"][-1]["type"] == "tool" and third["notes"] == ["x"]
    assert last == {**third, "__interrupt__": [{"id": "i1", "value": "ok?"}]}
    assert start == {"messages": [{"type": "system", "content": "be brief"}], "notes": ["x"]}  # not changed


def test_updates_are_keyed_by_the_checkpoint_source() -> None:
    out = translate(["updates"])
    assert [next(iter(data)) for _, data in out] == ["input", "model", "tools", "__interrupt__"]
    assert out[0][1]["input"]["topic"] == "drinks"
    assert out[2][1]["tools"]["topic"] is None  # a reset key
    assert [m["content"] for m in out[2][1]["tools"]["messages"]] == ["found"]


def test_messages_pair_chunks_and_whole_messages_with_metadata() -> None:
    out = translate(["messages-tuple"])
    assert {name for name, _ in out} == {"messages"}
    (chunk, meta), (tool, tool_meta) = (data for _, data in out)
    assert chunk["type"] == "AIMessageChunk" and chunk["content"] == "Let me look" and chunk["id"] == "run-run-1-1"
    assert meta == {"run_id": "run-1", "thread_id": "t", "langgraph_node": "model", "langgraph_step": 1}
    assert tool["type"] == "tool" and tool["tool_call_id"] == "c1" and tool_meta["langgraph_node"] == "tools"


def test_a_reply_that_did_not_stream_is_sent_whole() -> None:
    translator = StreamTranslator(["messages"], run_id="r", thread_id=None)
    reply = ModelReply(**COMMON, seq=0, step=2, message=ChatMessage.from_assistant("all at once"))
    [(name, (message, meta))] = translator.translate(reply)
    assert (name, message["type"], message["content"], meta["langgraph_step"]) == ("messages", "ai", "all at once", 2)


def test_custom_and_native_events() -> None:
    assert [data for name, data in translate(["custom"])] == [{"name": "progress", "data": {"done": 1}}]
    native = translate(["events"])
    assert [data["type"] for _, data in native] == [e.type for e in events()]
    assert event_names(["messages", "messages-tuple", "values"]) == {"messages", "values"}


# --- command.resume --------------------------------------------------------------------------------------------------

BEFORE = {"id": "c1", "kind": "before", "tool_name": "send", "call_id": "c1", "value": {"to": "a"}}
ASK = {"id": "i1", "kind": "interrupt", "tool_name": "ask", "call_id": "c2", "value": "which one?"}
ASK2 = {"id": "i2", "kind": "interrupt", "tool_name": "ask", "call_id": "c3", "value": "sure?"}
CALLS = [ToolCall(tool_name="send", arguments={"to": "a"}, id="c1")]


def test_an_in_tool_interrupt_is_answered_by_id_or_alone() -> None:
    keyed = resume_from_command({"i1": "the blue one"}, [ASK], [], "cp", takes_answers=True)
    assert (keyed.decisions, keyed.answers) == (None, {"i1": "the blue one"})
    bare = resume_from_command({"color": "blue"}, [ASK], [], "cp", takes_answers=True)
    assert bare.answers == {"i1": {"color": "blue"}}  # the only interrupt: the value is its answer
    both = resume_from_command({"i1": 1, "i2": 2}, [ASK, ASK2], [], "cp", takes_answers=True)
    assert both.to_kwargs() == {"answers": {"i1": 1, "i2": 2}}


def test_approvals_and_answers_together() -> None:
    resume = resume_from_command({"i1": "yes", "c1": "reject"}, [BEFORE, ASK], CALLS, "cp", takes_answers=True)
    assert resume.to_kwargs() == {"decisions": {"c1": "reject"}, "answers": {"i1": "yes"}}
    only_before = resume_from_command("approve", [BEFORE], CALLS, "cp", takes_answers=False)
    assert only_before.to_kwargs() == {"decisions": {"c1": "approve"}}


@pytest.mark.parametrize(
    ("resume", "requests", "takes", "message"),
    [
        ({"i1": 1}, [ASK, ASK2], True, "has no answer for interrupt(s) ['i2']"),
        ("blue", [ASK, ASK2], True, "answer each pending interrupt by its id"),
        ({"i1": 1, "zz": 2}, [ASK], True, "command.resume.zz: names no pending interrupt"),
        ({"i1": 1}, [ASK], False, "cannot answer in-tool interrupts"),
    ],
)
def test_bad_answers_are_clear_errors(resume: Any, requests: list[Any], takes: bool, message: str) -> None:
    with pytest.raises(WireError, match=re.escape(message)):
        resume_from_command(resume, requests, [], "cp", takes_answers=takes)


def test_interrupts_group_approvals_and_list_questions() -> None:
    interrupts = interrupt_from_requests([BEFORE, ASK], "cp9")
    assert interrupts[0]["id"] == "cp9" and interrupts[0]["value"]["action_requests"][0]["args"] == {"to": "a"}
    assert interrupts[1] == {"id": "i1", "value": "which one?"}
