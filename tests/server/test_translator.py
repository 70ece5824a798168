"""
The pure parts of streaming and resuming: how Agent events become stream-mode events (``StreamTranslator``: LangGraph's
``messages`` accumulation and partial JSON, tasks that stop at an interrupt or fail), and how
a ``command.resume`` value becomes ``Agent.resume``'s decisions and answers, including in-tool interrupts (answered
by interrupt id) that the SDK tests cannot reach until the Agent raises them.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, StreamingChunk, ToolCall, ToolCallDelta

from haystack_state.agent.events import (
    AgentEvent,
    CheckpointCommitted,
    CustomEvent,
    Interrupted,
    ModelChunk,
    ModelReply,
    RunFailed,
    RunStarted,
    StateChanged,
    ToolCallStarted,
)
from haystack_state.server._interrupts import interrupt_from_requests, resume_from_command
from haystack_state.server._stream_messages import parse_partial_json
from haystack_state.server._streams import StreamTranslator, event_names
from haystack_state.server._wire import WireError

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
    translator = StreamTranslator(["messages-tuple"], run_id="r", thread_id=None)
    reply = ModelReply(**COMMON, seq=0, step=2, message=ChatMessage.from_assistant("all at once"))
    [(name, (message, meta))] = translator.translate(reply)
    assert (name, message["type"], message["content"], meta["langgraph_step"]) == ("messages", "ai", "all at once", 2)
    lang = StreamTranslator(["messages"], run_id="r", thread_id=None)
    [(first, metadata), (second, [whole])] = lang.translate(reply)
    assert (first, second, whole["content"]) == ("messages/metadata", "messages/complete", "all at once")
    assert metadata == {"run-r-2": {"metadata": meta}}


def test_custom_and_native_events() -> None:
    assert [data for name, data in translate(["custom"])] == [{"name": "progress", "data": {"done": 1}}]
    native = translate(["events"])
    assert [data["type"] for _, data in native] == [e.type for e in events()]
    assert event_names(["messages-tuple", "values"]) == {"messages", "values"}
    assert event_names(["messages", "debug"]) == {"messages/metadata", "messages/partial", "messages/complete", "debug"}


def test_partial_json_is_read_as_far_as_it_goes() -> None:
    assert parse_partial_json('{"text": "a lo') == {"text": "a lo"}
    assert parse_partial_json('{"a": 1, "b') == {"a": 1}
    assert parse_partial_json('{"a": [1, {"b": ') == {"a": [1, {}]}
    assert parse_partial_json('{"a": "x\\') == {"a": "x"}  # a dangling escape
    assert parse_partial_json("") is None and parse_partial_json("}") is None


def test_messages_mode_accumulates_a_reply_and_its_calls() -> None:
    translator = StreamTranslator(["messages"], run_id="r", thread_id="t")
    deltas = [('{"q"', "c9", "lookup"), (': "te', None, None), ('a"}', None, None)]
    chunks = [StreamingChunk(content=text, index=0) for text in ("Let ", "me ", "look")] + [
        StreamingChunk(
            content="", index=1, tool_calls=[ToolCallDelta(index=0, tool_name=name, arguments=args, id=call_id)]
        )
        for args, call_id, name in deltas
    ]
    out = []
    for n, chunk in enumerate(chunks):
        out += translator.translate(ModelChunk(**COMMON, seq=n, step=1, chunk=chunk, message_id="m1"))
    assert [name for name, _ in out] == ["messages/metadata"] + ["messages/partial"] * 6
    partials = [data[0] for name, data in out[1:]]
    assert [p["content"] for p in partials] == ["Let ", "Let me ", *["Let me look"] * 4]
    assert [p["tool_calls"] for p in partials[:3]] == [[], [], []]
    assert [p["tool_calls"][0]["args"] for p in partials[3:]] == [{}, {"q": "te"}, {"q": "tea"}]
    assert partials[-1]["tool_call_chunks"] == [
        {"name": "lookup", "args": '{"q": "tea"}', "id": "c9", "index": 0, "type": "tool_call_chunk"}
    ]
    assert partials[3]["tool_call_chunks"][0]["args"] == '{"q"'  # each event keeps its own copy


def test_a_tool_interrupt_and_a_failure_end_their_tasks() -> None:
    numbers = itertools.count()

    def make(kind: type[AgentEvent], **fields: Any) -> AgentEvent:
        return kind(**COMMON, seq=next(numbers), **fields)

    call = ToolCall(tool_name="ask", arguments={}, id="c2")
    question = {"id": "i1", "kind": "interrupt", "tool_name": "ask", "call_id": "c2", "value": "ok?"}
    translator = StreamTranslator(["tasks"], run_id="r", thread_id="t")
    translator.start({"messages": []}, 4)
    run = [
        make(RunStarted, checkpoint_id="cp0"),
        make(ModelReply, step=1, message=ChatMessage.from_assistant(tool_calls=[call])),
        make(CheckpointCommitted, checkpoint_id="cp1", step=5, source="model"),
        make(ToolCallStarted, step=1, tool_name="ask", call_id="c2", arguments={}),
        make(CheckpointCommitted, checkpoint_id="cp2", step=5, source="tools"),
        make(Interrupted, requests=[question]),
    ]
    out = [data for event in run for _, data in translator.translate(event)]
    assert [(t["id"], t["name"], "input" in t) for t in out] == [
        ("cp0", "model", True),
        ("cp0", "model", False),
        ("cp1", "tools", True),
        ("cp1", "tools", False),
    ]
    assert out[3]["interrupts"] == [{"id": "i1", "value": "ok?"}]  # its result waited for the interrupt
    failing = StreamTranslator(["debug"], run_id="r", thread_id="t")
    failing.start({}, 0)
    failing.translate(make(RunStarted, checkpoint_id=None))
    failing.translate(make(CheckpointCommitted, checkpoint_id="cp1", step=0, source="input"))
    failed = failing.translate(make(RunFailed, error="the model is down", error_type="RuntimeError"))
    assert [(d["type"], d["step"], d["payload"]["name"]) for _, d in failed] == [
        ("task", 1, "model"),
        ("task_result", 1, "model"),
    ]
    assert failed[1][1]["payload"]["error"] == "the model is down"


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
