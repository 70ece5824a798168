"""
Tests of ``ToolInvoker`` running calls in parallel: results merged in the order the model listed the calls whatever
order the threads finish in, readers waiting for writers, the ``max_workers`` bound, and determinism: a parallel run
always leaves the same state as running the calls one by one, in order (random sleeps, and a hypothesis property).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, StreamingChunk, ToolCall
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_state import State, ToolExecutionError, ToolInvoker, tool
from haystack_state.handlers import add as add_handler
from haystack_state.handlers import replace_values
from haystack_state.invocation._workers import WORKERS

# --- helpers -------------------------------------------------------------------------------------------


def calls(*specs: tuple[str, Any]) -> list[ChatMessage]:
    """One assistant message with a tool call per ``(tool_name, arguments)`` pair."""
    tool_calls = [ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(specs)]
    return [ChatMessage.from_assistant(tool_calls=tool_calls)]


def results(output: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(m.tool_call_results[0].result, m.tool_call_results[0].error) for m in output["tool_messages"]]


class Concurrency:
    """Counts how many tool bodies run at the same time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.max = 0
        self.total = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        with self.lock:
            self.now += 1
            self.total += 1
            self.max = max(self.max, self.now)
        try:
            yield
        finally:
            with self.lock:
                self.now -= 1


def schema() -> dict[str, Any]:
    return {
        "items": {"type": list[int]},
        "last": {"type": int},
        "total": {"type": int, "handler": add_handler},
        "seen": {"type": list[int]},
        "log": {"type": list[str]},
    }


def sleep_ms(delay_ms: float) -> None:
    if delay_ms:
        time.sleep(delay_ms / 1000)


# --- tools of the determinism tests ----------------------------------------------------------------------
# Each writes through outputs_to_state or the injected State; ``delay_ms`` only changes when it finishes.


@tool(outputs_to_state={"items": {}})
def append_item(value: int, delay_ms: float = 0) -> int:
    """Append an item."""
    sleep_ms(delay_ms)
    return value


@tool(outputs_to_state={"last": {"source": "value"}, "log": {"source": "line"}})
def replace_last(value: int, delay_ms: float = 0) -> dict[str, Any]:
    """Replace the last value."""
    sleep_ms(delay_ms)
    return {"value": value, "line": f"last={value}"}


@tool(outputs_to_state={"total": {}})
def add_total(value: int, delay_ms: float = 0) -> int:
    """Add to the total (the key's handler adds)."""
    sleep_ms(delay_ms)
    return value


@tool(outputs_to_state={"last": {"handler": lambda current, new: (current or 0) * 2 + new}})
def fold_last(value: int, delay_ms: float = 0) -> int:
    """Fold into the last value with a handler override."""
    sleep_ms(delay_ms)
    return value


@tool(inputs_from_state={"total": "total"}, outputs_to_state={"seen": {}})
def read_total(delay_ms: float = 0, total: int | None = None) -> int:
    """Read the total."""
    sleep_ms(delay_ms)
    return -1 if total is None else total


@tool
def via_state(value: int, state: State, delay_ms: float = 0) -> int:
    """Read and write through the injected State."""
    total = state.get("total") or 0
    sleep_ms(delay_ms)
    state.set("items", [value, total])
    state.set("last", total + value)
    state.set("log", f"via {value} saw {total}")
    return total


@tool
def write_then_fail(value: int, state: State, delay_ms: float = 0) -> int:
    """Write through the injected State, then fail."""
    state.set("items", value)
    state.set("total", 1000)
    sleep_ms(delay_ms)
    raise RuntimeError(f"failed {value}")


@tool(outputs_to_state={"last": {}})
def bad_merge(value: int, delay_ms: float = 0) -> str:
    """Return a value that does not fit the state key."""
    sleep_ms(delay_ms)
    return f"not an int {value}"


@tool(outputs_to_state={"items": {}})
async def async_append(value: int, delay_ms: float = 0) -> int:
    """Append an item, asynchronously."""
    if delay_ms:
        await asyncio.sleep(delay_ms / 1000)
    return value


TOOLS = [append_item, replace_last, add_total, fold_last, read_total, via_state, write_then_fail, bad_merge]
ASYNC_TOOLS = [*TOOLS, async_append]
TAKES_VALUE = {tool.name for tool in ASYNC_TOOLS} - {"read_total"}


