"""
Tests of ``interrupt(value)`` on the tool-runner side: inside sync and async tools, in worker threads and parallel
calls, the k-th ``interrupt()`` of a call returns the k-th answer or stops the call with ``ToolInterrupt``. A stopped
call produces no result and merges nothing (its staged State writes are dropped), the calls depending on it are held,
every other call runs and merges in call order; ``hold=`` holds calls without running them. ``run_tool_batch``
returns the pending calls; ``run_tool_calls`` and ``ToolInvoker`` (no human to ask) make them failures. Per-call
events (``on_call``) report starts, merges and interrupts.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state import (
    CodecError,
    State,
    ToolInterrupt,
    ToolInterruptedError,
    ToolInvoker,
    interrupt,
    tool,
    tool_specs,
)
from haystack_state.interrupts import interrupt_scope
from haystack_state.invocation import BatchOutcome, PendingCall, run_tool_batch, run_tool_batch_async
from haystack_state.invocation._run import run_tool_calls
from haystack_state.invocation._settings import ToolRunSettings


def calls(*pairs: tuple[str, dict[str, Any]]) -> list[ChatMessage]:
    """One assistant message with one tool call per ``(tool_name, arguments)`` pair, with ids c0, c1, ..."""
    return [
        ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(pairs)]
        )
    ]


def results(messages: list[ChatMessage]) -> list[tuple[str | None, str]]:
    return [(m.tool_call_results[0].origin.id, m.tool_call_results[0].result) for m in messages]


ran: list[str] = []
lock = threading.Lock()


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def note(name: str) -> None:
    with lock:
        ran.append(name)


@tool(outputs_to_state={"approved": {}})
def approve(amount: int, state: State) -> str:
    """Ask a human, then approve."""
    state.set("log", [f"asked {amount}"])  # staged: dropped if the call stops
    answer = interrupt({"question": f"Transfer {amount}?"})
    note("approve")
    return "yes" if answer else "no"


@tool
async def approve_async(amount: int) -> str:
    """Ask a human, asynchronously."""
    await asyncio.sleep(0)
    answer = interrupt({"question": f"Async {amount}?"})
    note("approve_async")
    return "yes" if answer else "no"


@tool
def two_questions(topic: str) -> str:
    """Ask two things in turn."""
    first = interrupt(f"first about {topic}")
    second = interrupt(f"second about {topic}")
    note("two_questions")
    return f"{first}+{second}"


@tool(outputs_to_state={"log": {}})
def plain(text: str) -> str:
    """Runs without asking."""
    note(f"plain {text}")
    return text


@tool(inputs_from_state={"approved": "approved"})
def reader(approved: str) -> str:
    """Reads what approve writes."""
    note("reader")
    return f"read {approved}"


SCHEMA = {"approved": {"type": str}, "log": {"type": list[str]}}
SPECS = tool_specs([approve, approve_async, two_questions, plain, reader])


# --- the interrupt function ---------------------------------------------------------------------------------------


def test_interrupt_outside_a_tool_call_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match=r"interrupt\(\) was called outside a tool call"):
        interrupt("anyone?")


def test_a_scope_answers_in_order_then_stops() -> None:
    with interrupt_scope("c7", "pay", answers=["a", "b"]) as scope:
        assert interrupt(1) == "a"
        assert interrupt(2) == "b"
        with pytest.raises(ToolInterrupt) as info:
            interrupt({"third": 3})
    stop = info.value
    assert (stop.value, stop.index, stop.call_id, stop.tool_name, stop.source) == ({"third": 3}, 2, "c7", "pay", "tool")
    assert scope.asked == 3
    with pytest.raises(RuntimeError):
        interrupt("after the scope")


def test_a_hook_scope_marks_its_interrupts() -> None:
    with pytest.raises(ToolInterrupt) as info, interrupt_scope("c1", "pay", source="hook"):
        interrupt("allow?")
    assert info.value.source == "hook" and info.value.index == 0


def test_tool_interrupt_is_not_swallowed_by_except_exception() -> None:
    @tool
    def careless(x: int) -> str:
        """Catches every Exception."""
        try:
            interrupt("sure?")
        except Exception:  # must not catch the interrupt
            return "swallowed"
        return "answered"

    outcome = run_tool_batch(calls(("careless", {"x": 1})), State({}), tool_specs([careless]))
    assert outcome.messages == [] and [p.reason for p in outcome.interrupts] == ["interrupt"]


def test_a_value_the_codec_cannot_store_fails_the_call() -> None:
    @tool
    def bad_question(x: int) -> str:
        """Asks with a lock."""
        interrupt({"lock": threading.Lock()})
        return "never"

    outcome = run_tool_batch(
        calls(("bad_question", {"x": 1})),
        State({}),
        tool_specs([bad_question]),
        settings=ToolRunSettings(raise_on_failure=False),
    )
    assert outcome.interrupts == []
    [(_, text)] = results(outcome.messages)
    assert "interrupt() in tool 'bad_question'" in text and "storable by the checkpoint codec" in text
    assert "value['lock']" in text
    with pytest.raises(CodecError), interrupt_scope("c0", "t"):
        interrupt(object())


# --- run_tool_batch: pending calls ---------------------------------------------------------------------------------


def test_an_interrupted_call_produces_no_result_and_its_writes_are_discarded() -> None:
    state = State(SCHEMA)
    messages = calls(("plain", {"text": "a"}), ("approve", {"amount": 5}), ("plain", {"text": "b"}))
    outcome = run_tool_batch(messages, state, SPECS)
    assert isinstance(outcome, BatchOutcome) and outcome.interrupted
    assert results(outcome.messages) == [("c0", "a"), ("c2", "b")]
    [pending] = outcome.interrupts
    assert pending == PendingCall(
        call_id="c1",
        tool_name="approve",
        arguments={"amount": 5},
        reason="interrupt",
        tool_call=messages[0].tool_calls[1],
        value={"question": "Transfer 5?"},
        index=0,
        source="tool",
    )
    assert state.data == {"log": ["a", "b"]}  # no "asked 5", no "approved"
    assert sorted(ran) == ["plain a", "plain b"]


def test_an_answered_call_runs_and_merges() -> None:
    state = State(SCHEMA)
    messages = calls(("approve", {"amount": 5}), ("plain", {"text": "b"}))
    outcome = run_tool_batch(messages, state, SPECS, answers={"c0": [True]})
    assert outcome.interrupts == []
    assert results(outcome.messages) == [("c0", "yes"), ("c1", "b")]
    assert state.data == {"approved": "yes", "log": ["asked 5", "b"]}


def test_the_kth_interrupt_gets_the_kth_answer() -> None:
    messages = calls(("two_questions", {"topic": "x"}))
    first = run_tool_batch(messages, State({}), SPECS)
    assert [(p.value, p.index) for p in first.interrupts] == [("first about x", 0)]
    second = run_tool_batch(messages, State({}), SPECS, answers={"c0": ["A"]})
    assert [(p.value, p.index) for p in second.interrupts] == [("second about x", 1)]
    done = run_tool_batch(messages, State({}), SPECS, answers={"c0": ["A", "B"]})
    assert results(done.messages) == [("c0", "A+B")] and done.interrupts == []
    assert ran == ["two_questions"]


def test_calls_depending_on_an_interrupted_call_are_held() -> None:
    state = State(SCHEMA, {"approved": "before"})
    messages = calls(("approve", {"amount": 1}), ("reader", {}), ("plain", {"text": "free"}))
    outcome = run_tool_batch(messages, state, SPECS)
    assert results(outcome.messages) == [("c2", "free")]
    assert [(p.call_id, p.reason, p.waits_for) for p in outcome.interrupts] == [
        ("c0", "interrupt", ()),
        ("c1", "depends", ("c0",)),
    ]
    assert "reader" not in ran
    assert state.data == {"approved": "before", "log": ["free"]}


def test_hold_keeps_calls_and_their_dependents_from_running() -> None:
    state = State(SCHEMA)
    messages = calls(("plain", {"text": "a"}), ("approve", {"amount": 1}), ("reader", {}), ("plain", {"text": "b"}))
    outcome = run_tool_batch(messages, state, SPECS, hold={"c1"}, answers={"c1": [True]})
    assert results(outcome.messages) == [("c0", "a"), ("c3", "b")]
    assert [(p.call_id, p.reason, p.value, p.index) for p in outcome.interrupts] == [
        ("c1", "held", None, None),
        ("c2", "depends", None, None),
    ]
    assert sorted(ran) == ["plain a", "plain b"]
    with pytest.raises(ValueError, match=r"hold names tool call id.*nope.*c0, c1, c2, c3"):
        run_tool_batch(messages, State(SCHEMA), SPECS, hold={"nope"})


def test_a_held_call_with_bad_arguments_is_held_not_raised() -> None:
    messages = calls(("approve", {"amount": "lots"}), ("plain", {"text": "a"}))
    outcome = run_tool_batch(messages, State(SCHEMA), SPECS, hold={"c0"})
    assert [p.reason for p in outcome.interrupts] == ["held"]
    assert results(outcome.messages) == [("c1", "a")]


def test_interrupts_in_parallel_calls_in_worker_threads() -> None:
    together = threading.Barrier(3, timeout=10)

    @tool
    def ask(n: int) -> str:
        """Ask after the others started."""
        together.wait()
        return str(interrupt(f"q{n}"))

    messages = calls(("ask", {"n": 0}), ("ask", {"n": 1}), ("ask", {"n": 2}))
    outcome = run_tool_batch(
        messages, State({}), tool_specs([ask]), settings=ToolRunSettings(max_workers=3), answers={"c1": ["one"]}
    )
    assert results(outcome.messages) == [("c1", "one")]
    assert [(p.call_id, p.value) for p in outcome.interrupts] == [("c0", "q0"), ("c2", "q2")]


def test_a_thread_started_by_the_tool_with_its_context_can_interrupt() -> None:
    @tool
    def delegating(x: int) -> str:
        """Asks from a thread of its own."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["answer"] = interrupt("from a thread")
            except BaseException as error:  # carried back to the tool's thread
                box["error"] = error

        context = contextvars.copy_context()
        worker = threading.Thread(target=context.run, args=(work,))
        worker.start()
        worker.join()
        if "error" in box:
            raise box["error"]
        return str(box["answer"])

    specs = tool_specs([delegating])
    outcome = run_tool_batch(calls(("delegating", {"x": 1})), State({}), specs)
    assert [(p.value, p.index) for p in outcome.interrupts] == [("from a thread", 0)]
    answered = run_tool_batch(calls(("delegating", {"x": 1})), State({}), specs, answers={"c0": [42]})
    assert results(answered.messages) == [("c0", "42")]


