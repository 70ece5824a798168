"""
Leases: a run's hold on its thread, so that a live run is never taken over and a crashed one is, once its lease
expires.

A lease is a row per thread with an owner id and an expiry. A run acquires it when it opens its thread (another
owner's live lease makes that a :class:`~haystack_state.errors.ThreadBusyError`, naming the holder and the expiry),
commits under it (a commit is refused if another owner took the thread meanwhile), renews it from a background
thread every third of its length (so a tool that blocks for minutes, or an event loop that a sync tool blocks, keeps
it), and releases it when the run ends. A process that dies stops renewing: its lease expires and the next run takes
the thread over. Expiry is judged by the clock of the process that checks it, so the machines sharing a database
must keep their clocks in step to well under a lease's length.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from haystack import logging

from haystack_state.errors import ThreadBusyError
from haystack_state.persistence.records import Lease

if TYPE_CHECKING:
    from haystack_state.persistence.base import Checkpointer

__all__ = ["LeaseKeeper", "busy_error", "lost_error", "new_owner"]

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


class LeaseKeeper:
    """
    Renews a lease from a background thread every third of its length, until :meth:`stop`. At each renewal it also
    looks for a stop asked of the run (``Checkpointer.request_stop``, ``Agent.cancel``) and reports it to
    ``on_stop``.

    :param checkpointer: Where the lease lives.
    :param lease: The lease.
    :param on_stop: Called (from the keeper's thread) when a stop was asked of the run.
    """

    def __init__(self, checkpointer: Checkpointer, lease: Lease, on_stop: Callable[[], None] | None = None) -> None:
        self.checkpointer = checkpointer
        self.lease = lease
        self.lost = False
        self.on_stop = on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"haystack-state-lease-{lease.thread_id[:40]}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        interval = self.checkpointer.lease_ttl / 3
        while not self._stop.wait(interval):
            try:
                self.lease = self.checkpointer.renew_lease(self.lease)
                if self.lease.stop_requested and self.on_stop is not None:
                    self.on_stop()
            except ThreadBusyError:
                self.lost = True
                return
            except Exception as error:  # a passing storage fault: the next renewal may work
                logger.warning(
                    "Could not renew the lease on thread '{thread_id}': {error}",
                    thread_id=self.lease.thread_id,
                    error=error,
                )

    def stop(self) -> Lease:
        """
        Stop renewing (waiting for a renewal under way to finish).

        :returns: The lease as last renewed.
        """
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        return self.lease
