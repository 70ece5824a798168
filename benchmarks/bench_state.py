"""
haystack-state's State against haystack-ai's, side by side in one process.

Run: ``python benchmarks/bench_state.py`` (add ``--quick`` for a smoke run). Prints each measurement and the
ratio haystack-ai / haystack-state (higher is better for us), with the issue's targets.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack.components.agents.state import State as HaystackState

from haystack_state import State


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds (the least disturbed by a noisy machine)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def appends(cls: type, n: int) -> Callable[[], None]:
    def run() -> None:
        state = cls({"items": {"type": list[dict]}})
        for i in range(n):
            state.set("items", {"i": i})

    return run


def gets(cls: type, size: int, reads: int) -> Callable[[], None]:
    state = cls(
        {"docs": {"type": list[dict]}}, {"docs": [{"id": i, "title": f"doc {i}", "score": 0.5} for i in range(size)]}
    )

    def run() -> None:
        for _ in range(reads):
            state.get("docs")

    return run


def replaces(cls: type, n: int) -> Callable[[], None]:
    state = cls({"name": {"type": str}})

    def run() -> None:
        for _ in range(n):
            state.set("name", "user")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    n_appends = 5_000 if args.quick else 50_000
    repeat = 1 if args.quick else 3
    rows = [
        (f"{n_appends:,} single-item appends", appends, (n_appends,), 50.0, "at least 50x faster"),
        ("get of a 10,000-dict list (x20)", gets, (10_000, 20), 20.0, "at least 20x cheaper"),
        ("10,000 replace sets", replaces, (10_000,), 1 / 1.5, "no slower than 1.5x"),
    ]
    print(f"{'measurement':38} {'haystack-ai':>12} {'haystack-state':>15} {'ratio':>8}  target")
    for label, make, params, target, target_text in rows:
        theirs = best_of(make(HaystackState, *params), repeat)
        ours = best_of(make(State, *params), repeat)
        ratio = theirs / ours
        verdict = "ok" if ratio >= target else "MISSED"
        print(f"{label:38} {theirs * 1e3:10.2f}ms {ours * 1e3:13.2f}ms {ratio:7.1f}x  {target_text} ({verdict})")


if __name__ == "__main__":
    main()
