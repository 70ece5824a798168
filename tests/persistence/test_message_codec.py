"""The codec's fast paths for ChatMessage give exactly what haystack's to_dict/from_dict and freeze() give."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from haystack.dataclasses import (
    ChatMessage,
    ChatRole,
    Document,
    ImageContent,
    ReasoningContent,
    TextContent,
    ToolCall,
)

from haystack_state import values as state_values
from haystack_state.persistence import codec
from haystack_state.persistence.codec import decode, encode, from_json, to_json

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
CALL = ToolCall(tool_name="search", arguments={"query": "q", "page": 3, "tags": ["a", {"b": [1, 2.5]}]}, id="c1")


def _messages() -> list[ChatMessage]:
    return [
        ChatMessage.from_user("hello"),
        ChatMessage.from_system("be brief", meta={"k": 1}),
        ChatMessage.from_user("named", name="ann"),
        ChatMessage.from_assistant("plain reply", meta={"model": "m", "usage": {"prompt_tokens": 3, "x": [1, None]}}),
        ChatMessage.from_assistant(tool_calls=[CALL, ToolCall(tool_name="t2", arguments={}, id=None, extra={"e": 1})]),
        ChatMessage.from_assistant("text and call", tool_calls=[CALL]),
        ChatMessage.from_tool("the result", origin=CALL),
        ChatMessage.from_tool("it failed", origin=CALL, error=True),
        ChatMessage.from_assistant("", meta={}),
        # Shapes the fast paths leave to the general path; they must still round-trip the same way.
        ChatMessage.from_assistant("with a document", meta={"doc": Document(content="d", meta={"a": 1})}),
        ChatMessage.from_assistant("odd values", meta={"t": (1, 2), "s": {3}, "nan": math.nan}),
        ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name="t", arguments={"when": (1, 2), "doc": Document(content="x")}, id="c2")]
        ),
        ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="t", arguments={"bad": math.inf}, id="c3")]),
        ChatMessage.from_tool([TextContent("part"), ImageContent(base64_image=PNG)], origin=CALL),  # type: ignore[arg-type]
        ChatMessage.from_assistant("thinking", reasoning=ReasoningContent(reasoning_text="because")),
        ChatMessage.from_user(content_parts=["look", ImageContent(base64_image=PNG)]),
        ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name="t", arguments=state_values.freeze({"a": [1, {"b": 2}]}), id="frozen-args")]
        ),
        # Metas a read-only read builds in one pass (flat, or dicts of scalars), and ones it leaves to the codec.
        ChatMessage.from_assistant(
            "a usual reply",
            meta={"model": "m", "index": 0, "finish_reason": "stop", "usage": {"prompt_tokens": 3, "cost": 0.5}},
        ),
        ChatMessage.from_assistant("nested, not flat", meta={"usage": {"details": {"cached": 1}}, "none": None}),
        ChatMessage.from_assistant("a reserved key inside", meta={"note": {"__type__": "not a tag"}}),
        ChatMessage.from_assistant("a reserved key", meta={"__type__": "not a tag", "k": 1}),
        ChatMessage.from_assistant("a tagged value", meta={"score": math.inf, "k": 1}),
    ]


def _general_encoding(message: ChatMessage) -> Any:
    """What the codec stored for a ChatMessage before the fast path: to_dict(), then each field encoded."""
    return codec._encode_object(message, "haystack.ChatMessage", lambda m: m.to_dict())


def _shape(value: Any) -> Any:
    """A value's structure with the exact type of every container and object, to compare read-only shapes."""
    kind = type(value)
    if isinstance(value, dict):
        return (kind, [(key, _shape(item)) for key, item in value.items()])
    if isinstance(value, list | tuple):
        return (kind, [_shape(item) for item in value])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (kind, [(name, _shape(item)) for name, item in vars(value).items()])
    return (kind, value if value == value else "nan")


@pytest.mark.parametrize("message", _messages(), ids=lambda m: m.text or (m.tool_call.id if m.tool_call else "x"))
def test_fast_paths_match_haystacks_to_dict_from_dict_and_freeze(message: ChatMessage) -> None:
    stored = encode(message)
    assert to_json(stored) == to_json(_general_encoding(message))  # JSON text: NaN is not equal to itself
    parsed = from_json(to_json(stored))
    expected = ChatMessage.from_dict(codec._decode_object_data(from_json(to_json(stored))["data"]))

    plain = decode(parsed)
    assert _shape(plain) == _shape(expected)

    frozen = decode(from_json(to_json(stored)), frozen=True)
    assert _shape(frozen) == _shape(state_values.freeze(expected))
    assert to_json(encode(frozen)) == to_json(stored)


