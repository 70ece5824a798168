"""
The run queue's in-process side: a :class:`RunManager` submits runs to the queue (:mod:`haystack_state.server.storage`),
executes the ones this process claims (through a :class:`~haystack_state.server.executor.RunExecutor`), and lets
clients wait for a run or follow its events, wherever it executes.

- ``runs/wait`` and ``runs/stream`` start their run here at once when its thread is free and this process has room
  (otherwise the run waits in the queue, for any worker); background runs (``POST /threads/{id}/runs``) are queued
  and the next free worker of any process claims them.
- A worker task claims queued runs when it is told that some may be claimable: at once for runs queued here, and
  when a run ends here while runs wait in the queue (or when a slot frees while it had no room for them); on
  PostgreSQL also when another process queues a run or ends one whose thread has runs queued (``LISTEN``/``NOTIFY``,
  see :class:`Listener`). Otherwise it polls, every ``poll_interval`` (on PostgreSQL with a listener, every
  ``listen_poll_interval``: a fallback), with one read when the queue is empty. It renews the leases of the runs
  it executes, and takes back the runs whose worker stopped (their lease expired, or their process on this host is
  gone): each goes back to the queue, ahead of its thread's other runs, and the next free worker of any process
  resumes it from its thread's last checkpoint (see :meth:`RunManager.job_for`), up to ``max_attempts`` attempts in
  all; then it fails. A worker writes about a run (its end, its relayed events) only while it holds the run at its
  attempt, and its checkpoints only under the thread's lease, so a worker that stopped and wakes later writes
  nothing. A tool call in flight when a worker died runs again (at least once).
- A run executing here keeps its events in memory while it runs (and a little after), so clients that join it, or
  come back after a disconnect, get every event from the start, or from the one after the last they saw
  (``Last-Event-ID``; see :mod:`haystack_state.server.live` for the ids), in the stream modes they ask for (among the
  run's). A run executing in another process is followed through the database: the follower asks for its events on
  the run's row, and the worker that runs it writes them all, from the first, under the same ids (it polls the
  request, and writes the rest before it records the run's end). A follower that comes after the run ended gets what
  was relayed, then the run's end (its final values, or its error) if none came.
- A run is cancelled at once if it executes here; otherwise a cancel request is written on its row, which the worker
  that runs it polls (on PostgreSQL, it is told at once). ``action="rollback"`` also restores the thread to where
  the run started and deletes the run. A new run with ``multitask_strategy="interrupt"`` or ``"rollback"`` cancels
  its thread's runs that way (the queue writes the requests in the transaction that adds it; see
  ``ServerStorage.create_run``) and starts, in whichever process claims it, once the cancelled run has stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from haystack_state.errors import CheckpointError, ThreadNotFoundError
from haystack_state.server.assistants import Assistant, Assistants
from haystack_state.server.cancelling import CANCEL_ACTIONS, close_cancelled_run, rollback_thread
from haystack_state.server.database import Database
from haystack_state.server.executor import RunExecutor, RunJob, RunOutcome, error_payload
from haystack_state.server.live import Cursor, Event, LiveRun, Sent, event_id
from haystack_state.server.storage import QUEUE, REQUESTS, Idempotency, RunRecord, ServerStorage, now_text
from haystack_state.server.streams import event_names
from haystack_state.server.views import values_view
from haystack_state.server.wire import values_from_wire

__all__ = ["AtCapacity", "Cursor", "Event", "LiveRun", "RunManager", "Sent", "job_from_kwargs", "new_run"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AtCapacity(CheckpointError):
    """This process runs its maximum of concurrent runs; the request is refused (HTTP 429)."""


class RunManager:
    """
    Submits, executes and follows runs.

    :param storage: The queue.
    :param assistants: The served agents (this worker claims their runs only).
    :param executor: Runs a job.
    :param max_concurrent_runs: How many runs this process executes at once.
    :param max_pending_runs: How many runs may wait in the queue (all processes together).
    :param poll_interval: How often (seconds) the worker looks for queued runs, and followers of runs executing
        elsewhere look for their end.
    :param lease_seconds: How long a claimed run stays ours without renewal; leases are renewed every third of it.
    :param keep_seconds: How long a finished run's events stay in memory for late followers.
    :param max_attempts: How many times a run is started, its resumptions after a worker stopped included, before
        it fails.
    :param listen_poll_interval: How often the worker polls the queue and the requests on its runs while it listens
        for them (PostgreSQL): a fallback, should a notification be lost with its connection.
    """

    def __init__(
        self,
        storage: ServerStorage,
        assistants: Assistants,
        executor: RunExecutor,
        *,
        max_concurrent_runs: int,
        max_pending_runs: int,
        poll_interval: float = 0.2,
        lease_seconds: float = 30.0,
        keep_seconds: float = 30.0,
        max_attempts: int = 3,
        listen_poll_interval: float = 2.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be a positive number of seconds, got {lease_seconds!r}")
        self.storage = storage
        self.assistants = assistants
        self.executor = executor
        self.max_concurrent_runs = max_concurrent_runs
        self.max_pending_runs = max_pending_runs
        self.poll_interval = poll_interval
        self.lease_seconds = lease_seconds
        self.keep_seconds = keep_seconds
        self.max_attempts = max_attempts
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._live: dict[str, LiveRun] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._slots = 0
        self.listen_poll_interval = max(poll_interval, listen_poll_interval)
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._listener: Listener | None = None
        #: Why the worker is woken: runs may be claimable; a run here may have a request from another process.
        self._claim_due = False
        self._requests_due = False
        #: Whether runs may wait in the queue (the last look found some, or it stopped for want of room): a run's
        #: end then makes the worker look again; otherwise it does not (no poll after every run).
        self._maybe_pending = True

    async def db(self, work: Callable[[], T], *, write: bool = False) -> T:
        """
        Do blocking database work (the server's storage, a checkpointer call) for the event loop: on SQLite inline,
        unless it would wait for the file's lock (then in a worker thread); on PostgreSQL in a worker thread (see
        :meth:`~haystack_state.server.database.Database.run`). ``write`` is kept for callers' clarity.
        """
        return await self.storage.database.run(work)

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def ensure_started(self) -> None:
        """Start the worker task (on the running event loop) unless it runs already."""
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._claim_due = self._maybe_pending = True
            if self.storage.database.listens and self._listener is None:
                self._listener = Listener(self.storage.database, self._heard)
                self._listener.start()
            self._worker = asyncio.get_running_loop().create_task(self._work(), name="haystack-state-run-worker")

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming runs; let the runs executing here finish (for up to ``timeout`` seconds)."""
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=timeout)

    @property
    def running_here(self) -> int:
        """How many runs execute in this process now."""
        return self._slots

    # --- submitting ------------------------------------------------------------------------------------------------

    async def submit(self, run: RunRecord, *, here: bool, idempotency: Idempotency | None = None) -> RunRecord:
        """
        Add a run to the queue; with ``here``, start it in this process at once if its thread is free.

        :param run: The run (its status is ignored).
        :param here: Whether the caller waits for the run (``runs/wait``, ``runs/stream``).
        :param idempotency: The submission's ``Idempotency-Key``: a run its owner submitted before with the same key
            and request is answered instead (``replayed``), wherever it runs and whatever its status.
        :returns: The run as stored (``running`` if it started here, else ``pending``), or the earlier run.
        :raises IdempotencyConflict: If the key was used for another request.
        :raises AtCapacity: With ``here``, if this process runs its maximum of runs.
        :raises ThreadBusy: For ``multitask_strategy="reject"`` on a busy thread.
        :raises QueueFull: If the queue is full.
        """
        self.ensure_started()
        assistant = self.assistants.resolve(run.assistant_id)
        graph_id = assistant.name if assistant is not None else None
        if here and self._slots >= self.max_concurrent_runs:
            raise AtCapacity(
                f"This server runs its maximum of {self.max_concurrent_runs} concurrent runs; retry shortly."
            )
        if here:
            self._slots += 1  # reserved before the insert, so that two requests cannot both take the last slot
            try:
                stored = await self.db(
                    lambda: self.storage.create_run(
                        dataclasses.replace(run, status="running", worker=self.worker_id),
                        lease_until=self._lease(),
                        max_pending=self.max_pending_runs,
                        graph_id=graph_id,
                        idempotency=idempotency,
                    ),
                    write=True,
                )
            except BaseException:
                self._slots -= 1
                raise
            if stored.replayed:
                self._slots -= 1
                return stored
            if stored.status == "running":
                self._launch(stored)
            else:
                self._slots -= 1
                self._cancel_here(stored)
                self._notify()  # queued behind its thread's run: claimed when that run ends
            return stored
        stored = await self.db(
            lambda: self.storage.create_run(
                dataclasses.replace(run, status="pending"),
                max_pending=self.max_pending_runs,
                graph_id=graph_id,
                idempotency=idempotency,
            ),
            write=True,
        )
        if stored.replayed:
            return stored
        self._cancel_here(stored)
        self._notify()
        return stored

    def _cancel_here(self, run: RunRecord) -> None:
        """
        For a new run of ``multitask_strategy`` ``interrupt`` or ``rollback``: stop at once its thread's run that
        executes here (the queue wrote the cancel request; a worker elsewhere polls it).
        """
        if run.multitask_strategy not in CANCEL_ACTIONS:
            return
        for live in self._live.values():
            if live.thread_id == run.thread_id and live.run_id != run.run_id and not live.done.is_set():
                live.cancel(run.multitask_strategy)

    async def run_stateless(self, job: RunJob) -> LiveRun:
        """
        Start a run without a thread (not queued, not stored) in this process.

        :raises AtCapacity: If this process runs its maximum of runs.
        """
        if self._slots >= self.max_concurrent_runs:
            raise AtCapacity(
                f"This server runs its maximum of {self.max_concurrent_runs} concurrent runs; retry shortly."
            )
        self._slots += 1
        live = LiveRun(job.run_id)

        async def execute() -> None:
            try:
                live.finish(await self.executor.execute(job, live.emit, live.stop))
            finally:
                self._slots -= 1

        task = asyncio.get_running_loop().create_task(execute())
        self._tasks[job.run_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.run_id, None))
        return live

    def _notify(self, *, claim: bool = True, requests: bool = False) -> None:
        """Wake the worker: to claim runs (some may be claimable), and/or to read the requests on its runs."""
        if claim:
            self._claim_due = self._maybe_pending = True
        if requests:
            self._requests_due = True
        if self._wake is not None:
            self._wake.set()

    def _heard(self, payload: str) -> None:
        """A notification from the database (see :class:`Listener`)."""
        if payload == REQUESTS:
            if self._running():
                self._notify(claim=False, requests=True)
        else:
            self._notify()

    def _launch(self, run: RunRecord) -> None:
        """Execute a run claimed by this process (its slot is taken already)."""
        stale = self._tasks.get(run.run_id)
        if stale is not None:  # an earlier attempt of this run, here, whose lease expired: it can write nothing now
            stale.cancel()
        live = self._live[run.run_id] = LiveRun(run.run_id, attempt=run.attempt, thread_id=run.thread_id)
        task = asyncio.get_running_loop().create_task(self._execute(run, live), name=f"run-{run.run_id}")
        self._tasks[run.run_id] = task
        task.add_done_callback(
            lambda done: self._tasks.pop(run.run_id) if self._tasks.get(run.run_id) is done else None
        )

    def _done(self, run_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(run_id) is task:  # (not a later attempt's task)
            del self._tasks[run_id]

    async def _execute(self, run: RunRecord, live: LiveRun) -> None:
        try:
            try:
                if run.attempt > 1:  # its events follow those its earlier attempts relayed
                    live.seq_base = await self.db(lambda: self.storage.next_event_seq(run.run_id))
                job = self.job_for(run)
            except Exception as error:  # stored kwargs that no longer fit the agent (a schema change, a bad value)
                payload = error_payload(error)
                await live.emit("error", payload)
                outcome = RunOutcome("error", None, payload, "error")
            else:
                outcome = await self.executor.execute(job, live.emit, live.stop)
            rollback = outcome.cancelled and live.cancel_action == "rollback"
            if rollback and outcome.started:
                try:
                    outcome = await self._rollback(run, outcome)
                except Exception:  # the thread stays as the cancelled run left it
                    logger.exception("Could not roll back the thread of run %s", run.run_id)
            elif outcome.cancelled:  # (its RunStarted event may not have been read when it was cancelled)
                agent = job.assistant.agent
                try:
                    await self.db(lambda: close_cancelled_run(agent, run.thread_id, run.run_id), write=True)
                except Exception:  # the thread's next run continues the cancelled one instead
                    logger.exception("Could not close the cancelled run %s on its thread", run.run_id)
            failure = json.dumps(outcome.error) if outcome.error is not None else None
            try:
                if live.events and not live.relay:  # asked for since the last poll?
                    live.relay = await self.db(lambda: self.storage.relay_requested(run.run_id))
                if live.relay:  # every event is in the database before the run is seen to end
                    await self._flush(live)
                recorded = await self.db(
                    lambda: self.storage.finish_run(
                        run.run_id,
                        outcome.status,
                        thread_status=outcome.thread_status,
                        error=failure,
                        worker=self.worker_id,
                        attempt=run.attempt,
                    ),
                    write=True,
                )
                if not recorded:
                    logger.warning(
                        "Run %s (attempt %s) ended after this worker lost it; its end is not recorded",
                        run.run_id,
                        run.attempt,
                    )
                if rollback and recorded:
                    await self.db(lambda: self.storage.delete_run(run.run_id), write=True)
            except Exception:  # the database went away: the lease expires and another worker reports the run
                logger.exception("Could not record the end of run %s", run.run_id)
            live.finish(outcome)
        finally:
            self._slots -= 1
            if self._maybe_pending:  # runs wait in the queue: the freed slot, or the thread, may take one
                self._notify()
            asyncio.get_running_loop().call_later(self.keep_seconds, self._forget, live)

    def _forget(self, live: LiveRun) -> None:
        """Drop a finished run's events (unless a later attempt of the run executes here now)."""
        if self._live.get(live.run_id) is live:
            del self._live[live.run_id]

    async def _rollback(self, run: RunRecord, outcome: RunOutcome) -> RunOutcome:
        """Restore a cancelled run's thread to the checkpoint it started from; the outcome then shows that state."""
        assistant = self.assistants.resolve(run.assistant_id) or self.assistants.default
        agent = assistant.agent
        await self.db(lambda: rollback_thread(agent, run.thread_id, outcome.started_from, run.run_id), write=True)
        try:
            snapshot = await self.db(lambda: agent.get_state(run.thread_id))
        except ThreadNotFoundError:
            return dataclasses.replace(outcome, values={}, thread_status="idle")
        values = values_view(snapshot, system_prompt=assistant.wire_system_prompt)
        return dataclasses.replace(
            outcome, values=values, thread_status="interrupted" if "__interrupt__" in values else "idle"
        )

    def job_for(self, run: RunRecord) -> RunJob:
        """
        Rebuild a run's job from its stored kwargs.

        :raises LookupError: If this server does not serve the run's assistant.
        """
        assistant = self.assistants.resolve(run.assistant_id)
        if assistant is None:
            raise LookupError(f"Run {run.run_id}: this server does not serve assistant '{run.assistant_id}'.")
        return job_from_kwargs(run.run_id, assistant, run.thread_id, run.kwargs, attempt=run.attempt)

    # --- the worker --------------------------------------------------------------------------------------------------

    async def _work(self) -> None:
        renew_every = self.lease_seconds / 3
        loop = asyncio.get_running_loop()
        next_renewal = next_poll = loop.time()
        wake = self._wake
        assert wake is not None
        while True:
            wake.clear()  # (a notification from now on wakes the next wait: its flag says what to do)
            polling = loop.time() >= next_poll
            try:
                if loop.time() >= next_renewal:
                    await self._maintain()
                    next_renewal = loop.time() + renew_every
                if polling or self._claim_due:
                    self._claim_due = False
                    await self._claim_all()
                if polling or self._requests_due:
                    self._requests_due = False
                    await self._poll_requests()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database is unreachable: log and try again at the next tick
                logger.exception("The run worker failed to poll the queue")
            if polling:
                # Listening, the worker polls only as a fallback; not while it relays a run's events to followers
                # in other processes, which it writes at each poll.
                listening = self._listener is not None and self._listener.listening
                relaying = any(live.relay for live in self._running())
                slow = listening and not relaying
                next_poll = loop.time() + (self.listen_poll_interval if slow else self.poll_interval)
            timeout = max(0.0, min(next_poll, next_renewal) - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=timeout)

    async def _claim_all(self) -> None:
        assistants = self.assistants.ids
        while True:
            if self._slots >= self.max_concurrent_runs:
                self._maybe_pending = True  # no room: look again when a run ends
                return
            self._slots += 1
            try:
                run, pending = await self.db(
                    lambda: self.storage.next_claim(self.worker_id, assistants, self._lease()), write=True
                )
            except BaseException:
                self._slots -= 1
                raise
            self._maybe_pending = pending
            if run is None:
                self._slots -= 1
                return
            self._launch(run)

    def _running(self) -> list[LiveRun]:
        """The runs (on threads) executing here now."""
        found = (self._live.get(run_id) for run_id in self._tasks)
        return [live for live in found if live is not None and not live.done.is_set()]

    async def _poll_requests(self) -> None:
        """
        Serve the requests on the runs executing here that came through other processes: cancel the cancelled ones,
        and write the events of the followed ones to the database.
        """
        running = self._running()
        if not running:
            return
        for run_id, action, relay in await self.db(lambda: self.storage.requests(self.worker_id)):
            live = self._live.get(run_id)
            if live is None or live.done.is_set():
                continue
            if action is not None:
                live.cancel(action)
            live.relay = live.relay or relay
        for live in running:
            if live.relay:
                await self._flush(live)

    async def _flush(self, live: LiveRun) -> None:
        """Write a followed run's new events to the database (one writer at a time: see ``LiveRun.relaying``)."""
        async with live.relaying:
            events = live.events[live.relayed :]
            if not events:
                return
            first = live.relayed
            rows = [(name, json.dumps(data, ensure_ascii=False, separators=(",", ":"))) for name, data in events]
            await self.db(
                lambda: self.storage.relay_events(
                    live.run_id, live.seq_base + first, rows, worker=self.worker_id, attempt=live.attempt
                ),
                write=True,
            )
            live.relayed = first + len(rows)

    async def _maintain(self) -> None:
        running = [run_id for run_id in self._tasks if run_id in self._live]
        await self.db(lambda: self.storage.renew_leases(self.worker_id, running, self._lease()), write=True)
        dead = [worker for worker in await self.db(self.storage.running_workers) if self._is_gone(worker)]
        requeued, failed = await self.db(
            lambda: self.storage.expire_leases(self.max_attempts, dead_workers=dead), write=True
        )
        kept = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.keep_seconds)).isoformat(timespec="microseconds")
        await self.db(lambda: self.storage.forget_relayed(kept), write=True)
        if requeued:
            logger.warning(
                "Runs %s lost their worker; they are queued again, to resume from their checkpoint", requeued
            )
            self._notify()
        if failed:
            logger.warning(
                "Runs %s lost their worker and used their %s attempt(s); they failed", failed, self.max_attempts
            )

    def _is_gone(self, worker: str) -> bool:
        """Whether a worker id (``host:pid:random``) names a process of this host that is gone."""
        return worker != self.worker_id and process_gone(worker)

    def _lease(self) -> str:
        return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.lease_seconds)).isoformat(timespec="microseconds")

    # --- following -------------------------------------------------------------------------------------------------

    async def wait(self, run: RunRecord) -> tuple[str, Any]:
        """
        Wait for a run to end.

        :returns: ``("values", the thread's values)`` or ``("error", {"error", "message"})``.
        """
        while True:
            live = self._live.get(run.run_id)
            if live is not None:
                await live.done.wait()
                outcome = live.outcome
                assert outcome is not None
                if outcome.error is not None:
                    return "error", outcome.error
                return "values", outcome.values if outcome.values is not None else {}
            current = await self.db(lambda: self.storage.get_run(run.run_id))
            if current is None:
                return "error", {"error": "RunNotFound", "message": f"Run {run.run_id} was deleted."}
            if current.done:
                return await self.final_event(current)
            await asyncio.sleep(self.poll_interval)

    async def events(
        self, run: RunRecord, modes: list[str] | None = None, after: Cursor | None = None
    ) -> AsyncIterator[Sent]:
        """
        The run's stream events, in ``modes`` (the run's own modes if None), with their ids, from its first (or the
        one after ``after``): live if it executes here, else relayed through the database by the process that runs
        it (see the module docstring). When ``values`` is asked for and none came, the thread's values at the run's
        end come last.
        """
        async for batch in self.event_batches(run, modes, after):
            for sent in batch:
                yield sent

    async def event_batches(
        self, run: RunRecord, modes: list[str] | None = None, after: Cursor | None = None
    ) -> AsyncIterator[list[Sent]]:
        """
        :meth:`events`, a batch at a time: the events ready at one moment together, so that a stream writes them to
        its client at once. The first batch comes at once (perhaps empty); later ones are not empty, but for a run
        followed through the database (one batch per poll).
        """
        names = event_names(modes if modes is not None else run.kwargs.get("stream_mode") or ["values"])
        cursor, asked = after, 0
        while True:
            live = self._live.get(run.run_id)
            if live is not None:
                earlier: list[Sent] = []
                if cursor is not None and cursor[0] < live.attempt:  # first what its earlier attempts relayed
                    async for position, sent in self._relayed(run.run_id, names, cursor, before=live.attempt):
                        cursor = position
                        if sent is not None:
                            earlier.append(sent)
                async for batch in live.follow_batches(names, cursor):
                    yield earlier + batch if earlier else batch
                    earlier = []
                return
            current = await self.db(lambda: self.storage.get_run(run.run_id))
            if current is None:
                yield [(None, "error", {"error": "RunNotFound", "message": f"Run {run.run_id} was deleted."})]
                return
            if current.status == "running" and asked != current.attempt:  # (asked again of a resumed run's worker)
                await self.db(lambda: self.storage.request_relay(run.run_id), write=True)
                asked = current.attempt
            found: list[Sent] = []
            async for position, sent in self._relayed(run.run_id, names, cursor or (0, -1)):
                cursor = position
                if sent is not None:
                    found.append(sent)
            if current.done:
                final = await self._relayed_final(current, names, cursor)
                if final is not None:
                    found.append(final)
                yield found
                return
            yield found
            await asyncio.sleep(self.poll_interval)

    async def _relayed(
        self, run_id: str, names: set[str], after: Cursor, *, before: int | None = None
    ) -> AsyncIterator[tuple[Cursor, Sent | None]]:
        """
        A run's relayed events after ``after`` (those of its attempts before ``before`` only, if given): for each,
        the follower's new position, and the event if it is in ``names`` (or an error).
        """
        cursor = after
        while rows := await self.db(functools.partial(self.storage.relayed_events, run_id, cursor)):
            for attempt, seq, name, data in rows:
                if before is not None and attempt >= before:
                    return
                cursor = (attempt, seq)
                wanted = name in names or name == "error"
                yield cursor, ((event_id(attempt, seq), name, json.loads(data)) if wanted else None)

    async def _relayed_final(self, run: RunRecord, names: set[str], cursor: Cursor | None) -> Sent | None:
        """
        The end of a finished run followed through the database, unless its relayed events carried it: its final
        values (if asked for) or its error. Numbered after its last relayed event; without an id if it relayed none
        (it ended before a follower asked, so the events it made are not known here).
        """
        last, relayed_values, relayed_error = await self.db(lambda: self.storage.relayed_end(run.run_id, run.attempt))
        if relayed_error or (run.status != "error" and (relayed_values or "values" not in names)):
            return None
        name, data = await self.final_event(run)
        if last is None:
            return None, name, data
        if cursor is not None and cursor >= (run.attempt, last + 1):
            return None
        return event_id(run.attempt, last + 1), name, data

    async def final_event(self, run: RunRecord) -> Event:
        """A finished run's last event: the thread's values now, or the run's error."""
        if run.status == "error":
            try:
                payload = json.loads(run.error or "")
            except ValueError:
                payload = {"error": "RunError", "message": run.error or "the run failed"}
            return "error", payload
        assistant = self.assistants.resolve(run.assistant_id) or self.assistants.default
        try:
            snapshot = await self.db(lambda: assistant.agent.get_state(run.thread_id))
        except KeyError:  # the run was cancelled before the thread's first run
            return "values", {}
        return "values", values_view(snapshot, system_prompt=assistant.wire_system_prompt)

    # --- cancelling ------------------------------------------------------------------------------------------------

    async def cancel(self, run: RunRecord, action: str = "interrupt") -> None:
        """
        Cancel a run: a pending one leaves the queue (status ``interrupted``; deleted with ``rollback``); a running
        one stops before its next step (at once if it executes here, else when its worker polls the request). A
        finished run is left as it is.

        :param run: The run.
        :param action: ``interrupt`` or ``rollback`` (also restore the thread to where the run started, and delete
            the run).
        """
        if action not in CANCEL_ACTIONS:
            raise ValueError(f"cancel action must be one of {CANCEL_ACTIONS}, got {action!r}")
        if await self.db(lambda: self.storage.cancel_pending(run.run_id), write=True):
            if action == "rollback":
                await self.db(lambda: self.storage.delete_run(run.run_id), write=True)
            return
        live = self._live.get(run.run_id)
        if live is not None and not live.done.is_set():
            live.cancel(action)
            return
        await self.db(lambda: self.storage.request_cancel(run.run_id, action), write=True)


