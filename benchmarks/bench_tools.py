"""
The per-call overhead of ``ToolInvoker.run`` against calling the function directly and against haystack-ai's own
tool-execution path, side by side in one process.

The tool is trivial: one argument from the model, one parameter filled from state (``inputs_from_state``) and one
output merged into state (``outputs_to_state``), so what is measured is the machinery around the call: resolving the
tool, validating the arguments, injecting, calling, merging and building the result message.

- ``direct call``: the function itself, with the state value passed by hand (the floor).
- ``haystack-ai _run_tool``: ``haystack.components.agents.tool_calling._run_tool``, the code behind haystack-ai's
  ``Agent``, with its ``State`` and a tool made by its ``@tool`` with the same mappings.
- ``haystack-state ToolInvoker.run``: our component, with our ``State`` and our ``@tool`` (and, to show the tool format
  costs nothing, with the very tool haystack-ai's path uses).

Single calls (one tool call per model message) and parallel batches (six calls per message) are measured.

Run: ``python benchmarks/bench_tools.py`` (add ``--quick`` for a smoke run, ``--profile`` for a cProfile of ours).
Prints microseconds per tool call and the ratios ours / floor and haystack-ai / ours (higher is better for us).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack.components.agents.state import State as HaystackState
from haystack.components.agents.tool_calling import _run_tool
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import tool as haystack_tool

from haystack_state import State, ToolInvoker, tool

INPUTS_FROM_STATE = {"factor": "factor"}
OUTPUTS_TO_STATE = {"result": {"source": "product"}}


def scale(x: int, factor: int) -> dict[str, int]:
    """Multiply x by the factor kept in state."""
    return {"product": x * factor}


ours_tool = tool(scale, inputs_from_state=INPUTS_FROM_STATE, outputs_to_state=OUTPUTS_TO_STATE)
haystack_scale = haystack_tool(scale, inputs_from_state=INPUTS_FROM_STATE, outputs_to_state=OUTPUTS_TO_STATE)


def messages(calls_per_message: int) -> list[ChatMessage]:
    tool_calls = [ToolCall(tool_name="scale", arguments={"x": i}, id=f"call_{i}") for i in range(calls_per_message)]
    return [ChatMessage.from_assistant(tool_calls=tool_calls)]


def schema() -> dict[str, Any]:
    return {"factor": {"type": int}, "result": {"type": int}}


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds (the least disturbed by a noisy machine)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def direct(n: int, per_message: int) -> Callable[[], None]:
    state = {"factor": 3}

    def run() -> None:
        for _ in range(n):
            for i in range(per_message):
                state["result"] = scale(x=i, factor=state["factor"])["product"]

    return run


def haystack(n: int, per_message: int) -> Callable[[], None]:
    state = HaystackState(schema(), {"factor": 3})
    batch = messages(per_message)

    def run() -> None:
        for _ in range(n):
            tool_messages, _ = _run_tool(messages=batch, state=state, tools=[haystack_scale], max_workers=4)
            assert not tool_messages[0].tool_call_results[0].error

    return run


def ours(n: int, per_message: int, the_tool: Any = ours_tool) -> Callable[[], None]:
    invoker = ToolInvoker(tools=[the_tool], max_workers=4)
    state = State(schema(), {"factor": 3})
    batch = messages(per_message)

    def run() -> None:
        for _ in range(n):
            output = invoker.run(messages=batch, state=state)
            assert not output["tool_messages"][0].tool_call_results[0].error

    return run


def ours_with_haystack_tool(n: int, per_message: int) -> Callable[[], None]:
    return ours(n, per_message, haystack_scale)


def check_same_results() -> None:
    """Both paths do the same thing: same tool messages, same state."""
    ours_state = State(schema(), {"factor": 3})
    haystack_state = HaystackState(schema(), {"factor": 3})
    batch = messages(6)
    ours_messages = ToolInvoker(tools=[ours_tool]).run(messages=batch, state=ours_state)["tool_messages"]
    haystack_messages, _ = _run_tool(messages=batch, state=haystack_state, tools=[haystack_scale])
    assert [m.tool_call_results[0].result for m in ours_messages] == [
        m.tool_call_results[0].result for m in haystack_messages
    ]
    assert ours_state.get("result") == haystack_state.get("result") == 15


def profile(n: int) -> None:
    run = ours(n, 1)
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of ToolInvoker.run and exit")
    args = parser.parse_args()
    n_single = 300 if args.quick else 3_000
    n_batches = 50 if args.quick else 500
    repeat = 1 if args.quick else 5
    if args.profile:
        profile(n_single)
        return
    check_same_results()

    scenarios = [("1 call per message", n_single, 1), ("6 parallel calls per message", n_batches, 6)]
    print(f"{'scenario':30} {'path':36} {'us/call':>9}")
    for label, n, per_message in scenarios:
        calls = n * per_message
        timings = {}
        for name, make in (
            ("direct call (floor)", direct),
            ("haystack-ai _run_tool", haystack),
            ("haystack-state ToolInvoker.run", ours),
            ("  ... with haystack-ai's @tool", ours_with_haystack_tool),
        ):
            make(min(n, 20), per_message)()  # warm up
            timings[name] = best_of(make(n, per_message), repeat) / calls * 1e6
            print(f"{label:30} {name:36} {timings[name]:9.2f}")
        floor = timings["direct call (floor)"]
        ours_us = timings["haystack-state ToolInvoker.run"]
        theirs = timings["haystack-ai _run_tool"]
        print(
            f"{'':30} ratios: ours / floor = {ours_us / floor:,.0f}x;  haystack-ai / ours = {theirs / ours_us:.2f}x "
            f"({'ours faster' if theirs > ours_us else 'HAYSTACK FASTER'}); overhead ours {ours_us - floor:.1f} us, "
            f"haystack-ai {theirs - floor:.1f} us per call"
        )

    many_calls(repeat)


@tool
def jot(text: str, state: State) -> str:
    """
    Write a note through the injected State.

    :param text: The note.
    """
    state.set("notes", [text])
    return "ok"


def many_calls(repeat: int) -> None:
    """
    One model reply with many calls to a tool that receives the State, with no cap (``max_tool_calls=None``): each
    call waits for the one before it (they all write the state), so planning and starting them must stay linear.
    """
    invoker = ToolInvoker(tools=[jot], max_tool_calls=None)

    def run(n: int) -> Callable[[], None]:
        calls = [ToolCall(tool_name="jot", arguments={"text": f"t{i}"}, id=f"c{i}") for i in range(n)]
        message = ChatMessage.from_assistant(tool_calls=calls)

        def once() -> None:
            invoker.run(messages=[message], state=State({"notes": {"type": list[str]}}))

        return once

    small, large = (best_of(run(n), repeat) for n in (300, 1_200))
    print(
        f"one reply with uncapped calls to a State tool: 300 calls {small * 1e3:.1f} ms, 1,200 calls "
        f"{large * 1e3:.1f} ms: {large / small:.1f}x for 4x the calls (target: at most 5x)"
    )


if __name__ == "__main__":
    main()
