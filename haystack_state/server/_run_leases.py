"""
The leases of running runs (:class:`RunLeases`): a worker renews the leases of the runs it executes; a run whose lease
expired, or whose worker is a process of this host that is gone, is taken back: queued again to be resumed (up to the
server's ``max_attempts``), or failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from haystack_state._driver import Flow
from haystack_state.server._database import Change, Row, Rows
from haystack_state.server._metadata import dumps, loads
from haystack_state.server._records import RunLease, now_text
from haystack_state.server._tables import LEASE_EXPIRED, QUEUE, Tables, reads, writes, writes_alone

__all__ = ["ExpiredRuns", "RunLeases"]


class ExpiredRuns(NamedTuple):
    """The runs taken back from their stopped worker (:meth:`RunLeases.expire_leases`)."""

    #: The ids of the runs queued again.
    requeued: list[str]
    #: The ids of the runs failed.
    failed: list[str]


class RunLeases(Tables):
    """The leases of running runs. Thread-safe; each method is one :class:`~haystack_state.server._database.Work`."""

    @writes_alone
    def renew_leases(self, lease: RunLease, run_ids: Iterable[str]) -> Flow[None]:
        """Extend the leases of the runs a worker is running to ``lease.until``."""
        ids = list(run_ids)
        if not ids:
            return
        params: dict[str, str] = {f"r_{i}": run_id for i, run_id in enumerate(ids)}
        placeholders = ", ".join(f":r_{i}" for i in range(len(ids)))
        yield Change(
            f"UPDATE {{runs}} SET lease_until = :lease WHERE worker = :worker AND status = 'running' "
            f"AND run_id IN ({placeholders})",
            {**params, "lease": lease.until, "worker": lease.worker},
        )

    @reads
    def running_workers(self) -> Flow[list[str]]:
        """The workers that hold running runs."""
        rows: list[Row] = yield Rows(
            "SELECT DISTINCT worker FROM {runs} WHERE status = 'running' AND worker IS NOT NULL"
        )
        return [str(row[0]) for row in rows]

    @writes
    def expire_leases(self, max_attempts: int = 1, dead_workers: Sequence[str] = ()) -> Flow[ExpiredRuns]:
        """
        Take back the running runs whose worker stopped: their lease expired, or their worker is one of
        ``dead_workers`` (a process of this host that is gone). A run that has had fewer than ``max_attempts``
        attempts goes back to the queue, ahead of its thread's other runs, to be resumed by any worker; the others
        fail. Each attempt's end is recorded in the run's metadata (``attempts``).

        """
        at = now_text()
        names = {f"w_{i}": worker for i, worker in enumerate(dead_workers)}
        dead = f" OR worker IN ({', '.join(':' + n for n in names)})" if names else ""
        requeued: list[str] = []
        failed: list[str] = []
        rows: list[Row] = yield Rows(
            "SELECT run_id, thread_id, attempt, worker, metadata, cancel FROM {runs} WHERE status = 'running' "
            f"AND (lease_until < :at{dead})",
            {"at": at, **names},
        )
        for run_id, thread_id, attempt, worker, metadata, cancel in rows:
            record = {"attempt": int(attempt), "worker": worker, "ended_at": at, "outcome": LEASE_EXPIRED}
            meta = loads(metadata)
            meta["attempts"] = [*(meta.get("attempts") or []), record]
            if cancel is not None:  # a cancelled run is not resumed: it ends as a cancel would have ended it
                yield Change(
                    "UPDATE {runs} SET status = 'interrupted', error = :error, lease_until = NULL, "
                    "metadata = :metadata, updated_at = :at WHERE run_id = :id AND status = 'running'",
                    {"error": f"cancelled; {LEASE_EXPIRED}", "metadata": dumps(meta), "at": at, "id": run_id},
                )
                failed.append(str(run_id))
                continue
            if int(attempt) < max_attempts:
                meta.update(resumed=True, attempt=int(attempt) + 1)
                yield Change(
                    "UPDATE {runs} SET status = 'pending', worker = NULL, lease_until = NULL, cancel = NULL, "
                    "relay = NULL, attempt = attempt + 1, metadata = :metadata, updated_at = :at "
                    "WHERE run_id = :id AND status = 'running'",
                    {"metadata": dumps(meta), "at": at, "id": run_id},
                )
                requeued.append(str(run_id))
                yield from self.database.notify(QUEUE)
                continue
            error = json.dumps(
                {"error": "RunError", "message": f"{LEASE_EXPIRED}, {attempt} of {max_attempts} attempt(s)"}
            )
            yield Change(
                "UPDATE {runs} SET status = 'error', error = :error, lease_until = NULL, metadata = :metadata, "
                "updated_at = :at WHERE run_id = :id AND status = 'running'",
                {"error": error, "metadata": dumps(meta), "at": at, "id": run_id},
            )
            yield Change(
                "UPDATE {threads} SET status = 'error', updated_at = :at WHERE thread_id = :id",
                {"at": at, "id": thread_id},
            )
            failed.append(str(run_id))
        return ExpiredRuns(requeued, failed)
