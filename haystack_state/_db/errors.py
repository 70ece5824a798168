"""
How a database driver's error becomes one of ours, in one place for every backend: our own errors
(:class:`~haystack_state.errors.HaystackStateError`) pass through; a driver's error (``sqlite3``, ``psycopg``, an
``OSError``) becomes the backend's storage error naming the operation, its cause chained (the drivers of
:mod:`haystack_state._driver` chain it); a broken unique constraint becomes :class:`UniqueViolation`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from haystack_state.errors import CheckpointError, HaystackStateError

__all__ = ["UniqueViolation", "driver_error", "unique_violation"]

OpT = TypeVar("OpT")


class UniqueViolation(CheckpointError):
    """A write broke a unique constraint (for example a second running run on one thread)."""


def driver_error(
    op: OpT, exc: Exception, storage_error: Callable[[OpT, Exception], HaystackStateError]
) -> BaseException:
    """
    The error an operation's failure is reported as (the ``wrap`` of :func:`haystack_state._driver.run_flow`).

    :param op: The operation that failed.
    :param exc: What its driver raised.
    :param storage_error: Builds the backend's error for a driver's error (it names the operation).
    :returns: ``exc`` itself if it is one of ours, else ``storage_error(op, exc)`` (whose cause the driver chains).
    """
    if isinstance(exc, HaystackStateError):
        return exc
    return storage_error(op, exc)


def unique_violation(exc: BaseException) -> UniqueViolation | None:
    """
    :class:`UniqueViolation` for a driver's error that says a unique constraint was broken, else None.

    :param exc: A ``sqlite3`` or ``psycopg`` error.
    """
    if isinstance(exc, sqlite3.IntegrityError):
        return UniqueViolation(str(exc)) if "UNIQUE" in str(exc) else None
    if type(exc).__name__ == "UniqueViolation" and type(exc).__module__.startswith("psycopg"):
        return UniqueViolation(str(exc).splitlines()[0])
    return None
