"""
Tool-call spans as haystack-ai 3.4 opens them (``haystack.agent.step.tool``, tagged with the tool's name and
description, the arguments and result as content tags, ``haystack.tool.error`` on failure), siblings under the
runner's ``parent_span`` (or the current span), whichever thread runs them. Checked with haystack's OpenTelemetry
tracer and the OpenTelemetry SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import pytest
from haystack import tracing
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tracing.tracer import Span, Tracer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from haystack_state import State, ToolInvoker, tool
from haystack_state.invocation._run import run_tool_calls, run_tool_calls_async
from haystack_state.tools.spec import tool_specs


@tool
def lookup(query: str) -> dict[str, str]:
    """Look something up."""
    return {"found": query}


@tool
def broken(query: str) -> str:
    """Always fails."""
    raise RuntimeError(f"no {query}")


@tool
async def fetch(url: str) -> str:
    """Fetch a page."""
    await asyncio.sleep(0)
    return f"page {url}"


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ChatMessage]:
    tool_calls = [ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(specs)]
    return [ChatMessage.from_assistant(tool_calls=tool_calls)]


def test_each_call_gets_a_span_with_haystacks_tags_as_siblings_under_the_current_span(
    exporter: InMemorySpanExporter,
) -> None:
    with tracing.tracer.trace("outer"):
        ToolInvoker([lookup, broken], raise_on_failure=False, max_workers=3).run(
            calls(("lookup", {"query": "a"}), ("broken", {"query": "b"}), ("lookup", {"query": "c"}), ("nope", {}))
        )
    spans = exporter.get_finished_spans()
    (outer,) = [s for s in spans if s.name == "outer"]
    tool_spans = [s for s in spans if s.name == "haystack.agent.step.tool"]
    assert len(tool_spans) == 3  # the unknown tool never ran: no span, as in haystack-ai
    assert all(s.parent is not None and s.parent.span_id == outer.context.span_id for s in tool_spans)
    by_input = {s.attributes["haystack.agent.step.tool.input"]: s for s in tool_spans}
    ok = by_input['{"query": "a"}']
    assert ok.attributes["haystack.tool.name"] == "lookup"
    assert ok.attributes["haystack.tool.description"] == "Look something up."
    assert ok.attributes["haystack.agent.step.tool.output"] == '{"found": "a"}'
    assert "haystack.tool.error" not in ok.attributes
    failed = by_input['{"query": "b"}']
    assert failed.attributes["haystack.tool.error"] is True
    assert "no b" in failed.attributes["haystack.agent.step.tool.output"]


class RecordingTracer(Tracer):
    """A haystack tracer that honours ``parent_span`` (as Langfuse's does; OpenTelemetry's uses the current context)."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, str | None]] = []
        self.current: contextvars.ContextVar[NamedSpan | None] = contextvars.ContextVar("current", default=None)

    @contextlib.contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
    ) -> Iterator[Span]:
        parent = parent_span if parent_span is not None else self.current.get()
        span = NamedSpan(operation_name)
        self.opened.append((operation_name, parent.name if isinstance(parent, NamedSpan) else None))
        token = self.current.set(span)
        try:
            yield span
        finally:
            self.current.reset(token)

    def current_span(self) -> Span | None:
        return self.current.get()


class NamedSpan(Span):
    def __init__(self, name: str) -> None:
        self.name = name

    def set_tag(self, key: str, value: Any) -> None:
        pass


@pytest.mark.parametrize("parallel", [False, True])
def test_spans_go_under_the_parent_span_given_to_the_runner(parallel: bool) -> None:
    recording = RecordingTracer()
    tracing.enable_tracing(recording)
    try:
        messages = calls(*[("lookup", {"query": str(i)}) for i in range(3 if parallel else 1)])
        with recording.trace("parent") as parent, recording.trace("unrelated"):
            run_tool_calls(messages, State({}), tool_specs([lookup]), parent_span=parent)
            asyncio.run(run_tool_calls_async(messages, State({}), tool_specs([lookup]), parent_span=parent))
            run_tool_calls(messages, State({}), tool_specs([lookup]))  # the current span
    finally:
        tracing.disable_tracing()
    tools = [parent for name, parent in recording.opened if name == "haystack.agent.step.tool"]
    count = 3 if parallel else 1
    assert tools == ["parent"] * (2 * count) + ["unrelated"] * count


def test_async_runs_and_async_tools_get_the_same_spans(exporter: InMemorySpanExporter) -> None:
    async def main() -> None:
        with tracing.tracer.trace("outer"):
            await ToolInvoker([lookup, fetch]).run_async(calls(("lookup", {"query": "a"}), ("fetch", {"url": "u"})))

    asyncio.run(main())
    spans = exporter.get_finished_spans()
    (outer,) = [s for s in spans if s.name == "outer"]
    tool_spans = [s for s in spans if s.name == "haystack.agent.step.tool"]
    assert sorted(s.attributes["haystack.tool.name"] for s in tool_spans) == ["fetch", "lookup"]
    assert all(s.parent is not None and s.parent.span_id == outer.context.span_id for s in tool_spans)


def test_no_span_is_recorded_when_tracing_is_off() -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    output = ToolInvoker([lookup]).run(calls(("lookup", {"query": "a"}), ("lookup", {"query": "b"})))
    assert len(output["tool_messages"]) == 2
    assert exported.get_finished_spans() == ()
