"""
Tests of ``ToolInvoker``: its construction and sockets, and what one tool call does before and around the call:
resolving the tool, validating the model's arguments, hidden parameters, and a tool that raises.

The injected State, merging and rendering are in ``test_invoker_state.py``; haystack-ai's tool formats, async tools
and run-time tools in ``test_invoker_formats.py``; streaming and serialization in ``test_invoker_streaming.py``;
the quick argument check and state keys without a value in ``test_invoker_checks.py``. Parallel execution, ordering
and determinism are in ``test_invoker_parallel.py``; pipelines in ``test_invoker_pipeline.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Callable
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import Tool

from haystack_state import (
    State,
    ToolArgumentsError,
    ToolExecutionError,
    ToolInvocationError,
    ToolInvoker,
    ToolNotFoundError,
    tool,
    tool_spec,
)
from haystack_state.invocation._calls import plan_calls
from invocation.invoker_tools import (
    add,
    calls,
    echo,
    explode,
    only_result,
    results,
)

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
