"""
Memory of a long agent run: haystack-state's ``Agent`` (without and with a ``SQLiteCheckpointer`` thread) next to
haystack-ai's ``Agent`` on the same run.

Workload (10,000 steps by default): each step is one model reply calling a tool (~200 characters of arguments) and
the tool's result (~500 characters); then a final text reply. The model is a tiny scripted chat generator defined
here (no token counting, no copies), the same for every contender; the tool is a plain function.

Each contender runs in a subprocess of its own, twice: once to measure the peak resident set size (``ru_maxrss``,
minus the process's size after the imports), the garbage collector's pauses (``gc.callbacks``: the longest, and all
of them added up) and the wall time; once under ``tracemalloc`` for the peak of traced Python allocations. After the
run, still holding the run's result, the child counts the ``ChatMessage`` objects alive in the process: a run that
holds each message once has about one per message of the conversation (the State's copy, which the result and the
checkpointer's cache share as read-only values, plus the result's own shallow copies of the message list's items).

Usage::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_memory.py              # 10,000 steps
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_memory.py --steps 2000
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_memory.py --no-tracemalloc
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

QUERY = "Find the quarterly revenue figures for the EMEA region, broken down by product line and by month, " + (
    "including returns, discounts and currency adjustments, with sources cited for every figure."
)
FILLER = "Revenue rose in every product line; the largest gains came from services. " * 8
CONTENDERS = ("haystack-ai Agent", "ours, no checkpointer", "ours, SQLite thread")


def result_text(page: int) -> str:
    """The ~500-character tool result of one step."""
    return f"Page {page}: " + FILLER[: 500 - len(f"Page {page}: ")]


def search(query: str, page: int) -> str:
    """
    Search the reports.

    :param query: What to look for.
    :param page: The result page.
    """
    return result_text(page)


def make_generator(steps: int) -> Any:
    from haystack import component
    from haystack.dataclasses import ChatMessage, ToolCall

    @component
    class StepsGenerator:
        """Replies with one tool call per step, then with a text."""

        def __init__(self) -> None:
            self.calls = 0

        @component.output_types(replies=list[ChatMessage])
        def run(
            self,
            messages: list[ChatMessage],
            tools: Any = None,
            generation_kwargs: dict[str, Any] | None = None,
            streaming_callback: Any = None,
        ) -> dict[str, Any]:
            page, self.calls = self.calls, self.calls + 1
            usage = {"prompt_tokens": 47, "completion_tokens": 50, "total_tokens": 97}
            meta = {"model": "scripted", "finish_reason": "tool_calls", "usage": usage}
            if page >= steps:
                return {"replies": [ChatMessage.from_assistant("Done.", meta={**meta, "finish_reason": "stop"})]}
            call = ToolCall(tool_name="search", arguments={"query": QUERY, "page": page}, id=f"call_{page}")
            return {"replies": [ChatMessage.from_assistant(tool_calls=[call], meta=meta)]}

    return StepsGenerator()


def run_child(contender: str, steps: int, traced: bool) -> dict[str, Any]:
    """Run one contender in this process and measure it (called in a subprocess)."""
    import tracemalloc

    from haystack.dataclasses import ChatMessage

    if contender == CONTENDERS[0]:
        from haystack.components.agents import Agent as HaystackAgent
        from haystack.tools import create_tool_from_function

        agent: Any = HaystackAgent(
            chat_generator=make_generator(steps),
            tools=[create_tool_from_function(search)],
            max_agent_steps=steps + 2,
        )
        agent.warm_up()
        kwargs: dict[str, Any] = {}
    else:
        from haystack_state import Agent, tool
        from haystack_state.persistence import SQLiteCheckpointer

        checkpointer = None
        kwargs = {}
        if contender == CONTENDERS[2]:
            folder = tempfile.mkdtemp(prefix="bench-memory-")
            checkpointer = SQLiteCheckpointer(Path(folder) / "threads.sqlite")
            kwargs = {"thread_id": "bench"}
        agent = Agent(
            chat_generator=make_generator(steps),
            tools=[tool(search)],
            checkpointer=checkpointer,
            max_agent_steps=steps + 2,
        )
    pauses: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.collect()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if traced:
        tracemalloc.start()
    gc.callbacks.append(on_gc)
    start = time.perf_counter()
    result = agent.run([ChatMessage.from_user("Collect the figures.")], **kwargs)
    wall = time.perf_counter() - start
    gc.callbacks.remove(on_gc)
    peak_traced = tracemalloc.get_traced_memory()[1] if traced else 0
    if traced:
        tracemalloc.stop()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    messages = len(result["messages"])
    alive = sum(1 for obj in gc.get_objects() if type(obj) is ChatMessage)
    assert messages == 2 * steps + 2, f"{contender}: the run has {messages} messages"
    return {
        "wall": wall,
        "rss": peak_rss - base_rss,
        "traced": peak_traced,
        "gc_max": max(pauses, default=0.0),
        "gc_total": sum(pauses),
        "gc_count": len(pauses),
        "messages": messages,
        "alive": alive,
    }


def measure(contender: str, steps: int, traced: bool) -> dict[str, Any]:
    """Run a contender in a subprocess and return its figures."""
    command = [sys.executable, __file__, "--child", contender, "--steps", str(steps)]
    if traced:
        command.append("--traced")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{contender} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def mb(n: float) -> str:
    return f"{n / 1024 / 1024:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--no-tracemalloc", action="store_true", help="skip the (slow) tracemalloc runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.child, args.steps, args.traced)))
        return 0

    load = os.getloadavg()[0]
    print(f"workload: {args.steps} steps (a tool call and its ~500-character result each), one subprocess per run")
    rows = {}
    for contender in CONTENDERS:
        figures = measure(contender, args.steps, traced=False)
        if not args.no_tracemalloc:
            figures["traced"] = measure(contender, args.steps, traced=True)["traced"]
        rows[contender] = figures
        print(f"  {contender}: done in {figures['wall']:.1f} s")
    print(f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores")
    print()
    reference = rows[CONTENDERS[0]]
    header = f"{'contender':<24}{'peak RSS':>11}{'/ hs-ai':>9}{'traced peak':>13}{'/ hs-ai':>9}"
    print(header + f"{'max GC pause':>14}{'GC total':>10}{'run':>8}{'messages':>10}{'alive':>8}")
    for contender, f in rows.items():
        traced = "-" if args.no_tracemalloc else mb(f["traced"])
        traced_ratio = "-" if args.no_tracemalloc else f"{f['traced'] / reference['traced']:.2f}x"
        print(
            f"{contender:<24}{mb(f['rss']):>11}{f['rss'] / reference['rss']:>8.2f}x{traced:>13}{traced_ratio:>9}"
            f"{f['gc_max'] * 1e3:>11.1f} ms{f['gc_total']:>9.2f}s{f['wall']:>7.1f}s{f['messages']:>10}{f['alive']:>8}"
        )
    print()
    print(
        "alive: ChatMessage objects in the process after the run, its result still held (the result's message list "
        "holds shallow copies for ours, the originals for haystack-ai)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
