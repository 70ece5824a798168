"""
Nothing a model sends escapes as a raw exception: hostile tool names and arguments (JSON text nested thousands of
levels deep, huge numbers, NaN, non-object JSON, invalid UTF-8, lone surrogates, NUL, enormous strings, values that
are not JSON, ...) become error tool results naming the tool and the parameter. In an Agent on a durable SQLite
thread, the reply is stored (made storable first by ``safe_tool_calls``) and the thread stays usable. Also: the cap
on the calls of one reply (``max_tool_calls``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from haystack.components.agents.tool_calling import ToolNotFoundException
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools.errors import ToolInvocationError as HaystackToolInvocationError

from haystack_state import (
    Agent,
    State,
    ToolArgumentsError,
    ToolCallLimitError,
    ToolInvoker,
    ToolNotFoundError,
    tool,
)
from haystack_state.errors import CodecError
from haystack_state.invocation.arguments import (
    INVALID_ARGUMENTS,
    MAX_ARGUMENT_CHARS,
    read_arguments,
    safe_tool_call,
    safe_tool_calls,
)
from haystack_state.persistence import SQLiteCheckpointer
from haystack_state.persistence.codec import dumps
from haystack_state.testing import ScriptedChatGenerator

CALLED: list[Any] = []


@tool(outputs_to_state={"notes": {"source": "note"}})
def note(text: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write a note."""
    CALLED.append(text)
    return {"note": [text]}


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


#: (case, arguments, what the error message must say). Arguments given as JSON text, as some providers do.
HOSTILE_TEXT = [
    ("deep array text", "[" * 100_000 + "]" * 100_000, "nested more than 100 levels deep"),
    ("deep object text", '{"text": "a", "payload": ' + '{"x":' * 5000 + "1" + "}" * 5001, "nested"),
    ("deep but parseable text", '{"text": "a", "payload": ' + '{"x":' * 300 + "1" + "}" * 301, "parameter 'payload'"),
    ("huge number text", '{"text": ' + "9" * 10_000 + "}", "more than 4,000 digits"),
    ("NaN text", '{"text": NaN}', "NaN, which is not a JSON number"),
    ("Infinity text", '{"text": "a", "payload": {"n": -Infinity}}', "-Infinity, which is not a JSON number"),
    ("array text", "[1, 2]", "must be a JSON object, got list"),
    ("string text", '"hello"', "must be a JSON object, got str"),
    ("number text", "12", "must be a JSON object, got int"),
    ("invalid JSON", '{"text": ', "not valid JSON"),
    ("lone surrogate text", '{"text": "\\ud800"}', "parameter 'text' holds text that is not valid Unicode"),
    ("NUL text", '{"text": "a\\u0000b"}', "parameter 'text' holds a NUL character"),
    ("enormous text", '{"text": "' + "a" * (MAX_ARGUMENT_CHARS + 1) + '"}', "at most 2,000,000 are accepted"),
    ("invalid UTF-8 bytes", b'{"text": "\xff\xfe"}', "not valid UTF-8 (at byte 10)"),
]

#: The same, as the dict a provider would have parsed.
HOSTILE_DICTS = [
    ("deep dict", {"text": "a", "payload": nested(5000)}, "parameter 'payload' is nested more than 100 levels deep"),
    ("deep list", {"text": "a", "payload": {"l": nested_list(5000)}}, "parameter 'payload' is nested"),
    ("huge int", {"text": 10**5000}, "parameter 'text' holds a number with more than 4,000 digits"),
    ("NaN", {"text": "a", "payload": {"n": float("nan")}}, "parameter 'payload' holds nan"),
    ("infinity", {"text": float("inf")}, "parameter 'text' holds inf"),
    ("lone surrogate", {"text": "\udc80"}, "parameter 'text' holds text that is not valid Unicode"),
    ("surrogate key", {"text": "a", "payload": {"\ud800": 1}}, "parameter 'payload' has a key that holds text"),
    ("NUL", {"text": "a\x00b"}, "parameter 'text' holds a NUL character"),
    ("NUL parameter name", {"te\x00xt": "a"}, "the parameter name 'te\\x00xt' is not a usable name"),
    ("int key", {1: "a"}, "a parameter name must be a string, got int (1)"),
    ("nested int key", {"text": "a", "payload": {1: "b"}}, "parameter 'payload' has a key that is not a string"),
    ("object", {"text": object()}, "parameter 'text' holds a value of type object, which is not a JSON value"),
    ("set", {"text": "a", "payload": {"s": {1, 2}}}, "parameter 'payload' holds a value of type set"),
    ("enormous string", {"text": "a" * (MAX_ARGUMENT_CHARS + 1)}, "larger than 2,000,000 characters"),
    ("list arguments", [1, 2], "must be a JSON object, got list"),
]

