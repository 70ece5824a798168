"""
Tracing: runs emit spans through ``haystack.tracing`` with haystack-ai's Agent span names and tags, so the
OpenTelemetry (and Langfuse) integrations show them; checkpoints get spans of their own. Checked with haystack's
OpenTelemetry tracer (``opentelemetry-haystack``) and the OpenTelemetry SDK's in-memory exporter, side by side with
haystack-ai's own Agent.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from haystack.components.agents import Agent as HaystackAgent
from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import ChatMessage
from haystack.hooks import hook
from haystack.tools import tool as haystack_tool
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from haystack_state import Agent, InMemoryCheckpointer
from haystack_state.testing import ScriptedChatGenerator


@haystack_tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


@hook
def noop(state: HaystackState) -> None:
    """A hook that does nothing."""


HOOKS = {point: [noop] for point in ("before_run", "before_llm", "before_tool", "after_tool", "after_run")}


def script() -> list[Any]:
    return [[("lookup", {"query": "a"})], [("lookup", {"query": "b"})], "done"]


def names(spans: tuple[ReadableSpan, ...]) -> Counter[str]:
    return Counter(span.name for span in spans)


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_name(spans: tuple[ReadableSpan, ...], span: ReadableSpan) -> str | None:
    if span.parent is None:
        return None
    for other in spans:
        if other.context.span_id == span.parent.span_id:
            return other.name
    return None


def test_a_run_emits_haystack_ais_agent_spans_with_their_parents_and_tags(exporter: InMemorySpanExporter) -> None:
    agent = Agent(ScriptedChatGenerator(script=script()), tools=[lookup], hooks=HOOKS)
    agent.run([ChatMessage.from_user("hi")])
    spans = exporter.get_finished_spans()

    counts = names(spans)
    assert counts["haystack.agent.run"] == 1
    assert counts["haystack.agent.step"] == 3
    assert counts["haystack.agent.step.llm"] == 3
    assert counts["haystack.agent.step.tool"] == 2
    assert counts["haystack.agent.hook"] == 2 + 3 + 2 + 2  # before_run/after_run once, before_llm 3x, tools 2x each
    run = by_name(spans, "haystack.agent.run")[0]
    assert run.attributes is not None
    assert run.attributes["haystack.agent.max_steps"] == 100
    assert run.attributes["haystack.agent.steps_taken"] == 3
    assert "haystack.agent.input" in run.attributes and "haystack.agent.output" in run.attributes
    for step in by_name(spans, "haystack.agent.step"):
        assert parent_name(spans, step) == "haystack.agent.run"
    assert sorted(step.attributes["haystack.agent.step"] for step in by_name(spans, "haystack.agent.step")) == [
        0,
        1,
        2,
    ]
    for name in ("haystack.agent.step.llm", "haystack.agent.step.tool"):
        for child in by_name(spans, name):
            assert parent_name(spans, child) == "haystack.agent.step"
    llm = by_name(spans, "haystack.agent.step.llm")[0]
    assert "haystack.agent.step.llm.input" in (llm.attributes or {})
    points = Counter(span.attributes["haystack.agent.hook.point"] for span in by_name(spans, "haystack.agent.hook"))
    assert points == {"before_run": 1, "before_llm": 3, "before_tool": 2, "after_tool": 2, "after_run": 1}
    hook_span = by_name(spans, "haystack.agent.hook")[0]
    assert hook_span.attributes["haystack.agent.hook.name"].endswith("noop")


def test_our_spans_match_haystack_ais_for_the_same_run(exporter: InMemorySpanExporter) -> None:
    ours = Agent(ScriptedChatGenerator(script=script()), tools=[lookup], hooks=HOOKS)
    ours.run([ChatMessage.from_user("hi")])
    our_names = names(exporter.get_finished_spans())
    exporter.clear()

    theirs = HaystackAgent(chat_generator=ScriptedChatGenerator(script=script()), tools=[lookup], hooks=HOOKS)
    theirs.run(messages=[ChatMessage.from_user("hi")])
    their_names = names(exporter.get_finished_spans())

    assert our_names == their_names


def test_checkpoints_get_spans_of_their_own(exporter: InMemorySpanExporter) -> None:
    agent = Agent(ScriptedChatGenerator(script=script()), tools=[lookup], checkpointer=InMemoryCheckpointer())
    result = agent.run([ChatMessage.from_user("hi")], thread_id="traced")
    spans = exporter.get_finished_spans()

    commits = by_name(spans, "haystack_state.checkpoint.commit")
    history = agent.get_history("traced")
    assert [span.attributes["haystack_state.checkpoint.id"] for span in commits] == [
        meta.checkpoint_id for meta in reversed(list(history))
    ]
    assert {span.attributes["haystack_state.checkpoint.source"] for span in commits} == {"input", "model", "tools"}
    assert all(span.attributes["haystack_state.thread_id"] == "traced" for span in commits)
    assert commits[-1].attributes["haystack_state.checkpoint.id"] == result["checkpoint_id"]
    assert by_name(spans, "haystack.agent.run")[0].attributes["haystack_state.thread_id"] == "traced"


def test_async_runs_emit_the_same_spans(exporter: InMemorySpanExporter) -> None:
    agent = Agent(ScriptedChatGenerator(script=script()), tools=[lookup], hooks=HOOKS)
    agent.run([ChatMessage.from_user("hi")])
    sync_names = names(exporter.get_finished_spans())
    exporter.clear()
    agent = Agent(ScriptedChatGenerator(script=script()), tools=[lookup], hooks=HOOKS)
    asyncio.run(agent.run_async([ChatMessage.from_user("hi")]))
    assert names(exporter.get_finished_spans()) == sync_names
    for child in by_name(exporter.get_finished_spans(), "haystack.agent.step.llm"):
        assert parent_name(exporter.get_finished_spans(), child) == "haystack.agent.step"


def test_no_span_is_recorded_when_tracing_is_off() -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    agent = Agent(ScriptedChatGenerator(script=script()), tools=[lookup], hooks=HOOKS)
    agent.run([ChatMessage.from_user("hi")])
    assert exported.get_finished_spans() == ()
