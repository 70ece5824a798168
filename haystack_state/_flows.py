"""
``FlowDriver``: the base of the backends whose public methods are written once as *flows* (generators that yield
operations and receive their results): checkpointers and long-term stores. A backend implements ``_execute`` (and,
with I/O, ``_aexecute``); the driver runs a flow synchronously (:meth:`FlowDriver._drive`) or awaiting each
operation (:meth:`FlowDriver._adrive`) on the package's one driver of flows (:mod:`haystack_state._driver`), throws
an operation's error back into the flow (a driver error wrapped by ``_storage_error``, with the cause chained: see
:func:`haystack_state._db.errors.driver_error`), and makes the backend a (sync and async) context manager.
"""

from __future__ import annotations

import abc
from collections.abc import Generator
from types import TracebackType
from typing import Any, Self, TypeVar

from haystack_state._db.errors import driver_error
from haystack_state._driver import run_flow, run_flow_async
from haystack_state.errors import HaystackStateError

__all__ = ["FlowDriver"]

T = TypeVar("T")


class FlowDriver(abc.ABC):
    """Runs a backend's flows (see the module docstring)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @abc.abstractmethod
    def close(self) -> None:
        """Release the backend's resources. Idempotent."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the backend's resources, awaiting its async connections. Idempotent."""

    # --- the pair of methods a backend implements ---------------------------------------------------------------

    @abc.abstractmethod
    def _execute(self, op: Any) -> Any:
        """Execute one operation (one transaction) and return its result."""

    async def _aexecute(self, op: Any) -> Any:
        """Execute one operation without blocking the event loop; backends with I/O override this."""
        return self._execute(op)

    @abc.abstractmethod
    def _storage_error(self, op: Any, exc: Exception) -> HaystackStateError:
        """The error for an operation whose driver raised ``exc`` (its cause is chained by the driver)."""

    @abc.abstractmethod
    def _check_open(self) -> None:
        """Raise if the backend is closed."""

    # --- driving flows ------------------------------------------------------------------------------------------

    def _step(self, op: Any) -> Any:
        """Execute one operation a flow yielded (a subclass may yield other steps than its operations)."""
        return self._execute(op)

    async def _astep(self, op: Any) -> Any:
        """:meth:`_step`, awaited."""
        return await self._aexecute(op)

    def _drive(self, flow: Generator[Any, Any, T]) -> T:
        self._check_open()
        return run_flow(flow, self._step, wrap=self._wrap)

    async def _adrive(self, flow: Generator[Any, Any, T]) -> T:
        self._check_open()
        return await run_flow_async(flow, self._astep, wrap=self._wrap)

    def _wrap(self, op: object, exc: Exception) -> BaseException:
        """An operation's error as thrown back into its flow: ours as is, a driver's as ``_storage_error``."""
        return driver_error(op, exc, self._storage_error)

    @staticmethod
    def _one(op: Any) -> Generator[Any, Any, Any]:
        """A flow of one operation, returning its result."""
        result = yield op
        return result
