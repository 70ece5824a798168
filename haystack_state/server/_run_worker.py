"""
The run worker of this process (:class:`RunWorker`): it claims queued runs and executes them here, through a
:class:`~haystack_state.server._executor.RunExecutor`, each in a slot of its own (``max_concurrent_runs``).

A worker task claims queued runs when it is told that some may be claimable: at once for runs queued here, and when a
run ends here while runs wait in the queue (or when a slot frees while it had no room for them); on PostgreSQL also
when another process queues a run or ends one whose thread has runs queued (``LISTEN``/``NOTIFY``, see
:class:`~haystack_state.server._listener.Listener`). Otherwise it polls, every ``poll_interval`` (on PostgreSQL with a
listener, every ``listen_poll_interval``: a fallback), with one read when the queue is empty. It renews the leases of
the runs it executes, and takes back the runs whose worker stopped (their lease expired, or their process on this host
is gone): each goes back to the queue, ahead of its thread's other runs, and the next free worker of any process
resumes it from its thread's last checkpoint (see :meth:`RunWorker.job_for`), up to ``max_attempts`` attempts in all;
then it fails. A worker writes about a run (its end, its relayed events) only while it holds the run at its attempt,
and its checkpoints only under the thread's lease, so a worker that stopped and wakes later writes nothing. A tool call
in flight when a worker died runs again (at least once).

It serves the requests that other processes write on the rows of its runs: it cancels a cancelled run, and writes the
events of a followed run to the database (it polls the request, and writes the rest before it records the run's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import socket
import uuid

from haystack_state.errors import ThreadNotFoundError
from haystack_state.server._assistants import Assistants
from haystack_state.server._cancelling import close_cancelled_run, rollback_thread
from haystack_state.server._executor import RunExecutor, RunJob, RunOutcome, error_payload
from haystack_state.server._following import RunFollower
from haystack_state.server._listener import Listener, process_gone
from haystack_state.server._live import LiveRun
from haystack_state.server._records import RunLease, RunRecord
from haystack_state.server._run_jobs import job_from_kwargs
from haystack_state.server._storage import ServerStorage
from haystack_state.server._tables import REQUESTS
from haystack_state.server._views import values_view

__all__ = ["RunWorker"]

logger = logging.getLogger(__name__)


class RunWorker(RunFollower):
    """
    Claims queued runs and executes them in this process; follows runs (:class:`RunFollower`).

    :param storage: The queue.
    :param assistants: The served agents (this worker claims their runs only).
    :param executor: Runs a job.
    :param max_concurrent_runs: How many runs this process executes at once.
    :param max_pending_runs: How many runs may wait in the queue (all processes together; see ``RunManager.submit``).
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
        super().__init__(storage, assistants, poll_interval)
        self.executor = executor
        self.max_concurrent_runs = max_concurrent_runs
        self.max_pending_runs = max_pending_runs
        self.lease_seconds = lease_seconds
        self.keep_seconds = keep_seconds
        self.max_attempts = max_attempts
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
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

    def _notify(self, *, claim: bool = True, requests: bool = False) -> None:
        """Wake the worker: to claim runs (some may be claimable), and/or to read the requests on its runs."""
        if claim:
            self._claim_due = self._maybe_pending = True
        if requests:
            self._requests_due = True
        if self._wake is not None:
            self._wake.set()

    def _heard(self, payload: str) -> None:
        """A notification from the database (see :class:`~haystack_state.server._listener.Listener`)."""
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

    async def _execute(self, run: RunRecord, live: LiveRun) -> None:
        try:
            try:
                if run.attempt > 1:  # its events follow those its earlier attempts relayed
                    live.seq_base = await self.storage.next_event_seq(run.run_id)
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
                    live.relay = await self.storage.relay_requested(run.run_id)
                if live.relay:  # every event is in the database before the run is seen to end
                    await self._flush(live)
                recorded = await self.storage.finish_run(
                    run.run_id,
                    outcome.status,
                    thread_status=outcome.thread_status,
                    error=failure,
                    worker=self.worker_id,
                    attempt=run.attempt,
                )
                if not recorded:
                    logger.warning(
                        "Run %s (attempt %s) ended after this worker lost it; its end is not recorded",
                        run.run_id,
                        run.attempt,
                    )
                if rollback and recorded:
                    await self.storage.delete_run(run.run_id)
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
                run, pending = await self.storage.next_claim(assistants, self._lease())
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
        for run_id, action, relay in await self.storage.requests(self.worker_id):
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
            await self.storage.relay_events(
                live.run_id, live.seq_base + first, rows, worker=self.worker_id, attempt=live.attempt
            )
            live.relayed = first + len(rows)

    async def _maintain(self) -> None:
        running = [run_id for run_id in self._tasks if run_id in self._live]
        await self.storage.renew_leases(self._lease(), running)
        dead = [worker for worker in await self.storage.running_workers() if self._is_gone(worker)]
        requeued, failed = await self.storage.expire_leases(self.max_attempts, dead_workers=dead)
        kept = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.keep_seconds)).isoformat(timespec="microseconds")
        await self.storage.forget_relayed(kept)
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

    def _lease(self) -> RunLease:
        """This worker's lease on the runs it holds, from now."""
        until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.lease_seconds)
        return RunLease(self.worker_id, until.isoformat(timespec="microseconds"))