def make_call(name: str, value: int, delay_ms: float) -> tuple[str, dict[str, Any]]:
    arguments: dict[str, Any] = {"delay_ms": delay_ms}
    if name in TAKES_VALUE:
        arguments["value"] = value
    return name, arguments


def sequential_reference(
    batch: list[tuple[str, dict[str, Any]]], initial: dict[str, Any], tools: list[Any]
) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    """Run each call alone, in order, without its delay, on a fresh state: what a parallel run must equal."""
    state = State(schema(), initial)
    invoker = ToolInvoker(tools, raise_on_failure=False)
    messages = []
    for name, arguments in batch:
        output = invoker.run(calls((name, {**arguments, "delay_ms": 0})), state=state)
        messages += results(output)
    return state.data, messages


# --- determinism ------------------------------------------------------------------------------------------


def random_batch(rng: random.Random, names: list[str], size: int) -> list[tuple[str, dict[str, Any]]]:
    return [make_call(rng.choice(names), rng.randint(-9, 9), rng.uniform(0, 20)) for _ in range(size)]


@pytest.mark.slow
def test_parallel_runs_with_random_sleeps_equal_sequential_execution() -> None:
    rng = random.Random(1234)
    names = [t.name for t in TOOLS]
    for round_number in range(30):
        batch = random_batch(rng, names, 6)
        initial = {"total": rng.randint(0, 5)} if round_number % 2 else {}
        expected_state, expected_messages = sequential_reference(batch, initial, TOOLS)
        state = State(schema(), initial)
        invoker = ToolInvoker(TOOLS, raise_on_failure=False, max_workers=1 + round_number % 4)
        output = invoker.run(calls(*batch), state=state)
        assert state.data == expected_state, f"round {round_number}: {batch}"
        assert results(output) == expected_messages, f"round {round_number}: {batch}"


@pytest.mark.slow
def test_run_async_with_random_sleeps_equals_sequential_execution() -> None:
    rng = random.Random(99)
    names = [t.name for t in ASYNC_TOOLS]

    async def main() -> None:
        for round_number in range(12):
            batch = random_batch(rng, names, 6)
            expected_state, expected_messages = sequential_reference(batch, {}, ASYNC_TOOLS)
            state = State(schema())
            invoker = ToolInvoker(ASYNC_TOOLS, raise_on_failure=False, max_workers=1 + round_number % 4)
            output = await invoker.run_async(calls(*batch), state=state)
            assert state.data == expected_state, f"round {round_number}: {batch}"
            assert results(output) == expected_messages, f"round {round_number}: {batch}"

    asyncio.run(main())


# Random batches: each call appends, replaces or adds to a few keys, through outputs_to_state or an injected
# State; some read, some fail; tiny sleeps shuffle the order the threads finish in.
call_strategy = st.tuples(
    st.sampled_from([t.name for t in ASYNC_TOOLS]),
    st.integers(min_value=-5, max_value=5),
    st.sampled_from([0, 0, 0.2, 0.5, 1, 2]),
)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    batch=st.lists(call_strategy, min_size=1, max_size=8),
    max_workers=st.integers(min_value=1, max_value=4),
    initial_total=st.none() | st.integers(min_value=0, max_value=3),
    use_async=st.booleans(),
)
def test_property_parallel_batches_equal_sequential_execution(
    batch: list[tuple[str, int, float]], max_workers: int, initial_total: int | None, use_async: bool
) -> None:
    planned = [make_call(name, value, delay) for name, value, delay in batch]
    initial = {} if initial_total is None else {"total": initial_total}
    expected_state, expected_messages = sequential_reference(planned, initial, ASYNC_TOOLS)
    state = State(schema(), initial)
    invoker = ToolInvoker(ASYNC_TOOLS, raise_on_failure=False, max_workers=max_workers)
    if use_async:
        output = asyncio.run(invoker.run_async(calls(*planned), state=state))
    else:
        output = invoker.run(calls(*planned), state=state)
    assert state.data == expected_state
    assert results(output) == expected_messages


# --- merge order ------------------------------------------------------------------------------------------------


