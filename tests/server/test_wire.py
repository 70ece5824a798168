"""
Messages on the wire: haystack ``ChatMessage`` <-> LangChain-style dicts, without loss for text, tool calls and tool
results (property-tested through JSON), and errors that name the field at fault.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ImageContent, ReasoningContent, TextContent, ToolCall
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_state.agent._message_ids import stored_id, with_id
from haystack_state.server._wire import (
    WireError,
    message_from_wire,
    message_to_wire,
    messages_from_wire,
    values_from_wire,
    values_to_wire,
)

text = st.text(max_size=30)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | text
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(names, json_values, max_size=4)
meta = st.dictionaries(names, json_values, max_size=3) | st.builds(
    lambda m, i: {**m, "id": i}, st.dictionaries(names, json_values, max_size=2), text
)
call_ids = st.none() | st.text(min_size=1, max_size=12)
tool_calls = st.builds(
    ToolCall,
    tool_name=names,
    arguments=arguments,
    id=call_ids,
    extra=st.none() | st.dictionaries(names, json_values, min_size=1, max_size=2),
)
user = st.builds(
    lambda parts, name, m: ChatMessage.from_user(content_parts=parts, name=name, meta=m),
    st.lists(text.map(TextContent), min_size=1, max_size=3),
    st.none() | names,
    meta,
)
system = st.builds(lambda t, m: ChatMessage.from_system(t, meta=m), text, meta)
assistant = st.builds(
    lambda t, calls, reasoning, name, m: ChatMessage.from_assistant(
        text=t, tool_calls=calls, reasoning=reasoning, name=name, meta=m
    ),
    st.none() | text,
    st.lists(tool_calls, max_size=3),
    st.none() | text.map(ReasoningContent),
    st.none() | names,
    meta,
)
tool = st.builds(
    lambda result, origin, error, m: ChatMessage.from_tool(result, origin, error=error, meta=m),
    text,
    tool_calls,
    st.booleans(),
    meta,
)
messages = user | system | assistant | tool


def through_json(data: Any) -> Any:
    return json.loads(json.dumps(data))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(messages)
def test_a_message_survives_the_round_trip(message: ChatMessage) -> None:
    wire = through_json(message_to_wire(message))
    assert message_from_wire(wire) == message
    assert message_to_wire(message_from_wire(wire)) == wire


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.lists(messages, max_size=6))
def test_a_conversation_survives_the_round_trip(conversation: list[ChatMessage]) -> None:
    wire = through_json(values_to_wire({"messages": conversation}, thread_id="t", system_prompt=True))
    # a message without id gets one from its thread and position
    expected = [with_id(message, stored_id(message, "t", i)) for i, message in enumerate(conversation)]
    assert values_from_wire(wire) == {"messages": expected}


def test_the_langchain_shape() -> None:
    call = ToolCall(tool_name="search", arguments={"q": "tea"}, id="call_1")
    ai = message_to_wire(ChatMessage.from_assistant(tool_calls=[call], meta={"id": "m1", "model": "x"}))
    assert ai == {
        "type": "ai",
        "content": "",
        "id": "m1",
        "name": None,
        "tool_calls": [{"name": "search", "args": {"q": "tea"}, "id": "call_1", "type": "tool_call"}],
        "additional_kwargs": {},
        "response_metadata": {"model": "x"},
    }
    result = message_to_wire(ChatMessage.from_tool("found", call, error=True))
    assert {k: result[k] for k in ("type", "content", "tool_call_id", "name", "status")} == {
        "type": "tool",
        "content": "found",
        "tool_call_id": "call_1",
        "name": "search",
        "status": "error",
    }
    assert message_to_wire(ChatMessage.from_user("hi"))["content"] == "hi"


def test_langchain_clients_messages_are_understood() -> None:
    conversation = messages_from_wire(
        [
            {"role": "user", "content": [{"type": "text", "text": "look"}, "up"]},
            {"type": "ai", "content": "", "tool_calls": [{"name": "search", "args": {"q": "x"}, "id": "c1"}]},
            {"type": "tool", "content": "result", "tool_call_id": "c1"},  # the call is found by its id
            {"role": "assistant", "content": "done"},
        ]
    )
    assert conversation[0] == ChatMessage.from_user(content_parts=["look", "up"])
    assert conversation[1].tool_calls == [ToolCall(tool_name="search", arguments={"q": "x"}, id="c1")]
    assert conversation[1].texts == []
    assert conversation[2].tool_call_result is not None
    assert conversation[2].tool_call_result.origin == conversation[1].tool_calls[0]
    assert conversation[3] == ChatMessage.from_assistant("done")


def test_images_travel_as_base64_blocks() -> None:
    image = ImageContent(base64_image="iVBORw0KGgo=", mime_type="image/png", validation=False)
    message = ChatMessage.from_user(content_parts=["see", image])
    wire = message_to_wire(message)
    assert wire["content"][1] == {
        "type": "image",
        "source_type": "base64",
        "data": "iVBORw0KGgo=",
        "mime_type": "image/png",
    }
    assert message_from_wire(wire) == message


def test_other_state_keys_travel_through_the_codec() -> None:
    values = {"when": (1, 2), "count": 3, "tags": {"a"}}
    wire = values_to_wire(values)
    assert wire["count"] == 3 and wire["when"] == {"__type__": "tuple", "data": [1, 2]}
    assert values_from_wire(through_json(wire)) == values


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ([{"type": "robot", "content": "x"}], "messages.0.type"),
        ([{"type": "human", "content": 3}], "messages.0.content"),
        ([{"type": "human", "content": [{"type": "video"}]}], "messages.0.content.0.type"),
        ([{"type": "ai", "content": "", "tool_calls": [{"args": {}}]}], "messages.0.tool_calls.0.name"),
        ([{"type": "ai", "content": "", "tool_calls": [{"name": "t", "args": []}]}], "messages.0.tool_calls.0.args"),
        ([{"type": "human", "content": "x", "tool_calls": [{"name": "t"}]}], "messages.0.tool_calls"),
        ([{"type": "tool", "content": "x"}], "messages.0.tool_call_id"),
        ([{"type": "tool", "content": "x", "tool_call_id": "nope"}], "messages.0.name"),
        ([{"type": "tool", "content": "x", "tool_call_id": "c", "name": "t", "status": "odd"}], "messages.0.status"),
        ([{"type": "human", "content": "x", "id": 5}], "messages.0.id"),
        (["hello"], "messages.0"),
        ({"type": "human"}, "messages"),
    ],
)
def test_bad_messages_name_the_field(items: Any, field: str) -> None:
    with pytest.raises(WireError) as caught:
        messages_from_wire(items)
    assert caught.value.field == field


def test_a_bad_codec_value_names_its_key() -> None:
    with pytest.raises(WireError) as caught:
        values_from_wire({"when": {"__type__": "os.system", "data": "rm"}})
    assert caught.value.field == "input.when"
