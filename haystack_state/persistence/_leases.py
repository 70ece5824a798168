"""
Leases: a run's hold on its thread, so that a live run is never taken over and a crashed one is, once its lease
expires.

A lease is a row per thread with an owner id and an expiry. A run acquires it when it opens its thread (another
owner's live lease makes that a :class:`~haystack_state.errors.ThreadBusyError`, naming the holder and the expiry),
commits under it (a commit is refused if another owner took the thread meanwhile), renews it every third of its
length from the process's one renewer thread (so a tool that blocks for minutes, or an event loop that a sync tool
blocks, keeps it), and releases it when the run ends. A process that dies stops renewing: its lease expires and the
next run takes the thread over. Expiry is judged by the clock of the process that checks it, so the machines sharing a
database must keep their clocks in step to well under a lease's length.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import itertools
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from haystack import logging

from haystack_state.errors import ThreadBusyError
from haystack_state.persistence.records import Lease

if TYPE_CHECKING:
    from haystack_state.persistence.base import Checkpointer

__all__ = ["LeaseKeeper", "Renewer", "busy_error", "lost_error", "new_owner"]

logger = logging.getLogger(__name__)


def new_owner() -> str:
    """A unique lease owner id: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def busy_error(thread_id: str, holder: str, expires_at: dt.datetime) -> ThreadBusyError:
    """The error for a thread whose lease another owner holds."""
    return ThreadBusyError(
        f"Thread '{thread_id}' is busy: a run holds its lease (owner '{holder}', expiring at "
        f"{expires_at.isoformat(timespec='seconds')} unless renewed). Nothing was written. Retry later; a crashed "
        "run's thread is taken over once its lease expires.",
        holder=holder,
        expires_at=expires_at,
    )


def lost_error(lease: Lease) -> ThreadBusyError:
    """The error for a lease that expired and was taken by another owner."""
    return ThreadBusyError(
        f"Thread '{lease.thread_id}': this run's lease (owner '{lease.owner}') was lost: it expired and another run "
        "took the thread over. Nothing more of this run is written.",
        holder=None,
    )


@dataclasses.dataclass(eq=False)
class LeaseKeeper:
    """
    Renews a lease every third of its length, until :meth:`stop`. At each renewal it also looks for a stop asked of
    the run (``Checkpointer.request_stop``, ``Agent.cancel``) and reports it to ``on_stop``. The renewals of every
    keeper of the process are made by one background thread (see :class:`Renewer`), not a thread per run.

    :param checkpointer: Where the lease lives.
    :param lease: The lease (as last renewed, once renewed).
    :param on_stop: Called (from the renewer's thread) when a stop was asked of the run.
    """

    checkpointer: Checkpointer
    lease: Lease
    on_stop: Callable[[], None] | None = None
    #: The lease was lost: another owner took the thread.
    lost: bool = dataclasses.field(default=False, init=False)
    #: Still to be renewed (until :meth:`stop`).
    active: bool = dataclasses.field(default=True, init=False)
    #: A renewal is under way (in the renewer's thread).
    renewing: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        Renewer.shared().add(self)

    def renew(self) -> bool:
        """Renew the lease once (in the renewer's thread). Returns whether to keep renewing it."""
        try:
            self.lease = self.checkpointer.renew_lease(self.lease)
            if self.lease.stop_requested and self.on_stop is not None:
                self.on_stop()
        except ThreadBusyError:
            self.lost = True
            return False
        except Exception as error:  # a passing storage fault: the next renewal may work
            logger.warning(
                "Could not renew the lease on thread '{thread_id}': {error}",
                thread_id=self.lease.thread_id,
                error=error,
            )
        return True

    def stop(self) -> Lease:
        """
        Stop renewing (waiting for a renewal under way to finish).

        :returns: The lease as last renewed.
        """
        Renewer.shared().remove(self)
        return self.lease

    def try_stop(self) -> Lease | None:
        """
        Stop renewing, without waiting: for an event loop, which must not wait for a renewal under way.

        :returns: The lease as last renewed; None if a renewal is under way (it is not renewed again after it: call
            :meth:`stop` from a worker thread to wait for it and get the lease it renewed).
        """
        return self.lease if Renewer.shared().remove(self, wait=False) else None


class Renewer:
    """
    The one thread of a process that renews every live :class:`LeaseKeeper`'s lease, each every third of its
    checkpointer's ``lease_ttl``, soonest due first. Started with the first keeper; it waits idle when none is left.
    """

    _shared: Renewer | None = None
    _shared_lock = threading.Lock()

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, LeaseKeeper]] = []
        self._count = itertools.count()
        self._thread: threading.Thread | None = None

    @classmethod
    def shared(cls) -> Renewer:
        """The process's renewer (a child process after ``fork`` gets a new one)."""
        renewer = cls._shared
        if renewer is None:
            with cls._shared_lock:
                renewer = cls._shared
                if renewer is None:
                    renewer = cls._shared = cls()
        return renewer

    @property
    def thread(self) -> threading.Thread | None:
        """The renewing thread, once started."""
        return self._thread

    def add(self, keeper: LeaseKeeper) -> None:
        """Renew ``keeper``'s lease from now on."""
        with self._cond:
            self._schedule(keeper)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="haystack-state-lease-renewer", daemon=True)
                self._thread.start()
            if self._due[0][2] is keeper:  # due before every other: the thread sleeps until a later one
                self._cond.notify_all()

    def remove(self, keeper: LeaseKeeper, *, wait: bool = True) -> bool:
        """
        Stop renewing ``keeper``'s lease, waiting for a renewal of it under way (unless called from it).

        :param wait: Whether to wait for a renewal under way; without, return False if there is one.
        :returns: Whether no renewal of it is under way any more.
        """
        with self._cond:
            keeper.active = False
            if threading.current_thread() is not self._thread:
                if keeper.renewing and not wait:
                    return False
                while keeper.renewing:
                    self._cond.wait()
        return True

    def _schedule(self, keeper: LeaseKeeper) -> None:
        due = time.monotonic() + keeper.checkpointer.lease_ttl / 3
        heapq.heappush(self._due, (due, next(self._count), keeper))

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._due and not self._due[0][2].active:  # stopped keepers leave the queue
                        heapq.heappop(self._due)
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    if wait is not None and wait <= 0:
                        keeper = heapq.heappop(self._due)[2]
                        keeper.renewing = True
                        break
                    self._cond.wait(wait)
            keep = False
            try:
                keep = keeper.renew()
            finally:
                with self._cond:
                    keeper.renewing = False
                    if keep and keeper.active:
                        self._schedule(keeper)
                    self._cond.notify_all()


def _forget_renewer_after_fork() -> None:
    Renewer._shared = None
    Renewer._shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_renewer_after_fork)
