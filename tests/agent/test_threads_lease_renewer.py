"""
One renewer thread keeps every run's lease of a process alive: 50 concurrent runs whose tool call lasts several
lease periods all finish (a lost lease would fail their commits), while the process has one renewing thread.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage

from haystack_state import Agent, tool
from haystack_state.persistence import SQLiteCheckpointer
from haystack_state.persistence._leases import Renewer
from haystack_state.testing import ScriptedChatGenerator

pytestmark = pytest.mark.slow

LEASE = 0.6
WORK = 2.0  # more than three lease periods


@tool
async def wait_a_while(n: str) -> str:
    """Wait a while."""
    await asyncio.sleep(WORK)
    return f"waited {n}"


def policy(messages: list[ChatMessage], tools: Any) -> Any:
    last = messages[-1]
    if last.tool_call_result is not None:
        return f"Done: {last.tool_call_result.result}"
    return [("wait_a_while", {"n": last.text})]


def test_fifty_runs_keep_their_leases_with_one_renewer(tmp_path: Path) -> None:
    checkpointer = SQLiteCheckpointer(tmp_path / "threads.db", lease_ttl=LEASE)
    agent = Agent(ScriptedChatGenerator(policy=policy), tools=[wait_a_while], checkpointer=checkpointer)
    seen: list[tuple[int, int]] = []  # (renewing threads, lease threads of the old kind) while the runs wait

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set():
            names = [thread.name for thread in threading.enumerate()]
            renewers = sum(1 for name in names if name == "haystack-state-lease-renewer")
            per_run = sum(1 for name in names if name.startswith("haystack-state-lease-") and "renewer" not in name)
            seen.append((renewers, per_run))
            await asyncio.sleep(0.1)

    live: list[int] = []

    async def check_leases() -> None:
        await asyncio.sleep(WORK * 0.75)  # past two lease periods: only renewed leases are alive still
        live.append(sum(checkpointer.read_lease(f"t{i}") is not None for i in range(50)))

    async def main() -> list[dict[str, Any]]:
        done = asyncio.Event()
        watcher = asyncio.ensure_future(watch(done))
        runs = [agent.run_async([ChatMessage.from_user(str(i))], thread_id=f"t{i}") for i in range(50)]
        try:
            return list(await asyncio.gather(*runs, check_leases()))[:-1]
        finally:
            done.set()
            await watcher

    try:
        results = asyncio.run(main())
        assert [r["last_message"].text for r in results] == [f"Done: waited {i}" for i in range(50)]
        assert live == [50]
        assert seen and {count for count, _ in seen[5:]} == {1}, seen  # one renewer while the runs wait
        assert all(per_run == 0 for _, per_run in seen)
        thread = Renewer.shared().thread
        assert thread is not None and thread.is_alive()
        assert all(checkpointer.read_lease(f"t{i}") is None for i in range(50))  # released at their ends
    finally:
        checkpointer.close()
