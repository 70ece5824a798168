"""
The events of a run followed from another process are written to the database once each, in order, and their ids
(``attempt-seq``) resume a follower at the same place wherever it follows the run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from haystack_state.server._database import database_for
from haystack_state.server._executor import RunOutcome
from haystack_state.server._live import LiveRun
from haystack_state.server._records import RunRecord, now_text
from haystack_state.server._runs import RunManager
from haystack_state.server._storage import ServerStorage


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
    storage.create_run(run, lease_until="9999-12-31T00:00:00.000000+00:00").result()
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
        rows = storage.relayed_events("run-1").result()
    finally:
        storage.close()
    assert [(attempt, seq) for attempt, seq, _, _ in rows] == [(1, n) for n in range(6)] and live.relayed == 6
    assert [data for _, _, _, data in rows] == [f'{{"n":{index}}}' for index in range(6)]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_event_ids_order_by_attempt_then_number_wherever_the_run_is_followed(backend: Any) -> None:
    """
    A run's first attempt relayed events 0-2 and died after showing a client 0-5 from memory; its second attempt
    numbers its events from 3. A client back with ``1-5`` gets every event of the second attempt (``2-3`` on), none of
    the first's again: from the process that runs the second attempt (its memory), and through the database.
    """
    storage = ServerStorage(database_for(backend.checkpointer()))
    manager = RunManager(storage, None, None, max_concurrent_runs=1, max_pending_runs=1)  # type: ignore[arg-type]
    at = now_text()
    kwargs = {"stream_mode": ["values"]}
    run = RunRecord("run-1", "t-1", "agent", "", "running", "reject", kwargs, {}, None, manager.worker_id, at, at)
    storage.create_run(run, lease_until="9999-12-31T00:00:00.000000+00:00").result()
    first = [("values", f'{{"n":{n}}}') for n in range(3)]
    storage.relay_events("run-1", 0, first, worker=manager.worker_id, attempt=1).result()
    storage.relay_events("run-1", 3, [("values", '{"n":"a"}'), ("values", '{"n":"b"}')], attempt=2).result()

    async def follow(after: tuple[int, int] | None) -> list[tuple[str | None, Any]]:
        return [(number, data) async for number, _, data in manager.events(run, after=after)]

    async def main() -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        relayed = await follow((1, 5)), await follow((1, 1))
        live = manager._live["run-1"] = LiveRun("run-1", attempt=2, thread_id="t-1")
        live.seq_base = 3
        await live.emit("values", {"n": "a"})
        await live.emit("values", {"n": "b"})
        live.finish(RunOutcome("success", {"n": "b"}, None, "idle"))
        return relayed[0], relayed[1], await follow((1, 5)), await follow((1, 1))

    storage.finish_run("run-1", "success", thread_status="idle").result()
    try:
        through_db, earlier_db, from_memory, earlier_memory = asyncio.run(main())
    finally:
        storage.close()
    second = [("2-3", {"n": "a"}), ("2-4", {"n": "b"})]
    assert through_db == second and from_memory == second
    assert earlier_db == [("1-2", {"n": 2}), *second] and earlier_memory == [("1-2", {"n": 2}), *second]
