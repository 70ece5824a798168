"""
Tests of ``ToolInvoker``: what one tool call does (resolve, validate, inject, call, merge, render), its errors, tools
in haystack-ai's own formats, async tools, streaming and serialization.

Parallel execution, ordering and determinism are in ``test_invoker_parallel.py``; pipelines in
``test_invoker_pipeline.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import inspect
import json
import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from haystack import component
from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import ChatMessage, StreamingChunk, TextContent, ToolCall
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Tool, Toolset
from haystack.tools import tool as haystack_tool
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from haystack_state import (
    ComponentTool,
    StagedState,
    State,
    StateTypeError,
    ToolArgumentsError,
    ToolExecutionError,
    ToolInvocationError,
    ToolInvoker,
    ToolMergeError,
    ToolNotFoundError,
    tool,
    tool_spec,
)
from haystack_state.handlers import merge_lists, replace_values
from haystack_state.invocation.calls import _checker, _validate, plan_calls, result_to_string

# --- helpers -------------------------------------------------------------------------------------------


def calls(*specs: tuple[str, Any], text: str | None = None) -> list[ChatMessage]:
    """One assistant message with a tool call per ``(tool_name, arguments)`` pair, ids ``c0``, ``c1``, ..."""
    tool_calls = [ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(specs)]
    return [ChatMessage.from_assistant(text=text, tool_calls=tool_calls)]


def results(output: dict[str, Any]) -> list[tuple[str, bool]]:
    """``(text, error)`` of each tool message."""
    return [(m.tool_call_results[0].result, m.tool_call_results[0].error) for m in output["tool_messages"]]


def only_result(output: dict[str, Any]) -> tuple[Any, bool]:
    messages = output["tool_messages"]
    assert len(messages) == 1
    result = messages[0].tool_call_results[0]
    return result.result, result.error


def concat(current: Any, new: Any) -> Any:
    return f"{current or ''}{new}"


def failing_handler(current: Any, new: Any) -> Any:
    raise RuntimeError("handler refuses")


def shout(value: Any) -> str:
    return str(value).upper()


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool(outputs_to_state={"total": {"source": "sum"}})
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


# --- construction and signatures ----------------------------------------------------------------------


def test_component_declares_its_sockets() -> None:
    invoker = ToolInvoker(tools=[echo])
    inputs = invoker.__haystack_input__._sockets_dict  # type: ignore[attr-defined]
    outputs = invoker.__haystack_output__._sockets_dict  # type: ignore[attr-defined]
    assert set(inputs) == {
        "messages",
        "state",
        "tools",
        "streaming_callback",
        "context",
        "answers",
        "enable_streaming_callback_passthrough",
    }
    assert not inputs["context"].is_mandatory and not inputs["answers"].is_mandatory
    assert inputs["messages"].is_mandatory
    assert not inputs["state"].is_mandatory
    assert set(outputs) == {"tool_messages", "state"}


def test_run_and_run_async_take_the_same_parameters() -> None:
    sync = inspect.signature(ToolInvoker.run)
    asynchronous = inspect.signature(ToolInvoker.run_async)
    assert list(sync.parameters) == [
        "self",
        "messages",
        "state",
        "tools",
        "streaming_callback",
        "context",
        "answers",
        "enable_streaming_callback_passthrough",
    ]
    assert [(p.name, p.default, p.kind) for p in sync.parameters.values()] == [
        (p.name, p.default, p.kind) for p in asynchronous.parameters.values()
    ]


def test_constructor_defaults() -> None:
    invoker = ToolInvoker([echo])
    assert invoker.raise_on_failure is True
    assert invoker.max_workers == 4
    assert invoker.streaming_callback is None
    assert invoker.enable_streaming_callback_passthrough is False


def test_without_state_it_builds_an_empty_state() -> None:
    output = ToolInvoker([echo]).run(calls(("echo", {"text": "hi"})))
    assert isinstance(output["state"], State)
    assert only_result(output) == ("hi", False)
    assert output["state"].keys() == ["messages"]
    assert not output["state"].has("messages")


def test_without_state_run_async_builds_an_empty_state() -> None:
    output = asyncio.run(ToolInvoker([echo]).run_async(calls(("echo", {"text": "hi"}))))
    assert isinstance(output["state"], State)
    assert only_result(output) == ("hi", False)


def test_returns_the_state_it_was_given() -> None:
    state = State({"total": {"type": int}})
    output = ToolInvoker([add]).run(calls(("add", {"a": 1, "b": 2})), state=state)
    assert output["state"] is state
    assert state.get("total") == 3


def test_messages_without_tool_calls_do_nothing() -> None:
    state = State({"total": {"type": int}}, {"total": 1})
    output = ToolInvoker([add]).run([ChatMessage.from_user("hi"), ChatMessage.from_assistant("hello")], state=state)
    assert output["tool_messages"] == []
    assert state.data == {"total": 1}


def test_result_message_keeps_the_origin_tool_call() -> None:
    output = ToolInvoker([echo]).run(calls(("echo", {"text": "hi"})))
    message = output["tool_messages"][0]
    assert message.is_from("tool")
    assert message.tool_call_results[0].origin == ToolCall(tool_name="echo", arguments={"text": "hi"}, id="c0")


def test_calls_across_several_messages_all_run_in_order() -> None:
    messages = [
        ChatMessage.from_user("go"),
        *calls(("echo", {"text": "a"}), ("echo", {"text": "b"})),
        *calls(("echo", {"text": "c"})),
    ]
    output = ToolInvoker([echo]).run(messages)
    assert results(output) == [("a", False), ("b", False), ("c", False)]


# --- resolving the tool ----------------------------------------------------------------------------------


def test_unknown_tool_raises_naming_it_and_the_available_tools() -> None:
    with pytest.raises(ToolNotFoundError) as info:
        ToolInvoker([echo, add]).run(calls(("search", {"q": "x"})))
    assert isinstance(info.value, ToolInvocationError)
    assert info.value.tool_name == "search"
    assert "'search'" in str(info.value) and "add, echo" in str(info.value)


def test_unknown_tool_becomes_an_error_result() -> None:
    state = State({"total": {"type": int}})
    output = ToolInvoker([echo, add], raise_on_failure=False).run(
        calls(("search", {"q": "x"}), ("add", {"a": 1, "b": 1})), state=state
    )
    (text, error), second = results(output)
    assert error is True
    assert "'search' not found" in text and "add, echo" in text
    assert second == ('{"sum": 2}', False)
    assert state.get("total") == 2


def test_unknown_tool_with_raise_runs_nothing() -> None:
    ran = []

    @tool
    def record(x: int) -> int:
        """Record."""
        ran.append(x)
        return x

    with pytest.raises(ToolNotFoundError):
        ToolInvoker([record]).run(calls(("record", {"x": 1}), ("nope", {})))
    assert ran == []


# --- validating the arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"a": 1}, "'b' is a required property"),
        ({"a": 1, "b": "two"}, "parameter 'b'"),
        ({"a": 1, "b": 2, "c": 3}, "unexpected argument(s) 'c'"),
        ({"a": 1.5, "b": 2}, "parameter 'a'"),
    ],
)
def test_bad_arguments_raise_naming_the_tool_and_parameter(arguments: dict[str, Any], expected: str) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        ToolInvoker([add]).run(calls(("add", arguments)), state=State({"total": {"type": int}}))
    assert info.value.tool_name == "add"
    assert "Tool 'add'" in str(info.value)
    assert expected in str(info.value)


def test_bad_arguments_become_an_error_result_and_the_tool_is_not_called() -> None:
    ran = []

    @tool(outputs_to_state={"total": {}})
    def count(n: int) -> int:
        """Count."""
        ran.append(n)
        return n

    state = State({"total": {"type": int}}, {"total": 7})
    output = ToolInvoker([count], raise_on_failure=False).run(calls(("count", {"n": "seven"})), state=state)
    text, error = only_result(output)
    assert error is True
    assert "Tool 'count'" in text and "parameter 'n'" in text and "integer" in text
    assert ran == []
    assert state.data == {"total": 7}


def test_unexpected_argument_lists_the_parameters() -> None:
    output = ToolInvoker([add], raise_on_failure=False).run(calls(("add", {"a": 1, "b": 2, "z": 0})))
    text, error = only_result(output)
    assert error and "'z'" in text and "the parameters are: a, b" in text


@pytest.mark.parametrize("raw", ['{"a": 1, "b": ', "not json at all", "{'a': 1}"])
def test_malformed_json_arguments_raise(raw: str) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        ToolInvoker([add]).run(calls(("add", raw)))
    assert info.value.tool_name == "add"
    assert "not valid JSON" in str(info.value)


def test_malformed_json_arguments_become_an_error_result() -> None:
    state = State({"total": {"type": int}}, {"total": 5})
    output = ToolInvoker([add], raise_on_failure=False).run(
        calls(("add", '{"a": 1, "b": '), ("add", {"a": 2, "b": 2})), state=state
    )
    (text, error), second = results(output)
    assert error is True and "Tool 'add'" in text and "not valid JSON" in text
    assert second == ('{"sum": 4}', False)
    assert state.get("total") == 4


def test_json_string_arguments_are_parsed() -> None:
    state = State({"total": {"type": int}})
    output = ToolInvoker([add]).run(calls(("add", '{"a": 2, "b": 3}')), state=state)
    assert only_result(output) == ('{"sum": 5}', False)
    assert state.get("total") == 5


@pytest.mark.parametrize("raw", ["[1, 2]", "3", '"text"'])
def test_json_arguments_that_are_not_an_object_are_rejected(raw: str) -> None:
    output = ToolInvoker([add], raise_on_failure=False).run(calls(("add", raw)))
    text, error = only_result(output)
    assert error is True and "must be a JSON object" in text


@pytest.mark.parametrize("raw", ["", "   ", None])
def test_empty_arguments_mean_no_arguments(raw: Any) -> None:
    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    assert only_result(ToolInvoker([ping]).run(calls(("ping", raw)))) == ("pong", False)


@dataclasses.dataclass
class Point:
    x: int
    y: int


def test_arguments_are_converted_to_the_parameter_types() -> None:
    @tool
    def norm(p: Point) -> int:
        """Manhattan norm."""
        assert isinstance(p, Point)
        return abs(p.x) + abs(p.y)

    assert only_result(ToolInvoker([norm]).run(calls(("norm", {"p": {"x": 3, "y": -4}})))) == ("7", False)


# --- hidden parameters ----------------------------------------------------------------------------------


def test_a_value_the_model_sends_for_an_inputs_from_state_parameter_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @tool(inputs_from_state={"user_id": "user"})
    def whoami(user: str) -> str:
        """Who am I."""
        return user

    state = State({"user_id": {"type": str}}, {"user_id": "alice"})
    with caplog.at_level(logging.WARNING):
        output = ToolInvoker([whoami]).run(calls(("whoami", {"user": "mallory"})), state=state)
    assert only_result(output) == ("alice", False)
    assert "ignored values the model sent for hidden parameters user" in caplog.text


def test_a_hidden_value_is_dropped_even_when_state_has_no_value() -> None:
    @tool(inputs_from_state={"user_id": "user"})
    def whoami(user: str = "anonymous") -> str:
        """Who am I."""
        return user

    output = ToolInvoker([whoami]).run(calls(("whoami", {"user": "mallory"})), state=State({"user_id": {"type": str}}))
    assert only_result(output) == ("anonymous", False)


def test_a_value_the_model_sends_for_the_state_parameter_is_dropped() -> None:
    @tool
    def peek(key: str, state: State) -> Any:
        """Peek."""
        assert isinstance(state, State)
        return state.get(key)

    state = State({"x": {"type": int}}, {"x": 42})
    output = ToolInvoker([peek]).run(calls(("peek", {"key": "x", "state": {"x": 0}})), state=state)
    assert only_result(output) == ("42", False)


def test_a_value_the_model_sends_for_streaming_callback_is_dropped() -> None:
    @tool
    def stream(text: str, streaming_callback: Callable[..., None] | None = None) -> str:
        """Stream."""
        return f"{text}:{streaming_callback is None}"

    output = ToolInvoker([stream]).run(calls(("stream", {"text": "t", "streaming_callback": "os.system"})))
    assert only_result(output) == ("t:True", False)


def test_hidden_values_from_a_haystack_tool_whose_schema_lists_them_are_dropped() -> None:
    # A Tool built by hand may show the hidden parameter to the model; its value still comes from state.
    def lookup(query: str, user: str) -> str:
        return f"{user}:{query}"

    lookup_tool = Tool(
        name="lookup",
        description="Lookup.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}, "user": {"type": "string"}},
            "required": ["query", "user"],
        },
        function=lookup,
        inputs_from_state={"user_id": "user"},
    )
    state = State({"user_id": {"type": str}}, {"user_id": "alice"})
    output = ToolInvoker([lookup_tool]).run(calls(("lookup", {"query": "q", "user": "mallory"})), state=state)
    assert only_result(output) == ("alice:q", False)


def test_planned_call_records_the_dropped_parameters() -> None:
    @tool(inputs_from_state={"user_id": "user"})
    def whoami(user: str, state: State) -> str:
        """Who am I."""
        return user

    spec = tool_spec(whoami)
    (planned,) = plan_calls(calls(("whoami", {"user": "m", "state": 1})), {"whoami": spec})
    assert planned.error is None
    assert planned.arguments == {}
    assert planned.dropped == ("state", "user")


# --- the tool raising -----------------------------------------------------------------------------------


@tool
def explode(reason: str) -> str:
    """Fail."""
    raise ValueError(reason)


def test_a_tool_that_raises_raises_naming_the_tool_and_the_cause() -> None:
    with pytest.raises(ToolExecutionError) as info:
        ToolInvoker([explode]).run(calls(("explode", {"reason": "no disk"})))
    error = info.value
    assert isinstance(error, ToolInvocationError)
    assert error.tool_name == "explode"
    assert str(error) == "Failed to invoke tool 'explode': ValueError: no disk"
    assert isinstance(error.__cause__, ValueError)


def test_a_tool_that_raises_becomes_an_error_result() -> None:
    output = ToolInvoker([explode, echo], raise_on_failure=False).run(
        calls(("explode", {"reason": "no disk"}), ("echo", {"text": "still here"}))
    )
    assert results(output) == [("Failed to invoke tool 'explode': ValueError: no disk", True), ("still here", False)]


def test_a_failing_call_raises_after_the_earlier_ones_merged() -> None:
    state = State({"total": {"type": int}})
    with pytest.raises(ToolExecutionError):
        ToolInvoker([add, explode]).run(calls(("add", {"a": 1, "b": 1}), ("explode", {"reason": "x"})), state=state)
    assert state.get("total") == 2


# --- injected State ----------------------------------------------------------------------------------------


def test_writes_through_the_injected_state_are_merged() -> None:
    @tool
    def remember(note: str, state: State) -> str:
        """Remember."""
        state.set("notes", note)
        state.set("count", (state.get("count") or 0) + 1)
        return "ok"

    state = State({"notes": {"type": list[str]}, "count": {"type": int}}, {"notes": ["first"]})
    ToolInvoker([remember]).run(calls(("remember", {"note": "a"}), ("remember", {"note": "b"})), state=state)
    assert state.data == {"notes": ["first", "a", "b"], "count": 2}


def test_the_injected_state_is_staged() -> None:
    seen: list[Any] = []

    @tool
    def inspect_state(state: State) -> str:
        """Inspect."""
        seen.append(type(state))
        state.set("x", 2)
        seen.append(state.get("x"))
        return "ok"

    state = State({"x": {"type": int}}, {"x": 1})
    ToolInvoker([inspect_state]).run(calls(("inspect_state", {})), state=state)
    assert seen == [StagedState, 2]
    assert state.get("x") == 2


def test_a_tool_that_writes_then_raises_leaves_state_untouched() -> None:
    @tool(outputs_to_state={"log": {}})
    def half_done(state: State) -> str:
        """Write, then fail."""
        state.set("notes", ["written"])
        state.set("count", 99)
        state.reset("flag")
        raise RuntimeError("crashed mid-way")

    state = State(
        {"notes": {"type": list[str]}, "count": {"type": int}, "flag": {"type": bool}, "log": {"type": str}},
        {"notes": ["kept"], "count": 1, "flag": True},
    )
    before = state.data
    output = ToolInvoker([half_done], raise_on_failure=False).run(calls(("half_done", {})), state=state)
    text, error = only_result(output)
    assert error is True and "crashed mid-way" in text
    assert state.data == before

    with pytest.raises(ToolExecutionError):
        ToolInvoker([half_done]).run(calls(("half_done", {})), state=state)
    assert state.data == before


def test_a_write_the_tool_saw_fail_through_the_injected_state_is_not_merged() -> None:
    @tool
    def careful(state: State) -> str:
        """Try an update that fails, and carry on."""
        with contextlib.suppress(StateTypeError):
            state.update({"a": 1, "b": "not an int"})
        state.set("c", 3)
        return f"a={state.get('a')}"

    state = State({"a": {"type": int}, "b": {"type": int}, "c": {"type": int}})
    output = ToolInvoker([careful]).run(calls(("careful", {})), state=state)
    assert only_result(output) == ("a=None", False)
    assert state.data == {"c": 3}


def test_injected_state_sees_earlier_merged_calls() -> None:
    @tool
    def bump(state: State) -> int:
        """Bump."""
        value = (state.get("n") or 0) + 1
        state.set("n", value)
        return value

    state = State({"n": {"type": int}})
    output = ToolInvoker([bump]).run(calls(*[("bump", {})] * 5), state=state)
    assert [text for text, _ in results(output)] == ["1", "2", "3", "4", "5"]
    assert state.get("n") == 5


@pytest.mark.parametrize(
    "annotation", ["State", "State | None", "Annotated[State, 'the state']", "HaystackState", "HaystackState | None"]
)
def test_state_annotations_are_injected(annotation: str) -> None:
    namespace: dict[str, Any] = {"State": State, "HaystackState": HaystackState, "Annotated": Annotated}
    exec(
        f"def peek(key: str, state: {annotation} = None) -> object:\n"
        "    '''Peek.'''\n"
        "    state.set('seen', True)\n"
        "    return state.get(key)\n",
        namespace,
    )
    peek = tool(namespace["peek"])
    state = State({"x": {"type": int}, "seen": {"type": bool}}, {"x": 3})
    assert only_result(ToolInvoker([peek]).run(calls(("peek", {"key": "x"})), state=state)) == ("3", False)
    assert state.get("seen") is True


# --- merging ----------------------------------------------------------------------------------------------------


def test_outputs_to_state_without_source_merges_the_whole_result() -> None:
    @tool(outputs_to_state={"docs": {}, "last": {"handler": replace_values}})
    def find(q: str) -> list[str]:
        """Find."""
        return [q, q + "!"]

    state = State({"docs": {"type": list[str]}, "last": {"type": list[str]}}, {"docs": ["old"]})
    ToolInvoker([find]).run(calls(("find", {"q": "a"}), ("find", {"q": "b"})), state=state)
    assert state.data == {"docs": ["old", "a", "a!", "b", "b!"], "last": ["b", "b!"]}


def test_outputs_to_state_with_source_merges_that_entry() -> None:
    @tool(outputs_to_state={"docs": {"source": "documents"}, "hits": {"source": "count"}})
    def search(q: str) -> dict[str, Any]:
        """Search."""
        return {"documents": [q], "count": 1, "ignored": "x"}

    state = State({"docs": {"type": list[str]}, "hits": {"type": int}})
    ToolInvoker([search]).run(calls(("search", {"q": "a"}), ("search", {"q": "b"})), state=state)
    assert state.data == {"docs": ["a", "b"], "hits": 1}


def test_outputs_to_state_skips_a_missing_source() -> None:
    @tool(outputs_to_state={"docs": {"source": "documents"}, "hits": {"source": "count"}})
    def search(q: str) -> dict[str, Any]:
        """Search."""
        return {"documents": [q]}

    state = State({"docs": {"type": list[str]}, "hits": {"type": int}}, {"hits": 9})
    ToolInvoker([search]).run(calls(("search", {"q": "a"})), state=state)
    assert state.data == {"docs": ["a"], "hits": 9}


def test_outputs_to_state_with_a_handler_override() -> None:
    @tool(outputs_to_state={"log": {"source": "line", "handler": concat}, "docs": {"handler": merge_lists}})
    def note(line: str) -> dict[str, Any]:
        """Note."""
        return {"line": line}

    state = State({"log": {"type": str}, "docs": {"type": list[dict[str, str]]}}, {"log": ">"})
    ToolInvoker([note]).run(calls(("note", {"line": "a"}), ("note", {"line": "b"})), state=state)
    assert state.get("log") == ">ab"  # the default handler of a str key would have replaced
    assert state.get("docs") == [{"line": "a"}, {"line": "b"}]


def test_a_merge_that_fails_the_type_check_leaves_state_untouched() -> None:
    @tool(outputs_to_state={"docs": {"source": "docs"}, "total": {"source": "total"}})
    def report(n: int) -> dict[str, Any]:
        """Report."""
        return {"docs": ["fine"], "total": "not a number"}

    state = State({"docs": {"type": list[str]}, "total": {"type": int}}, {"docs": ["kept"], "total": 1})
    output = ToolInvoker([report], raise_on_failure=False).run(calls(("report", {"n": 1})), state=state)
    text, error = only_result(output)
    assert error is True
    assert "Tool 'report'" in text and "'total'" in text and "int" in text
    assert state.data == {"docs": ["kept"], "total": 1}

    with pytest.raises(ToolMergeError) as info:
        ToolInvoker([report]).run(calls(("report", {"n": 1})), state=state)
    assert info.value.tool_name == "report"
    assert isinstance(info.value, ToolInvocationError)
    assert isinstance(info.value.__cause__, StateTypeError)
    assert state.data == {"docs": ["kept"], "total": 1}


def test_a_merge_whose_handler_raises_leaves_state_untouched() -> None:
    @tool(outputs_to_state={"docs": {"source": "docs"}, "log": {"source": "log", "handler": failing_handler}})
    def work(n: int) -> dict[str, Any]:
        """Work."""
        return {"docs": ["new"], "log": "x"}

    state = State({"docs": {"type": list[str]}, "log": {"type": str}}, {"docs": ["kept"]})
    output = ToolInvoker([work], raise_on_failure=False).run(calls(("work", {"n": 1})), state=state)
    text, error = only_result(output)
    assert error is True and "Tool 'work'" in text and "handler refuses" in text and "'log'" in text
    assert state.data == {"docs": ["kept"]}
    with pytest.raises(ToolMergeError, match="handler refuses"):
        ToolInvoker([work]).run(calls(("work", {"n": 1})), state=state)
    assert state.data == {"docs": ["kept"]}


def test_a_merge_to_an_unknown_key_leaves_state_untouched() -> None:
    @tool(outputs_to_state={"docs": {"source": "docs"}, "nowhere": {"source": "docs"}})
    def work(n: int) -> dict[str, Any]:
        """Work."""
        return {"docs": ["new"]}

    state = State({"docs": {"type": list[str]}}, {"docs": ["kept"]})
    output = ToolInvoker([work], raise_on_failure=False).run(calls(("work", {"n": 1})), state=state)
    text, error = only_result(output)
    assert error is True and "'nowhere'" in text
    assert state.data == {"docs": ["kept"]}


def test_a_failed_merge_drops_the_writes_made_through_the_injected_state() -> None:
    @tool(outputs_to_state={"total": {}})
    def both(state: State) -> str:
        """Write through the state, then return a result that does not fit."""
        state.set("notes", "staged")
        return "not an int"

    state = State({"notes": {"type": list[str]}, "total": {"type": int}}, {"notes": ["kept"]})
    output = ToolInvoker([both], raise_on_failure=False).run(calls(("both", {})), state=state)
    assert only_result(output)[1] is True
    assert state.data == {"notes": ["kept"]}


def test_the_state_given_to_the_tool_is_isolated() -> None:
    @tool(inputs_from_state={"docs": "docs"})
    def mutate(docs: list[dict[str, Any]]) -> int:
        """Try to mutate what was read."""
        docs.append({"id": "injected"})
        with contextlib.suppress(TypeError):
            docs[0]["id"] = "changed"
        return len(docs)

    state = State({"docs": {"type": list[dict[str, Any]]}}, {"docs": [{"id": "a"}]})
    assert only_result(ToolInvoker([mutate]).run(calls(("mutate", {})), state=state)) == ("2", False)
    assert state.get("docs") == [{"id": "a"}]


# --- the result message (outputs_to_string) ---------------------------------------------------------------------


@dataclasses.dataclass
class Weather:
    city: str
    degrees: float


class Unserializable:
    def __str__(self) -> str:
        return "<unserializable>"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain text", "plain text"),
        ({"a": 1, "é": [1, 2]}, '{"a": 1, "é": [1, 2]}'),
        ([1, "two", None], '[1, "two", null]'),
        (3, "3"),
        (None, "null"),
        (Weather("Rome", 21.5), '{"city": "Rome", "degrees": 21.5}'),
        (Unserializable(), "<unserializable>"),
        ({1, 2}, "[1, 2]"),
        (b"bytes", "b'bytes'"),
    ],
)
def test_results_are_rendered_as_text(value: Any, expected: str) -> None:
    assert result_to_string(value) == expected


def test_result_rendering_never_raises() -> None:
    class BrokenToDict:
        def to_dict(self) -> dict[str, Any]:
            raise AttributeError("broken")

        def __str__(self) -> str:
            return "broken-object"

    looped: list[Any] = []
    looped.append(looped)
    assert result_to_string(BrokenToDict()) == "broken-object"
    assert result_to_string(looped) == "[[...]]"


def test_outputs_to_string_source() -> None:
    @tool(outputs_to_string={"source": "answer"})
    def ask(q: str) -> dict[str, Any]:
        """Ask."""
        return {"answer": {"text": q}, "debug": "hidden from the model"}

    assert only_result(ToolInvoker([ask]).run(calls(("ask", {"q": "hi"})))) == ('{"text": "hi"}', False)


def test_outputs_to_string_handler() -> None:
    @tool(outputs_to_string={"source": "answer", "handler": shout})
    def ask(q: str) -> dict[str, Any]:
        """Ask."""
        return {"answer": q}

    assert only_result(ToolInvoker([ask]).run(calls(("ask", {"q": "hi"})))) == ("HI", False)


def test_outputs_to_string_raw_result() -> None:
    @tool(outputs_to_string={"source": "content", "raw_result": True})
    def picture(q: str) -> dict[str, Any]:
        """Picture."""
        return {"content": [TextContent(text=q)]}

    output = ToolInvoker([picture]).run(calls(("picture", {"q": "described"})))
    result = output["tool_messages"][0].tool_call_results[0]
    assert result.result == [TextContent(text="described")]
    assert result.error is False


def test_outputs_to_string_per_output() -> None:
    @tool(outputs_to_string={"summary": {"source": "docs", "handler": len}, "first": {"source": "first"}})
    def search(q: str) -> dict[str, Any]:
        """Search."""
        return {"docs": ["a", "b", "c"], "first": {"id": 1}, "debug": "x"}

    text, error = only_result(ToolInvoker([search]).run(calls(("search", {"q": "x"}))))
    assert error is False
    assert json.loads(text) == {"summary": 3, "first": '{"id": 1}'}


def test_outputs_to_string_handler_that_raises_fails_the_call_and_merges_nothing() -> None:
    def broken(value: Any) -> str:
        raise ValueError("cannot render")

    @tool(outputs_to_state={"total": {"source": "n"}}, outputs_to_string={"handler": broken})
    def count(n: int, state: State) -> dict[str, int]:
        """Count."""
        state.set("log", "counted")
        return {"n": n}

    state = State({"total": {"type": int}, "log": {"type": str}}, {"total": 1})
    output = ToolInvoker([count], raise_on_failure=False).run(calls(("count", {"n": 5})), state=state)
    text, error = only_result(output)
    assert error is True and "Tool 'count'" in text and "cannot render" in text
    assert state.data == {"total": 1}
    with pytest.raises(ToolExecutionError, match="cannot render"):
        ToolInvoker([count]).run(calls(("count", {"n": 5})), state=state)
    assert state.data == {"total": 1}


# --- haystack-ai's own tool formats ---------------------------------------------------------------------------


@haystack_tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"source": "note"}})
def hs_note(text: str, user: str) -> dict[str, str]:
    """Take a note (haystack-ai's @tool)."""
    return {"note": f"{user}: {text}"}


@haystack_tool(outputs_to_state={"count": {"source": "count", "handler": lambda old, new: (old or 0) + new}})
def hs_count(state: HaystackState, amount: int) -> dict[str, int]:
    """Count with haystack-ai's State annotation."""
    state.set("seen", [amount])
    return {"count": amount}


def test_haystack_tool_decorator_with_state_mappings() -> None:
    state = State({"user_id": {"type": str}, "notes": {"type": list[str]}}, {"user_id": "alice"})
    output = ToolInvoker([hs_note]).run(calls(("hs_note", {"text": "hi", "user": "mallory"})), state=state)
    assert only_result(output) == ('{"note": "alice: hi"}', False)
    assert state.get("notes") == ["alice: hi"]


def test_haystack_tool_with_haystack_state_annotation_and_handler() -> None:
    state = State({"count": {"type": int}, "seen": {"type": list[int]}}, {"count": 10})
    ToolInvoker([hs_count]).run(calls(("hs_count", {"amount": 2}), ("hs_count", {"amount": 3})), state=state)
    assert state.data == {"count": 15, "seen": [2, 3]}


def test_haystack_tool_with_haystack_state_that_raises_leaves_state_untouched() -> None:
    @haystack_tool
    def fail_after_write(state: HaystackState) -> str:
        """Fail after writing."""
        state.set("seen", [1])
        raise KeyError("gone")

    state = State({"seen": {"type": list[int]}}, {"seen": [0]})
    output = ToolInvoker([fail_after_write], raise_on_failure=False).run(calls(("fail_after_write", {})), state=state)
    text, error = only_result(output)
    assert error and text == "Failed to invoke tool 'fail_after_write': KeyError: 'gone'"
    assert state.data == {"seen": [0]}


def test_haystack_tool_built_by_hand() -> None:
    def multiply(x: int, factor: int) -> dict[str, int]:
        return {"product": x * factor}

    multiply_tool = Tool(
        name="multiply",
        description="Multiply.",
        parameters={"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        function=multiply,
        inputs_from_state={"factor": "factor"},
        outputs_to_state={"result": {"source": "product"}},
        outputs_to_string={"source": "product"},
    )
    state = State({"factor": {"type": int}, "result": {"type": int}}, {"factor": 3})
    output = ToolInvoker([multiply_tool]).run(calls(("multiply", {"x": 4})), state=state)
    assert only_result(output) == ("12", False)
    assert state.get("result") == 12
    bad = ToolInvoker([multiply_tool], raise_on_failure=False).run(calls(("multiply", {"x": "4"})), state=state)
    assert only_result(bad)[1] is True


@component
class Retriever:
    """Find documents."""

    @component.output_types(documents=list[str], count=int)
    def run(self, query: str, user: str, top_k: int = 2) -> dict[str, Any]:
        """
        Find documents.

        :param query: What to find.
        :param user: The user.
        :param top_k: How many.
        """
        return {"documents": [f"{user}/{query}/{i}" for i in range(top_k)], "count": top_k}


@component
class StatefulCounter:
    """Count into the state."""

    @component.output_types(total=int)
    def run(self, amount: int, state: HaystackState) -> dict[str, int]:
        """
        Count.

        :param amount: How much.
        """
        state.set("seen", [amount])
        return {"total": amount}


def test_haystack_component_tool() -> None:
    retrieve = HaystackComponentTool(
        Retriever(),
        name="retrieve",
        inputs_from_state={"user_id": "user"},
        outputs_to_state={"docs": {"source": "documents"}},
        outputs_to_string={"source": "count"},
    )
    state = State({"user_id": {"type": str}, "docs": {"type": list[str]}}, {"user_id": "u1"})
    output = ToolInvoker([retrieve]).run(
        calls(("retrieve", {"query": "q", "top_k": 3, "user": "mallory"})), state=state
    )
    assert only_result(output) == ("3", False)
    assert state.get("docs") == ["u1/q/0", "u1/q/1", "u1/q/2"]


def test_haystack_component_tool_with_haystack_state_socket() -> None:
    counter = HaystackComponentTool(StatefulCounter(), name="counter", outputs_to_state={"total": {"source": "total"}})
    state = State({"total": {"type": int}, "seen": {"type": list[int]}})
    ToolInvoker([counter]).run(calls(("counter", {"amount": 4})), state=state)
    assert state.data == {"total": 4, "seen": [4]}


def test_our_component_tool() -> None:
    counter = ComponentTool(StatefulCounter(), name="counter", outputs_to_state={"total": {"source": "total"}})
    retrieve = ComponentTool(Retriever(), inputs_from_state={"user_id": "user"}, outputs_to_state={"docs": {}})
    state = State(
        {"total": {"type": int}, "seen": {"type": list[int]}, "docs": {"type": dict}, "user_id": {"type": str}}
    )
    state.set("user_id", "u")
    ToolInvoker([counter, retrieve]).run(calls(("counter", {"amount": 1}), ("retriever", {"query": "q"})), state=state)
    assert state.get("total") == 1 and state.get("seen") == [1]
    assert state.get("docs") == {"documents": ["u/q/0", "u/q/1"], "count": 2}


def test_toolset_and_mixed_tool_lists() -> None:
    toolset = Toolset([add, hs_note])
    state = State({"total": {"type": int}, "notes": {"type": list[str]}, "user_id": {"type": str}}, {"user_id": "u"})
    output = ToolInvoker([toolset, echo]).run(
        calls(("add", {"a": 1, "b": 2}), ("hs_note", {"text": "n"}), ("echo", {"text": "e"})), state=state
    )
    assert [error for _, error in results(output)] == [False, False, False]
    assert state.data == {"total": 3, "notes": ["u: n"], "user_id": "u"}
    output = ToolInvoker(Toolset([echo])).run(calls(("echo", {"text": "only a toolset"})))
    assert only_result(output) == ("only a toolset", False)


# --- async tools ---------------------------------------------------------------------------------------------------


@tool(outputs_to_state={"log": {}})
async def async_double(x: int) -> int:
    """Double, asynchronously."""
    await asyncio.sleep(0)
    return 2 * x


@tool
async def async_fail(x: int) -> int:
    """Fail, asynchronously."""
    await asyncio.sleep(0)
    raise LookupError(f"no {x}")


def test_async_tools_under_run() -> None:
    state = State({"log": {"type": list[int]}})
    output = ToolInvoker([async_double]).run(calls(("async_double", {"x": 1}), ("async_double", {"x": 2})), state=state)
    assert results(output) == [("2", False), ("4", False)]
    assert state.get("log") == [2, 4]
    output = ToolInvoker([async_double]).run(calls(("async_double", {"x": 3})), state=state)
    assert only_result(output) == ("6", False)


def test_async_tools_under_run_async() -> None:
    state = State({"log": {"type": list[int]}})
    output = asyncio.run(
        ToolInvoker([async_double, echo]).run_async(
            calls(("async_double", {"x": 1}), ("echo", {"text": "sync"}), ("async_double", {"x": 2})), state=state
        )
    )
    assert results(output) == [("2", False), ("sync", False), ("4", False)]
    assert state.get("log") == [2, 4]


def test_async_tool_errors_under_both_runners() -> None:
    with pytest.raises(ToolExecutionError, match="LookupError: no 1"):
        ToolInvoker([async_fail]).run(calls(("async_fail", {"x": 1})))
    with pytest.raises(ToolExecutionError, match="LookupError: no 1"):
        asyncio.run(ToolInvoker([async_fail]).run_async(calls(("async_fail", {"x": 1}))))
    output = asyncio.run(ToolInvoker([async_fail], raise_on_failure=False).run_async(calls(("async_fail", {"x": 2}))))
    assert only_result(output) == ("Failed to invoke tool 'async_fail': LookupError: no 2", True)


def test_async_tool_under_run_called_from_inside_an_event_loop() -> None:
    # e.g. a notebook cell: run() is called while an event loop is running in this thread.
    async def main() -> dict[str, Any]:
        state = State({"log": {"type": list[int]}})
        return ToolInvoker([async_double]).run(calls(("async_double", {"x": 5})), state=state)

    output = asyncio.run(main())
    assert only_result(output) == ("10", False)
    assert output["state"].get("log") == [10]


def test_sync_tools_under_run_async_do_not_block_the_loop() -> None:
    release = threading.Event()

    @tool
    def wait_for_release() -> str:
        """Block until released."""
        assert release.wait(5)
        return "released"

    async def main() -> dict[str, Any]:
        task = asyncio.ensure_future(ToolInvoker([wait_for_release]).run_async(calls(("wait_for_release", {}))))
        await asyncio.sleep(0.01)  # the loop still runs while the tool blocks its worker thread
        release.set()
        return await task

    assert only_result(asyncio.run(main())) == ("released", False)


def test_async_injected_state_tool_that_raises_leaves_state_untouched() -> None:
    @tool
    async def half(state: State) -> str:
        """Write, then fail."""
        state.set("n", 1)
        await asyncio.sleep(0)
        raise RuntimeError("late")

    state = State({"n": {"type": int}}, {"n": 0})
    output = asyncio.run(ToolInvoker([half], raise_on_failure=False).run_async(calls(("half", {})), state=state))
    assert only_result(output)[1] is True
    assert state.data == {"n": 0}


def test_run_async_errors_match_run() -> None:
    invoker = ToolInvoker([add, explode], raise_on_failure=False)
    messages = calls(("nope", {}), ("add", {"a": "x", "b": 1}), ("add", '{"a"'), ("explode", {"reason": "r"}))
    sync = results(invoker.run(messages, state=State({"total": {"type": int}})))
    asynchronous = results(asyncio.run(invoker.run_async(messages, state=State({"total": {"type": int}}))))
    assert sync == asynchronous
    assert [error for _, error in sync] == [True, True, True, True]


# --- tools= at run time -------------------------------------------------------------------------------------------


def test_runtime_tools_override_the_constructor_tools() -> None:
    invoker = ToolInvoker([echo], raise_on_failure=False)
    state = State({"total": {"type": int}})
    output = invoker.run(calls(("add", {"a": 1, "b": 1}), ("echo", {"text": "x"})), state=state, tools=[add])
    (_, first_error), (second, second_error) = results(output)
    assert first_error is False and state.get("total") == 2
    assert second_error is True and "'echo' not found" in second and "Available tools: add" in second
    # the constructor tools are used again afterwards
    assert only_result(invoker.run(calls(("echo", {"text": "back"})))) == ("back", False)
    output = asyncio.run(invoker.run_async(calls(("add", {"a": 2, "b": 2})), state=state, tools=Toolset([add])))
    assert only_result(output) == ('{"sum": 4}', False)


@pytest.mark.slow
def test_runtime_tools_do_not_leak_validators() -> None:
    from haystack_state.invocation import calls as calls_module

    invoker = ToolInvoker([echo])
    for _ in range(3):
        invoker.run(calls(("add", {"a": 1, "b": 1})), state=State({"total": {"type": int}}), tools=[add])
    gc.collect()
    before = len(calls_module._CHECKERS)
    for _ in range(20):
        invoker.run(calls(("add", {"a": 1, "b": 1})), state=State({"total": {"type": int}}), tools=[add])
    gc.collect()
    assert len(calls_module._CHECKERS) <= before + 1


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


# --- argument checking: the quick path agrees with jsonschema -----------------------------------------------------


def test_a_tool_whose_schema_is_broken_is_called_with_unchecked_arguments(caplog: pytest.LogCaptureFixture) -> None:
    def square(x: Any) -> Any:
        return x * x

    square_tool = Tool(
        name="square",
        description="Square.",
        parameters={"type": "object", "properties": {"x": {"type": "number"}}},
        function=square,
    )
    square_tool.parameters = {"type": "object", "properties": {"x": {"type": "no-such-type", "minimum": 0}}}
    with caplog.at_level(logging.WARNING):
        output = ToolInvoker([square_tool]).run(calls(("square", {"x": 3})))
    assert only_result(output) == ("9", False)
    assert "passed unchecked" in caplog.text


JSON_TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=4,
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    types=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(JSON_TYPES), max_size=3),
    required=st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3),
    closed=st.booleans(),
    arguments=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), json_values, max_size=4),
)
def test_quick_argument_check_accepts_only_what_jsonschema_accepts(
    types: dict[str, str], required: list[str], closed: bool, arguments: dict[str, Any]
) -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {name: {"type": kind, "description": name} for name, kind in types.items()},
        "required": required,
    }
    if closed:
        schema["additionalProperties"] = False
    checker = _checker(tool_spec(Tool(name="t", description="t", parameters=schema, function=lambda **kw: kw)))
    assert checker.types is not None  # a flat schema: the quick path is used
    valid = Draft202012Validator(schema).is_valid(arguments)
    if checker.quick(arguments):
        assert valid
    # and _validate, quick path or not, agrees with jsonschema (the tool takes **kwargs: extras are the schema's call)
    spec = tool_spec(Tool(name="t", description="t", parameters=schema, function=lambda **kw: kw))
    assert spec.accepts_any_keyword
    try:
        _validate(spec, dict(arguments))
    except ToolArgumentsError:
        assert not valid
    else:
        assert valid