HOSTILE = HOSTILE_TEXT + HOSTILE_DICTS


def reply_with(arguments: Any, name: Any = "note") -> ChatMessage:
    return ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name=name, arguments=arguments, id="c1")])


def schema() -> dict[str, Any]:
    return {"notes": {"type": list[str]}}


@pytest.fixture(autouse=True)
def clear_calls() -> None:
    CALLED.clear()


@pytest.mark.parametrize(("case", "arguments", "expected"), HOSTILE, ids=[case for case, _, _ in HOSTILE])
def test_hostile_arguments_become_an_error_result_naming_the_tool(case: str, arguments: Any, expected: str) -> None:
    state = State(schema(), {"notes": ["kept"]})
    output = ToolInvoker([note], raise_on_failure=False).run([reply_with(arguments)], state=state)
    (message,) = output["tool_messages"]
    result = message.tool_call_result
    assert result is not None and result.error
    assert result.result.startswith("Tool 'note': ")
    assert expected in result.result
    assert len(result.result) < 1000  # the message shows no enormous value
    assert CALLED == []  # the tool did not run
    assert state.get("notes") == ["kept"]
    dumps(message)  # the error result itself can be stored


@pytest.mark.parametrize(("case", "arguments", "expected"), HOSTILE, ids=[case for case, _, _ in HOSTILE])
def test_hostile_arguments_raise_a_tool_arguments_error_with_raise_on_failure(
    case: str, arguments: Any, expected: str
) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        ToolInvoker([note]).run([reply_with(arguments)])
    assert expected in str(info.value)
    assert info.value.tool_name == "note"
    assert isinstance(info.value, HaystackToolInvocationError)


@pytest.mark.parametrize(("case", "arguments", "expected"), HOSTILE_DICTS[:4], ids=[c for c, _, _ in HOSTILE_DICTS[:4]])
def test_hostile_arguments_in_run_async(case: str, arguments: Any, expected: str) -> None:
    output = asyncio.run(ToolInvoker([note], raise_on_failure=False).run_async([reply_with(arguments)]))
    assert expected in output["tool_messages"][0].tool_call_result.result


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (5, "The tool name must be a string, got int (5). Available tools: note."),
        (None, "The tool name must be a string, got NoneType (None). Available tools: note."),
        (["note"], "The tool name must be a string, got list (['note']). Available tools: note."),
        ("nope", "Tool 'nope' not found. Available tools: note."),
        ("no\x00pe", "Tool 'no\\x00pe' not found. Available tools: note."),
        ("x" * 10_000, "Tool '" + "x" * 77 + "...' not found. Available tools: note."),
    ],
)
def test_a_bad_or_unknown_tool_name_is_an_error_result_listing_the_tools(name: Any, expected: str) -> None:
    output = ToolInvoker([note], raise_on_failure=False).run([reply_with({"text": "a"}, name=name)])
    (message,) = output["tool_messages"]
    assert message.tool_call_result.error
    assert message.tool_call_result.result == expected
    assert isinstance(message.tool_call_result.origin.tool_name, str)
    dumps(message)
    with pytest.raises(ToolNotFoundError) as info:
        ToolInvoker([note]).run([reply_with({"text": "a"}, name=name)])
    assert isinstance(info.value, ToolNotFoundException)  # haystack-ai's class for the same case


def test_a_hostile_call_does_not_stop_the_other_calls_of_the_reply() -> None:
    calls = [
        ToolCall(tool_name="note", arguments={"text": "one"}, id="c1"),
        ToolCall(tool_name="note", arguments="[" * 50_000, id="c2"),
        ToolCall(tool_name=7, arguments={"text": "x"}, id="c3"),  # type: ignore[arg-type]
        ToolCall(tool_name="note", arguments={"text": "two"}, id="c4"),
    ]
    state = State(schema())
    output = ToolInvoker([note], raise_on_failure=False).run([ChatMessage.from_assistant(tool_calls=calls)], state)
    assert [m.tool_call_result.error for m in output["tool_messages"]] == [False, True, True, False]
    assert [m.tool_call_result.origin.id for m in output["tool_messages"]] == ["c1", "c2", "c3", "c4"]
    assert state.get("notes") == ["one", "two"]


# --- safe_tool_calls ------------------------------------------------------------------------------------------------


def test_a_clean_reply_is_returned_as_it_is() -> None:
    reply = ChatMessage.from_assistant(text="hi", tool_calls=[ToolCall(tool_name="note", arguments={"text": "a"})])
    assert safe_tool_calls(reply) is reply
    text = ChatMessage.from_assistant("just text")
    assert safe_tool_calls(text) is text
    assert safe_tool_call(reply.tool_calls[0]) is reply.tool_calls[0]