def test_data_written_by_the_general_path_reads_the_same() -> None:
    for message in _messages():
        old = to_json(_general_encoding(message))
        assert _shape(decode(from_json(old))) == _shape(decode(from_json(to_json(encode(message)))))


@pytest.mark.parametrize(
    "data",
    [
        {"role": "nobody", "meta": {}, "name": None, "content": [{"text": "x"}]},
        {"role": "user", "meta": {}, "name": None, "content": [{"tool_call": {"tool_name": "t"}}]},
        {
            "role": "user",
            "meta": {},
            "name": None,
            "content": [{"tool_call": {"tool_name": "t", "arguments": {}, "x": 1}}],
        },
        {"role": "tool", "meta": {}, "name": None, "content": [{"tool_call_result": {"result": "r", "error": False}}]},
        {"role": "user", "meta": {}, "name": None, "content": [{"unknown": 1}]},
        {"role": "user", "meta": {}, "name": None, "content": "old string content"},
        {"role": "user", "content": [{"text": "no meta or name"}]},
        {"role": ["not", "hashable"], "meta": {}, "name": None, "content": []},
    ],
)
def test_unusual_stored_messages_read_as_from_dict_reads_them(data: dict[str, Any]) -> None:
    stored = to_json({"__type__": "haystack.ChatMessage", "data": data})
    try:
        expected: Any = ChatMessage.from_dict(json.loads(stored)["data"])
    except Exception:
        expected = None
    if expected is None:
        with pytest.raises(ValueError, match=r"haystack\.ChatMessage"):
            decode(from_json(stored))
        with pytest.raises(ValueError, match=r"haystack\.ChatMessage"):
            decode(from_json(stored), frozen=True)
    else:
        assert _shape(decode(from_json(stored))) == _shape(expected)
        assert _shape(decode(from_json(stored), frozen=True)) == _shape(state_values.freeze(expected))


def test_a_role_is_shared_not_rebuilt() -> None:
    message = decode(from_json(to_json(encode(ChatMessage.from_user("x")))), frozen=True)
    assert message.role is ChatRole.USER
    with pytest.raises(TypeError, match="read-only"):
        message._content.append(TextContent("y"))


def test_the_usual_messages_take_the_fast_paths() -> None:
    from haystack_state.persistence._message_codec import decode_chat_message, encode_chat_message

    for message in _messages()[:9]:
        data = encode_chat_message(message, codec._encode)
        assert data is not None
        assert encode_chat_message(state_values.freeze(message), codec._encode) == data  # as a State holds it
        assert decode_chat_message(from_json(to_json(data)), codec._decode, False) is not None


@pytest.mark.slow
def test_a_state_built_from_a_read_only_checkpoint_holds_each_message_once(tmp_path: Any) -> None:
    import gc

    from haystack_state import State
    from haystack_state.persistence import SQLiteCheckpointer, extend

    path = tmp_path / "once.sqlite"
    with SQLiteCheckpointer(path) as writer:
        head = None
        for i in range(40):
            delta = {"messages": extend([ChatMessage.from_user(f"m{i}"), ChatMessage.from_tool(f"r{i}", origin=CALL)])}
            head = writer.commit(
                "t", parent_id=head, expected_head=head, delta=delta, step=i, source="tools"
            ).checkpoint_id
    del delta
    gc.collect()
    before = sum(type(obj) is ChatMessage for obj in gc.get_objects())  # other tests' messages
    with SQLiteCheckpointer(path) as reader:
        values = reader.get("t", read_only=True).values  # decoded frozen, shared with the reader's cache
        state = State({"messages": {"type": list[ChatMessage]}}, values)
        del values
        gc.collect()
        alive = sum(type(obj) is ChatMessage for obj in gc.get_objects()) - before
        assert alive == 80  # the cache's, shared by the State
        mine = state.get("messages")
        mine.append(ChatMessage.from_user("not in the state"))
        assert mine[0] == reader.get("t").values["messages"][0]
        assert mine[0] is not reader.get("t", read_only=True).values["messages"][0]  # a reader's copy, not the cache's
        assert len(state.get("messages")) == 80


