"""
``ToolInvoker`` inside a haystack ``Pipeline``: ``chat_generator -> tool_invoker``, dumped to YAML, loaded back
(through haystack's deserialization allowlist) and run with ``run`` and ``run_async``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Pipeline
from haystack.core.errors import DeserializationError
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.tools import Toolset
from haystack.tools import tool as haystack_tool

from haystack_state import State, ToolInvoker, tool
from haystack_state.testing import ScriptedChatGenerator


@tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"source": "note"}})
def save_note(text: str, user: str = "nobody") -> dict[str, str]:
    """Save a note for the current user."""
    return {"note": f"{user}: {text}"}


@tool(outputs_to_state={"total": {"source": "sum"}}, outputs_to_string={"source": "sum"})
def add_numbers(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@haystack_tool(outputs_to_state={"total": {"source": "sum"}})
def hs_multiply(a: int, b: int) -> dict[str, int]:
    """Multiply two numbers (haystack-ai's @tool)."""
    return {"sum": a * b}


STREAMED: list[StreamingChunk] = []


def collect_chunk(chunk: StreamingChunk) -> None:
    """A module-level streaming callback, serializable by import path."""
    STREAMED.append(chunk)


TOOLS = [save_note, Toolset([add_numbers, hs_multiply])]

SCRIPT = [
    {
        "text": "Working on it.",
        "tool_calls": [
            ("save_note", {"text": "buy milk", "user": "mallory"}),
            ("add_numbers", {"a": 2, "b": 3}),
            ("hs_multiply", {"a": 4, "b": "five"}),
        ],
    }
]


def schema() -> dict[str, Any]:
    return {"user_id": {"type": str}, "notes": {"type": list[str]}, "total": {"type": int}}


def build_pipeline(**invoker_kwargs: Any) -> Pipeline:
    pipeline = Pipeline()
    pipeline.add_component("chat_generator", ScriptedChatGenerator(script=SCRIPT))
    pipeline.add_component(
        "tool_invoker",
        ToolInvoker(tools=TOOLS, raise_on_failure=False, **invoker_kwargs),
    )
    pipeline.connect("chat_generator.replies", "tool_invoker.messages")
    return pipeline


def check_output(output: dict[str, Any]) -> None:
    messages = output["tool_invoker"]["tool_messages"]
    assert [m.tool_call_results[0].origin.tool_name for m in messages] == ["save_note", "add_numbers", "hs_multiply"]
    assert [m.tool_call_results[0].error for m in messages] == [False, False, True]
    assert messages[0].tool_call_results[0].result == '{"note": "alice: buy milk"}'
    assert messages[1].tool_call_results[0].result == "5"
    assert "parameter 'b'" in messages[2].tool_call_results[0].result
    state = output["tool_invoker"]["state"]
    assert isinstance(state, State)
    assert state.data == {"user_id": "alice", "notes": ["alice: buy milk"], "total": 5}


def run_inputs() -> dict[str, Any]:
    return {
        "chat_generator": {"messages": [ChatMessage.from_user("note and add")], "tools": TOOLS},
        "tool_invoker": {"state": State(schema(), {"user_id": "alice"})},
    }


def test_pipeline_runs_generator_then_invoker() -> None:
    check_output(build_pipeline().run(run_inputs()))


def test_pipeline_round_trips_through_yaml_and_runs() -> None:
    yaml_text = build_pipeline(max_workers=2).dumps()
    assert "haystack_state.invocation.ToolInvoker" in yaml_text
    assert f"{__name__}.save_note" in yaml_text and f"{__name__}.hs_multiply" in yaml_text

    loaded = Pipeline.loads(yaml_text, allowed_modules=[__name__])
    invoker = loaded.get_component("tool_invoker")
    assert isinstance(invoker, ToolInvoker)
    assert invoker.max_workers == 2 and invoker.raise_on_failure is False
    assert loaded.dumps() == yaml_text
    check_output(loaded.run(run_inputs()))


def test_loading_needs_the_tools_module_on_the_allowlist() -> None:
    yaml_text = build_pipeline().dumps()
    with pytest.raises(DeserializationError, match=__name__):
        Pipeline.loads(yaml_text)


def test_yaml_round_trip_keeps_the_streaming_callback() -> None:
    STREAMED.clear()
    yaml_text = build_pipeline(streaming_callback=collect_chunk).dumps()
    assert f"{__name__}.collect_chunk" in yaml_text
    loaded = Pipeline.loads(yaml_text, allowed_modules=[__name__])
    check_output(loaded.run(run_inputs()))
    assert [c.tool_call_result.origin.tool_name for c in STREAMED if c.tool_call_result is not None] == [
        "save_note",
        "add_numbers",
        "hs_multiply",
    ]
    assert STREAMED[-1].finish_reason == "tool_call_results"


@pytest.mark.slow
def test_pipeline_from_yaml_runs_asynchronously() -> None:
    loaded = Pipeline.loads(build_pipeline().dumps(), allowed_modules=[__name__])
    check_output(asyncio.run(loaded.run_async(run_inputs())))


def test_pipeline_without_a_state_input_builds_an_empty_one() -> None:
    pipeline = Pipeline()
    pipeline.add_component("chat_generator", ScriptedChatGenerator(script=[[("add_numbers", {"a": 1, "b": 1})]]))
    pipeline.add_component("tool_invoker", ToolInvoker(tools=[add_numbers], raise_on_failure=False))
    pipeline.connect("chat_generator.replies", "tool_invoker.messages")
    output = Pipeline.loads(pipeline.dumps(), allowed_modules=[__name__]).run(
        {"chat_generator": {"messages": [ChatMessage.from_user("add")], "tools": [add_numbers]}}
    )
    (message,) = output["tool_invoker"]["tool_messages"]
    # an empty State has no "total" key: the merge fails, and says which key
    assert message.tool_call_results[0].error is True
    assert "'total'" in message.tool_call_results[0].result
    assert output["tool_invoker"]["state"].data == {}
