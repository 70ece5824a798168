"""
A served run survives its worker: ``serve`` processes are killed with SIGKILL in the middle of runs, and the runs
they held are resumed from their threads' last checkpoints (by the other process, or by the same one restarted),
each ending ``success`` with its final answer. A tool call in flight at the kill runs again (at least once); no
other call runs twice, and no finished run runs again.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client

from server.conftest import Backend, ServeProcess

pytestmark = pytest.mark.slow

LEASE_SECONDS = 3.0


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def tool_calls(log: Path) -> collections.Counter[str]:
    """How many times ``slow_work`` started, per argument, in every process."""
    if not log.exists():
        return collections.Counter()
    return collections.Counter(line.split()[0] for line in log.read_text().splitlines() if line)


def serve_env(log: Path, seconds: float) -> dict[str, str]:
    return {"HAYSTACK_STATE_TEST_TOOL_LOG": str(log), "HAYSTACK_STATE_TEST_WORK_SECONDS": str(seconds)}


def wait_all_done(client: Any, runs: list[tuple[str, str]], timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = {run_id: client.runs.get(thread_id, run_id) for thread_id, run_id in runs}
        if all(run["status"] not in ("pending", "running") for run in found.values()):
            return found
        if time.monotonic() > deadline:
            statuses = collections.Counter(run["status"] for run in found.values())
            raise AssertionError(f"runs still active after {timeout} s: {statuses}")
        time.sleep(0.1)


def pids_of(log: Path) -> collections.Counter[int]:
    if not log.exists():
        return collections.Counter()
    return collections.Counter(int(line.split()[1]) for line in log.read_text().splitlines() if line)


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_two_processes_on_postgres_one_killed_mid_runs_every_run_succeeds(backend: Backend, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    args = [
        "server.agents:serve_agents",
        *backend.serve_args,
        "--poll-interval",
        "0.05",
        "--lease-seconds",
        str(LEASE_SECONDS),
        "--max-concurrent-runs",
        "10",
    ]
    env = serve_env(log, 1.5)
    first, second = ServeProcess(*args, env=env), ServeProcess(*args, env=env)
    try:
        first.wait_ready()
        second.wait_ready()
        with get_sync_client(url=first.url, api_key=None) as client:
            runs = []
            for index in range(30):
                thread_id = client.threads.create()["thread_id"]
                runs.append((thread_id, client.runs.create(thread_id, "agent", input=human(f"work {index}"))["run_id"]))
            # Kill the second process while it is inside some of its tool calls.
            deadline = time.monotonic() + 30
            while second.process.pid not in pids_of(log):
                assert time.monotonic() < deadline, "the second process took no run"
                time.sleep(0.02)
            time.sleep(0.3)
            in_flight = {n for n, pid in _calls_by_pid(log) if pid == second.process.pid}
            os.kill(second.process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            second.stop()  # (reaps it, and closes its pipes)
            found = wait_all_done(client, runs, timeout=LEASE_SECONDS + 30)
            recovered_in = time.monotonic() - killed_at
            assert {run["status"] for run in found.values()} == {"success"}, found
            for index, (thread_id, _) in enumerate(runs):
                values = client.threads.get_state(thread_id)["values"]
                assert values["messages"][-1]["content"] == f"Done: worked {index}", values["messages"]
            resumed = [run for run in found.values() if run["metadata"].get("resumed")]
            assert resumed, "no run was resumed"
            for run in resumed:
                assert run["metadata"]["attempt"] == 2
                assert run["metadata"]["attempts"][0]["outcome"].startswith("its worker stopped")
        calls = tool_calls(log)
        twice = {n for n, count in calls.items() if count > 1}
        assert set(calls) == {str(i) for i in range(30)}
        assert max(calls.values()) <= 2, calls
        assert twice <= in_flight, (twice, in_flight)  # only the calls in flight at the kill ran again
        assert recovered_in <= LEASE_SECONDS + 10, recovered_in
    finally:
        first.stop()
        second.stop()


def _calls_by_pid(log: Path) -> list[tuple[str, int]]:
    return [(line.split()[0], int(line.split()[1])) for line in log.read_text().splitlines() if line]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_one_sqlite_process_killed_and_restarted_resumes_its_runs(backend: Backend, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    args = ["server.agents:serve_agents", *backend.serve_args, "--poll-interval", "0.05", "--lease-seconds", "30"]
    env = serve_env(log, 1.0)
    server = ServeProcess(*args, env=env).wait_ready()
    try:
        with get_sync_client(url=server.url, api_key=None) as client:
            runs = []
            for index in range(6):
                thread_id = client.threads.create()["thread_id"]
                runs.append((thread_id, client.runs.create(thread_id, "agent", input=human(f"work {index}"))["run_id"]))
            deadline = time.monotonic() + 30
            while len(tool_calls(log)) < 3:
                assert time.monotonic() < deadline, "no tool call started"
                time.sleep(0.02)
            in_flight = set(tool_calls(log))
            os.kill(server.process.pid, signal.SIGKILL)
            server.stop()
        # The same command again: the runs left running resume at once (their process is gone), without waiting
        # for their 30 s leases.
        restarted_at = time.monotonic()
        server = ServeProcess(*args, env=env).wait_ready()
        with get_sync_client(url=server.url, api_key=None) as client:
            found = wait_all_done(client, runs, timeout=30)
            assert {run["status"] for run in found.values()} == {"success"}, found
            assert time.monotonic() - restarted_at < 20
            for index, (thread_id, _) in enumerate(runs):
                messages = client.threads.get_state(thread_id)["values"]["messages"]
                assert messages[-1]["content"] == f"Done: worked {index}"
                assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai"]
        calls = tool_calls(log)
        assert set(calls) == {str(i) for i in range(6)}
        assert {n for n, count in calls.items() if count > 1} <= in_flight and max(calls.values()) <= 2
    finally:
        server.stop()


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_stale_worker_that_wakes_after_its_run_was_resumed_writes_nothing(backend: Backend, tmp_path: Path) -> None:
    """A worker frozen (SIGSTOP) past its lease loses its run to another process; woken, it writes nothing."""
    log = tmp_path / "calls.log"
    args = ["server.agents:serve_agents", *backend.serve_args, "--poll-interval", "0.05", "--lease-seconds", "2"]
    env = serve_env(log, 2.0)
    stale = ServeProcess(*args, env=env).wait_ready()
    other: ServeProcess | None = None
    try:
        with get_sync_client(url=stale.url, api_key=None) as client:
            thread_id = client.threads.create()["thread_id"]
            run_id = client.runs.create(thread_id, "agent", input=human("work 7"))["run_id"]
        deadline = time.monotonic() + 30
        while stale.process.pid not in pids_of(log):
            assert time.monotonic() < deadline, "the tool call did not start"
            time.sleep(0.02)
        os.kill(stale.process.pid, signal.SIGSTOP)  # frozen inside its tool call, its leases unrenewed
        other = ServeProcess(*args, env=env).wait_ready()
        with get_sync_client(url=other.url, api_key=None) as client:
            found = wait_all_done(client, [(thread_id, run_id)], timeout=30)[run_id]
            assert found["status"] == "success" and found["metadata"]["attempt"] == 2, found
            history = client.threads.get_history(thread_id, limit=100)
            os.kill(stale.process.pid, signal.SIGCONT)  # its tool call ends; it would commit, then record the end
            time.sleep(3.0)
            assert client.runs.get(thread_id, run_id) == client.runs.get(thread_id, run_id) | {"status": "success"}
            assert client.threads.get_history(thread_id, limit=100) == history  # no checkpoint of the stale worker
            messages = client.threads.get_state(thread_id)["values"]["messages"]
            assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai"]
            assert messages[-1]["content"] == "Done: worked 7"
        assert tool_calls(log) == {"7": 2}  # the call in flight ran again; nothing else did
        # The woken process is not wedged: it serves runs again.
        with get_sync_client(url=stale.url, api_key=None) as client:
            assert client.runs.wait(thread_id, "agent", input=human("hi"))["messages"][-1]["content"] == "echo: hi"
        _, err = stale.stop()
        assert "ended after this worker lost it; its end is not recorded" in err, err[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stale.process.pid, signal.SIGCONT)
        stale.stop()
        if other is not None:
            other.stop()