def test_results_merge_in_call_order_when_threads_finish_in_reverse() -> None:
    n = 4
    done = [threading.Event() for _ in range(n)]
    finished: list[int] = []

    @tool(outputs_to_state={"items": {}, "last": {"handler": replace_values}})
    def staggered(i: int) -> int:
        """Finish after the next call has finished."""
        if i + 1 < n:
            assert done[i + 1].wait(5)
        finished.append(i)
        done[i].set()
        return i

    chunks: list[StreamingChunk] = []
    state = State(schema())
    output = ToolInvoker([staggered], max_workers=n, streaming_callback=chunks.append).run(
        calls(*[("staggered", {"i": i}) for i in range(n)]), state=state
    )
    assert finished == [3, 2, 1, 0]
    assert state.get("items") == [0, 1, 2, 3]
    assert state.get("last") == 3
    assert [text for text, _ in results(output)] == ["0", "1", "2", "3"]
    streamed = [c.tool_call_result.origin.arguments["i"] for c in chunks if c.tool_call_result is not None]
    assert streamed == [0, 1, 2, 3]


def test_run_async_merges_in_call_order_when_tasks_finish_in_reverse() -> None:
    n = 4
    finished: list[int] = []

    async def main() -> tuple[dict[str, Any], State]:
        done = [asyncio.Event() for _ in range(n)]

        @tool(outputs_to_state={"items": {}})
        async def staggered(i: int) -> int:
            """Finish after the next call has finished."""
            if i + 1 < n:
                await asyncio.wait_for(done[i + 1].wait(), 5)
            finished.append(i)
            done[i].set()
            return i

        state = State(schema())
        invoker = ToolInvoker([staggered], max_workers=n)
        return await invoker.run_async(calls(*[("staggered", {"i": i}) for i in range(n)]), state=state), state

    output, state = asyncio.run(main())
    assert finished == [3, 2, 1, 0]
    assert state.get("items") == [0, 1, 2, 3]
    assert [text for text, _ in results(output)] == ["0", "1", "2", "3"]


def test_a_failing_parallel_call_merges_nothing_and_the_others_merge() -> None:
    state = State(schema(), {"total": 5})
    output = ToolInvoker(TOOLS, raise_on_failure=False).run(
        calls(
            ("append_item", {"value": 1, "delay_ms": 5}),
            ("write_then_fail", {"value": 2}),
            ("append_item", {"value": 3}),
            ("bad_merge", {"value": 4}),
            ("add_total", {"value": 1}),
        ),
        state=state,
    )
    assert [error for _, error in results(output)] == [False, True, False, True, False]
    assert state.data == {"items": [1, 3], "total": 6}
    assert results(output)[1][0] == "Failed to invoke tool 'write_then_fail': RuntimeError: failed 2"
    assert "Tool 'bad_merge'" in results(output)[3][0] and "'last'" in results(output)[3][0]


def test_raise_on_failure_with_parallel_calls_keeps_the_earlier_merges() -> None:
    state = State(schema())
    with pytest.raises(ToolExecutionError) as info:
        ToolInvoker(TOOLS).run(
            calls(
                ("append_item", {"value": 1, "delay_ms": 5}),
                ("write_then_fail", {"value": 2}),
                ("append_item", {"value": 3}),
            ),
            state=state,
        )
    assert info.value.tool_name == "write_then_fail"
    assert "failed 2" in str(info.value)
    assert state.data == {"items": [1]}
    assert WORKERS.busy == 0  # no call is left running


# --- dependencies: a reader waits for the writers listed before it -----------------------------------------------


def test_a_reader_waits_for_the_writer_and_sees_its_value() -> None:
    events: list[str] = []

    @tool(outputs_to_state={"total": {"handler": replace_values}})
    def slow_writer(value: int) -> int:
        """Write the total, slowly."""
        events.append("writer start")
        time.sleep(0.03)
        events.append("writer end")
        return value

    @tool(inputs_from_state={"total": "total"})
    def total_reader(total: int | None = None) -> str:
        """Read the total."""
        events.append("reader start")
        return f"saw {total}"

    state = State(schema(), {"total": 1})
    output = ToolInvoker([slow_writer, total_reader], max_workers=4).run(
        calls(("slow_writer", {"value": 42}), ("total_reader", {})), state=state
    )
    assert results(output) == [("42", False), ("saw 42", False)]
    assert events == ["writer start", "writer end", "reader start"]


