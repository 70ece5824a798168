"""`benchmarks/bench_context.py` keeps running: a smoke run names every policy and haystack-ai (no timing asserted)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import pytest


def test_the_context_benchmark_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    path = Path(__file__).resolve().parents[1] / "bench_context.py"
    spec = importlib.util.spec_from_file_location("bench_context", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_context", module)
    spec.loader.exec_module(module)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = module.main(["--quick", "--repeat", "3"], sizes=(60, 200))
    assert code == 0
    text = output.getvalue()
    for name in ("SlidingWindow(10)", "TokenBudget(8000)", "Summarize(4000, keep 3)", "haystack-ai"):
        assert name in text
