"""
A run executing in this process, as its followers see it: :class:`LiveRun` keeps its stream events (so that late
and returning followers get them all, from the first or from the one after the last they saw), its end, and the
switch that cancels it.

Every event of a run has an id, ``"{attempt}-{seq}"``: the attempt of the run that made it and its number in the run.
Numbers count from 0 and go on across attempts (a resumed run's later attempt numbers its events after those its
earlier attempts relayed through the database), and the database relay keeps both, so a client that sends the last
id it saw (``Last-Event-ID``) resumes after that event from any process. Ids order as ``(attempt, seq)``: a later
attempt's events all come after every event of an earlier one, even those the client saw from a process that died
before relaying them.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

from haystack_state.server._executor import RunOutcome

__all__ = ["Cursor", "Event", "LiveRun", "Sent", "event_id", "parse_event_id"]

Event = tuple[str, Any]
"""A stream event: ``(SSE event name, JSON data)``."""
Sent = tuple[str | None, str, Any]
"""A stream event as sent: ``(its id, or None for a run's end summarised without one; name; data)``."""
Cursor = tuple[int, int]
"""Where a follower is in a run's events: the ``(attempt, seq)`` of the last event it saw."""


def event_id(attempt: int, seq: int) -> str:
    """The id of a run's event ``seq`` made by attempt ``attempt``."""
    return f"{attempt}-{seq}"


def parse_event_id(text: str) -> Cursor:
    """
    The cursor a ``Last-Event-ID`` names.

    :raises ValueError: If it is not an id this server sent (``"{attempt}-{seq}"``).
    """
    attempt, separator, seq = text.strip().partition("-")
    if not separator or not attempt.isdigit() or not seq.isdigit() or int(attempt) < 1:
        raise ValueError(f"'{text}' is not an event id of this server (ATTEMPT-SEQ, as in '1-7')")
    return int(attempt), int(seq)


class LiveRun:
    """
    The events of a run executing in this process, kept so that late and returning followers get them all, and
    the switch that cancels it.

    :param run_id: The run.
    :param attempt: The run's attempt that executes here.
    :param thread_id: Its thread (None for a stateless run).
    """

    def __init__(self, run_id: str, attempt: int = 1, thread_id: str | None = None) -> None:
        self.run_id = run_id
        self.thread_id = thread_id
        #: The run's attempt that executes here, and the number its first event takes (after the events its earlier
        #: attempts relayed).
        self.attempt = attempt
        self.seq_base = 0
        self.events: list[Event] = []
        self.outcome: RunOutcome | None = None
        self.done = asyncio.Event()
        #: Set to cancel the run; ``cancel_action`` says how.
        self.stop = asyncio.Event()
        self.cancel_action = "interrupt"
        #: Whether a follower in another process asked for the events, and how many are written to the database.
        self.relay = False
        self.relayed = 0
        #: Held while events are written to the database: the worker's poll and the run's end both write them, and
        #: two writes of the same events would collide on their numbers.
        self.relaying = asyncio.Lock()
        self._new = asyncio.Event()

    def cancel(self, action: str) -> None:
        """Cancel the run (``interrupt``; ``rollback`` also restores its thread and deletes it)."""
        if not self.stop.is_set() or action == "rollback":
            self.cancel_action = action
        self.stop.set()

    async def emit(self, event: str, data: object) -> None:
        """Record an event and wake the followers."""
        self.events.append((event, data))
        self._wake()

    def finish(self, outcome: RunOutcome) -> None:
        """Record the run's end."""
        self.outcome = outcome
        self.done.set()
        self._wake()

    def _wake(self) -> None:
        new, self._new = self._new, asyncio.Event()
        new.set()

    def _first(self, after: Cursor | None) -> int:
        """The index of the first event after ``after`` (past the end for a cursor of a later attempt)."""
        if after is None:
            return 0
        attempt, seq = after
        if attempt < self.attempt:  # every event of this attempt comes after it
            return 0
        if attempt > self.attempt:
            return sys.maxsize
        return max(0, seq - self.seq_base + 1)

    async def follow(self, names: set[str] | None = None, after: Cursor | None = None) -> AsyncIterator[Sent]:
        """
        The events from the first (or the one after ``after``), then the new ones as they come, until the run ends.

        :param names: Only events of these names (and errors); all of them if None. When ``values`` is asked for and
            the run streamed none (it streams its end only), its final values come last, numbered as the next event.
        :param after: The last event the follower saw, if it comes back.
        """
        async for batch in self.follow_batches(names, after):
            for sent in batch:
                yield sent

    async def follow_batches(
        self, names: set[str] | None = None, after: Cursor | None = None
    ) -> AsyncIterator[list[Sent]]:
        """
        :meth:`follow`, a batch at a time: the events there now (at once, perhaps none), then, each time the
        follower comes back for more, every event that came meanwhile (waiting for one if none did). A stream
        writes each batch to its client at once: the events of one moment go out together.
        """
        index = self._first(after)
        first = True
        while True:
            batch: list[Sent] = []
            events = self.events
            while index < len(events):
                name, data = events[index]
                index += 1
                if names is None or name in names or name == "error":
                    batch.append((event_id(self.attempt, self.seq_base + index - 1), name, data))
            if self.done.is_set():
                final = self._final(names, index)
                if final is not None:
                    batch.append(final)
                if batch or first:
                    yield batch
                return
            if batch or first:
                first = False
                yield batch
                continue  # (more may have come while the follower was away)
            await self._new.wait()

    def _final(self, names: set[str] | None, index: int) -> Sent | None:
        """A finished run's final values, if the follower asks for them and the run streamed none."""
        outcome = self.outcome
        if (
            (names is None or "values" in names)
            and outcome is not None
            and outcome.values is not None
            and index <= len(self.events)  # (the follower did not see it already)
            and all(name != "values" for name, _ in self.events)
        ):
            return event_id(self.attempt, self.seq_base + len(self.events)), "values", outcome.values
        return None