def test_independent_calls_overlap_with_a_writer_while_the_reader_waits() -> None:
    independent_started = threading.Event()
    events: list[str] = []

    @tool(outputs_to_state={"total": {"handler": replace_values}})
    def writer(value: int) -> int:
        """Write, once the independent call has started."""
        events.append(f"writer overlapped: {independent_started.wait(5)}")
        return value

    @tool(outputs_to_state={"items": {}})
    def independent(value: int) -> int:
        """Touch nothing the others read."""
        independent_started.set()
        return value

    @tool(inputs_from_state={"total": "total"}, outputs_to_state={"seen": {}})
    def reader(total: int | None = None) -> int:
        """Read the total."""
        events.append("reader start")
        return -1 if total is None else total

    state = State(schema())
    ToolInvoker([writer, independent, reader], max_workers=4).run(
        calls(("writer", {"value": 7}), ("reader", {}), ("independent", {"value": 1})), state=state
    )
    assert events == ["writer overlapped: True", "reader start"]
    assert state.data == {"total": 7, "items": [1], "seen": [7]}


def test_a_reader_listed_before_the_writer_sees_the_old_value() -> None:
    # Calls merge in the order the model listed them: as if run one by one, a reader listed first reads first.
    state = State(schema(), {"total": 1})
    output = ToolInvoker(TOOLS).run(calls(("read_total", {}), ("add_total", {"value": 10})), state=state)
    assert results(output) == [("1", False), ("10", False)]
    assert state.data == {"total": 11, "seen": [1]}


def test_a_chain_of_writers_and_readers_in_one_message() -> None:
    state = State(schema(), {"total": 0})
    batch = [("add_total", {"value": 1}), ("read_total", {}), ("add_total", {"value": 2}), ("read_total", {})]
    batch += [("via_state", {"value": 5}), ("read_total", {})]
    output = ToolInvoker(TOOLS, max_workers=4).run(calls(*batch), state=state)
    assert [text for text, _ in results(output)] == ["1", "1", "2", "3", "3", "3"]
    assert state.get("seen") == [1, 3, 3]
    assert state.get("items") == [5, 3]


def test_an_injected_state_reader_waits_for_earlier_writers_under_run_async() -> None:
    @tool(outputs_to_state={"total": {"handler": replace_values}})
    async def async_writer(value: int) -> int:
        """Write, after yielding to the loop."""
        await asyncio.sleep(0.01)
        return value

    state = State(schema())
    output = asyncio.run(
        ToolInvoker([async_writer, via_state]).run_async(
            calls(("async_writer", {"value": 4}), ("via_state", {"value": 1})), state=state
        )
    )
    assert results(output) == [("4", False), ("4", False)]
    assert state.data == {"total": 4, "items": [1, 4], "last": 5, "log": ["via 1 saw 4"]}


def test_calls_across_messages_see_the_writes_of_earlier_messages() -> None:
    messages = [*calls(("add_total", {"value": 3})), *calls(("read_total", {}))]
    state = State(schema())
    output = ToolInvoker(TOOLS).run(messages, state=state)
    assert results(output) == [("3", False), ("3", False)]


# --- max_workers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_workers", [1, 4])
def test_many_calls_respect_max_workers_and_call_order(max_workers: int) -> None:
    concurrency = Concurrency()
    barrier = threading.Barrier(max_workers, timeout=5)

    @tool(outputs_to_state={"items": {}, "total": {}})
    def work(value: int) -> int:
        """Work a little."""
        with concurrency.running():
            if value < max_workers:
                barrier.wait()  # the first max_workers calls are only released together
            time.sleep(0.001)
        return value

    state = State(schema())
    n = 60
    output = ToolInvoker([work], max_workers=max_workers).run(
        calls(*[("work", {"value": i}) for i in range(n)]), state=state
    )
    assert state.get("items") == list(range(n))
    assert state.get("total") == sum(range(n))
    assert [text for text, _ in results(output)] == [str(i) for i in range(n)]
    assert concurrency.total == n
    assert concurrency.max == max_workers


