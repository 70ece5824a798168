"""
Tests of ``ToolInvoker`` and the State: the injected State (staged, isolated, all or nothing), merging outputs
into the state (``outputs_to_state``, handlers, failed merges), and the result message (``outputs_to_string``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Annotated, Any

import pytest
from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import TextContent

from haystack_state import (
    StagedState,
    State,
    StateTypeError,
    ToolExecutionError,
    ToolInvocationError,
    ToolInvoker,
    ToolMergeError,
    tool,
)
from haystack_state.handlers import merge_lists, replace_values
from haystack_state.invocation._calls import result_to_string
from invocation.invoker_tools import (
    calls,
    concat,
    failing_handler,
    only_result,
    results,
    shout,
)

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