def test_the_async_runner_pends_async_and_sync_tools() -> None:
    state = State(SCHEMA)
    messages = calls(("approve_async", {"amount": 2}), ("approve", {"amount": 3}), ("plain", {"text": "c"}))
    outcome = asyncio.run(run_tool_batch_async(messages, state, SPECS))
    assert results(outcome.messages) == [("c2", "c")]
    assert [(p.call_id, p.value) for p in outcome.interrupts] == [
        ("c0", {"question": "Async 2?"}),
        ("c1", {"question": "Transfer 3?"}),
    ]
    assert state.data == {"log": ["c"]}
    answered = asyncio.run(run_tool_batch_async(messages, state, SPECS, answers={"c0": [True], "c1": [False]}))
    assert results(answered.messages) == [("c0", "yes"), ("c1", "no"), ("c2", "c")]
    assert state.data == {"approved": "no", "log": ["c", "asked 3", "c"]}


def test_the_sync_runner_runs_an_async_tool_that_interrupts() -> None:
    outcome = run_tool_batch(calls(("approve_async", {"amount": 2})), State({}), SPECS)
    assert [(p.reason, p.index) for p in outcome.interrupts] == [("interrupt", 0)]


def test_the_sync_runner_inside_a_running_event_loop() -> None:
    # An async tool then runs on a loop of its own in a helper thread, which must see the call's scope.
    async def main() -> tuple[BatchOutcome, BatchOutcome]:
        messages = calls(("approve_async", {"amount": 2}))
        return run_tool_batch(messages, State({}), SPECS, answers={"c0": [True]}), run_tool_batch(
            messages, State({}), SPECS
        )

    answered, pending = asyncio.run(main())
    assert results(answered.messages) == [("c0", "yes")]
    assert [(p.reason, p.value) for p in pending.interrupts] == [("interrupt", {"question": "Async 2?"})]