def test_invalid_json_text_that_can_be_stored_is_kept_and_answered_with_an_error() -> None:
    reply = reply_with('{"text": ')
    assert safe_tool_calls(reply) is reply
    with pytest.raises(ToolArgumentsError, match="not valid JSON"):
        read_arguments(reply.tool_calls[0])


@pytest.mark.parametrize(
    "arguments",
    [nested(5000), {"text": 10**5000}, {"text": object()}, "[" * 100_000, {"text": "\ud800"}, {"text": float("nan")}],
    ids=["deep", "huge int", "object", "deep text", "surrogate", "nan"],
)
def test_a_reply_with_unstorable_calls_is_made_storable(arguments: Any) -> None:
    reply = ChatMessage.from_assistant(
        text="let me see",
        tool_calls=[
            ToolCall(tool_name="note", arguments={"text": "ok"}, id="c0"),
            ToolCall(tool_name="note", arguments=arguments, id="c1"),
        ],
        meta={"model": "m"},
    )
    safe = safe_tool_calls(reply)
    assert safe is not reply
    assert safe.text == "let me see" and safe.meta == {"model": "m"}
    assert safe.tool_calls[0] is reply.tool_calls[0]
    fixed = safe.tool_calls[1]
    assert fixed.id == "c1" and fixed.tool_name == "note"
    assert set(fixed.arguments) == {INVALID_ARGUMENTS}
    assert fixed.arguments[INVALID_ARGUMENTS].startswith("Tool 'note': ")
    dumps(safe)  # storable now
    with pytest.raises(ToolArgumentsError) as info:
        read_arguments(fixed)
    assert str(info.value) == fixed.arguments[INVALID_ARGUMENTS]


def test_an_unstorable_reply_fails_the_codec_without_safe_tool_calls() -> None:
    with pytest.raises(CodecError):
        dumps(reply_with(nested(5000)))


def test_a_non_string_tool_name_and_id_are_made_printable() -> None:
    call = ToolCall(tool_name=12, arguments={"text": "a"}, id="bad\x00id")  # type: ignore[arg-type]
    fixed = safe_tool_call(call)
    assert fixed.tool_name == "12" and fixed.id == "bad\\x00id"
    assert fixed.arguments == {INVALID_ARGUMENTS: "The tool name must be a string, got int (12)."}
    output = ToolInvoker([note], raise_on_failure=False).run([ChatMessage.from_assistant(tool_calls=[fixed])])
    assert output["tool_messages"][0].tool_call_result.result == (
        "The tool name must be a string, got int (12). Available tools: note."
    )


# --- through an Agent on a durable thread --------------------------------------------------------------------------

AGENT_CASES = [
    ("deep array text", "[" * 100_000 + "]" * 100_000),
    ("deep dict", {"text": "a", "payload": nested(5000)}),
    ("huge int", {"text": 10**5000}),
    ("huge number text", '{"text": ' + "9" * 10_000 + "}"),
    ("NaN", {"text": float("nan")}),
    ("lone surrogate", {"text": "\ud800"}),
    ("NUL", {"text": "a\x00b"}),
    ("object", {"text": object()}),
    ("enormous string", {"text": "a" * (MAX_ARGUMENT_CHARS + 1)}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "arguments"), AGENT_CASES, ids=[case for case, _ in AGENT_CASES])
@pytest.mark.parametrize("name", ["note", 42, "no\x00te"], ids=["known tool", "int name", "NUL name"])
def test_a_hostile_reply_leaves_the_thread_usable(tmp_path: Path, case: str, arguments: Any, name: Any) -> None:
    generator = ScriptedChatGenerator(
        script=[reply_with(arguments, name=name), "Sorry.", "Still here.", "Hello again."], validate_tools=False
    )
    checkpointer = SQLiteCheckpointer(tmp_path / "threads.db")
    agent = Agent(generator, tools=[note], state_schema=schema(), checkpointer=checkpointer)

    first = agent.run([ChatMessage.from_user("go")], thread_id="t")
    assert first["exit_reason"] == "text"
    errors = [m for m in first["messages"] if m.tool_call_result is not None]
    assert len(errors) == 1 and errors[0].tool_call_result.error
    assert CALLED == []

    # a fresh process reads the thread back as it was stored
    stored = Agent(
        generator, tools=[note], state_schema=schema(), checkpointer=SQLiteCheckpointer(tmp_path / "threads.db")
    )
    assert [m.text for m in stored.get_state("t").values["messages"]][-1] == "Sorry."

    again = agent.run([], thread_id="t")
    assert again["last_message"].text == "Still here."
    turn = agent.run([ChatMessage.from_user("hello?")], thread_id="t")
    assert turn["last_message"].text == "Hello again."
    assert agent.get_state("t").values["messages"][-1].text == "Hello again."


