"""
Live events: ``Agent.stream`` and ``Agent.stream_async`` yield typed events while the run goes on; their JSON forms;
replaying the ``StateChanged`` events gives the final state; a consumer that stops early cancels the run cleanly.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import itertools
import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
from haystack import component, tracing
from haystack.dataclasses import ChatMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from haystack_state import Agent, AgentRunError, InMemoryCheckpointer, RunContext, SQLiteCheckpointer, State, tool
from haystack_state.agent import _streaming
from haystack_state.agent.events import (
    AgentEvent,
    CheckpointCommitted,
    CustomEvent,
    EventSink,
    Interrupted,
    ModelChunk,
    ModelReply,
    RunFailed,
    RunFinished,
    RunStarted,
    StateChanged,
    ToolCallStarted,
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


def test_run_makes_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    monkeypatch.setattr(EventSink, "emit", lambda self, event_type, **fields: made.append(event_type))
    make(SCRIPT).run(user())
    assert made == []
    list(make(SCRIPT).stream(user()))  # (the spy sees a stream's)
    assert made[0] is RunStarted


def test_events_are_made_as_their_classes_make_them() -> None:
    made: list[AgentEvent] = []
    sink = EventSink(made.append, "t")
    sink.emit(StateChanged, key="notes", op="append", items=["a"])
    sink.emit(RunStarted)
    for event in made:
        fields = {field.name: getattr(event, field.name) for field in dataclasses.fields(event)}
        assert vars(event) == vars(type(event)(**fields))  # the defaults included
    with pytest.raises(dataclasses.FrozenInstanceError):
        made[0].key = "other"  # type: ignore[misc]
    with pytest.raises(TypeError, match="StateChanged takes"):
        sink.emit(StateChanged, key="notes")  # no op
    with pytest.raises(TypeError, match="RunStarted takes"):
        sink.emit(RunStarted, unknown=1)


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


# --- a sync stream: live events, stopping, failing ---------------------------------------------------------------


@component
class SlowModel:
    """
    A ScriptedChatGenerator that takes its time, as a real model does: it waits ``pause`` s after each chunk. With
    ``acks``, it waits after the first chunk of a call until the consumer has seen it (``acks[call].set()``), and
    records in ``acked`` whether it was in time.
    """

    def __init__(self, script: list[Any], pause: float = 0.005, *, acks: bool = False, fail: bool = False) -> None:
        self.inner = ScriptedChatGenerator(script=script, chunk_size=2)
        self.pause = pause
        self.fail = fail
        self.acks: list[threading.Event] | None = [] if acks else None
        self.acked: list[bool] = []
        self.calls = 0

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None, streaming_callback: Any = None) -> dict[str, Any]:
        self.calls += 1
        ack = threading.Event()
        if self.acks is not None:
            self.acks.append(ack)

        def slowly(chunk: Any) -> None:
            streaming_callback(chunk)
            if self.acks is not None and len(self.acked) < len(self.acks):
                self.acked.append(ack.wait(10))  # the consumer sees the chunk while the model still streams
            time.sleep(self.pause)
            if self.fail:
                raise ConnectionError("the model went away")

        return self.inner.run(messages, tools=tools, streaming_callback=slowly if streaming_callback else None)


@tool
def slow_job(ctx: RunContext, seconds: float = 0.01) -> str:
    """Work a while."""
    ctx.emit("progress", {"done": 0})
    time.sleep(seconds)
    return "worked"


def stream_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "haystack-state-stream"]


def test_a_consumer_sees_the_chunks_and_the_tool_events_as_they_are_made() -> None:
    model = SlowModel([[("job", {})], [("job", {})], "all done now"], acks=True)
    seen_started = threading.Event()
    tool_acked: list[bool] = []

    @tool
    def job(ctx: RunContext) -> str:
        """Work once the consumer has seen the call's progress."""
        ctx.emit("progress", {"done": 0})
        tool_acked.append(seen_started.wait(10))
        seen_started.clear()
        time.sleep(0.005)
        return "worked"

    agent = Agent(model, tools=[job])
    acks = model.acks
    assert acks is not None
    events = []
    for event in agent.stream(user()):
        events.append(event)
        if isinstance(event, ModelChunk):
            acks[event.step - 1].set()
        if isinstance(event, CustomEvent):
            seen_started.set()
    assert isinstance(events[-1], RunFinished)
    assert model.acked == [True, True, True]  # every step's chunks, the first step's and the later ones'
    assert tool_acked == [True, True]
    started = [event.seq for event in events if isinstance(event, ToolCallStarted)]
    progress = [event.seq for event in events if isinstance(event, CustomEvent)]
    assert len(started) == 2 and all(a < b for a, b in zip(started, progress, strict=True))
    assert [event.seq for event in events] == list(range(len(events)))
    assert stream_threads() == []


def test_breaking_out_on_a_chunk_stops_the_run_after_that_model_call(tmp_path: Any) -> None:
    checkpointer = SQLiteCheckpointer(tmp_path / "threads.db")
    model = SlowModel(SCRIPT)
    agent = Agent(model, tools=[write, bump], state_schema=SCHEMA, checkpointer=checkpointer)
    stream = agent.stream(user(), thread_id="t")
    for event in stream:
        if isinstance(event, ModelChunk) and event.step == 2:
            break  # while the second reply streams
    stream.close()  # (what leaving the loop does, once the iterator is collected)
    assert model.calls == 2  # the call under way was let finish; nothing more ran
    head = agent.get_state("t")
    assert head.values["notes"] == ["a"]  # the second reply was not committed, nor its tool run
    assert head.values["messages"][-1].tool_call_result is not None
    assert stream_threads() == []
    lease = checkpointer.acquire_lease("t")  # the run let go of the thread
    checkpointer.release_lease(lease)
    result = make(SCRIPT[1:], checkpointer=checkpointer).run([], thread_id="t")
    assert result["notes"] == ["a", "b"] and result["exit_reason"] == "text"


