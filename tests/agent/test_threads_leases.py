"""
Leases across processes: a run in another process holds its thread while it works (through a tool call that blocks
for several lease lengths), so no other process takes it over and no tool runs twice; a crashed run's thread is taken
over once its lease expires. On SQLite and PostgreSQL, with worker processes (``tests/workers``).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from haystack.dataclasses import ChatMessage
from workers.harness import Harness, Worker, store_spec, wait_for_leases
from workers.thread_worker import WORKER_LEASE_TTL, build_agent

from haystack_state.errors import ThreadBusyError


@pytest.mark.slow
def test_a_live_run_in_another_process_is_never_taken_over(persistent_store: Harness, tmp_path: Path) -> None:
    signal_file = tmp_path / "reached"
    hold = 3 * WORKER_LEASE_TTL  # the tool blocks for three lease lengths: only renewals keep the thread
    args = ["--store", store_spec(persistent_store), "--thread", "t", "--message", "alpha:2"]
    cp = persistent_store.make()
    agent = build_agent(cp)
    refused = 0
    with Worker(*args, "--block", "tool:alpha-1", "--signal", str(signal_file), "--hold", str(hold)) as worker:
        worker.wait_for(signal_file)
        started = time.monotonic()
        while time.monotonic() - started < hold - 0.5:
            for attempt in (
                lambda: agent.run([], thread_id="t"),
                lambda: agent.run([ChatMessage.from_user("beta:1")], thread_id="t"),
                lambda: asyncio.run(agent.run_async([], thread_id="t")),
            ):
                with pytest.raises(ThreadBusyError, match="busy") as busy:
                    attempt()
                assert busy.value.holder is not None and busy.value.expires_at is not None
                refused += 1
            time.sleep(0.2)
        summary = json.loads(worker.finish())
    assert refused >= 6
    assert summary["exit_reason"] == "text"
    assert cp.read_lease("t") is None  # released at the end of the run
    values = agent.get_state("t").values
    assert values["notes"] == ["alpha-1", "alpha-2"]  # each tool call ran once
    # Free again: a run here goes on at once.
    assert agent.run([ChatMessage.from_user("beta:1")], thread_id="t")["notes"] == ["alpha-1", "alpha-2", "beta-1"]


@pytest.mark.slow
def test_a_crashed_run_is_taken_over_once_its_lease_expires(persistent_store: Harness, tmp_path: Path) -> None:
    signal_file = tmp_path / "reached"
    args = ["--store", store_spec(persistent_store), "--thread", "t", "--message", "alpha:2"]
    with Worker(*args, "--block", "tool:alpha-2", "--signal", str(signal_file)) as worker:
        worker.wait_for(signal_file)
        worker.kill()
    cp = persistent_store.make()
    agent = build_agent(cp)
    lease = cp.read_lease("t")
    assert lease is not None
    with pytest.raises(ThreadBusyError) as busy:
        agent.run([], thread_id="t")
    assert busy.value.holder == lease.owner
    waited = wait_for_leases(cp, ["t"])
    assert waited <= WORKER_LEASE_TTL + 1
    result = agent.run([], thread_id="t")
    assert result["notes"] == ["alpha-1", "alpha-2"]


def test_update_state_on_a_live_run_is_busy_and_writes_nothing(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    agent.run([ChatMessage.from_user("alpha:1")], thread_id="t")
    before = cp.history("t")
    lease = cp.acquire_lease("t", owner="another process")
    with pytest.raises(ThreadBusyError, match="another process"):
        agent.update_state("t", {"notes": ["human"]})
    assert cp.history("t") == before
    cp.release_lease(lease)
    agent.update_state("t", {"notes": ["human"]})
    assert agent.get_state("t").values["notes"] == ["alpha-1", "human"]
