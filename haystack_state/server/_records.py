"""
The server's records of threads and runs (:class:`ThreadRecord`, :class:`RunRecord`), the statuses and strategies they
take (as ``Literal`` types), the errors the queue refuses a run with, and how a database row becomes a record and back.
The tables that hold them are in :mod:`haystack_state.server._tables`; the queries in the modules beside it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from haystack_state.errors import CheckpointError
from haystack_state.server._metadata import dumps, loads

__all__ = [
    "ACTIVE",
    "CancelAction",
    "Idempotency",
    "IdempotencyConflict",
    "MultitaskStrategy",
    "QueueFull",
    "RunLease",
    "RunRecord",
    "RunStatus",
    "ThreadBusy",
    "ThreadRecord",
    "ThreadStatus",
    "now_text",
    "RUN_FIELDS",
    "run_params",
    "run_record",
    "thread_record",
]

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
RunStatus = Literal["pending", "running", "success", "error", "timeout", "interrupted"]
#: What a new run does on a busy thread.
MultitaskStrategy = Literal["reject", "enqueue", "interrupt", "rollback"]
#: How a run is cancelled: stopped (``interrupt``), or stopped and its thread restored (``rollback``).
CancelAction = Literal["interrupt", "rollback"]
ACTIVE: tuple[RunStatus, ...] = ("pending", "running")


def now_text() -> str:
    """The current UTC time as fixed-width ISO-8601 text (so that text order is time order)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


@dataclasses.dataclass(frozen=True)
class ThreadRecord:
    """
    The server's record of a thread.

    :param thread_id: The thread.
    :param owner: The user who created it ("" when the server has no ``auth``).
    :param assistant_id: The assistant of its last run, if any.
    :param metadata: Free-form metadata.
    :param status: ``idle``, ``busy`` (a run is pending or running), ``interrupted`` or ``error``.
    :param created_at: ISO-8601 time.
    :param updated_at: ISO-8601 time.
    """

    thread_id: str
    owner: str
    assistant_id: str | None
    metadata: dict[str, Any]
    status: ThreadStatus
    created_at: str
    updated_at: str


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """
    A run of the queue.

    :param run_id: The run (a UUIDv7: ids sort by creation).
    :param thread_id: Its thread.
    :param assistant_id: The assistant that runs it.
    :param owner: The user who created it.
    :param status: ``pending``, ``running``, ``success``, ``error``, ``timeout`` or ``interrupted``.
    :param multitask_strategy: ``reject``, ``enqueue``, ``interrupt`` or ``rollback``.
    :param kwargs: What the run does (input, command, checkpoint id, stream modes, ...), as JSON data.
    :param metadata: Free-form metadata.
    :param error: What went wrong, for a failed run.
    :param worker: The worker that claimed it.
    :param created_at: ISO-8601 time.
    :param updated_at: ISO-8601 time.
    :param attempt: Which attempt this is: 1, then one more each time a worker stopped before the run ended and the
        run was resumed.
    :param replayed: See below.
    """

    run_id: str
    thread_id: str
    assistant_id: str
    owner: str
    status: RunStatus
    multitask_strategy: MultitaskStrategy
    kwargs: dict[str, Any]
    metadata: dict[str, Any]
    error: str | None
    worker: str | None
    created_at: str
    updated_at: str
    attempt: int = 1
    #: Not stored: True when :meth:`~haystack_state.server._run_queue.RunQueue.create_run` found this run by its
    #: idempotency key instead of creating it.
    replayed: bool = dataclasses.field(default=False, compare=False)

    @property
    def done(self) -> bool:
        """Whether the run reached an end (it is neither pending nor running)."""
        return self.status not in ACTIVE


class RunLease(NamedTuple):
    """A worker's hold on the runs it claims, until it renews it (a run whose lease expired is taken back)."""

    #: The worker (``host:pid:random``).
    worker: str
    #: When the lease ends unless renewed (ISO-8601, as :func:`now_text` writes it).
    until: str


class ThreadBusy(CheckpointError):
    """A run was refused (``multitask_strategy="reject"``) because the thread has a pending or running run."""


class IdempotencyConflict(CheckpointError):
    """A run was refused: its ``Idempotency-Key`` was used before, by a request that was not the same."""


@dataclasses.dataclass(frozen=True)
class Idempotency:
    """
    A submission's ``Idempotency-Key`` and a digest of its request (the route, the thread and the body).

    :param key: The client's key.
    :param digest: What the request asked, hashed: the same key with another digest is refused.
    """

    key: str
    digest: str


class QueueFull(CheckpointError):
    """The run queue holds its maximum of pending runs."""


def thread_record(row: Sequence[Any]) -> ThreadRecord:
    """A thread record from a row of ``THREADS`` (:mod:`haystack_state.server._tables`)."""
    thread_id, owner, assistant_id, metadata, _, created_at, updated_at, status = row[:8]
    return ThreadRecord(
        thread_id=str(thread_id),
        owner=str(owner),
        assistant_id=assistant_id,
        metadata=loads(metadata, str(thread_id)),
        status=status,
        created_at=str(created_at),
        updated_at=str(updated_at),
    )


#: The stored fields of a run, in the order of ``RUN_COLUMNS`` (:mod:`haystack_state.server._tables`).
RUN_FIELDS = tuple(field.name for field in dataclasses.fields(RunRecord) if field.name != "replayed")


def run_params(run: RunRecord) -> dict[str, object]:
    """A run's stored fields, as query parameters."""
    params = {name: getattr(run, name) for name in RUN_FIELDS}
    params["kwargs"] = dumps(run.kwargs)
    params["metadata"] = dumps(run.metadata)
    return params


def run_record(row: Sequence[Any]) -> RunRecord:
    """A run record from a row of ``RUN_COLUMNS``."""
    values = dict(zip(RUN_FIELDS, row, strict=True))
    values["kwargs"] = loads(values["kwargs"])
    values["metadata"] = loads(values["metadata"])
    return RunRecord(**values)
