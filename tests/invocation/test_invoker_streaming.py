"""
Tests of ``ToolInvoker`` streaming (results as they are merged, the final chunk, async callbacks, passthrough to
tools) and serialization (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.tools import Toolset
from haystack.tools import tool as haystack_tool

from haystack_state import (
    State,
    ToolExecutionError,
    ToolInvoker,
    tool,
)
from invocation.invoker_tools import (
    async_double,
    calls,
    echo,
    explode,
    only_result,
)

# Defined here (not imported from ``invocation.invoker_tools``): the serialization tests deserialize these tools,
# and only this module is on their deserialization allowlist.


@tool(outputs_to_state={"total": {"source": "sum"}})
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@haystack_tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"source": "note"}})
def hs_note(text: str, user: str) -> dict[str, str]:
    """Take a note (haystack-ai's @tool)."""
    return {"note": f"{user}: {text}"}


# --- streaming ----------------------------------------------------------------------------------------------------


def test_streaming_callback_receives_each_result_then_a_final_chunk() -> None:
    chunks: list[StreamingChunk] = []
    invoker = ToolInvoker([echo, explode], raise_on_failure=False, streaming_callback=chunks.append)
    output = invoker.run(calls(("echo", {"text": "a"}), ("explode", {"reason": "r"}), ("echo", {"text": "b"})))
    assert len(chunks) == 4
    for i, (chunk, message) in enumerate(zip(chunks[:3], output["tool_messages"], strict=True)):
        assert chunk.index == i
        assert chunk.start is True
        assert chunk.tool_call_result == message.tool_call_results[0]
        assert chunk.meta["tool_call"] == message.tool_call_results[0].origin
        assert chunk.meta["tool_result"] == message.tool_call_results[0].result
    assert chunks[1].tool_call_result is not None and chunks[1].tool_call_result.error is True
    assert chunks[3].finish_reason == "tool_call_results"
    assert chunks[3].tool_call_result is None


def test_streaming_results_arrive_as_they_are_produced() -> None:
    seen_by_tool: list[int] = []
    chunks: list[StreamingChunk] = []

    # dependent calls with dependent calls: each result is streamed before the next call starts
    @tool(inputs_from_state={"n": "n"}, outputs_to_state={"n": {}})
    def chain(n: int) -> int:
        """Chain."""
        seen_by_tool.append(len(chunks))
        return n + 1

    state = State({"n": {"type": int}}, {"n": 0})
    ToolInvoker([chain], streaming_callback=chunks.append).run(calls(*[("chain", {})] * 3), state=state)
    assert seen_by_tool == [0, 1, 2]
    assert state.get("n") == 3


def test_runtime_streaming_callback_overrides_the_constructor_one() -> None:
    init_chunks: list[StreamingChunk] = []
    run_chunks: list[StreamingChunk] = []
    invoker = ToolInvoker([echo], streaming_callback=init_chunks.append)
    invoker.run(calls(("echo", {"text": "a"})), streaming_callback=run_chunks.append)
    assert init_chunks == [] and len(run_chunks) == 2


def test_no_final_chunk_without_tool_calls() -> None:
    chunks: list[StreamingChunk] = []
    ToolInvoker([echo], streaming_callback=chunks.append).run([ChatMessage.from_assistant("no calls")])
    assert chunks == []


def test_streamed_results_are_delivered_before_a_failure_is_raised() -> None:
    chunks: list[StreamingChunk] = []
    with pytest.raises(ToolExecutionError):
        ToolInvoker([echo, explode], streaming_callback=chunks.append).run(
            calls(("echo", {"text": "a"}), ("echo", {"text": "b"}), ("explode", {"reason": "r"}))
        )
    assert [c.tool_call_result.result for c in chunks if c.tool_call_result] == ["a", "b"]


def test_async_streaming_callback_under_run_async() -> None:
    chunks: list[StreamingChunk] = []

    async def collect(chunk: StreamingChunk) -> None:
        await asyncio.sleep(0)
        chunks.append(chunk)

    invoker = ToolInvoker([echo, async_double], streaming_callback=collect)
    output = asyncio.run(
        invoker.run_async(
            calls(("echo", {"text": "a"}), ("async_double", {"x": 1})), state=State({"log": {"type": int}})
        )
    )
    assert [c.tool_call_result.result for c in chunks if c.tool_call_result] == ["a", "2"]
    assert chunks[-1].finish_reason == "tool_call_results"
    assert len(output["tool_messages"]) == 2


def test_async_callback_is_rejected_by_run() -> None:
    async def collect(chunk: StreamingChunk) -> None:
        pass

    with pytest.raises(ValueError, match="coroutine"):
        ToolInvoker([echo], streaming_callback=collect).run(calls(("echo", {"text": "a"})))


@tool
def narrate(text: str, streaming_callback: Callable[[StreamingChunk], None] | None = None) -> str:
    """Narrate, streaming as it goes."""
    if streaming_callback is not None:
        streaming_callback(StreamingChunk(content=f"narrating {text}"))
    return text


def test_streaming_callback_passthrough() -> None:
    chunks: list[StreamingChunk] = []
    ToolInvoker([narrate], streaming_callback=chunks.append, enable_streaming_callback_passthrough=True).run(
        calls(("narrate", {"text": "t"}))
    )
    assert [c.content for c in chunks[:1]] == ["narrating t"]
    assert chunks[1].tool_call_result is not None and chunks[1].tool_call_result.result == "t"

    chunks.clear()
    ToolInvoker([narrate], streaming_callback=chunks.append).run(calls(("narrate", {"text": "t"})))
    assert "narrating t" not in [c.content for c in chunks]
    assert len(chunks) == 2


def test_streaming_callback_passthrough_under_run_async() -> None:
    chunks: list[StreamingChunk] = []

    async def collect(chunk: StreamingChunk) -> None:
        chunks.append(chunk)

    @tool
    async def narrate_async(text: str, streaming_callback: Any = None) -> str:
        """Narrate."""
        await streaming_callback(StreamingChunk(content=f"narrating {text}"))
        return text

    invoker = ToolInvoker([narrate_async], streaming_callback=collect, enable_streaming_callback_passthrough=True)
    asyncio.run(invoker.run_async(calls(("narrate_async", {"text": "t"}))))
    assert chunks[0].content == "narrating t"
    assert len(chunks) == 3


# --- serialization --------------------------------------------------------------------------------------------


def record_chunk(chunk: StreamingChunk) -> None:
    """A module-level streaming callback, serializable by import path."""


def test_to_dict_and_from_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", __name__)
    invoker = ToolInvoker(
        tools=[add, hs_note],
        raise_on_failure=False,
        max_workers=2,
        streaming_callback=record_chunk,
        enable_streaming_callback_passthrough=True,
    )
    data = invoker.to_dict()
    assert data["type"] == "haystack_state.invocation.ToolInvoker"
    params = data["init_parameters"]
    assert params["raise_on_failure"] is False
    assert params["max_workers"] == 2
    assert params["streaming_callback"] == f"{__name__}.record_chunk"
    assert params["enable_streaming_callback_passthrough"] is True
    assert [t["data"]["name"] for t in params["tools"]] == ["add", "hs_note"]
    json.dumps(data)  # plain JSON

    restored = ToolInvoker.from_dict(data)
    assert restored.raise_on_failure is False and restored.max_workers == 2
    assert restored.streaming_callback is record_chunk
    assert restored.enable_streaming_callback_passthrough is True
    assert [t.name for t in restored.tools] == ["add", "hs_note"]  # type: ignore[union-attr]
    assert restored.to_dict() == data
    state = State({"total": {"type": int}})
    output = restored.run(calls(("add", {"a": 2, "b": 5})), state=state)
    assert only_result(output) == ('{"sum": 7}', False) and state.get("total") == 7


def test_to_dict_with_a_toolset_and_no_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", __name__)
    invoker = ToolInvoker(tools=Toolset([add]))
    data = invoker.to_dict()
    assert data["init_parameters"]["streaming_callback"] is None
    restored = ToolInvoker.from_dict(data)
    assert isinstance(restored.tools, Toolset)
    assert restored.to_dict() == data


def test_sync_streaming_callback_under_run_async() -> None:
    chunks: list[StreamingChunk] = []
    output = asyncio.run(
        ToolInvoker([echo]).run_async(calls(("echo", {"text": "a"})), streaming_callback=chunks.append)
    )
    assert only_result(output) == ("a", False)
    assert [c.tool_call_result.result for c in chunks if c.tool_call_result] == ["a"]
    assert chunks[-1].finish_reason == "tool_call_results"
