"""
Group commit for async checkpointers: the commits that the runs of one event loop make while a batch is being written
wait and go together in the next one, so that concurrent runs share transactions (round trips, WAL flushes, thread
hops) instead of each paying its own. Each commit still succeeds or fails on its own: the backend writes a batch with
one result (or :class:`Failed`) per commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

__all__ = ["Failed", "GroupCommit"]

OpT = TypeVar("OpT")


class Failed:
    """An operation's error, carried back from a batch to the operation's own caller."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class GroupCommit(Generic[OpT]):
    """
    The group commit of one event loop: commits wait while a batch is written and go together in the next one (at
    most ``limit``).

    :param limit: The most commits in one batch.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self.pending: list[tuple[OpT, asyncio.Future[Any]]] = []
        self.writing: asyncio.Task[None] | None = None

    async def submit(self, op: OpT, write: Callable[[list[OpT]], Awaitable[list[Any]]]) -> object:
        """
        Commit ``op`` with the next batch.

        :param op: The commit.
        :param write: Writes a batch; returns one result per commit, in order (a :class:`Failed` for an error).
        :returns: The commit's result.
        :raises Exception: The commit's own error.
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((op, future))
        if self.writing is None:
            self.writing = asyncio.get_running_loop().create_task(self._drain(write))
        result = await future
        if isinstance(result, Failed):
            raise result.error
        return result

    async def _drain(self, write: Callable[[list[OpT]], Awaitable[list[Any]]]) -> None:
        try:
            await asyncio.sleep(0)  # let the commits of this turn of the loop join the first batch
            while self.pending:
                batch, self.pending = self.pending[: self.limit], self.pending[self.limit :]
                try:
                    results = await write([op for op, _ in batch])
                except BaseException as error:
                    results = [Failed(error)] * len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self.writing = None
