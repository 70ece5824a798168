"""
Per-step overhead of ``haystack_state.Agent`` next to haystack-ai's ``Agent``, on the same script.

Both agents run the same zero-cost chat generator (it hands out prebuilt replies: ``steps - 1`` tool-call replies,
then a text reply) and the same trivial haystack ``Tool`` with one ``outputs_to_state`` mapping, so what is measured
is the agents' own work per step: building the model inputs, running the tool call, merging its output into the
state, appending the messages, summing the token usage. Per-step time = total run time / steps (best of
``--repeat`` runs).

Usage::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_agent.py            # 1,000 steps
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_agent.py --quick    # 100 steps, a smoke run
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_agent.py --profile  # cProfile of our agent's run

Target: ours at most one third of haystack-ai's per-step time (goal: one fifth).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import component
from haystack.components.agents import Agent as HaystackAgent
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import Tool

from haystack_state import Agent, tool

TARGET_RATIO = 1 / 3
GOAL_RATIO = 1 / 5
USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


@component
class ReplayChatGenerator:
    """
    A zero-cost chat generator both agents accept: it returns prebuilt replies, one per call, in order.

    :param replies: The replies.
    """

    def __init__(self, replies: list[ChatMessage]) -> None:
        self._replies = replies
        self._position = 0

    @component.output_types(replies=list[ChatMessage])
    def run(
        self, messages: list[ChatMessage], tools: Any = None, streaming_callback: Any = None
    ) -> dict[str, list[ChatMessage]]:
        """
        Return the next reply.

        :param messages: Ignored.
        :param tools: Ignored.
        :param streaming_callback: Ignored.
        :returns: ``replies``: the next prebuilt reply.
        """
        reply = self._replies[self._position]
        self._position += 1
        return {"replies": [reply]}


def bump(n: int) -> dict[str, int]:
    """Return the number it is given."""
    return {"value": n}


BUMP_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
OUTPUTS_TO_STATE = {"last_value": {"source": "value"}}
STATE_SCHEMA = {"last_value": {"type": int}}


def haystack_tool() -> Tool:
    """The trivial tool as a plain haystack ``Tool``, given to both agents."""
    return Tool(
        name="bump", description="Return n.", parameters=BUMP_SCHEMA, function=bump, outputs_to_state=OUTPUTS_TO_STATE
    )


def script(steps: int) -> list[ChatMessage]:
    """``steps - 1`` tool-call replies, then a text reply; each with usage meta, as a real generator reports."""
    replies = [
        ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name="bump", arguments={"n": i}, id=f"call_{i}")], meta={"usage": dict(USAGE)}
        )
        for i in range(steps - 1)
    ]
    replies.append(ChatMessage.from_assistant("Done.", meta={"usage": dict(USAGE)}))
    return replies


def make_ours(steps: int, tools: list[Any]) -> Callable[[], dict[str, Any]]:
    agent = Agent(
        chat_generator=ReplayChatGenerator(script(steps)),
        tools=tools,
        state_schema=STATE_SCHEMA,
        max_agent_steps=steps + 1,
    )
    return lambda: agent.run([ChatMessage.from_user("Count.")])


def make_haystack(steps: int, tools: list[Any]) -> Callable[[], dict[str, Any]]:
    agent = HaystackAgent(
        chat_generator=ReplayChatGenerator(script(steps)),
        tools=tools,
        state_schema=STATE_SCHEMA,
        max_agent_steps=steps + 1,
    )
    return lambda: agent.run(messages=[ChatMessage.from_user("Count.")])


def check(result: dict[str, Any], steps: int) -> None:
    """Both agents must have done the same work."""
    assert result["last_value"] == steps - 2, result["last_value"]
    assert len(result["messages"]) == 1 + 2 * (steps - 1) + 1, len(result["messages"])
    assert result["last_message"].text == "Done."
    assert result["token_usage"]["total_tokens"] == USAGE["total_tokens"] * steps


Maker = Callable[[int, list[Any]], Callable[[], dict[str, Any]]]


def time_run(make: Maker, steps: int, tools: list[Any]) -> float:
    """Seconds one run takes, on a fresh agent and script (garbage from earlier runs collected first)."""
    run = make(steps, tools)
    gc.collect()
    start = time.perf_counter()
    result = run()
    elapsed = time.perf_counter() - start
    check(result, steps)
    return elapsed


def measure(contenders: dict[str, tuple[Maker, Callable[[], list[Any]]]], steps: int, repeat: int) -> dict[str, float]:
    """
    Best per-step time (seconds) of each contender over ``repeat`` rounds. The contenders take turns within a
    round, so a burst of load on a shared machine hits them alike.
    """
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(repeat):
        for name, (make, tools) in contenders.items():
            best[name] = min(best[name], time_run(make, steps, tools()))
    return {name: seconds / steps for name, seconds in best.items()}


def our_function_tool() -> Any:
    """The same tool made with this package's ``@tool`` (arguments coerced to the parameter types)."""
    return tool(outputs_to_state=OUTPUTS_TO_STATE)(bump)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 100 steps, one repeat")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 1000; 100 with --quick)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per agent, best kept (default 5; 2 quick)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one run of our agent")
    args = parser.parse_args(argv)
    steps = args.steps or (100 if args.quick else 1000)
    repeat = args.repeat or (2 if args.quick else 5)
    if steps < 2:
        parser.error("--steps must be at least 2")

    contenders: dict[str, tuple[Maker, Callable[[], list[Any]]]] = {
        "haystack-ai": (make_haystack, lambda: [haystack_tool()]),
        "ours": (make_ours, lambda: [haystack_tool()]),
        "ours, our @tool": (make_ours, lambda: [our_function_tool()]),
    }
    measure(contenders, 10, 1)  # imports and caches warm

    if args.profile:
        run = make_ours(steps, [haystack_tool()])
        profiler = cProfile.Profile()
        profiler.runcall(run)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(35)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)

    per_step = measure(contenders, steps, repeat)
    theirs, ours, ours_fn = per_step["haystack-ai"], per_step["ours"], per_step["ours, our @tool"]
    ratio = ours / theirs

    print(f"steps per run: {steps} ({steps - 1} tool-call steps, then a text reply); best of {repeat}")
    print(f"haystack-ai Agent:      {theirs * 1e6:9.1f} us/step")
    print(f"haystack_state Agent:   {ours * 1e6:9.1f} us/step  (same haystack Tool)")
    print(f"  with our @tool:       {ours_fn * 1e6:9.1f} us/step")
    print(f"ratio ours/haystack-ai: {ratio:.3f}  (target <= {TARGET_RATIO:.3f}, goal <= {GOAL_RATIO:.3f})")
    verdict = "goal met" if ratio <= GOAL_RATIO else "target met" if ratio <= TARGET_RATIO else "TARGET MISSED"
    print(verdict)
    return 0 if ratio <= TARGET_RATIO or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
