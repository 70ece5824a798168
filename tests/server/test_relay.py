"""The events of a run followed from another process are written to the database once each, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from haystack_state.server.database import database_for
from haystack_state.server.live import LiveRun
from haystack_state.server.runs import RunManager
from haystack_state.server.storage import RunRecord, ServerStorage, now_text


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_the_worker_and_the_runs_end_relaying_at_once_write_each_event_once(backend: Any) -> None:
    """
    The worker's poll and the run's end both write a followed run's new events. On PostgreSQL the writes run in
    worker threads, so the two could take the same events and numbers: the second write then failed on the key, the
    run's end went unrecorded, and the run was reported lost when its lease expired.
    """
    storage = ServerStorage(database_for(backend.checkpointer()))
    manager = RunManager(storage, None, None, max_concurrent_runs=1, max_pending_runs=1)  # type: ignore[arg-type]
    # The run, held by this manager's worker (a worker writes the events of the runs it holds only).
    at = now_text()
    run = RunRecord("run-1", "t-1", "agent", "", "running", "reject", {}, {}, None, manager.worker_id, at, at)
    storage.create_run(run, lease_until="9999-12-31T00:00:00.000000+00:00")
    live = LiveRun("run-1")
    live.relay = True

    async def main() -> None:
        for index in range(5):
            await live.emit("values", {"n": index})
        await asyncio.gather(*(manager._flush(live) for _ in range(4)))
        await live.emit("values", {"n": 5})
        await asyncio.gather(manager._flush(live), manager._flush(live))

    try:
        asyncio.run(main())
        rows = storage.relayed_events("run-1", -1)
    finally:
        storage.close()
    assert [seq for seq, _, _ in rows] == list(range(6)) and live.relayed == 6
    assert [data for _, _, data in rows] == [f'{{"n":{index}}}' for index in range(6)]
