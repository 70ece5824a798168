"""
How fast the installed ``haystack-state`` command answers ``--help``: the median wall time of several runs of the
console script, for the command's help and for a sub-command's, beside two baselines:

- ``python -c pass``: starting the interpreter, the floor of any command;
- ``python -m haystack_state.cli --help``: the same help through the package's module, which imports the package
  (and so haystack) first, as the console script did when its module was ``haystack_state.cli``.

The goal is an answer under 0.3 s; the figures are measured and printed, not asserted. Each command runs once first,
untimed, so that the operating system's file cache is warm.

Usage::

    python benchmarks/bench_cli.py              # 15 runs of each
    python benchmarks/bench_cli.py --runs 5
    python benchmarks/bench_cli.py --script /path/to/haystack-state
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_SECONDS = 0.3


def installed_script() -> Path:
    """The ``haystack-state`` script next to this interpreter."""
    return Path(sys.executable).parent / ("haystack-state.exe" if os.name == "nt" else "haystack-state")


def timed(command: list[str], runs: int) -> list[float]:
    """Wall times of ``runs`` runs of a command (after one untimed run); each must exit 0."""
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"}
    times = []
    for run in range(runs + 1):
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
        if run:
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each command (default: 15)")
    parser.add_argument("--script", type=Path, default=installed_script(), help="the haystack-state script")
    args = parser.parse_args()
    if not args.script.is_file():
        raise SystemExit(f"no haystack-state script at {args.script}: pip install -e . first, or pass --script")
    script = str(args.script)
    cases = [
        ("haystack-state --help", [script, "--help"]),
        ("haystack-state show --help", [script, "show", "--help"]),
        ("haystack-state store search --help", [script, "store", "search", "--help"]),
        ("python -c pass (interpreter start)", [sys.executable, "-c", "pass"]),
        ("python -m haystack_state.cli --help", [sys.executable, "-m", "haystack_state.cli", "--help"]),
    ]
    print(f"{args.runs} runs each; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}")
    print(f"{'command':<38} {'median':>8} {'min':>8} {'max':>8}")
    for name, command in cases:
        times = timed(command, args.runs)
        median = statistics.median(times)
        mark = "" if "haystack-state" not in name else ("  under 0.3 s" if median < GOAL_SECONDS else "  OVER 0.3 s")
        print(f"{name:<38} {median * 1e3:>6.0f}ms {min(times) * 1e3:>6.0f}ms {max(times) * 1e3:>6.0f}ms{mark}")


if __name__ == "__main__":
    main()
