"""
Following runs (:class:`RunFollower`): waiting for a run's end and reading its stream events, wherever it executes. A
run executing in this process keeps its events in memory while it runs (and a little after; see
:class:`~haystack_state.server._live.LiveRun`), so clients that join it, or come back after a disconnect, get every
event from the start, or from the one after the last they saw (``Last-Event-ID``), in the stream modes they ask for
(among the run's). A run executing in another process is followed through the database: the follower asks for its
events on the run's row, and the worker that runs it writes them all, from the first, under the same ids. A follower
that comes after the run ended gets what was relayed, then the run's end (its final values, or its error) if none came.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from haystack_state.server._assistants import Assistants
from haystack_state.server._live import Cursor, Event, LiveRun, Sent, event_id
from haystack_state.server._records import RunRecord
from haystack_state.server._storage import ServerStorage
from haystack_state.server._streams import event_names
from haystack_state.server._views import values_view

__all__ = ["RunFollower"]

T = TypeVar("T")


class RunFollower:
    """
    Waits for runs and follows their events: live if they execute here, else through the database.

    :param storage: The queue.
    :param assistants: The served agents (a finished run's values are read through its assistant's Agent).
    :param poll_interval: How often (seconds) followers of runs executing elsewhere look for their events and end.
    """

    def __init__(self, storage: ServerStorage, assistants: Assistants, poll_interval: float) -> None:
        self.storage = storage
        self.assistants = assistants
        self.poll_interval = poll_interval
        #: The runs executing in this process (and those that ended a little while ago), by id.
        self._live: dict[str, LiveRun] = {}

    async def db(self, work: Callable[[], T], *, write: bool = False) -> T:
        """
        Do blocking database work (the server's storage, a checkpointer call) for the event loop: on SQLite inline,
        unless it would wait for the file's lock (then in a worker thread); on PostgreSQL in a worker thread (see
        :meth:`~haystack_state.server._database.Database.run`). ``write`` is kept for callers' clarity.
        """
        return await self.storage.database.run(work)

    async def wait(self, run: RunRecord) -> Event:
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
            current = await self.storage.get_run(run.run_id)
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
            current = await self.storage.get_run(run.run_id)
            if current is None:
                yield [(None, "error", {"error": "RunNotFound", "message": f"Run {run.run_id} was deleted."})]
                return
            if current.status == "running" and asked != current.attempt:  # (asked again of a resumed run's worker)
                await self.storage.request_relay(run.run_id)
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
        while rows := await self.storage.relayed_events(run_id, cursor):
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
        last, relayed_values, relayed_error = await self.storage.relayed_end(run.run_id, run.attempt)
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
