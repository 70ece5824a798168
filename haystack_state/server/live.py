"""
A run executing in this process, as its followers see it: :class:`LiveRun` keeps its stream events (so that late
and returning followers get them all, from the first), its end, and the switch that cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from haystack_state.server.executor import RunOutcome

__all__ = ["Event", "LiveRun"]

Event = tuple[str, Any]
"""A stream event: ``(SSE event name, JSON data)``."""


class LiveRun:
    """
    The events of a run executing in this process, kept so that late and returning followers get them all, and
    the switch that cancels it.
    """

    def __init__(self, run_id: str, attempt: int = 1) -> None:
        self.run_id = run_id
        #: The run's attempt that executes here, and the number its first relayed event takes (after the events
        #: its earlier attempts relayed).
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

    async def emit(self, event: str, data: Any) -> None:
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

    async def follow(self, names: set[str] | None = None) -> AsyncIterator[Event]:
        """
        Every event from the first, then the new ones as they come, until the run ends.

        :param names: Only events of these names (and errors); all of them if None. When ``values`` is asked for and
            the run streamed none (it streams its end only), its final values come last.
        """
        index = 0
        sent_values = False
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if names is None or event[0] in names or event[0] == "error":
                    sent_values = sent_values or event[0] == "values"
                    yield event
            if self.done.is_set():
                break
            await self._new.wait()
        outcome = self.outcome
        wants_values = names is None or "values" in names
        if wants_values and not sent_values and outcome is not None and outcome.values is not None:
            yield "values", outcome.values