def test_a_failure_while_the_model_streams_is_streamed_then_raised() -> None:
    agent = Agent(SlowModel(["never finished"], fail=True))
    seen: list[AgentEvent] = []
    with pytest.raises(AgentRunError, match="the model went away"):
        for event in agent.stream(user()):
            seen.append(event)
    assert types(seen) == ["run_started", "state_changed", "model_chunk", "run_failed"]
    assert isinstance(seen[-1], RunFailed) and not seen[-1].cancelled
    assert stream_threads() == []


def test_a_consumer_acting_on_the_last_event_finds_the_thread_free() -> None:
    checkpointer = InMemoryCheckpointer()
    agent = make(SCRIPT, checkpointer=checkpointer)
    follow_up: dict[str, Any] = {}
    for event in agent.stream(user(), thread_id="t"):
        if isinstance(event, RunFinished):
            follow_up = make(["and more"], checkpointer=checkpointer).run(user("more"), thread_id="t")
    assert follow_up["last_message"].text == "and more"


REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST", default="none")


def test_the_run_sees_the_callers_context_and_keeps_its_own_changes() -> None:
    seen: list[str] = []

    def before_llm(state: Any) -> None:
        seen.append(REQUEST.get())
        REQUEST.set("changed by a hook")

    agent = Agent(
        ScriptedChatGenerator(script=[[("bump", {})], "done"]), tools=[bump], hooks={"before_llm": [before_llm]}
    )
    token = REQUEST.set("the caller's")
    try:
        for _ in agent.stream(user()):
            assert REQUEST.get() == "the caller's"  # the run's changes stay in the run
    finally:
        REQUEST.reset(token)
    assert seen == ["the caller's", "changed by a hook"]  # the run's context is its own, one for the whole run


def test_a_stream_closed_before_its_end_leaves_no_thread_behind() -> None:
    checkpointer = InMemoryCheckpointer()
    agent = Agent(SlowModel([[("slow_job", {"seconds": 0.2})], "done"]), tools=[slow_job], checkpointer=checkpointer)
    stream = agent.stream(user(), thread_id="t")
    for event in stream:
        if isinstance(event, ToolCallStarted):
            break  # while the tool works
    stream.close()
    assert stream_threads() == []
    lease = checkpointer.acquire_lease("t")
    checkpointer.release_lease(lease)
    messages = agent.get_state("t").values["messages"]
    assert messages[-1].tool_calls  # the tool's result came after the last commit: the call is left pending


def test_a_streamed_run_is_traced_under_the_callers_span_and_keeps_its_spans_to_itself() -> None:
    from haystack_integrations.tracing.opentelemetry import OpenTelemetryTracer

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.enable_tracing(OpenTelemetryTracer(provider.get_tracer("test")))
    try:
        with tracing.tracer.trace("caller"):
            caller = trace.get_current_span()
            for _ in make(SCRIPT).stream(user()):
                assert trace.get_current_span() is caller  # the run's spans stay in the run
            stream = make(SCRIPT).stream(user())
            for event in stream:
                if isinstance(event, ModelReply):
                    break
            stream.close()
            assert trace.get_current_span() is caller
    finally:
        tracing.disable_tracing()
    spans = exported.get_finished_spans()
    runs = [span for span in spans if span.name == "haystack.agent.run"]
    assert len(runs) == 2  # the stopped run's spans ended too
    [outer] = [span for span in spans if span.name == "caller"]
    assert all(run.parent is not None and run.parent.span_id == outer.context.span_id for run in runs)
    steps = [span for span in spans if span.name == "haystack.agent.step"]
    assert {step.parent.span_id for step in steps if step.parent} == {run.context.span_id for run in runs}


def test_quick_model_and_tool_calls_run_on_the_consumers_thread_after_their_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "Quick" is under a millisecond; a shared machine can stall a note that long, so the test counts a quarter second
    # as quick: what it checks is where calls run, not how fast.
    monkeypatch.setattr(_streaming, "QUICK_EFFECT", 0.25)
    threads: list[tuple[str, int]] = []

    @tool
    def note() -> str:
        """Take a note."""
        threads.append(("tool", threading.get_ident()))
        return "noted"

    def before_llm(state: Any) -> None:
        threads.append(("hook", threading.get_ident()))

    agent = Agent(
        ScriptedChatGenerator(script=[[("note", {})]] * 12 + ["done"]), tools=[note], hooks={"before_llm": [before_llm]}
    )
    events = list(agent.stream(user()))
    assert isinstance(events[-1], RunFinished)
    consumer = threading.get_ident()
    assert {ident for kind, ident in threads if kind == "hook"} == {consumer}  # hooks always
    tools = [ident for kind, ident in threads if kind == "tool"]
    assert tools[0] != consumer  # the first call of a tool, on the helper thread (it could be slow)
    assert sum(ident == consumer for ident in tools) >= len(tools) - 2  # the later ones: quick last time (a stalled
    # call runs the next one on the helper thread)
    assert stream_threads() == []