# --- no human to ask: run_tool_calls and ToolInvoker ---------------------------------------------------------------


def test_tool_invoker_cannot_wait_for_a_human() -> None:
    state = State(SCHEMA)
    messages = calls(("plain", {"text": "a"}), ("approve", {"amount": 9}), ("reader", {}))
    with pytest.raises(ToolInterruptedError) as info:
        ToolInvoker(tools=[approve, plain, reader]).run(messages=messages, state=state)
    error = info.value
    assert (error.tool_name, error.call_id, error.value, error.index) == (
        "approve",
        "c1",
        {"question": "Transfer 9?"},
        0,
    )
    assert "asked for human input" in str(error) and "answers={'c1': [...]}" in str(error)
    assert state.data == {"log": ["a"]}

    lenient = ToolInvoker(tools=[approve, plain, reader], raise_on_failure=False)
    output = lenient.run(messages=messages, state=State(SCHEMA, {"approved": "old"}))
    [_, second, third] = output["tool_messages"]
    assert second.tool_call_results[0].error and "asked for human input" in second.tool_call_results[0].result
    assert third.tool_call_results[0].result == "read old"  # a failed call's dependents run, as with any failure
    answered = lenient.run(messages=messages, state=State(SCHEMA), answers={"c1": [True]})
    assert [m.tool_call_results[0].result for m in answered["tool_messages"]] == ["a", "yes", "read yes"]
    answered = asyncio.run(lenient.run_async(messages=messages, state=State(SCHEMA), answers={"c1": [True]}))
    assert [m.tool_call_results[0].result for m in answered["tool_messages"]] == ["a", "yes", "read yes"]