def process_gone(owner: str) -> bool:
    """
    Whether a worker or lease owner id (``host:pid:random``) names a process of this host that no longer runs (then
    what it held can be taken back at once, without waiting for its lease to expire). False when unsure: another
    host, an id of another shape, a process id in use (perhaps by another process).
    """
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():  # this process's own id: not the process that held it, if the random part differs
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's)
        return False
    return False


def job_from_kwargs(
    run_id: str, assistant: Assistant, thread_id: str | None, kwargs: dict[str, Any], *, attempt: int = 1
) -> RunJob:
    """Build a job from a run's kwargs (as stored by the runs router)."""
    values = values_from_wire(kwargs.get("input"))
    messages = values.pop("messages", [])
    return RunJob(
        run_id=run_id,
        assistant=assistant,
        thread_id=thread_id,
        messages=messages,
        inputs=values,
        decisions=kwargs.get("decisions"),
        answers=kwargs.get("answers"),
        checkpoint_id=kwargs.get("checkpoint_id"),
        stream_modes=tuple(kwargs.get("stream_mode") or ()),
        attempt=attempt,
        on_unfinished_calls=kwargs.get("on_unfinished_calls"),
    )


def new_run(
    run_id: str,
    thread_id: str,
    assistant: Assistant,
    owner: str,
    kwargs: dict[str, Any],
    *,
    metadata: dict[str, Any] | None,
    multitask_strategy: str,
) -> RunRecord:
    """A new run record (its status is decided by the queue)."""
    at = now_text()
    return RunRecord(
        run_id=run_id,
        thread_id=thread_id,
        assistant_id=assistant.assistant_id,
        owner=owner,
        status="pending",
        multitask_strategy=multitask_strategy,
        kwargs=kwargs,
        metadata=dict(metadata or {}),
        error=None,
        worker=None,
        created_at=at,
        updated_at=at,
    )


