"""
How the run worker hears of work from other processes (:class:`Listener`: PostgreSQL ``LISTEN``), and tells a stopped
worker from a live one (:func:`process_gone`: a worker id names a process of this host that no longer runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from haystack_state.server._database import Database
from haystack_state.server._tables import QUEUE

__all__ = ["Listener", "process_gone"]

logger = logging.getLogger(__name__)


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


class Listener:
    """
    Hears the notifications of a PostgreSQL database's workers (``LISTEN`` on its channel, see
    :meth:`~haystack_state.server._database.Database.notify`) on a connection of its own, and hands each payload to
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
