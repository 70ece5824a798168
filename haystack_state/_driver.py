"""
The one driver of the package's *flows*: generators that yield operations and receive their results.

The agent loop, the thread session, the checkpointers and the long-term stores are written as flows, once, and run
synchronously or awaiting each operation by the two functions here:

- :func:`run_flow` calls ``step(op)`` for each operation and sends the result back;
- :func:`run_flow_async` awaits ``step(op)``.

An operation's exception is thrown back into the flow at its ``yield`` (after ``wrap``, which may turn a driver's
error into one of ours); if the flow does not catch it, it propagates out of the driver. ``check`` runs before each
operation and may raise to stop the flow (the flow is closed, so its ``finally`` blocks and spans end).

An operation is an :class:`Op` whose type parameter is its result's type. A flow that yields through
:func:`perform` gets that type back, so ``reply = yield from perform(CallModel(...))`` is typed::

    def flow() -> Flow[int]:
        count = yield from perform(CountRows("threads"))  # CountRows(Op[int])
        return count
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeAlias, TypeVar

__all__ = ["Flow", "Op", "perform", "run_flow", "run_flow_async"]

R = TypeVar("R")
T = TypeVar("T")


class Op(Generic[R]):
    """An operation a flow yields; the driver sends back a result of type ``R``."""

    __slots__ = ()


#: A flow that yields operations and returns ``T``.
Flow: TypeAlias = Generator[Any, Any, T]


def perform(op: Op[R]) -> Generator[Op[R], Any, R]:
    """Yield one operation and return its result, typed by the operation (``result = yield from perform(op)``)."""
    result: R = yield op  # (the driver sends the result of ``op``: an R)
    return result


def _keep(op: Any, exc: Exception) -> BaseException:
    return exc


def run_flow(
    flow: Flow[T],
    step: Callable[[Any], Any],
    *,
    wrap: Callable[[Any, Exception], BaseException] = _keep,
    check: Callable[[], None] | None = None,
) -> T:
    """
    Run ``flow`` to its end, executing each operation with ``step``.

    :param flow: The flow.
    :param step: Executes one operation and returns its result.
    :param wrap: Maps an operation's exception to the one thrown back into the flow (its cause chained when it is a
        new exception).
    :param check: Runs before each operation; an exception it raises closes the flow and propagates.
    :returns: The flow's return value.
    """
    with _Driving(flow, wrap, check) as driving:
        while (op := driving.next()) is not _DONE:
            try:
                driving.result = step(op)
            except Exception as exc:
                driving.fail(op, exc)
    return driving.value


async def run_flow_async(
    flow: Flow[T],
    step: Callable[[Any], Awaitable[Any]],
    *,
    wrap: Callable[[Any, Exception], BaseException] = _keep,
    check: Callable[[], None] | None = None,
) -> T:
    """:func:`run_flow`, awaiting each operation (a cancelled task closes the flow where it is)."""
    with _Driving(flow, wrap, check) as driving:
        while (op := driving.next()) is not _DONE:
            try:
                driving.result = await step(op)
            except Exception as exc:
                driving.fail(op, exc)
    return driving.value


#: What :meth:`_Driving.next` returns once the flow has returned.
_DONE: Any = object()


class _Driving(Generic[T]):
    """
    One flow being run: what both drivers share. It sends each result (or throws each error) into the flow, and
    closes the flow if anything escapes the ``with`` block (an error, a cancellation), so its ``finally`` blocks run.
    """

    __slots__ = ("check", "error", "flow", "result", "value", "wrap")

    def __init__(
        self, flow: Flow[T], wrap: Callable[[Any, Exception], BaseException], check: Callable[[], None] | None
    ) -> None:
        self.flow, self.wrap, self.check = flow, wrap, check
        self.result: Any = None
        self.error: BaseException | None = None
        self.value: T

    def __enter__(self) -> _Driving[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self.flow.close()

    def next(self) -> Any:
        """The flow's next operation, given the last one's result or error; :data:`_DONE` once it has returned."""
        error, self.error = self.error, None
        try:
            op = self.flow.send(self.result) if error is None else self.flow.throw(error)
        except StopIteration as stop:
            self.value = stop.value
            return _DONE
        if self.check is not None:
            self.check()
        return op

    def fail(self, op: Any, exc: Exception) -> None:
        """The operation ``op`` raised ``exc``: throw it (wrapped) into the flow next."""
        self.result, self.error = None, _wrapped(self.wrap, op, exc)


def _wrapped(wrap: Callable[[Any, Exception], BaseException], op: Any, exc: Exception) -> BaseException:
    error = wrap(op, exc)
    if error is not exc and error.__cause__ is None:
        error.__cause__ = exc
    return error