# --- the compact form checkpoints store ----------------------------------------------------------------------------


@pytest.mark.parametrize("message", _messages(), ids=lambda m: m.text or (m.tool_call.id if m.tool_call else "x"))
def test_the_compact_form_reads_back_as_from_dict_and_freeze_give(message: ChatMessage) -> None:
    stored = encode(message, compact=True)
    expected = ChatMessage.from_dict(codec._decode_object_data(from_json(to_json(encode(message)))["data"]))
    assert _shape(decode(from_json(to_json(stored)))) == _shape(expected)
    assert _shape(decode(from_json(to_json(stored)), owned=True)) == _shape(expected)
    frozen = decode(from_json(to_json(stored)), frozen=True)
    assert _shape(frozen) == _shape(state_values.freeze(expected))
    assert to_json(encode(frozen, compact=True)) == to_json(stored)  # a State's read-only message stores the same
    assert to_json(encode(frozen)) == to_json(encode(message))  # and without compact=True, to_dict's shape


def test_the_usual_messages_are_stored_compact_and_the_others_as_to_dict() -> None:
    messages = _messages()
    compact = [*messages[:11], *messages[16:]]  # any meta (encoded by the codec), plain arguments, text and tool parts
    for message in compact:
        data = encode(message, compact=True)["data"]
        assert isinstance(data, list) and len(data) == 4
    assert encode(messages[0], compact=True)["data"] == ["user", None, {}, ["hello"]]
    assert encode(messages[6], compact=True)["data"][3] == [
        ["r", "the result", ["search", {"query": "q", "page": 3, "tags": ["a", {"b": [1, 2.5]}]}, "c1", None], False]
    ]
    for message in messages[11:16]:  # arguments that are not plain JSON, images, reasoning: to_dict's shape
        assert encode(message, compact=True) == encode(message)
    # The flag is the call's own: encoding in between (say an event's JSON form) keeps to_dict's shape.
    assert isinstance(encode(messages[0])["data"], dict)


@pytest.mark.parametrize(
    "data",
    [
        ["user", None, {}],
        ["nobody", None, {}, ["x"]],
        ["user", None, {}, "not a list"],
        ["user", None, {}, [["c", "t", {}, "id"]]],
        ["tool", None, {}, [["r", "result", ["t", {}, "id"], "not a bool"]]],
        ["tool", None, {}, [["r", 5, ["t", {}, "id", None], False]]],
        ["user", None, {}, [["x", 1]]],
        ["user", None, {}, [7]],
    ],
)
def test_a_malformed_compact_message_is_a_codec_error(data: list[Any]) -> None:
    stored = to_json({"__type__": "haystack.ChatMessage", "data": data})
    with pytest.raises(ValueError, match=r"haystack\.ChatMessage"):
        decode(from_json(stored))
    with pytest.raises(ValueError, match=r"haystack\.ChatMessage"):
        decode(from_json(stored), frozen=True)


def test_a_checkpoint_stores_its_messages_compact_and_reads_old_rows(tmp_path: Any) -> None:
    import sqlite3

    from haystack_state.persistence import SQLiteCheckpointer, extend

    path = tmp_path / "t.db"
    messages = [ChatMessage.from_user("hi"), ChatMessage.from_tool("r", origin=CALL)]
    with SQLiteCheckpointer(path) as cp:
        cp.commit("t", parent_id=None, expected_head=None, delta={"messages": extend(messages)}, step=0, source="input")
    conn = sqlite3.connect(path)
    (delta,) = conn.execute("SELECT delta FROM haystack_state_checkpoints").fetchone()
    items = json.loads(delta)["messages"]["items"]
    assert [item["data"][3] for item in items] == [["hi"], [["r", "r", ["search", CALL.arguments, "c1", None], False]]]
    # A row written before the compact form (to_dict's shape) reads the same.
    old = to_json({"messages": {"op": "extend", "items": [_general_encoding(m) for m in messages]}})
    conn.execute("UPDATE haystack_state_checkpoints SET delta = ?", (old,))
    conn.commit()
    conn.close()
    with SQLiteCheckpointer(path) as cp:
        assert cp.get("t").values["messages"] == messages
