"""
The run queue (:class:`RunQueue`): one row per run. It keeps one run per thread at a time: a partial unique index
allows one ``running`` row per thread, so two workers (in one process or several sharing a PostgreSQL database) can
never run the same thread at once. Workers claim the oldest pending run of a free thread (``FOR UPDATE SKIP LOCKED``
on PostgreSQL; SQLite serializes writers) and hold a lease on it that they renew (see
:mod:`haystack_state.server.run_leases`). A new run of ``multitask_strategy`` ``interrupt`` or ``rollback`` cancels its
thread's runs in the transaction that adds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, NamedTuple

from haystack_state.server.database import Cursor, UniqueViolation
from haystack_state.server.metadata import dumps, loads
from haystack_state.server.records import (
    Idempotency,
    IdempotencyConflict,
    QueueFull,
    RunLease,
    RunRecord,
    RunStatus,
    ThreadBusy,
    ThreadStatus,
    now_text,
    run_params,
    run_record,
)
from haystack_state.server.tables import NEXT_PENDING, OLDER, QUEUE, REQUESTS, RUN_COLUMNS, Tables

__all__ = ["Claim", "RunQueue"]


class Claim(NamedTuple):
    """What a worker's look at the queue found (:meth:`RunQueue.next_claim`)."""

    #: The run it claimed (now ``running``), or None.
    run: RunRecord | None
    #: Whether runs were pending (claimable or not: their thread may be running).
    pending: bool


