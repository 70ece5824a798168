"""Tests of ``@tool``: the errors it raises at decoration time, every problem of a definition at once."""

from collections.abc import Callable
from typing import Any

import pytest

from haystack_state.errors import ToolDefinitionError
from haystack_state.state import State
from haystack_state.tools import tool
from tools.tool_helpers import Opaque, properties

# --- decoration-time errors ------------------------------------------------------------------------


def definition_error(build: Callable[[], Any]) -> ToolDefinitionError:
    with pytest.raises(ToolDefinitionError) as info:
        build()
    return info.value


def handler(current: Any, new: Any) -> Any:
    return new


def test_inputs_from_state_naming_a_missing_parameter() -> None:
    def f(query: str) -> None:
        """F."""

    error = definition_error(lambda: tool(f, inputs_from_state={"user_id": "user"}))
    assert error.tool_name == "f"
    assert len(error.problems) == 1
    assert "'user_id'" in error.problems[0] and "'user'" in error.problems[0] and "'f'" in error.problems[0]
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("outputs_to_state", "fragment"),
    [
        ({"docs": ["source"]}, "must be a dict"),
        ({"docs": {"source": "x", "merge": handler}}, "unknown key(s) ['merge']"),
        ({"docs": {"handler": "not callable"}}, "not callable"),
        ({"docs": {"handler": lambda new: new}}, "cannot be called as handler(current, new)"),
        ({"docs": {"source": 3}}, "source 3"),
        ({"docs": {"source": ""}}, "non-empty string"),
    ],
)
def test_malformed_outputs_to_state(outputs_to_state: dict[str, Any], fragment: str) -> None:
    def f(query: str) -> dict[str, Any]:
        """F."""
        return {}

    error = definition_error(lambda: tool(f, outputs_to_state=outputs_to_state))
    assert len(error.problems) == 1
    assert fragment in error.problems[0]
    assert "Tool 'f'" in error.problems[0] and "'docs'" in error.problems[0]


@pytest.mark.parametrize(
    ("annotation", "fragment"),
    [(Opaque, "JSON schema"), (Callable[[int], int], "callable")],
)
def test_required_parameter_nobody_can_supply(annotation: Any, fragment: str) -> None:
    def f(query: str, thing: Any) -> None:
        """F."""

    f.__annotations__["thing"] = annotation
    error = definition_error(lambda: tool(f))
    assert len(error.problems) == 1
    assert "'thing'" in error.problems[0] and fragment in error.problems[0]


def test_unrepresentable_parameter_is_fine_when_filled_from_state_or_defaulted() -> None:
    @tool(inputs_from_state={"client": "client"})
    def f(query: str, client: Opaque, other: Opaque | None = None) -> None:
        """F."""

    assert list(properties(f)) == ["query"]


def test_missing_annotation_and_positional_only_and_required_streaming_callback() -> None:
    def f(a, /, b, streaming_callback: Callable[..., None]) -> None:  # type: ignore[no-untyped-def]
        """F."""

    error = definition_error(lambda: tool(f))
    joined = "\n".join(error.problems)
    assert len(error.problems) == 3
    assert "'a' is positional-only" in joined
    assert "'b' has no type annotation" in joined
    assert "'streaming_callback' must have a default" in joined


def test_state_parameter_filled_from_state_and_parameter_filled_twice() -> None:
    def f(query: str, state: State, user: str) -> None:
        """F."""

    error = definition_error(lambda: tool(f, inputs_from_state={"s": "state", "a": "user", "b": "user"}))
    joined = "\n".join(error.problems)
    assert len(error.problems) == 2
    assert "'state' receives the State object" in joined
    assert "'user' is filled from two state keys, 'a' and 'b'" in joined


def test_invalid_name_and_outputs_to_string() -> None:
    error = definition_error(lambda: tool(lambda x: x, outputs_to_string={"source": 1, "extra": 2}))
    joined = "\n".join(error.problems)
    assert error.tool_name == "<lambda>"
    assert "the name must be" in joined
    assert "'x' has no type annotation" in joined
    assert "mixes 'source'/'handler'/'raw_result'" in joined
    assert "source 1" in joined


def test_unresolvable_string_annotation() -> None:
    def f(x: "DoesNotExist") -> None:  # type: ignore[name-defined]  # noqa: F821
        """F."""

    error = definition_error(lambda: tool(f))
    assert "cannot be resolved" in error.problems[0] and "'x'" in error.problems[0]


def test_several_problems_are_reported_together() -> None:
    def f(query: str, thing: Opaque) -> None:
        """F."""

    error = definition_error(
        lambda: tool(
            f,
            name="bad name!",
            inputs_from_state={"k": "missing"},
            outputs_to_state={"a": {"source": 1}, "b": {"handler": 42}, "c": {"sauce": "x"}},
        )
    )
    assert error.tool_name == "bad name!"
    assert len(error.problems) == 6
    assert all("Tool 'bad name!'" in problem for problem in error.problems)
    message = str(error)
    assert message.startswith("Invalid tool 'bad name!' (6 problem(s)):")
    for fragment in ("name must be", "'missing'", "'thing'", "'a'", "'b'", "'c'"):
        assert fragment in message


def test_not_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="needs a function"):
        tool(42)  # type: ignore[call-overload]


def test_inputs_from_state_that_is_not_a_dict() -> None:
    def f(query: str) -> None:
        """F."""

    error = definition_error(lambda: tool(f, inputs_from_state=["query"]))  # type: ignore[arg-type]
    assert "inputs_from_state must be a dict" in error.problems[0]
