"""
The run queue's in-process side: a :class:`RunManager` submits runs to the queue
(:mod:`haystack_state.server._storage`), executes the ones this process claims (through a
:class:`~haystack_state.server._executor.RunExecutor`), and lets clients wait for a run or follow its events, wherever
it executes.

- ``runs/wait`` and ``runs/stream`` start their run here at once when its thread is free and this process has room
(otherwise the run waits in the queue, for any worker); background runs (``POST /threads/{id}/runs``) are queued and the
next free worker of any process claims them. - The worker of this process
(:class:`~haystack_state.server._run_worker.RunWorker`, which :class:`RunManager` extends) claims queued runs, executes
them, renews their leases and takes back the runs whose worker stopped, to be resumed by any worker. - Clients follow a
run through :class:`~haystack_state.server._following.RunFollower` (which the worker extends): live if it executes here,
else through the database, where the worker that runs a followed run writes its events (it polls the request, and writes
the rest before it records the run's end). - A run is cancelled at once if it executes here; otherwise a cancel request
is written on its row, which the worker that runs it polls (on PostgreSQL, it is told at once). ``action="rollback"``
also restores the thread to where the run started and deletes the run. A new run with ``multitask_strategy="interrupt"``
or ``"rollback"`` cancels its thread's runs that way (the queue writes the requests in the transaction that adds it; see
``RunQueue.create_run`` in :mod:`haystack_state.server._run_queue`) and starts, in whichever process claims it, once the
cancelled run has stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses

from haystack_state.errors import CheckpointError
from haystack_state.server._cancelling import CANCEL_ACTIONS
from haystack_state.server._executor import RunJob
from haystack_state.server._live import Cursor, Event, LiveRun, Sent
from haystack_state.server._records import CancelAction, Idempotency, RunRecord
from haystack_state.server._run_jobs import job_from_kwargs, new_run
from haystack_state.server._run_worker import RunWorker

# (The names moved to live and run_jobs are re-exported from here, where they were before.)
__all__ = ["AtCapacity", "Cursor", "Event", "LiveRun", "RunManager", "Sent", "job_from_kwargs", "new_run"]


class AtCapacity(CheckpointError):
    """This process runs its maximum of concurrent runs; the request is refused (HTTP 429)."""


class RunManager(RunWorker):
    """
    Submits runs, starts the ones it may at once, and cancels runs; executes the runs this process claims and follows
    runs (:class:`~haystack_state.server._run_worker.RunWorker`, whose parameters it takes).
    """

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
                stored = await self.storage.create_run(
                    dataclasses.replace(run, status="running", worker=self.worker_id),
                    lease_until=self._lease().until,
                    max_pending=self.max_pending_runs,
                    graph_id=graph_id,
                    idempotency=idempotency,
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
        stored = await self.storage.create_run(
            dataclasses.replace(run, status="pending"),
            max_pending=self.max_pending_runs,
            graph_id=graph_id,
            idempotency=idempotency,
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

    # --- cancelling ------------------------------------------------------------------------------------------------

    async def cancel(self, run: RunRecord, action: CancelAction = "interrupt") -> None:
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
        if await self.storage.cancel_pending(run.run_id):
            if action == "rollback":
                await self.storage.delete_run(run.run_id)
            return
        live = self._live.get(run.run_id)
        if live is not None and not live.done.is_set():
            live.cancel(action)
            return
        await self.storage.request_cancel(run.run_id, action)
