"""
What a context policy costs before each model call, as the stored conversation grows: it should stay flat.

A thread of N stored messages (turns of a question, a tool call, a 400-character result and an answer; the current
run is the last turn) is planned by each policy:

- ``cold``: the first ``plan()`` on the thread (no token count cached yet), in milliseconds;
- ``step``: a ``plan()`` after a step was appended (a tool call and its result), as it happens before every model
  call, in microseconds (the median of many; a new run, with a new question, starts every 10 steps).

Side by side, in the same process: haystack-ai's ``SlidingWindowCompactor.compact`` (the compaction hook's
compactor) on the same conversation with the same budget as ``TokenBudget``. It measures the whole conversation on
every call (and then cuts the stored history, which our policies never do).

Run::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_context.py            # 100 to 50,000 messages
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_context.py --quick    # 100 and 1,000, a smoke run

Exits with 1 if a policy's ``step`` time at the largest size is more than 3 times its time at 1,000 messages (by
then every policy sends a full window; below, it sends the whole, shorter, conversation).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import warnings
from collections.abc import Callable

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.compaction import SlidingWindowCompactor
from haystack.token_counters import ApproximateTokenCounter

from haystack_state.agent.context import (
    ContextPolicy,
    ContextSummary,
    ContextView,
    OffloadToolResults,
    SlidingWindow,
    Summarize,
    TokenBudget,
)
from haystack_state.testing import ScriptedChatGenerator

SIZES = (100, 1_000, 10_000, 50_000)
QUICK_SIZES = (100, 1_000)
BUDGET = 8_000
FLATNESS = 3.0


def turn(i: int) -> list[ChatMessage]:
    """One turn: a question, a tool call, its result and the answer."""
    call = ToolCall(tool_name="search", arguments={"query": f"topic {i}"}, id=f"call_{i}")
    return [
        ChatMessage.from_user(f"Question {i}: what do we know about topic {i}?"),
        ChatMessage.from_assistant(tool_calls=[call]),
        ChatMessage.from_tool(f"Result {i}: " + "lorem ipsum dolor sit amet " * 15, origin=call),
        ChatMessage.from_assistant(f"Answer {i}: topic {i} is well covered."),
    ]


def thread(size: int) -> list[ChatMessage]:
    """A stored conversation of ``size`` messages (about)."""
    messages = [ChatMessage.from_system("You are a research assistant.")]
    i = 0
    while len(messages) < size:
        messages += turn(i)
        i += 1
    return messages


def policies(messages: list[ChatMessage]) -> dict[str, tuple[ContextPolicy, ContextSummary | None]]:
    """The policies measured, each with the summary it plans with."""
    fold_at = max(1, len(messages) - 40)
    while fold_at > 1 and not messages[fold_at].is_from("user"):
        fold_at -= 1
    summary = ContextSummary(text="- earlier turns covered topics 0 to n", covers=(0, fold_at), tokens=12)
    summarizer = ScriptedChatGenerator.summarizer(record=False)
    return {
        "SlidingWindow(10)": (SlidingWindow(max_turns=10), None),
        f"TokenBudget({BUDGET})": (TokenBudget(max_tokens=BUDGET), None),
        "Summarize(4000, keep 3)": (Summarize(summarizer, trigger_tokens=4000, keep_last_turns=3), summary),
        f"Offload | TokenBudget({BUDGET})": (
            OffloadToolResults(max_chars=200, preview_chars=100) | TokenBudget(max_tokens=BUDGET),
            None,
        ),
    }


def median_us(action: Callable[[], object], repeat: int) -> float:
    """The median time of ``action``, in microseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(size: int, repeat: int) -> dict[str, tuple[float, float]]:
    """``{policy: (cold ms, step us)}`` at one size, plus haystack-ai's compactor (the garbage collector off while
    timing, as ``timeit`` does: a collection of the 50,000 messages is not the policy's cost)."""
    counter = ApproximateTokenCounter()
    results: dict[str, tuple[float, float]] = {}
    base = thread(size)
    for name, (policy, summary) in policies(base).items():
        messages = thread(size)  # fresh objects: nothing cached
        run_start = len(messages) - 4
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        policy.plan(ContextView(messages, run_start, summary=summary, counter=counter))
        cold = (time.perf_counter() - start) * 1e3
        steps: list[float] = []
        for i in range(repeat):
            if i % 10 == 9:
                run_start = len(messages)
                messages.append(ChatMessage.from_user(f"Follow-up question {i}."))
            call = ToolCall(tool_name="search", arguments={"query": f"more {i}"}, id=f"more_{i}")
            messages += [
                ChatMessage.from_assistant(tool_calls=[call]),
                ChatMessage.from_tool("more " * 40, origin=call),
            ]
            view = ContextView(messages, run_start, summary=summary, counter=counter)
            start = time.perf_counter()
            policy.plan(view)
            steps.append((time.perf_counter() - start) * 1e6)
        gc.enable()
        results[name] = (cold, statistics.median(steps))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # haystack-ai marks its compactors experimental
        compactor = SlidingWindowCompactor()
    messages = thread(size)
    gc.collect()
    gc.disable()
    hay = median_us(
        lambda: compactor.compact(messages, target_tokens=BUDGET, token_counter=counter), max(3, repeat // 10)
    )
    gc.enable()
    results["haystack-ai SlidingWindowCompactor"] = (hay / 1e3, hay)
    return results


def main(argv: list[str] | None = None, sizes: tuple[int, ...] | None = None) -> int:
    """
    Print the table; return 1 if a policy's step time is not flat.

    :param argv: Command-line arguments.
    :param sizes: Sizes to measure instead of the defaults (for a smoke test).
    :returns: The exit code.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 100 and 1,000 messages")
    parser.add_argument("--repeat", type=int, default=None, help="steps measured per policy (default 200; 20 quick)")
    args = parser.parse_args(argv)
    sizes = sizes or (QUICK_SIZES if args.quick else SIZES)
    repeat = args.repeat or (20 if args.quick else 200)
    table = {size: measure(size, repeat) for size in sizes}
    names = list(table[sizes[0]])
    print(f"{'policy':38} " + " ".join(f"{size:>18,}" for size in sizes))
    print(f"{'':38} " + " ".join(f"{'cold ms / step us':>18}" for _ in sizes))
    for name in names:
        cells = []
        for size in sizes:
            cold, step = table[size][name]
            cells.append(f"{cold:8.2f} / {step:7.0f}")
        print(f"{name:38} " + " ".join(f"{c:>18}" for c in cells))
    largest, smallest = sizes[-1], sizes[min(1, len(sizes) - 1)]
    hay = table[largest]["haystack-ai SlidingWindowCompactor"][1]
    print(f"\nat {largest:,} messages, haystack-ai's compactor / our step time:")
    for name in names[:-1]:
        print(f"  {name:36} {hay / table[largest][name][1]:8.0f}x")
    growth = {name: table[largest][name][1] / table[smallest][name][1] for name in names[:-1]}
    print(
        f"\nstep time growth from {smallest:,} to {largest:,} messages: "
        + ", ".join(f"{name} {ratio:.1f}x" for name, ratio in growth.items())
    )
    return 0 if args.quick or all(ratio <= FLATNESS for ratio in growth.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
