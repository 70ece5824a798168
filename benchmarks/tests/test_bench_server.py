"""
`benchmarks/bench_server.py` keeps running: a smoke run (our server as a process, the FastAPI floor, in-process
runs; LangGraph's server is left out, it lives in a virtualenv of its own) prints every figure of every server, the
ratios, and ours against in-process runs. No timing is asserted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench_server.py"


def test_the_server_benchmark_reports_ours_the_floor_and_in_process_runs() -> None:
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-langgraph", "--clients", "1,2", "--runs", "2"],
        cwd=BENCH.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    for operation in ("wait", "stream", "ok"):
        for server in ("ours", "floor"):
            for clients in (1, 2):
                row = re.search(rf"^{operation}\s+{clients}\s+{server}\s+([\d.]+)\s+([\d.]+)", text, re.MULTILINE)
                assert row is not None, f"no {operation}/{server}/{clients} row in:\n{text}"
                assert float(row.group(1)) > 0, row.group(0)
    assert re.search(r"^run_async\s+2\s+in-process\s+[\d.]+", text, re.MULTILINE), text
    assert "ours / FastAPI floor" in text
    assert re.search(r"ours, 2 clients, runs/wait: p50 [-+][\d.]+ ms, p99 [-+][\d.]+ ms over in-process", text), text