@tool
def garbled(text: str) -> str:
    """Echo text decoded from bytes that were not UTF-8 (as errors="surrogateescape" leaves it)."""
    return f"{text} \udced"


def test_lone_surrogates_in_a_reply_and_a_tool_result_are_replaced_and_the_thread_is_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A State and a checkpoint refuse lone surrogates; what a model or a tool produces gets U+FFFD instead."""
    reasoning = ChatMessage.from_assistant(
        "thinking \ud800", reasoning="why \udfff", tool_calls=[ToolCall(tool_name="garbled", arguments={"text": "x"})]
    )
    generator = ScriptedChatGenerator(script=[reasoning, "done \udc80"])
    agent = Agent(generator, tools=[garbled], checkpointer=SQLiteCheckpointer(tmp_path / "threads.db"))
    with caplog.at_level("WARNING"):
        result = agent.run([ChatMessage.from_user("go")], thread_id="t")
    texts = [m.text or (m.tool_call_result.result if m.tool_call_result else None) for m in result["messages"]]
    assert texts == ["go", "thinking \ufffd", "x \ufffd", "done \ufffd"]
    assert result["messages"][1].reasoning.reasoning_text == "why \ufffd"
    assert "Tool 'garbled': its result holds text that is not valid Unicode" in caplog.text
    assert "The model's reply holds text that is not valid Unicode" in caplog.text
    stored = SQLiteCheckpointer(tmp_path / "threads.db").get("t").values["messages"]
    assert stored == result["messages"]
    assert safe_tool_calls(ChatMessage.from_assistant("clean é")).text == "clean é"


# --- max_tool_calls -------------------------------------------------------------------------------------------------


def many(count: int) -> list[ChatMessage]:
    calls = [ToolCall(tool_name="note", arguments={"text": f"n{i}"}, id=f"c{i}") for i in range(count)]
    return [ChatMessage.from_assistant(tool_calls=calls)]


def test_calls_past_max_tool_calls_get_error_results_and_do_not_run() -> None:
    state = State(schema())
    output = ToolInvoker([note], raise_on_failure=False, max_tool_calls=3).run(many(5), state=state)
    messages = output["tool_messages"]
    assert [m.tool_call_result.error for m in messages] == [False, False, False, True, True]
    assert sorted(CALLED) == ["n0", "n1", "n2"]
    assert state.get("notes") == ["n0", "n1", "n2"]
    assert messages[3].tool_call_result.result == (
        "Tool 'note' was not called: the reply asks for 5 tool calls and at most 3 run per reply (max_tool_calls). "
        "Ask for fewer calls at once."
    )


def test_the_default_limit_is_64_calls_and_none_lifts_it() -> None:
    output = ToolInvoker([note], raise_on_failure=False).run(many(70), state=State(schema()))
    assert sum(m.tool_call_result.error for m in output["tool_messages"]) == 6
    assert len(CALLED) == 64
    CALLED.clear()
    output = ToolInvoker([note], raise_on_failure=False, max_tool_calls=None).run(many(70), state=State(schema()))
    assert not any(m.tool_call_result.error for m in output["tool_messages"])
    assert len(CALLED) == 70


def test_with_raise_on_failure_too_many_calls_raise_before_any_runs() -> None:
    with pytest.raises(ToolCallLimitError):
        ToolInvoker([note], max_tool_calls=2).run(many(3))
    assert CALLED == []


def test_the_agent_caps_the_calls_of_a_reply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    generator = ScriptedChatGenerator(script=[[("note", {"text": f"n{i}"}) for i in range(4)], "done"])
    agent = Agent(
        generator,
        tools=[note],
        state_schema=schema(),
        max_tool_calls=2,
        checkpointer=SQLiteCheckpointer(tmp_path / "t.db"),
    )
    result = agent.run([ChatMessage.from_user("go")], thread_id="t")
    assert result["notes"] == ["n0", "n1"]
    errors = [m.tool_call_result.error for m in result["messages"] if m.tool_call_result is not None]
    assert errors == [False, False, True, True]
    assert Agent.from_dict(agent.to_dict()).max_tool_calls == 2


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_an_invalid_max_tool_calls_is_refused_at_construction(value: Any) -> None:
    with pytest.raises(ValueError, match="max_tool_calls must be a positive int or None"):
        ToolInvoker([note], max_tool_calls=value)
    with pytest.raises(ValueError, match="max_tool_calls must be a positive int or None"):
        Agent(ScriptedChatGenerator(script=["x"]), tools=[note], max_tool_calls=value)
