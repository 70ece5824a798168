"""`benchmarks/bench_checkpoints.py` keeps running: a smoke run reports every figure (no timing is asserted)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest


def test_the_checkpoints_benchmark_reports_the_sql_floor_and_the_long_thread_floors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = Path(__file__).resolve().parents[1] / "bench_checkpoints.py"
    spec = importlib.util.spec_from_file_location("bench_checkpoints", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_checkpoints", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "LONG_STEPS", 40)  # the long-thread lines, on a thread short enough for a test
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = module.main(["--quick", "--steps", "40", "--repeat", "1", "--no-langgraph"])
    text = output.getvalue()
    assert code == 0, text
    sql = re.search(r"of which the SQL alone .*?: ([\d.]+) m?s", text)
    assert sql is not None and float(sql.group(1)) > 0, text
    assert "agent.get_state of a 40-step thread, cold" in text
    for label in ("pickle.loads of the values", "json.loads of their JSON text"):
        assert re.search(rf"the same values, {re.escape(label)}.*: [\d.]+ m?s \(a cold agent.get_state", text), text
