"""
The run queue (:class:`RunQueue`): one row per run. It keeps one run per thread at a time: a partial unique index
allows one ``running`` row per thread, so two workers (in one process or several sharing a PostgreSQL database) can
never run the same thread at once. Workers claim the oldest pending run of a free thread (``FOR UPDATE SKIP LOCKED``
on PostgreSQL; SQLite serializes writers) and hold a lease on it that they renew (see
:mod:`haystack_state.server._run_leases`). A new run of ``multitask_strategy`` ``interrupt`` or ``rollback`` cancels its
thread's runs in the transaction that adds it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any, NamedTuple

from haystack_state._driver import Flow
from haystack_state.server._database import Change, Row, Rows, Work
from haystack_state.server._metadata import dumps, loads
from haystack_state.server._records import (
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
from haystack_state.server._tables import (
    NEXT_PENDING,
    QUEUE,
    REQUESTS,
    RUN_COLUMNS,
    Tables,
    reads,
    writes,
    writes_alone,
)

__all__ = ["Claim", "RunQueue"]


class Claim(NamedTuple):
    """What a worker's look at the queue found (:meth:`RunQueue.next_claim`)."""

    #: The run it claimed (now ``running``), or None.
    run: RunRecord | None
    #: Whether runs were pending (claimable or not: their thread may be running).
    pending: bool