@pytest.mark.parametrize("max_workers", [1, 4])
def test_run_async_respects_max_workers(max_workers: int) -> None:
    concurrency = Concurrency()

    async def main() -> tuple[dict[str, Any], State]:
        barrier = asyncio.Barrier(max_workers)

        @tool(outputs_to_state={"items": {}})
        async def work(value: int) -> int:
            """Work a little."""
            with concurrency.running():
                if value < max_workers:
                    await asyncio.wait_for(barrier.wait(), 5)
                await asyncio.sleep(0.001)
            return value

        state = State(schema())
        invoker = ToolInvoker([work, append_item], max_workers=max_workers)
        batch = [("work", {"value": i}) if i % 3 else ("append_item", {"value": i}) for i in range(30)]
        batch[: max_workers + 1] = [("work", {"value": i}) for i in range(max_workers + 1)]
        return await invoker.run_async(calls(*batch), state=state), state

    output, state = asyncio.run(main())
    assert state.get("items") == list(range(30))
    assert all(not error for _, error in results(output))
    assert concurrency.max == max_workers


def test_max_workers_zero_or_less_still_runs() -> None:
    state = State(schema())
    ToolInvoker(TOOLS, max_workers=0).run(calls(*[("append_item", {"value": i}) for i in range(5)]), state=state)
    assert state.get("items") == [0, 1, 2, 3, 4]
    state = State(schema())
    asyncio.run(
        ToolInvoker(TOOLS, max_workers=0).run_async(
            calls(*[("append_item", {"value": i}) for i in range(5)]), state=state
        )
    )
    assert state.get("items") == [0, 1, 2, 3, 4]


def test_contextvars_reach_tools_in_worker_threads() -> None:
    import contextvars

    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")

    @tool(outputs_to_state={"log": {}})
    def tagged(value: int) -> str:
        """Report the request id."""
        time.sleep(0.002)
        return f"{request_id.get()}:{value}"

    request_id.set("req-7")
    state = State(schema())
    ToolInvoker([tagged], max_workers=4).run(calls(*[("tagged", {"value": i}) for i in range(4)]), state=state)
    assert state.get("log") == ["req-7:0", "req-7:1", "req-7:2", "req-7:3"]


# --- failing fast and cancellation ---------------------------------------------------------------------------------


def test_calls_queued_behind_a_raised_failure_do_not_run() -> None:
    ran: list[int] = []

    @tool
    def first_fails(i: int) -> int:
        """Fail on the first call; the others take a moment."""
        ran.append(i)
        if i == 0:
            raise ValueError("first")
        time.sleep(0.05)
        return i

    with pytest.raises(ToolExecutionError, match="first"):
        ToolInvoker([first_fails], max_workers=1).run(calls(*[("first_fails", {"i": i}) for i in range(10)]))
    assert ran[0] == 0
    assert len(ran) < 10  # the calls still queued when the failure was raised were dropped
    assert WORKERS.busy == 0  # no call is left running


def test_cancelling_run_async_cancels_the_running_tools() -> None:
    outcomes: list[str] = []

    @tool
    async def wait_forever(i: int) -> int:
        """Wait until cancelled."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcomes.append(f"cancelled {i}")
            raise
        return i

    async def main() -> None:
        task = asyncio.ensure_future(
            ToolInvoker([wait_forever]).run_async(calls(("wait_forever", {"i": 0}), ("wait_forever", {"i": 1})))
        )
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sorted(outcomes) == ["cancelled 0", "cancelled 1"]


def test_a_raised_failure_under_run_async_cancels_the_other_running_tools() -> None:
    outcomes: list[str] = []

    @tool
    async def slow(i: int) -> int:
        """Wait until cancelled."""
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            outcomes.append(f"cancelled {i}")
            raise
        return i

    @tool
    async def fail_soon() -> int:
        """Fail."""
        await asyncio.sleep(0.01)
        raise ValueError("soon")

    state = State(schema())
    with pytest.raises(ToolExecutionError, match="soon"):
        asyncio.run(ToolInvoker([slow, fail_soon]).run_async(calls(("fail_soon", {}), ("slow", {"i": 1})), state=state))
    assert outcomes == ["cancelled 1"]


def test_a_tool_that_cancels_itself_is_an_error_result() -> None:
    @tool
    async def self_cancelling() -> int:
        """Cancel this very task."""
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
        return 1

    output = asyncio.run(
        ToolInvoker([self_cancelling, append_item], raise_on_failure=False).run_async(
            calls(("self_cancelling", {}), ("append_item", {"value": 1})), state=State(schema())
        )
    )
    assert [error for _, error in results(output)] == [True, False]
    assert "cancelled" in results(output)[0][0]
