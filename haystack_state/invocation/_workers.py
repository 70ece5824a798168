"""
The threads sync tool calls run in: daemon threads, kept for reuse while idle.

A tool call that overruns its timeout, or that is still running when the run is interrupted (Ctrl-C), is abandoned:
its thread is never joined, so it hangs neither the run nor the interpreter's exit (a ``ThreadPoolExecutor``'s
threads are joined at exit, and its ``shutdown`` waits for them). Idle threads are reused by later calls, from any
run, and end after :data:`IDLE_SECONDS` without work.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["IDLE_SECONDS", "WORKERS", "DaemonWorkers"]

#: How long an idle worker thread waits for more work before it ends.
IDLE_SECONDS = 30.0

_Job = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]]


class DaemonWorkers:
    """
    Runs callables in daemon threads and hands back ``concurrent.futures.Future``s. Each call gets an idle thread, or
    a new one: the caller bounds how many run at once.

    :param idle_seconds: How long an idle thread waits for work before it ends.
    :param name: The prefix of the threads' names.
    """

    def __init__(self, idle_seconds: float = IDLE_SECONDS, name: str = "haystack-state-tool") -> None:
        self.idle_seconds = idle_seconds
        self.name = name
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job]] = []
        self._count = 0
        self._busy = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """
        Run ``fn(*args)`` in a worker thread.

        :param fn: What to run.
        :param args: Its arguments.
        :returns: The future of its result (or exception).
        """
        future: Future[Any] = Future()
        job: _Job = (future, fn, args)
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            self._count += 1
            self._busy += 1
            number = self._count
        if inbox is not None:
            inbox.put(job)
        else:
            inbox = queue.SimpleQueue()
            thread = threading.Thread(target=self._work, args=(inbox, job), name=f"{self.name}-{number}", daemon=True)
            thread.start()
        return future

    def _work(self, inbox: queue.SimpleQueue[_Job], job: _Job | None) -> None:
        while job is not None:
            future, fn, args = job
            job = None
            ok, outcome = False, None
            if future.set_running_or_notify_cancel():
                try:
                    outcome, ok = fn(*args), True
                except BaseException as exc:  # delivered to the waiting caller, whatever it is
                    outcome = exc
            with self._lock:  # no longer busy once its caller can see the outcome
                self._busy -= 1
            if future.running():
                if ok:
                    future.set_result(outcome)
                else:
                    future.set_exception(outcome)
            del future, fn, args, outcome  # nothing of the finished call stays referenced while idle
            with self._lock:
                self._idle.append(inbox)
            try:
                job = inbox.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                job = inbox.get()  # it was handed work just as it timed out

    @property
    def busy(self) -> int:
        """How many calls are running (or about to): abandoned ones included, until they return."""
        with self._lock:
            return self._busy

    def forget_threads(self) -> None:
        """In a forked child, the parent's threads do not exist: start afresh."""
        self._lock = threading.Lock()
        self._idle = []
        self._busy = 0


#: The workers every tool runner shares.
WORKERS = DaemonWorkers()

os.register_at_fork(after_in_child=WORKERS.forget_threads)
