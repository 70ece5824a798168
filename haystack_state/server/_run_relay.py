"""
The requests on running runs and their relayed events (:class:`RunRelay`): a cancel request or a relay request is
written on a running run's row, and polled by the worker that runs it (on PostgreSQL, it is told at once by a
``NOTIFY``); a followed run's worker writes its stream events to the ``run_events`` table, numbered ``attempt-seq``,
for the followers in other processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from haystack_state._driver import Flow
from haystack_state.server._database import Change, Row, Rows
from haystack_state.server._records import CancelAction, now_text
from haystack_state.server._tables import REQUESTS, Tables, reads, writes, writes_alone

__all__ = ["RelayedEnd", "RelayedEvent", "RunRelay", "WorkerRequest"]


class WorkerRequest(NamedTuple):
    """A request on a running run, for the worker that runs it (:meth:`RunRelay.requests`)."""

    run_id: str
    #: The cancel action asked for, if any.
    cancel: CancelAction | None
    #: Whether a follower in another process asked for the run's events.
    relay: bool


class RelayedEvent(NamedTuple):
    """A relayed stream event of a run (:meth:`RunRelay.relayed_events`)."""

    attempt: int
    seq: int
    event: str
    #: The event's JSON data, as text.
    data: str


class RelayedEnd(NamedTuple):
    """What one attempt of a run relayed (:meth:`RunRelay.relayed_end`)."""

    #: The number of its last event (None if none).
    last: int | None
    #: Whether it relayed a ``values`` event.
    values: bool
    #: Whether it relayed an ``error`` event.
    error: bool


class RunRelay(Tables):
    """
    Cancel and relay requests on running runs, and relayed events. Thread-safe; each method is one
    :class:`~haystack_state.server._database.Work`.
    """

    @writes
    def request_cancel(self, run_id: str, action: CancelAction) -> Flow[bool]:
        """
        Ask the worker of a running run to stop it (it polls :meth:`requests`).

        :param run_id: The run.
        :param action: ``interrupt`` (stop; the thread keeps what the run committed) or ``rollback`` (stop, restore
            the thread to where the run started, and delete the run).
        :returns: Whether the run was running.
        """
        changed: int = yield Change(
            "UPDATE {runs} SET cancel = :action, updated_at = :at WHERE run_id = :id AND status = 'running'",
            {"action": action, "at": now_text(), "id": run_id},
        )
        if changed:
            yield from self.database.notify(REQUESTS)
        return changed == 1

    @reads
    def requests(self, worker: str) -> Flow[list[WorkerRequest]]:
        """The requests on the runs a worker is running: one for each run that has a cancel or a relay request."""
        rows: list[Row] = yield Rows(
            "SELECT run_id, cancel, relay FROM {runs} WHERE worker = :worker AND status = 'running' "
            "AND (cancel IS NOT NULL OR relay = 1)",
            {"worker": worker},
        )
        return [WorkerRequest(str(run_id), action, bool(relay)) for run_id, action, relay in rows]

    @writes
    def request_relay(self, run_id: str) -> Flow[None]:
        """Ask the worker of a running run to write its stream events to the database (see :meth:`relay_events`)."""
        changed: int = yield Change(
            "UPDATE {runs} SET relay = 1 WHERE run_id = :id AND status = 'running' AND relay IS NULL", {"id": run_id}
        )
        if changed:
            yield from self.database.notify(REQUESTS)

    @reads
    def relay_requested(self, run_id: str) -> Flow[bool]:
        """Whether a follower in another process asked for a run's events."""
        rows: list[Row] = yield Rows("SELECT relay FROM {runs} WHERE run_id = :id", {"id": run_id})
        return bool(rows and rows[0][0])

    @writes
    def relay_events(
        self,
        run_id: str,
        first_seq: int,
        events: Sequence[tuple[str, str]],
        *,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Flow[None]:
        """
        Write a run's stream events, numbered from ``first_seq``.

        :param run_id: The run.
        :param first_seq: The number of the first event.
        :param events: ``(event name, JSON data)`` pairs.
        :param worker: With ``attempt``: write them only if this worker still holds the run at this attempt.
        :param attempt: The attempt the worker executes.
        """
        if not events:
            return
        if worker is not None:
            holds: list[Row] = yield Rows(
                "SELECT 1 FROM {runs} WHERE run_id = :id AND worker = :worker AND attempt = :attempt",
                {"id": run_id, "worker": worker, "attempt": attempt or 1},
            )
            if not holds:
                return
        for offset, (event, data) in enumerate(events):
            yield Change(
                "INSERT INTO {run_events} (run_id, seq, attempt, event, data) "
                "VALUES (:id, :seq, :attempt, :event, :data)",
                {"id": run_id, "seq": first_seq + offset, "attempt": attempt or 1, "event": event, "data": data},
            )

    @reads
    def relayed_events(
        self, run_id: str, after: tuple[int, int] = (0, -1), limit: int = 1000
    ) -> Flow[list[RelayedEvent]]:
        """
        A run's relayed events after the event ``after`` (``(attempt, seq)``; every event by default):
        ``(attempt, seq, event name, JSON data)``, in order. Every event of a later attempt comes after those of an
        earlier one.
        """
        attempt, seq = after
        rows: list[Row] = yield Rows(
            "SELECT attempt, seq, event, data FROM {run_events} WHERE run_id = :id "
            "AND (attempt > :attempt OR (attempt = :attempt AND seq > :seq)) ORDER BY attempt, seq LIMIT :limit",
            {"id": run_id, "attempt": attempt, "seq": seq, "limit": limit},
        )
        return [RelayedEvent(int(made_by), int(number), str(event), str(data)) for made_by, number, event, data in rows]

    @reads
    def relayed_end(self, run_id: str, attempt: int) -> Flow[RelayedEnd]:
        """What one attempt of a run relayed."""
        rows: list[Row] = yield Rows(
            "SELECT MAX(seq), MAX(CASE WHEN event = 'values' THEN 1 ELSE 0 END), "
            "MAX(CASE WHEN event = 'error' THEN 1 ELSE 0 END) FROM {run_events} "
            "WHERE run_id = :id AND attempt = :attempt",
            {"id": run_id, "attempt": attempt},
        )
        last, values, error = rows[0] if rows else (None, 0, 0)
        return RelayedEnd(None if last is None else int(last), bool(values), bool(error))

    @writes_alone
    def forget_relayed(self, before: str) -> Flow[int]:
        """Delete the relayed events of runs that ended before ``before`` (ISO-8601). Returns how many."""
        deleted: int = yield Change(
            "DELETE FROM {run_events} WHERE run_id IN (SELECT run_id FROM {runs} WHERE status NOT IN "
            "('pending', 'running') AND updated_at < :before)",
            {"before": before},
        )
        return deleted

    @reads
    def next_event_seq(self, run_id: str) -> Flow[int]:
        """The number the next relayed event of a run takes (a resumed run's events follow its earlier attempts')."""
        rows: list[Row] = yield Rows("SELECT MAX(seq) FROM {run_events} WHERE run_id = :id", {"id": run_id})
        return int(rows[0][0]) + 1 if rows and rows[0][0] is not None else 0
