"""
Tool call timeouts: which timeout a call has, and the deadlines of the calls a sync runner is waiting for.

A call's timeout is its tool's own (``@tool(timeout=...)``, or a ``timeout`` attribute on any haystack ``Tool``), else
the runner's ``tool_timeout``; None means no timeout. A call over time becomes a ``ToolTimeoutError`` result and merges
nothing, whatever it does later: an async tool is cancelled, a sync one is abandoned in its daemon worker thread (see
:mod:`._workers`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Hashable
from typing import TypeVar

from haystack_state.errors import ToolTimeoutError
from haystack_state.tools.spec import ToolSpec

#: How long past its timeout a sync runner waits for an async tool to be cancelled before abandoning it.
CANCEL_GRACE = 1.0

__all__ = ["CANCEL_GRACE", "Deadlines", "call_timeout", "check_max_tool_calls", "check_timeout", "with_timeout"]

T = TypeVar("T")


def check_timeout(timeout: object, what: str) -> float | None:
    """
    Validate a timeout given by a programmer.

    :param timeout: Seconds (a positive finite number), or None for no timeout.
    :param what: The argument, for the message.
    :returns: The timeout as a float, or None.
    :raises ValueError: If it is not a positive finite number.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"{what} must be a positive number of seconds or None, got {timeout!r}.")
    return float(timeout)


def check_max_tool_calls(limit: object, what: str) -> int | None:
    """
    Validate a ``max_tool_calls`` given by a programmer.

    :param limit: A positive int, or None for no limit.
    :param what: The argument, for the message.
    :returns: The limit.
    :raises ValueError: If it is not a positive int.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"{what} must be a positive int or None, got {limit!r}.")
    return limit


def call_timeout(spec: ToolSpec, default: float | None) -> float | None:
    """
    The timeout of a call of this tool: the tool's own, else ``default``.

    :param spec: The tool.
    :param default: The runner's ``tool_timeout``.
    :returns: Seconds, or None for no timeout.
    """
    return spec.timeout if spec.timeout is not None else default


async def with_timeout(awaitable: Awaitable[T], spec: ToolSpec, timeout: float | None) -> T:
    """
    Await a call, cancelling it when it overruns ``timeout``.

    :param awaitable: The call.
    :param spec: Its tool, for the error.
    :param timeout: Seconds, or None.
    :returns: Its result.
    :raises ToolTimeoutError: If it did not finish in time (it is cancelled).
    """
    if timeout is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise ToolTimeoutError(spec.name, timeout) from None


class Deadlines:
    """The deadlines of the running calls of a sync runner, by any key (their futures)."""

    def __init__(self) -> None:
        self._due: dict[Hashable, tuple[float, float]] = {}

    def start(self, key: Hashable, timeout: float | None, grace: float = 0.0) -> None:
        """
        Note that the call ``key`` starts now with this timeout (nothing is noted for None).

        :param key: The call.
        :param timeout: Its timeout, in seconds.
        :param grace: How much longer to wait before abandoning it: an async tool is cancelled by its own worker when
            it overruns, so the runner waits for that, and abandons it only if it ignores the cancellation.
        """
        if timeout is not None:
            self._due[key] = (time.monotonic() + timeout + grace, timeout)

    def discard(self, key: Hashable) -> None:
        """The call ``key`` finished."""
        self._due.pop(key, None)

    def wait_time(self) -> float | None:
        """How long the runner may wait for a call to finish before a deadline passes; None without deadlines."""
        if not self._due:
            return None
        return max(0.0, min(due for due, _ in self._due.values()) - time.monotonic())

    def expired(self) -> list[tuple[Hashable, float]]:
        """The calls whose deadline has passed, with their timeouts; they are forgotten."""
        now = time.monotonic()
        late = [(key, timeout) for key, (due, timeout) in self._due.items() if due <= now]
        for key, _ in late:
            del self._due[key]
        return late
