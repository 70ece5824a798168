"""
Tests of ``ToolInvoker``'s argument checks (the quick path agrees with jsonschema), odd inputs (a haystack-ai State,
a tool running a ``ToolInvoker``), every failure naming the tool, and parameters filled from a state key that holds
no value.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import ChatMessage
from haystack.tools import Tool
from haystack.tools import tool as haystack_tool
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from haystack_state import (
    State,
    ToolArgumentsError,
    ToolExecutionError,
    ToolInvocationError,
    ToolInvoker,
    ToolMergeError,
    ToolNotFoundError,
    tool,
    tool_spec,
)
from haystack_state.invocation._calls import _checker, _validate
from invocation.invoker_tools import (
    add,
    calls,
    explode,
    only_result,
    results,
)

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