def test_run_tool_calls_fails_an_unanswered_interrupt() -> None:
    messages = calls(("two_questions", {"topic": "t"}))
    with pytest.raises(ToolInterruptedError, match="'second about t'"):
        run_tool_calls(messages, State({}), SPECS, answers={"c0": ["only one"]})


# --- per-call events ---------------------------------------------------------------------------------------------


def test_on_call_reports_starts_merges_and_interrupts_in_the_calling_thread() -> None:
    events: list[tuple[str, dict[str, Any], int]] = []
    messages = calls(("plain", {"text": "a"}), ("approve", {"amount": 1}), ("nope", {}), ("plain", {"text": "b"}))
    outcome = run_tool_batch(
        messages,
        State(SCHEMA),
        SPECS,
        settings=ToolRunSettings(raise_on_failure=False),
        on_call=lambda kind, data: events.append((kind, data, threading.get_ident())),
    )
    assert {ident for _, _, ident in events} == {threading.get_ident()}
    kinds = [(kind, data["call_id"]) for kind, data, _ in events]
    for call_id in ("c0", "c3"):
        assert kinds.index(("started", call_id)) < kinds.index(("finished", call_id))
    assert kinds.index(("started", "c1")) < kinds.index(("interrupted", "c1"))
    assert ("finished", "c2") in kinds and ("started", "c2") not in kinds  # an unknown tool never starts
    finished = {data["call_id"]: data for kind, data, _ in events if kind == "finished"}
    assert [call_id for call_id in finished] == ["c0", "c2", "c3"]  # merged in call order
    assert finished["c0"]["result"] == "a" and finished["c0"]["error"] is False
    assert finished["c0"]["message"] is outcome.messages[0]
    assert finished["c2"]["error"] is True and "not found" in finished["c2"]["result"]
    assert all(isinstance(data["duration_s"], float) and data["duration_s"] >= 0 for data in finished.values())
    [interrupted] = [data for kind, data, _ in events if kind == "interrupted"]
    assert interrupted["value"] == {"question": "Transfer 1?"} and interrupted["index"] == 0
    started = [data for kind, data, _ in events if kind == "started"]
    assert started[0] == {"call_id": "c0", "tool_name": "plain", "arguments": {"text": "a"}}


def test_on_call_in_the_async_runner() -> None:
    events: list[tuple[str, str | None]] = []
    messages = calls(("approve_async", {"amount": 1}), ("plain", {"text": "a"}))
    asyncio.run(
        run_tool_batch_async(
            messages, State(SCHEMA), SPECS, on_call=lambda kind, data: events.append((kind, data["call_id"]))
        )
    )
    assert sorted(events) == [("finished", "c1"), ("interrupted", "c0"), ("started", "c0"), ("started", "c1")]