class RunQueue(Tables):
    """Adds, claims, ends and deletes the runs of the queue. Thread-safe; every method is one transaction."""

    def create_run(
        self,
        run: RunRecord,
        *,
        lease_until: str | None = None,
        max_pending: int | None = None,
        graph_id: str | None = None,
        idempotency: Idempotency | None = None,
    ) -> RunRecord:
        """
        :meth:`_create_run`; when two submissions with one idempotency key race (the second insert breaks the key's
        unique index), the loser looks again and finds the winner's run.
        """
        try:
            return self._create_run(
                run, lease_until=lease_until, max_pending=max_pending, graph_id=graph_id, idempotency=idempotency
            )
        except UniqueViolation:
            if idempotency is None:
                raise
        return self._create_run(
            run, lease_until=lease_until, max_pending=max_pending, graph_id=graph_id, idempotency=idempotency
        )

    def _create_run(
        self,
        run: RunRecord,
        *,
        lease_until: str | None,
        max_pending: int | None,
        graph_id: str | None,
        idempotency: Idempotency | None,
    ) -> RunRecord:
        """
        Add a run to the queue: ``running`` (claimed by ``run.worker`` until ``lease_until``) if ``run.status`` is
        running and its thread is free, else pending. The thread's metadata gets the run's ``assistant_id`` and
        ``graph_id``, as LangGraph's platform stamps them (so that clients list a graph's conversations by them).

        With ``multitask_strategy="interrupt"`` or ``"rollback"``, the thread's other runs are cancelled in the same
        transaction, as LangGraph's platform cancels them: its pending runs leave the queue (``interrupted``, or
        deleted for ``rollback``), and its running run gets a cancel request of that action, which its worker polls;
        the new run waits in the queue until that run has stopped.

        :raises ThreadBusy: With ``multitask_strategy="reject"``, if the thread has a pending or running run; with
            ``"enqueue"``, never (the run waits its turn). Nothing is written then.
        With ``idempotency``, a run its owner created before with the same key is answered instead (``replayed``,
        whatever its status, nothing written), if that run was asked with the same request.

        :raises QueueFull: If ``max_pending`` runs are pending already.
        :raises IdempotencyConflict: If the key was used by the owner for another request (nothing is written).
        """
        with self.database.transaction() as cur:
            if idempotency is not None:
                found = cur.rows(
                    f"SELECT {RUN_COLUMNS}, request_digest FROM {{runs}} "
                    "WHERE owner = :owner AND idempotency_key = :key",
                    {"owner": run.owner, "key": idempotency.key},
                )
                if found:
                    earlier = run_record(found[0][:-1])
                    if found[0][-1] != idempotency.digest:
                        raise IdempotencyConflict(
                            f"Idempotency-Key '{idempotency.key}' was used for run {earlier.run_id} (thread "
                            f"'{earlier.thread_id}') with another request; send a new key for a new run."
                        )
                    return dataclasses.replace(earlier, replayed=True)
            active = cur.rows(
                "SELECT run_id, status FROM {runs} WHERE thread_id = :id AND status IN ('pending', 'running')",
                {"id": run.thread_id},
            )
            if active and run.multitask_strategy == "reject":
                raise ThreadBusy(
                    f"Thread '{run.thread_id}' is busy with run {active[0][0]} ({active[0][1]}); retry when it ends, "
                    "or send multitask_strategy='enqueue' to queue this run behind it (or 'interrupt' or 'rollback' "
                    "to cancel it)."
                )
            if active and run.multitask_strategy in ("interrupt", "rollback"):
                active = _cancel_for(cur, active, run)
            if max_pending is not None:
                pending = int(cur.rows("SELECT COUNT(*) FROM {runs} WHERE status = 'pending'")[0][0])
                if pending >= max_pending:
                    raise QueueFull(f"The run queue is full ({pending} pending runs); retry later.")
            status: RunStatus = "running" if run.status == "running" and not active else "pending"
            record = dataclasses.replace(run, status=status, worker=run.worker if status == "running" else None)
            if status == "pending":
                self.database.notify(cur, QUEUE)
            if active and run.multitask_strategy in ("interrupt", "rollback"):
                self.database.notify(cur, REQUESTS)  # the running run's worker, wherever it is, stops it
            cur.change(
                f"INSERT INTO {{runs}} ({RUN_COLUMNS}, lease_until, idempotency_key, request_digest) VALUES (:run_id, "
                ":thread_id, :assistant_id, :owner, :status, :multitask_strategy, :kwargs, :metadata, :error, "
                ":worker, :created_at, :updated_at, :attempt, :lease_until, :idempotency_key, :request_digest)",
                {
                    **run_params(record),
                    "lease_until": lease_until if status == "running" else None,
                    "idempotency_key": idempotency.key if idempotency is not None else None,
                    "request_digest": idempotency.digest if idempotency is not None else None,
                },
            )
            stamp = {"assistant_id": run.assistant_id, **({"graph_id": graph_id} if graph_id is not None else {})}
            found = cur.rows("SELECT metadata FROM {threads} WHERE thread_id = :id", {"id": run.thread_id})
            metadata = loads(found[0][0]) if found else {}
            if all(metadata.get(key) == value for key, value in stamp.items()):
                cur.change(
                    "UPDATE {threads} SET assistant_id = :assistant, updated_at = :at WHERE thread_id = :id",
                    {"assistant": run.assistant_id, "at": run.created_at, "id": run.thread_id},
                )
            else:
                cur.change(
                    "UPDATE {threads} SET assistant_id = :assistant, metadata = :metadata, updated_at = :at "
                    "WHERE thread_id = :id",
                    {
                        "assistant": run.assistant_id,
                        "metadata": dumps({**metadata, **stamp}),
                        "at": run.created_at,
                        "id": run.thread_id,
                    },
                )
            return record

    def get_run(self, run_id: str, owner: str | None = None) -> RunRecord | None:
        """A run (the owner's, when ``owner`` is given), or None."""
        rows = self.database.read(f"SELECT {RUN_COLUMNS} FROM {{runs}} WHERE run_id = :id", {"id": run_id})
        run = run_record(rows[0]) if rows else None
        return run if run is not None and (owner is None or run.owner == owner) else None

    def list_runs(
        self, thread_id: str, owner: str, *, limit: int = 10, offset: int = 0, status: str | None = None
    ) -> list[RunRecord]:
        """The thread's runs, newest first."""
        query = f"SELECT {RUN_COLUMNS} FROM {{runs}} WHERE thread_id = :id AND owner = :owner"
        params: dict[str, Any] = {"id": thread_id, "owner": owner, "limit": limit, "offset": offset}
        if status is not None:
            query += " AND status = :status"
            params["status"] = status
        rows = self.database.read(query + " ORDER BY run_id DESC LIMIT :limit OFFSET :offset", params)
        return [run_record(row) for row in rows]

    def claim_next(self, assistants: Iterable[str], lease: RunLease) -> RunRecord | None:
        """
        Claim the oldest pending run of a thread that has no running run, among ``assistants``.

        :returns: The claimed run (now ``running``), or None if there is none (or another worker won the race).
        """
        return self.next_claim(assistants, lease).run

    def next_claim(self, assistants: Iterable[str], lease: RunLease) -> Claim:
        """
        :meth:`claim_next`, and whether any run was pending (claimable or not: its thread may be running). An empty
        queue costs one read (no write transaction, no lock).

        :returns: The claimed run or None, and whether pending runs were found.
        """
        names = sorted(set(assistants))
        if not names:
            return Claim(None, False)
        if not self.database.read("SELECT 1 FROM {runs} WHERE status = 'pending' LIMIT 1"):
            return Claim(None, False)
        params: dict[str, Any] = {f"a_{i}": name for i, name in enumerate(names)}
        query = NEXT_PENDING.replace("{assistants}", ", ".join(f":a_{i}" for i in range(len(names))))
        if self.database.dialect == "postgres":
            query += " FOR UPDATE SKIP LOCKED"
        try:
            with self.database.transaction() as cur:
                rows = cur.rows(query, params)
                if not rows:
                    return Claim(None, True)
                return Claim(self._start(cur, str(rows[0][0]), lease), True)
        except UniqueViolation:  # another worker started a run of the same thread first
            return Claim(None, True)

    def claim(self, run_id: str, lease: RunLease) -> RunRecord | None:
        """Claim one pending run, if its thread has no running run and no older pending run."""
        try:
            with self.database.transaction() as cur:
                rows = cur.rows(
                    "SELECT q.run_id FROM {runs} AS q WHERE q.run_id = :id AND q.status = 'pending' AND NOT EXISTS "
                    "(SELECT 1 FROM {runs} AS o WHERE o.thread_id = q.thread_id AND (o.status = 'running' OR "
                    f"(o.status = 'pending' AND {OLDER})))",
                    {"id": run_id},
                )
                return self._start(cur, run_id, lease) if rows else None
        except UniqueViolation:
            return None

    def _start(self, cur: Cursor, run_id: str, lease: RunLease) -> RunRecord | None:
        changed = cur.change(
            "UPDATE {runs} SET status = 'running', worker = :worker, lease_until = :lease, updated_at = :at "
            "WHERE run_id = :id AND status = 'pending'",
            {"worker": lease.worker, "lease": lease.until, "at": now_text(), "id": run_id},
        )
        if changed != 1:
            return None
        rows = cur.rows(f"SELECT {RUN_COLUMNS} FROM {{runs}} WHERE run_id = :id", {"id": run_id})
        return run_record(rows[0])

    def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        thread_status: ThreadStatus,
        error: str | None = None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> bool:
        """
        Record a run's end and its thread's new outcome (``idle``, ``interrupted`` or ``error``).

        :param worker: With ``attempt``: the worker that executed the run. Its end is recorded only if that worker
            still holds the run at that attempt (a worker that lost its lease, and whose run another worker resumed,
            records nothing).
        :param attempt: The attempt the worker executed.
        :returns: Whether the end was recorded.
        """
        at = now_text()
        fence = ""
        params: dict[str, Any] = {"status": status, "error": error, "at": at, "id": run_id}
        if worker is not None:
            fence = " AND status = 'running' AND worker = :worker AND attempt = :attempt"
            params.update(worker=worker, attempt=attempt or 1)
        with self.database.transaction() as cur:
            rows = cur.rows(
                "UPDATE {runs} SET status = :status, error = :error, lease_until = NULL, updated_at = :at "
                "WHERE run_id = :id" + fence + " RETURNING thread_id",
                params,
            )
            changed = len(rows)
            if rows:
                cur.change(
                    "UPDATE {threads} SET status = :status, updated_at = :at WHERE thread_id = :id",
                    {"status": thread_status, "at": at, "id": rows[0][0]},
                )
                if self.database.listens and cur.rows(
                    "SELECT 1 FROM {runs} WHERE thread_id = :id AND status = 'pending' LIMIT 1", {"id": rows[0][0]}
                ):
                    self.database.notify(cur, QUEUE)  # the thread's next run may start now, in any process
            return bool(changed)

    def cancel_pending(self, run_id: str) -> bool:
        """Cancel a pending run (status ``interrupted``). Returns whether it was pending."""
        with self.database.transaction() as cur:
            return (
                cur.change(
                    "UPDATE {runs} SET status = 'interrupted', error = 'cancelled before it started', "
                    "updated_at = :at WHERE run_id = :id AND status = 'pending'",
                    {"at": now_text(), "id": run_id},
                )
                == 1
            )

    def delete_run(self, run_id: str) -> bool:
        """Delete a run that is not running. Returns whether it was deleted."""
        with self.database.transaction() as cur:
            if cur.change("DELETE FROM {runs} WHERE run_id = :id AND status <> 'running'", {"id": run_id}) != 1:
                return False
            cur.change("DELETE FROM {run_events} WHERE run_id = :id", {"id": run_id})
            return True

    def pending_count(self) -> int:
        """How many runs wait in the queue."""
        return int(self.database.read("SELECT COUNT(*) FROM {runs} WHERE status = 'pending'")[0][0])


