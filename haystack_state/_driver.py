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
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                op = flow.send(result) if error is None else flow.throw(error)
            except StopIteration as stop:
                value: T = stop.value
                return value
            if check is not None:
                check()
            try:
                result, error = step(op), None
            except Exception as exc:
                result, error = None, _wrapped(wrap, op, exc)
    except BaseException:
        flow.close()
        raise


async def run_flow_async(
    flow: Flow[T],
    step: Callable[[Any], Awaitable[Any]],
    *,
    wrap: Callable[[Any, Exception], BaseException] = _keep,
    check: Callable[[], None] | None = None,
) -> T:
    """:func:`run_flow`, awaiting each operation (a cancelled task closes the flow where it is)."""
    result: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                op = flow.send(result) if error is None else flow.throw(error)
            except StopIteration as stop:
                value: T = stop.value
                return value
            if check is not None:
                check()
            try:
                result, error = await step(op), None
            except Exception as exc:
                result, error = None, _wrapped(wrap, op, exc)
    except BaseException:
        flow.close()
        raise


def _wrapped(wrap: Callable[[Any, Exception], BaseException], op: Any, exc: Exception) -> BaseException:
    error = wrap(op, exc)
    if error is not exc and error.__cause__ is None:
        error.__cause__ = exc
    return error
