"""
A server keeps the leases of its runs alive however many run at once and however long they last: 50 concurrent
runs, each lasting past several lease periods of the run queue (``lease_seconds``) and of the checkpointer
(``lease_ttl``), all finish in their first attempt, while the process has one lease renewer thread. The worker's
queue leases are renewed by its own loop (now woken by its timers, not by a poll after every run), the thread
leases by the renewer thread, and the runs' commits go inline on the event loop while that thread writes too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from langgraph_sdk import get_client, get_sync_client

from haystack_state.persistence import Checkpointer, SQLiteCheckpointer
from haystack_state.server import Limits, create_app
from server.agents import make_agent
from server.conftest import Backend, LiveServer

pytestmark = pytest.mark.slow

RUNS = 50
CHECKPOINTER_LEASE = 0.6
QUEUE_LEASE = 0.9
WORK = 10.0  # the model's answer takes this long: many leases of each kind (and time for 50 runs to start)


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def checkpointer_of(backend: Backend) -> Checkpointer:
    if backend.name == "sqlite":
        assert backend.path is not None
        made: Checkpointer = SQLiteCheckpointer(backend.path, lease_ttl=CHECKPOINTER_LEASE)
    else:
        from haystack_state.persistence.postgres import PostgresCheckpointer

        made = PostgresCheckpointer(backend.dsn, schema=backend.schema or "public", lease_ttl=CHECKPOINTER_LEASE)
    backend.opened.append(made)
    return made


def renewers() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "haystack-state-lease-renewer")


def test_fifty_long_runs_keep_their_leases(backend: Backend) -> None:
    checkpointer = checkpointer_of(backend)
    app = create_app(
        {"agent": make_agent(checkpointer)},
        poll_interval=0.05,
        lease_seconds=QUEUE_LEASE,
        limits=Limits(max_concurrent_runs=64),
    )
    with LiveServer(app) as live, get_sync_client(url=live.url, api_key=None) as client:
        threads = [client.threads.create()["thread_id"] for _ in range(RUNS)]

        async def start_all() -> list[str]:  # at once: every run is under way before the checks below
            async with get_client(url=live.url, api_key=None) as sdk:
                made = await asyncio.gather(
                    *(sdk.runs.create(thread_id, "agent", input=human(f"sleep {WORK}")) for thread_id in threads)
                )
            return [run["run_id"] for run in made]

        runs = asyncio.run(start_all())
        deadline = time.monotonic() + WORK - 3 * CHECKPOINTER_LEASE
        while not all(checkpointer.read_lease(thread_id) is not None for thread_id in threads):  # all under way
            assert time.monotonic() < deadline, "the runs did not all start in time"
            time.sleep(0.05)
        started = time.monotonic()
        time.sleep(3 * CHECKPOINTER_LEASE)  # past several leases of each kind: only renewed leases hold still
        held = sum(checkpointer.read_lease(thread_id) is not None for thread_id in threads)
        running = [client.runs.get(t, r)["status"] for t, r in zip(threads, runs, strict=True)]
        during = renewers()
        found = [client.runs.join(t, r) for t, r in zip(threads, runs, strict=True)]
        ended = [client.runs.get(t, r) for t, r in zip(threads, runs, strict=True)]
    assert time.monotonic() - started >= 3 * CHECKPOINTER_LEASE
    assert held == RUNS, held
    assert running.count("running") == RUNS, running
    assert during == 1
    assert all("__error__" not in values for values in found), found
    assert [run["status"] for run in ended] == ["success"] * RUNS
    assert not [run for run in ended if run["metadata"].get("resumed") or run["metadata"].get("attempts")]
    assert all(checkpointer.read_lease(thread_id) is None for thread_id in threads)  # released at their ends
