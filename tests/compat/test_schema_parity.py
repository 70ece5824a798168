"""
Schema parity with haystack-ai 3.4, side by side: every corpus entry is built into a tool by haystack-ai and by us,
and the schemas (and descriptions) the model sees must be equal; then real calls with the corpus's valid and invalid
arguments go through our ToolInvoker, whose JSON Schema validation must accept exactly what the schema says.
"""

import warnings
from collections.abc import Mapping
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Tool, create_tool_from_function
from haystack.tools.errors import SchemaGenerationError
from jsonschema import Draft202012Validator

from compat.postponed_corpus import POSTPONED_CASES
from compat.schema_corpus import CASES, Case
from haystack_state import State, ToolInvoker
from haystack_state.tools import ComponentTool, tool

ALL_CASES = [*CASES, *POSTPONED_CASES]
MATCHING = [case for case in ALL_CASES if case.haystack_broken is None]
BROKEN_IN_HAYSTACK = [case for case in ALL_CASES if case.haystack_broken is not None]


def haystack_tool(case: Case) -> Tool:
    with warnings.catch_warnings():  # pydantic warns about fields named like BaseModel attributes (json, copy...)
        warnings.simplefilter("ignore")
        if case.kind == "function":
            return create_tool_from_function(case.make(), **case.options)
        return HaystackComponentTool(case.make(), **case.options)


def our_tool(case: Case) -> Tool:
    if case.kind == "function":
        return tool(case.make(), **case.options)
    return ComponentTool(case.make(), **case.options)


def without(schema: dict[str, Any], hidden: tuple[str, ...]) -> dict[str, Any]:
    """haystack-ai's schema without the parameters we hide."""
    if not hidden:
        return schema
    result = dict(schema)
    result["properties"] = {name: sub for name, sub in schema["properties"].items() if name not in hidden}
    required = [name for name in schema.get("required", []) if name not in hidden]
    result.pop("required", None)
    if required:
        result["required"] = required
    return result


def expected_schema(case: Case) -> dict[str, Any]:
    if case.reference is not None:
        return case.reference
    return without(haystack_tool(case).parameters, case.hidden)


def test_the_corpus_is_large_and_mostly_comparable() -> None:
    assert len(ALL_CASES) >= 30
    assert len({case.id for case in ALL_CASES}) == len(ALL_CASES)
    assert len(MATCHING) >= 30
    assert {case.kind for case in MATCHING} == {"function", "component"}


@pytest.mark.slow
@pytest.mark.parametrize("case", MATCHING, ids=[case.id for case in MATCHING])
def test_schema_and_description_equal_haystack_ai(case: Case) -> None:
    theirs = haystack_tool(case)
    ours = our_tool(case)
    assert ours.parameters == without(theirs.parameters, case.hidden)
    assert ours.description == theirs.description
    assert ours.name == theirs.name
    Draft202012Validator.check_schema(ours.parameters)


@pytest.mark.parametrize("case", BROKEN_IN_HAYSTACK, ids=[case.id for case in BROKEN_IN_HAYSTACK])
def test_where_haystack_ai_breaks_we_make_a_usable_schema(case: Case) -> None:
    # haystack-ai still fails on this entry (if a release fixes it, the entry moves to the equality test)
    with pytest.raises((SchemaGenerationError, ValueError, TypeError)):
        haystack_tool(case)
    ours = our_tool(case)
    assert ours.parameters == case.reference
    Draft202012Validator.check_schema(ours.parameters)


def run_call(case: Case, arguments: Mapping[str, Any]) -> Any:
    made = our_tool(case)
    state = State({key: {"type": type(value)} for key, value in case.state.items()}, dict(case.state))
    reply = ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name=made.name, arguments=dict(arguments), id="c1")])
    result = ToolInvoker(tools=[made], raise_on_failure=False).run(messages=[reply], state=state)
    [message] = result["tool_messages"]
    return message.tool_call_result


VALID = [(case, arguments) for case in ALL_CASES for arguments in case.valid]
INVALID = [(case, arguments, name) for case in ALL_CASES for arguments, name in case.invalid]


@pytest.mark.parametrize(
    ("case", "arguments"), VALID, ids=[f"{case.id}-{index}" for index, (case, _) in enumerate(VALID)]
)
def test_valid_arguments_pass_validation_and_run(case: Case, arguments: dict[str, Any]) -> None:
    assert Draft202012Validator(expected_schema(case)).is_valid(arguments)  # haystack-ai's schema agrees
    result = run_call(case, arguments)
    assert result.error is False, result.result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "arguments", "name"),
    INVALID,
    ids=[f"{case.id}-{name}" for case, _, name in INVALID],
)
def test_invalid_arguments_are_refused_naming_the_parameter(case: Case, arguments: dict[str, Any], name: str) -> None:
    assert not Draft202012Validator(expected_schema(case)).is_valid(arguments)  # haystack-ai's schema agrees
    result = run_call(case, arguments)
    assert result.error is True
    assert f"Tool '{our_tool(case).name}'" in result.result
    assert f"'{name}" in result.result, result.result


def test_every_corpus_entry_has_a_call_that_runs() -> None:
    assert all(case.valid for case in ALL_CASES)
    assert sum(1 for case in ALL_CASES if case.invalid) >= 30
