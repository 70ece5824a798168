"""
The concurrency test: worker processes doing many short agent runs on a few shared threads at once.

``HAYSTACK_STATE_LOAD_PROCS`` workers (default 8) each do ``HAYSTACK_STATE_LOAD_RUNS`` runs (default 25; 100 in the
``stress`` variant) over ``HAYSTACK_STATE_LOAD_THREADS`` threads (default 8), every run appending one marker, retried on
``ThreadConflictError`` (see ``reliability.load_worker``). All workers start together on the same thread, so conflicts
are forced. The store is empty at first: the workers open it at the same time, so they also race to create its
tables. Expected, per thread: the stored markers are exactly the markers of the runs that succeeded (0 lost
updates, 0 duplicates, nothing from a run that failed), every successful run's last checkpoint is on the thread's
branch, and the thread has no other branch (every commit followed the head it expected).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from persistence.harness import Harness, branch
from workers import harness
from workers.harness import store_spec

from haystack_state import Agent, ThreadBusyError, ThreadConflictError, tool
from haystack_state.persistence import Checkpointer, SQLiteCheckpointer
from haystack_state.testing import ScriptedChatGenerator
from reliability.common import env_count
from reliability.forkserver import ForkServer, wait_for_file
from reliability.load_worker import thread_name

persistent_store = harness.persistent_store  # SQLite (a file) and PostgreSQL (a fresh schema)


@pytest.mark.slow
def test_concurrent_runs_lose_no_update_and_conflicts_surface(
    persistent_store: Harness, tmp_path: Path, report: Callable[[str], None]
) -> None:
    load(persistent_store, tmp_path, report, runs=env_count("HAYSTACK_STATE_LOAD_RUNS", 25))


@pytest.mark.stress
def test_concurrent_runs_lose_no_update_and_conflicts_surface_long(
    persistent_store: Harness, tmp_path: Path, report: Callable[[str], None]
) -> None:
    load(persistent_store, tmp_path, report, runs=env_count("HAYSTACK_STATE_LOAD_RUNS", 100))


def load(store: Harness, tmp_path: Path, report: Callable[[str], None], runs: int) -> None:
    """Run the workers, then check every thread and report the figures."""
    procs = env_count("HAYSTACK_STATE_LOAD_PROCS", 8)
    threads = env_count("HAYSTACK_STATE_LOAD_THREADS", 8)
    seed = int(time.time())
    # No table exists yet: the workers create them, all at once (migrations must serialize).
    spec = store_spec(store)
    go = tmp_path / "go"
    started = time.monotonic()
    with ForkServer(tmp_path / "forkserver.log") as server:
        workers = []
        for proc in range(procs):
            ready, out, log = (tmp_path / f"{proc}.{name}" for name in ("ready", "json", "log"))
            args = ["--store", spec, "--proc", str(proc), "--runs", str(runs), "--threads", str(threads)]
            args += ["--seed", str(seed), "--ready", str(ready), "--go", str(go), "--out", str(out)]
            workers.append((server.spawn("load", args, log), ready, out, log))
        for pid, ready, _, log in workers:
            wait_for_file(server, pid, ready, log)
        go.write_text("go")
        reports: list[dict[str, Any]] = []
        for pid, _, out, log in workers:
            status = server.wait(pid, timeout=300)
            assert status == 0, f"worker {pid} failed ({status}):\n{log.read_text()}"
            reports.append(json.loads(out.read_text()))
    seconds = time.monotonic() - started

    succeeded: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for worker in reports:
        for run in worker["runs"]:
            succeeded[run["thread"]].append(run)
    conflicts = sum(worker["conflicts"] for worker in reports)
    busy = sum(worker["busy"] for worker in reports)
    cp = store.make()
    inputs = {f"mark {run['marker']} {run['attempts']}" for runs_of in succeeded.values() for run in runs_of}
    lost = duplicates = strays = off_branch = forks = orphans = 0
    for index in range(threads):
        thread_id = thread_name(index)
        expected = sorted(run["marker"] for run in succeeded[thread_id])
        if cp.head(thread_id) is None:
            assert not expected, thread_id
            continue
        stored = list(cp.get(thread_id).values.get("markers") or [])
        duplicates += len(stored) - len(set(stored))
        lost += len(set(expected) - set(stored))
        strays += len(set(stored) - set(expected))
        on_branch = {meta.checkpoint_id for meta in branch(cp, thread_id)}
        off_branch += sum(run["checkpoint_id"] not in on_branch for run in succeeded[thread_id])
        forks += len(cp.history(thread_id)) - len(on_branch)
        messages = cp.get(thread_id).values["messages"]
        orphans += sum(m.is_from("user") and m.text not in inputs for m in messages)
    successful = sum(len(runs_of) for runs_of in succeeded.values())
    attempts = sum(run["attempts"] for runs_of in succeeded.values() for run in runs_of)
    report(
        f"load[{store.name}]: procs={procs} runs-per-proc={runs} threads={threads} successful-runs={successful} "
        f"attempts={attempts} conflicts(ThreadConflictError)={conflicts} busy-thread-retries={busy} "
        f"lost-updates={lost} duplicates={duplicates} markers-of-failed-runs={strays} "
        f"acknowledged-checkpoints-off-branch={off_branch} forks={forks} "
        f"user-messages-left-by-failed-attempts={orphans} duration={seconds:.1f}s"
    )
    assert successful == procs * runs
    assert (lost, duplicates, strays, off_branch, forks) == (0, 0, 0, 0, 0)
    assert conflicts > 0


# --- what the load test found --------------------------------------------------------------------------------------


def _two_runs(tmp_path: Path, hold_in: str) -> tuple[Checkpointer, dict[str, str]]:
    """
    Run A (message "a") on thread ``t`` and hold it in its model call (``hold_in="model"``: its input is committed)
    or in its tool call (``"tool"``: its model reply, with the call, is committed); meanwhile run B (message "b") on
    ``t``; then let A go on. Returns the checkpointer and how each run ended.
    """
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(10)

    def policy(messages: list[ChatMessage], tools: list[Any]) -> Any:
        last = messages[-1]
        if last.is_from("user"):
            if last.text == "a" and hold_in == "model":
                hold()
            return [("note", {"text": last.text})] if last.text == "a" else f"answer to {last.text}"
        return "done"

    @tool
    def note(text: str) -> str:
        """Take a note."""
        if hold_in == "tool":
            hold()
        return text

    cp = SQLiteCheckpointer(tmp_path / "two.sqlite")
    outcome: dict[str, str] = {}

    def run(text: str) -> None:
        # Each run has an agent of its own, as two processes would (a generator serializes its own calls).
        agent = Agent(ScriptedChatGenerator(policy=policy), tools=[note], checkpointer=cp)
        try:
            agent.run([ChatMessage.from_user(text)], thread_id="t")
            outcome[text] = "ok"
        except Exception as error:
            outcome[text] = f"{type(error).__name__}: {error}"

    first = threading.Thread(target=run, args=("a",))
    first.start()
    try:
        assert entered.wait(10)
        run("b")
    finally:
        release.set()
        first.join(10)
    return cp, outcome


def test_a_run_that_starts_while_another_is_in_flight_gets_a_conflict_and_writes_nothing(tmp_path: Path) -> None:
    # A has committed its input and waits in its model call; B arrives with a message of its own. The run in flight
    # wins; B gets ThreadBusyError (a ThreadConflictError) before writing anything, so a retry duplicates nothing.
    cp, outcome = _two_runs(tmp_path, hold_in="model")
    try:
        assert outcome["a"] == "ok"
        assert outcome["b"].startswith("ThreadBusyError"), outcome
        texts = [(m.role.value, m.text) for m in cp.get("t").values["messages"]]
        assert ("user", "b") not in texts
        assert texts[0] == ("user", "a") and texts[-1] == ("assistant", "done")
    finally:
        cp.close()


def test_a_run_on_a_thread_with_tool_calls_in_flight_gets_a_conflict(tmp_path: Path) -> None:
    cp, outcome = _two_runs(tmp_path, hold_in="tool")
    try:
        assert outcome["a"] == "ok"
        assert outcome["b"].startswith("ThreadBusyError"), outcome
        assert issubclass(ThreadBusyError, ThreadConflictError)
        assert [m.text for m in cp.get("t").values["messages"] if m.is_from("user")] == ["a"]
    finally:
        cp.close()