class RunQueue(Tables):
    """
    Adds, claims, ends and deletes the runs of the queue. Thread-safe; each method is one
    :class:`~haystack_state.server._database.Work` (but :meth:`next_claim`, a coroutine).
    """

    def create_run(
        self,
        run: RunRecord,
        *,
        lease_until: str | None = None,
        max_pending: int | None = None,
        graph_id: str | None = None,
        idempotency: Idempotency | None = None,
    ) -> Work[RunRecord]:
        """
        Add a run to the queue: ``running`` (claimed by ``run.worker`` until ``lease_until``) if ``run.status`` is
        running and its thread is free, else pending. The thread's metadata gets the run's ``assistant_id`` and
        ``graph_id``, as LangGraph's platform stamps them (so that clients list a graph's conversations by them).

        With ``multitask_strategy="interrupt"`` or ``"rollback"``, the thread's other runs are cancelled in the same
        transaction, as LangGraph's platform cancels them: its pending runs leave the queue (``interrupted``, or
        deleted for ``rollback``), and its running run gets a cancel request of that action, which its worker polls;
        the new run waits in the queue until that run has stopped.

        With ``idempotency``, a run its owner created before with the same key is answered instead (``replayed``,
        whatever its status, nothing written), if that run was asked with the same request. When two submissions
        with one key race (the second insert breaks the key's unique index), the loser looks again and finds the
        winner's run.

        :raises ThreadBusy: With ``multitask_strategy="reject"``, if the thread has a pending or running run; with
            ``"enqueue"``, never (the run waits its turn). Nothing is written then.
        :raises QueueFull: If ``max_pending`` runs are pending already.
        :raises IdempotencyConflict: If the key was used by the owner for another request (nothing is written).
        """
        flow = functools.partial(self._create_run, run, lease_until, max_pending, graph_id, idempotency)
        # On PostgreSQL the run and its thread's stamp are one statement, after one read (the thread's runs and
        # metadata): two round trips, each committing on its own, unless the run cancels others (one transaction).
        # A transaction would not make the read and the insert atomic anyway (read committed): the unique indexes
        # (one running run per thread, one run per idempotency key) are what settle a race.
        alone = self.database.dialect == "postgres" and run.multitask_strategy not in ("interrupt", "rollback")
        return Work(self.database, flow, write=True, alone=alone, again_on_unique=idempotency is not None)

    def _create_run(
        self,
        run: RunRecord,
        lease_until: str | None,
        max_pending: int | None,
        graph_id: str | None,
        idempotency: Idempotency | None,
    ) -> Flow[RunRecord]:
        if idempotency is not None:
            found: list[Row] = yield Rows(
                f"SELECT {RUN_COLUMNS}, request_digest FROM {{runs}} WHERE owner = :owner AND idempotency_key = :key",
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
        # One statement reads what the run depends on: the thread's active runs, how many runs are pending, and the
        # thread's metadata (rows tagged "run", "pending" and "thread").
        facts: list[Row] = yield Rows(_RUN_FACTS, {"id": run.thread_id})
        active = [(run_id, status) for tag, run_id, status in facts if tag == "run"]
        pending = next(int(count) for tag, count, _ in facts if tag == "pending")
        metadata = next((loads(stored) for tag, stored, _ in facts if tag == "thread"), {})
        if active and run.multitask_strategy == "reject":
            raise ThreadBusy(
                f"Thread '{run.thread_id}' is busy with run {active[0][0]} ({active[0][1]}); retry when it ends, "
                "or send multitask_strategy='enqueue' to queue this run behind it (or 'interrupt' or 'rollback' "
                "to cancel it)."
            )
        if active and run.multitask_strategy in ("interrupt", "rollback"):
            active = yield from _cancel_for(active, run)
        if max_pending is not None and pending >= max_pending:
            raise QueueFull(f"The run queue is full ({pending} pending runs); retry later.")
        status: RunStatus = "running" if run.status == "running" and not active else "pending"
        record = dataclasses.replace(run, status=status, worker=run.worker if status == "running" else None)
        stamp = {"assistant_id": run.assistant_id, **({"graph_id": graph_id} if graph_id is not None else {})}
        stamped = all(metadata.get(key) == value for key, value in stamp.items())
        params = {
            **run_params(record),
            "lease_until": lease_until if status == "running" else None,
            "idempotency_key": idempotency.key if idempotency is not None else None,
            "request_digest": idempotency.digest if idempotency is not None else None,
            "stamped": None if stamped else dumps({**metadata, **stamp}),
        }
        if self.database.dialect == "postgres":  # one statement (see create_run)
            yield Change(f"WITH added AS ({_ADD_RUN}) {_STAMP_THREAD}", params)
        else:
            yield Change(_ADD_RUN, params)
            yield Change(_STAMP_THREAD, params)
        # (after the run is in the table: its statements may each have committed already, see create_run)
        if status == "pending":
            yield from self.database.notify(QUEUE)
        if active and run.multitask_strategy in ("interrupt", "rollback"):
            yield from self.database.notify(REQUESTS)  # the running run's worker, wherever it is, stops it
        return record

    @reads
    def get_run(self, run_id: str, owner: str | None = None) -> Flow[RunRecord | None]:
        """A run (the owner's, when ``owner`` is given), or None."""
        rows: list[Row] = yield Rows(f"SELECT {RUN_COLUMNS} FROM {{runs}} WHERE run_id = :id", {"id": run_id})
        run = run_record(rows[0]) if rows else None
        return run if run is not None and (owner is None or run.owner == owner) else None

    @reads
    def list_runs(
        self, thread_id: str, owner: str, *, limit: int = 10, offset: int = 0, status: str | None = None
    ) -> Flow[list[RunRecord]]:
        """The thread's runs, newest first."""
        query = f"SELECT {RUN_COLUMNS} FROM {{runs}} WHERE thread_id = :id AND owner = :owner"
        params: dict[str, Any] = {"id": thread_id, "owner": owner, "limit": limit, "offset": offset}
        if status is not None:
            query += " AND status = :status"
            params["status"] = status
        rows: list[Row] = yield Rows(query + " ORDER BY run_id DESC LIMIT :limit OFFSET :offset", params)
        return [run_record(row) for row in rows]

    async def next_claim(self, assistants: Iterable[str], lease: RunLease) -> Claim:
        """
        Claim the oldest pending run of a thread that has no running run, among ``assistants``, and say whether any
        run was pending (claimable or not: its thread may be running). An empty queue costs one read (no write
        transaction, no lock).

        :returns: The claimed run (now ``running``) or None (none, or another worker won the race), and whether
            pending runs were found.
        """
        names = sorted(set(assistants))
        if not names or not await self.database.read("SELECT 1 FROM {runs} WHERE status = 'pending' LIMIT 1"):
            return Claim(None, False)
        flow = functools.partial(self._claim, names, lease)
        # (another worker started a run of the same thread first: the run's unique index refused this one)
        return await Work(self.database, flow, write=True, on_unique=lambda: Claim(None, True))

    def _claim(self, names: list[str], lease: RunLease) -> Flow[Claim]:
        params: dict[str, Any] = {f"a_{i}": name for i, name in enumerate(names)}
        query = NEXT_PENDING.replace("{assistants}", ", ".join(f":a_{i}" for i in range(len(names))))
        if self.database.dialect == "postgres":
            query += " FOR UPDATE SKIP LOCKED"
        rows: list[Row] = yield Rows(query, params)
        if not rows:
            return Claim(None, True)
        started: list[Row] = yield Rows(
            "UPDATE {runs} SET status = 'running', worker = :worker, lease_until = :lease, updated_at = :at "
            f"WHERE run_id = :id AND status = 'pending' RETURNING {RUN_COLUMNS}",
            {"worker": lease.worker, "lease": lease.until, "at": now_text(), "id": rows[0][0]},
        )
        return Claim(run_record(started[0]) if started else None, True)

    def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        thread_status: ThreadStatus,
        error: str | None = None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Work[bool]:
        """
        Record a run's end and its thread's new outcome (``idle``, ``interrupted`` or ``error``). On PostgreSQL it is
        one statement (one round trip, no ``BEGIN`` and ``COMMIT``); on SQLite two, in one transaction.

        :param worker: With ``attempt``: the worker that executed the run. Its end is recorded only if that worker
            still holds the run at that attempt (a worker that lost its lease, and whose run another worker resumed,
            records nothing).
        :param attempt: The attempt the worker executed.
        :returns: Whether the end was recorded.
        """
        params: dict[str, Any] = {
            "status": status,
            "error": error,
            "at": now_text(),
            "id": run_id,
            "thread_status": thread_status,
        }
        fence = ""
        if worker is not None:
            fence = " AND status = 'running' AND worker = :worker AND attempt = :attempt"
            params.update(worker=worker, attempt=attempt or 1)
        one_statement = self.database.dialect == "postgres"
        flow = functools.partial(self._finish, fence, params, one_statement)
        return Work(self.database, flow, write=True, alone=one_statement)

    def _finish(self, fence: str, params: dict[str, Any], one_statement: bool) -> Flow[bool]:
        end = (
            "UPDATE {runs} SET status = :status, error = :error, lease_until = NULL, updated_at = :at "
            "WHERE run_id = :id" + fence + " RETURNING thread_id"
        )
        # The thread's outcome, and (for the workers of other processes) whether its next run may start now.
        if one_statement:
            ended: list[Row] = yield Rows(_FINISH_AT_ONCE.replace("{end}", end), params)
        else:
            ended = yield Rows(end, params)
            if ended:
                ended = yield Rows(_THREAD_OUTCOME, {**params, "id": ended[0][0]})
        if not ended:
            return False
        if ended[0][1]:
            yield from self.database.notify(QUEUE)
        return True

    @writes_alone
    def cancel_pending(self, run_id: str) -> Flow[bool]:
        """Cancel a pending run (status ``interrupted``). Returns whether it was pending."""
        changed: int = yield Change(
            "UPDATE {runs} SET status = 'interrupted', error = 'cancelled before it started', "
            "updated_at = :at WHERE run_id = :id AND status = 'pending'",
            {"at": now_text(), "id": run_id},
        )
        return changed == 1

    @writes
    def delete_run(self, run_id: str) -> Flow[bool]:
        """Delete a run that is not running. Returns whether it was deleted."""
        deleted: int = yield Change("DELETE FROM {runs} WHERE run_id = :id AND status <> 'running'", {"id": run_id})
        if deleted != 1:
            return False
        yield Change("DELETE FROM {run_events} WHERE run_id = :id", {"id": run_id})
        return True


#: A new run's row.
_ADD_RUN = (
    f"INSERT INTO {{runs}} ({RUN_COLUMNS}, lease_until, idempotency_key, request_digest) VALUES (:run_id, "
    ":thread_id, :assistant_id, :owner, :status, :multitask_strategy, :kwargs, :metadata, :error, :worker, "
    ":created_at, :updated_at, :attempt, :lease_until, :idempotency_key, :request_digest)"
)
#: The thread of a new run: its assistant, and (``stamped``, unless NULL) its metadata with the run's assistant and
#: graph ids.
_STAMP_THREAD = (
    "UPDATE {threads} SET assistant_id = :assistant_id, metadata = COALESCE(:stamped, metadata), "
    "updated_at = :created_at WHERE thread_id = :thread_id"
)
#: A thread's outcome at its run's end, and whether the thread has runs queued: ``(thread_id, queued)``.
_THREAD_OUTCOME = (
    "UPDATE {threads} SET status = :thread_status, updated_at = :at WHERE thread_id = :id RETURNING thread_id, "
    "EXISTS (SELECT 1 FROM {runs} WHERE thread_id = :id AND status = 'pending')"
)
#: A run's end (``{end}``, returning its thread) and its thread's outcome in one statement (PostgreSQL), answering
#: ``(thread_id, queued)`` once if the run's end was recorded (whether or not its thread has a record).
_FINISH_AT_ONCE = (
    "WITH ended AS ({end}), outcome AS (UPDATE {threads} AS t SET status = :thread_status, updated_at = :at "
    "FROM ended WHERE t.thread_id = ended.thread_id) SELECT ended.thread_id, EXISTS (SELECT 1 FROM {runs} AS r "
    "WHERE r.thread_id = ended.thread_id AND r.status = 'pending') FROM ended"
)
#: What a new run of a thread depends on, in one statement: the thread's pending and running runs (``run``, its id
#: and status), how many runs are pending in all (``pending``), and the thread's stored metadata (``thread``).
_RUN_FACTS = (
    "SELECT 'run', run_id, status FROM {runs} WHERE thread_id = :id AND status IN ('pending', 'running') "
    "UNION ALL SELECT 'pending', CAST(COUNT(*) AS TEXT), NULL FROM {runs} WHERE status = 'pending' "
    "UNION ALL SELECT 'thread', metadata, NULL FROM {threads} WHERE thread_id = :id"
)


def _cancel_for(active: list[Row], run: RunRecord) -> Flow[list[Row]]:
    """
    Cancel a thread's pending and running runs for a new run of ``multitask_strategy`` ``interrupt`` or
    ``rollback`` (see :meth:`RunQueue.create_run`). Returns the runs that are still running (until their worker
    sees the request).
    """
    action, at = run.multitask_strategy, now_text()
    running: list[Row] = []
    for run_id, status in active:
        params = {"id": run_id, "at": at, "action": action}
        if status == "running":
            yield Change(
                "UPDATE {runs} SET cancel = CASE WHEN cancel = 'rollback' THEN cancel ELSE :action END, "
                "updated_at = :at WHERE run_id = :id AND status = 'running'",
                params,
            )
            running.append((run_id, status))
        elif action == "rollback":
            yield Change("DELETE FROM {runs} WHERE run_id = :id AND status = 'pending'", {"id": run_id})
            yield Change("DELETE FROM {run_events} WHERE run_id = :id", {"id": run_id})
        else:
            yield Change(
                "UPDATE {runs} SET status = 'interrupted', error = :error, updated_at = :at "
                "WHERE run_id = :id AND status = 'pending'",
                {**params, "error": f"cancelled before it started: run {run.run_id} interrupted the thread"},
            )
    return running