class Listener:
    """
    Hears the notifications of a PostgreSQL database's workers (``LISTEN`` on its channel, see
    :meth:`~haystack_state.server.database.Database.notify`) on a connection of its own, and hands each payload to
    ``heard``, on the event loop. A lost connection is opened again after a pause (the worker polls meanwhile).

    :param database: The database (PostgreSQL).
    :param heard: Called with each payload.
    """

    def __init__(self, database: Database, heard: Callable[[str], None]) -> None:
        self.database = database
        self.heard = heard
        self.listening = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start listening (on the running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._listen(), name="haystack-state-run-listener")

    async def stop(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.listening = False

    async def _listen(self) -> None:
        import psycopg

        conninfo = str(getattr(self.database, "conninfo", ""))
        channel = str(getattr(self.database, "channel", ""))
        pause, warned = 1.0, False
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f'LISTEN "{channel}"')
                    self.listening = True
                    if warned:
                        logger.warning("The run worker listens for notifications again")
                    pause, warned = 1.0, False
                    self.heard(QUEUE)  # what was notified before we listened is looked for now
                    async for notice in conn.notifies():
                        self.heard(notice.payload)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the database went away: poll meanwhile, listen again later
                if not warned:
                    logger.warning("The run worker cannot listen for notifications (%s); it polls meanwhile", error)
                    warned = True
            self.listening = False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 30.0)