def _cancel_for(cur: Cursor, active: list[tuple[Any, ...]], run: RunRecord) -> list[tuple[Any, ...]]:
    """
    Cancel a thread's pending and running runs for a new run of ``multitask_strategy`` ``interrupt`` or
    ``rollback`` (see :meth:`RunQueue.create_run`). Returns the runs that are still running (until their worker
    sees the request).
    """
    action, at = run.multitask_strategy, now_text()
    running: list[tuple[Any, ...]] = []
    for run_id, status in active:
        params = {"id": run_id, "at": at, "action": action}
        if status == "running":
            cur.change(
                "UPDATE {runs} SET cancel = CASE WHEN cancel = 'rollback' THEN cancel ELSE :action END, "
                "updated_at = :at WHERE run_id = :id AND status = 'running'",
                params,
            )
            running.append((run_id, status))
        elif action == "rollback":
            cur.change("DELETE FROM {runs} WHERE run_id = :id AND status = 'pending'", {"id": run_id})
            cur.change("DELETE FROM {run_events} WHERE run_id = :id", {"id": run_id})
        else:
            cur.change(
                "UPDATE {runs} SET status = 'interrupted', error = :error, updated_at = :at "
                "WHERE run_id = :id AND status = 'pending'",
                {**params, "error": f"cancelled before it started: run {run.run_id} interrupted the thread"},
            )
    return running