@pytest.mark.parametrize(
    ("schema", "bad"),
    [
        ({"type": "object", "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}, "x"),
        ({"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}}}, -1),
        ({"type": "object", "properties": {"x": {"type": ["integer", "string"]}}}, [1]),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": "integer"}}}, "x"),
        ({"type": "object", "properties": {"x": {"type": "array", "items": {"type": "integer"}}}}, ["x"]),
    ],
)
def test_schemas_with_constraints_go_to_jsonschema(schema: dict[str, Any], bad: Any) -> None:
    spec = tool_spec(Tool(name="t", description="t", parameters=schema, function=lambda **kw: kw))
    assert _checker(spec).types is None
    with pytest.raises(ToolArgumentsError, match="parameter 'x"):
        _validate(spec, {"x": bad})


def test_a_haystack_ai_state_is_refused_with_the_fix() -> None:
    haystack_state = HaystackState({"total": {"type": int}}, {"total": 1})
    with pytest.raises(TypeError, match=r"State.from_dict\(state.to_dict\(\)\)"):
        ToolInvoker([add]).run(calls(("add", {"a": 1, "b": 1})), state=haystack_state)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="haystack_state State"):
        asyncio.run(ToolInvoker([add]).run_async(calls(("add", {"a": 1, "b": 1})), state=haystack_state))  # type: ignore[arg-type]
    converted = State.from_dict(haystack_state.to_dict())
    ToolInvoker([add]).run(calls(("add", {"a": 1, "b": 1})), state=converted)
    assert converted.get("total") == 2


def test_haystack_state_annotation_on_an_async_tool_under_run_async() -> None:
    @haystack_tool
    async def async_note(text: str, state: HaystackState) -> str:
        """Note, asynchronously."""
        await asyncio.sleep(0)
        state.set("seen", [len(text)])
        return text

    state = State({"seen": {"type": list[int]}})
    output = asyncio.run(ToolInvoker([async_note]).run_async(calls(("async_note", {"text": "abc"})), state=state))
    assert only_result(output) == ("abc", False)
    assert state.get("seen") == [3]


def test_a_tool_may_run_a_tool_invoker_itself() -> None:
    inner = ToolInvoker([add], max_workers=1)

    @tool(outputs_to_state={"log": {}})
    def delegate(a: int) -> int:
        """Run an inner invoker with two parallel calls."""
        inner_state = State({"total": {"type": int}})
        inner.run(calls(("add", {"a": a, "b": 1}), ("add", {"a": a, "b": 2})), state=inner_state)
        return inner_state.get("total")

    state = State({"log": {"type": list[int]}})
    ToolInvoker([delegate], max_workers=1).run(calls(*[("delegate", {"a": i}) for i in range(3)]), state=state)
    assert state.get("log") == [2, 3, 4]


def test_a_value_for_a_parameter_missing_from_the_schema_is_dropped() -> None:
    def fetch(query: str, api_key: str = "server-side-key") -> str:
        return f"{query} with {api_key}"

    fetch_tool = Tool(
        name="fetch",
        description="Fetch.",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        function=fetch,
    )
    output = ToolInvoker([fetch_tool]).run(calls(("fetch", {"query": "q", "api_key": "attacker-key"})))
    assert only_result(output) == ("q with server-side-key", False)


@pytest.mark.parametrize(
    ("messages", "error_class"),
    [
        (calls(("nope", {})), ToolNotFoundError),
        (calls(("add", {"a": "1", "b": 2})), ToolArgumentsError),
        (calls(("add", "{oops")), ToolArgumentsError),
        (calls(("explode", {"reason": "r"})), ToolExecutionError),
        (calls(("add", {"a": 1, "b": 2})), ToolMergeError),  # the empty state has no "total" key
    ],
)
def test_every_failure_is_a_tool_invocation_error_naming_the_tool(
    messages: list[ChatMessage], error_class: type[ToolInvocationError]
) -> None:
    with pytest.raises(error_class) as info:
        ToolInvoker([add, explode]).run(messages)
    assert isinstance(info.value, ToolInvocationError)
    name = messages[0].tool_calls[0].tool_name
    assert info.value.tool_name == name
    assert f"'{name}'" in str(info.value)


# --- a parameter filled from a state key that holds no value --------------------------------------------------


@tool(inputs_from_state={"user_id": "user"})
def whoami(user: str) -> str:
    """Say who the user is."""
    return f"user {user}"


@tool(inputs_from_state={"user_id": "user"})
def whoami_or_guest(user: str = "guest") -> str:
    """Say who the user is, or guest."""
    return f"user {user}"


@pytest.mark.parametrize("run_async", [False, True])
def test_a_required_parameter_from_an_empty_state_key_is_an_error_naming_the_key(run_async: bool) -> None:
    state = State({"user_id": {"type": str}})
    invoker = ToolInvoker([whoami], raise_on_failure=False)
    message = calls(("whoami", {}))
    output = asyncio.run(invoker.run_async(message, state=state)) if run_async else invoker.run(message, state=state)
    [(text, error)] = results(output)
    assert error is True
    assert "'whoami'" in text and "'user'" in text and "state key 'user_id'" in text
    assert state.data == {}


def test_an_empty_state_key_raises_a_typed_error_with_raise_on_failure() -> None:
    with pytest.raises(ToolArgumentsError, match="state key 'user_id', which holds no value"):
        ToolInvoker([whoami]).run(calls(("whoami", {})), state=State({"user_id": {"type": str}}))


def test_an_optional_parameter_from_an_empty_state_key_keeps_its_default() -> None:
    output = ToolInvoker([whoami_or_guest]).run(calls(("whoami_or_guest", {})), state=State({"user_id": {"type": str}}))
    assert results(output) == [("user guest", False)]


def test_calls_after_one_that_cannot_start_still_run_in_order() -> None:
    state = State({"user_id": {"type": str}})
    output = ToolInvoker([whoami, whoami_or_guest], raise_on_failure=False).run(
        calls(("whoami", {}), ("whoami_or_guest", {}), ("whoami", {})), state=state
    )
    assert [error for _, error in results(output)] == [True, False, True]
