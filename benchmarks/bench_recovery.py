"""
What a served run survives: ``haystack-state serve`` processes are killed with SIGKILL in the middle of runs, and
the figures are what an operator sees afterwards: how many runs there were, how many ended ``success`` with their
final answer, how many tool calls ran twice (the calls in flight at the kill run again: at least once), and how long
it took from the kill until every run had ended.

1. **Two processes on PostgreSQL**, ``RUNS`` background runs (each one model call, one tool call of ``WORK`` seconds,
   one answer), the second process killed once it is inside some of its tool calls. The first resumes the dead
   process's runs once it sees that process is gone (same host) or, failing that, once their leases expire.
   Then the same with the second process frozen (SIGSTOP) instead: its process is alive, so only the expiry of its
   leases frees its runs, as for a worker on another host that hangs.
2. **One process on SQLite**, killed the same way and started again with the same command: the new process takes
   the runs its dead predecessor left ``running`` back at once.

Usage (PostgreSQL on 127.0.0.1:5432, database ``test``; the PostgreSQL scenario is skipped without it)::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_recovery.py [--runs 30] [--lease 5]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import httpx
from langgraph_sdk import get_sync_client

ROOT = Path(__file__).resolve().parent.parent
DSN = os.environ.get("HAYSTACK_STATE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
WORK = 1.5


class Serve:
    """A ``haystack-state serve`` process of the test agent (``tests/server/agents.py``)."""

    def __init__(self, args: list[str], log: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
            "HAYSTACK_STATE_TEST_TOOL_LOG": str(log),
            "HAYSTACK_STATE_TEST_WORK_SECONDS": str(WORK),
        }
        command = [sys.executable, "-m", "haystack_state.server.cli", "serve", "server.agents:serve_agents"]
        self.process = subprocess.Popen(
            [*command, *args, "--port", str(self.port), "--poll-interval", "0.05"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=1).status_code == 200:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("serve did not start")
            time.sleep(0.1)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def calls(log: Path) -> list[tuple[str, int]]:
    if not log.exists():
        return []
    return [(line.split()[0], int(line.split()[1])) for line in log.read_text().splitlines() if line]


def submit(url: str, count: int) -> list[tuple[str, str]]:
    with get_sync_client(url=url, api_key=None) as client:
        runs = []
        for index in range(count):
            thread_id = client.threads.create()["thread_id"]
            message = {"messages": [{"type": "human", "content": f"work {index}"}]}
            runs.append((thread_id, client.runs.create(thread_id, "agent", input=message)["run_id"]))
        return runs


def wait_done(url: str, runs: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with get_sync_client(url=url, api_key=None) as client:
        while True:
            found = {run_id: client.runs.get(thread_id, run_id) for thread_id, run_id in runs}
            if all(run["status"] not in ("pending", "running") for run in found.values()):
                answers = {
                    run_id: client.threads.get_state(thread_id)["values"]["messages"][-1]["content"]
                    for thread_id, run_id in runs
                }
                return {"runs": found, "answers": answers}
            if time.monotonic() > deadline:
                return {"runs": found, "answers": {}}
            time.sleep(0.05)


def report(
    name: str, runs: list[tuple[str, str]], done: dict[str, Any], log: Path, killed: set[str], took: float
) -> None:
    statuses = collections.Counter(run["status"] for run in done["runs"].values())
    answered = sum(
        1
        for index, (_, run_id) in enumerate(runs)
        if done["answers"].get(run_id) == f"Done: worked {index}" and done["runs"][run_id]["status"] == "success"
    )
    counts = collections.Counter(n for n, _ in calls(log))
    twice = sorted((n for n, c in counts.items() if c > 1), key=int)
    resumed = sum(1 for run in done["runs"].values() if run["metadata"].get("resumed"))
    print(f"{name}")
    print(f"  runs {len(runs)}, success with the final answer {answered}, statuses {dict(statuses)}")
    print(f"  resumed {resumed}; tool calls in flight at the kill {len(killed)}, run twice {len(twice)}", end="")
    more = sum(1 for c in counts.values() if c > 2)
    print(f", more than twice {more}, twice but not in flight {len(set(twice) - killed)}")
    print(f"  from the kill until every run ended: {took:.2f} s")


def postgres_scenario(count: int, lease: float, tmp: Path, freeze: bool) -> None:
    try:
        import psycopg

        with psycopg.connect(DSN, connect_timeout=3) as conn:
            schema = f"bench_recovery_{uuid.uuid4().hex[:8]}"
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except Exception as error:  # no server
        print(f"PostgreSQL scenario skipped: {error}")
        return
    log = tmp / f"pg-{freeze}.log"
    args = ["--db", DSN, "--schema", schema, "--lease-seconds", str(lease), "--max-concurrent-runs", "16"]
    first, second = Serve(args, log), Serve(args, log)
    try:
        runs = submit(first.url, count)
        deadline = time.monotonic() + 30
        while not any(pid == second.process.pid for _, pid in calls(log)) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        killed = {n for n, pid in calls(log) if pid == second.process.pid}
        if freeze:  # alive but silent (a hung host): only its leases' expiry frees its runs
            os.kill(second.process.pid, signal.SIGSTOP)
        else:
            second.kill()
        started = time.monotonic()
        done = wait_done(first.url, runs, lease + 60)
        how = "frozen with SIGSTOP" if freeze else "killed with SIGKILL"
        took = time.monotonic() - started
        report(f"two processes on PostgreSQL, one {how} (lease {lease:g} s)", runs, done, log, killed, took)
    finally:
        if freeze:
            os.kill(second.process.pid, signal.SIGKILL)
        first.stop()
        second.stop()
        with psycopg.connect(DSN) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def sqlite_scenario(count: int, tmp: Path) -> None:
    log = tmp / "sqlite.log"
    args = ["--db", str(tmp / "threads.db"), "--lease-seconds", "30"]
    server = Serve(args, log)
    runs = submit(server.url, count)
    deadline = time.monotonic() + 30
    while len(calls(log)) < min(count, 4) and time.monotonic() < deadline:
        time.sleep(0.02)
    killed = {n for n, _ in calls(log)}
    server.kill()
    started = time.monotonic()
    server = Serve(args, log)
    try:
        done = wait_done(server.url, runs, 60)
        report(
            "one process on SQLite, killed and started again (lease 30 s)",
            runs,
            done,
            log,
            killed,
            time.monotonic() - started,
        )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--lease", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        postgres_scenario(args.runs, args.lease, tmp, freeze=False)
        postgres_scenario(args.runs, args.lease, tmp, freeze=True)
        sqlite_scenario(args.runs, tmp)


if __name__ == "__main__":
    main()
