"""
Tests of ``ToolInvoker`` with tools in haystack-ai's own formats (its ``@tool``, ``Tool``, ``ComponentTool``,
``Toolset``), async tools under ``run`` and ``run_async``, and tools given at run time.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest
from haystack import component
from haystack.components.agents.state import State as HaystackState
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Tool, Toolset
from haystack.tools import tool as haystack_tool

from haystack_state import (
    ComponentTool,
    State,
    ToolExecutionError,
    ToolInvoker,
    tool,
)
from invocation.invoker_tools import (
    add,
    async_double,
    async_fail,
    calls,
    echo,
    explode,
    hs_count,
    hs_note,
    only_result,
    results,
)

# --- haystack-ai's own tool formats ---------------------------------------------------------------------------


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
    from haystack_state.invocation import _calls as calls_module

    invoker = ToolInvoker([echo])
    for _ in range(3):
        invoker.run(calls(("add", {"a": 1, "b": 1})), state=State({"total": {"type": int}}), tools=[add])
    gc.collect()
    before = len(calls_module._CHECKERS)
    for _ in range(20):
        invoker.run(calls(("add", {"a": 1, "b": 1})), state=State({"total": {"type": int}}), tools=[add])
    gc.collect()
    assert len(calls_module._CHECKERS) <= before + 1
