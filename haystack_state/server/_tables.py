"""
The server's tables, in the checkpointer's database beside the checkpoints: their schema, grown by an append-only list
of migrations (:data:`MIGRATIONS`, applied by :func:`migrate`), the SQL fragments the queries share, and the names of
the notifications the workers of every process hear. The queries themselves are grouped by concern:
:mod:`haystack_state.server._thread_table` (thread records), :mod:`haystack_state.server._run_queue` (adding, claiming
and ending runs), :mod:`haystack_state.server._run_relay` (cancel and relay requests, relayed events) and
:mod:`haystack_state.server._run_leases` (leases of running runs);
:class:`~haystack_state.server._storage.ServerStorage` joins them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from haystack_state._driver import Flow
from haystack_state.errors import CheckpointError
from haystack_state.server._database import Change, Database, Row, Rows, Work
from haystack_state.server._records import now_text

__all__ = [
    "LEASE_EXPIRED",
    "MIGRATIONS",
    "NEXT_PENDING",
    "OLDER",
    "QUEUE",
    "REQUESTS",
    "RUN_COLUMNS",
    "THREADS",
    "THREAD_SORT",
    "Tables",
    "migrate",
    "reads",
    "writes",
    "writes_alone",
]

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="Tables")

THREAD_SORT = ("thread_id", "status", "created_at", "updated_at")

#: Append-only: the schema version is the number of migrations applied. Never edit or reorder an entry.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE {threads} (
            thread_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            assistant_id TEXT,
            metadata TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE INDEX haystack_state_server_threads_owner ON {threads} (owner, updated_at)",
        """CREATE TABLE {runs} (
            run_id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL,
            assistant_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            status TEXT NOT NULL,
            multitask_strategy TEXT NOT NULL,
            kwargs TEXT NOT NULL,
            metadata TEXT NOT NULL,
            error TEXT,
            worker TEXT,
            lease_until TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE INDEX haystack_state_server_runs_queue ON {runs} (status, run_id)",
        "CREATE INDEX haystack_state_server_runs_thread ON {runs} (thread_id, run_id)",
        "CREATE UNIQUE INDEX haystack_state_server_runs_one_running ON {runs} (thread_id) WHERE status = 'running'",
    ),
    # 2: a cancel request on a running run (``interrupt`` or ``rollback``), and a request to relay its stream events
    # through the database (a client follows it through another process), both polled by the worker that runs it.
    (
        "ALTER TABLE {runs} ADD COLUMN cancel TEXT",
        "ALTER TABLE {runs} ADD COLUMN relay INTEGER",
        """CREATE TABLE {run_events} (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            event TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        )""",
    ),
    # 3: which attempt of a run its worker executes (a run whose worker stopped is resumed by another, up to the
    # server's max_attempts); the worker and the attempt together fence what a worker writes about a run.
    ("ALTER TABLE {runs} ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1",),
    # 4: which attempt of a run made each relayed event (its id is ``attempt-seq``, the same in every process).
    ("ALTER TABLE {run_events} ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1",),
    # 5: a run created with an ``Idempotency-Key`` keeps the key and a digest of its request: a retried submission
    # with the same key finds the run (one per owner and key), and the same key with another request is refused.
    (
        "ALTER TABLE {runs} ADD COLUMN idempotency_key TEXT",
        "ALTER TABLE {runs} ADD COLUMN request_digest TEXT",
        "CREATE UNIQUE INDEX haystack_state_server_runs_idempotency ON {runs} (owner, idempotency_key) "
        "WHERE idempotency_key IS NOT NULL",
    ),
]

_THREAD_COLUMNS = "t.thread_id, t.owner, t.assistant_id, t.metadata, t.status, t.created_at, t.updated_at"
_BUSY = "EXISTS (SELECT 1 FROM {runs} AS r WHERE r.thread_id = t.thread_id AND r.status IN ('pending', 'running'))"
#: A thread's row with its current status (``busy`` while a run of it is pending or running), as ``current_status``.
THREADS = (
    f"SELECT {_THREAD_COLUMNS}, CASE WHEN {_BUSY} THEN 'busy' ELSE t.status END AS current_status FROM {{threads}} AS t"
)
#: A run's stored fields, in the order of :data:`haystack_state.server._records.RUN_FIELDS`.
RUN_COLUMNS = (
    "run_id, thread_id, assistant_id, owner, status, multitask_strategy, kwargs, metadata, error, worker, "
    "created_at, updated_at, attempt"
)
# A run older than q in its thread's queue (runs are taken in the order they were created; a resumed run keeps its
# place, ahead of the runs queued behind it).
OLDER = "(o.created_at < q.created_at OR (o.created_at = q.created_at AND o.run_id < q.run_id))"
# The oldest pending run of a thread with no running run, among the assistants a worker serves.
NEXT_PENDING = (
    "SELECT run_id FROM {runs} AS q WHERE q.status = 'pending' AND q.assistant_id IN ({assistants})"
    " AND NOT EXISTS (SELECT 1 FROM {runs} AS o WHERE o.thread_id = q.thread_id"
    f" AND (o.status = 'running' OR (o.status = 'pending' AND {OLDER})))"
    " ORDER BY q.created_at, q.run_id LIMIT 1"
)
#: Why a resumed run's previous attempt ended.
LEASE_EXPIRED = "its worker stopped before the run ended (lease expired)"
#: What the workers of every process are told (PostgreSQL ``NOTIFY``; see ``Database.notify``): a run may be
#: claimable, or a running run has a new request (cancel, relay).
QUEUE = "queue"
REQUESTS = "requests"


def migrate(database: Database) -> None:
    """Create the server's tables, or bring them to the newest version, in one transaction."""
    Work(database, functools.partial(_migrate, database), write=True).result()


def _migrate(database: Database) -> Flow[None]:
    if database.dialect == "postgres":
        yield Rows("SELECT pg_advisory_xact_lock(hashtext('haystack_state_server_migrations'))")
        yield Change(f'CREATE SCHEMA IF NOT EXISTS "{getattr(database, "schema", "public")}"')
    yield Change("CREATE TABLE IF NOT EXISTS {migrations} (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    found: list[Row] = yield Rows("SELECT COALESCE(MAX(version), 0) FROM {migrations}")
    current = int(found[0][0])
    if current > len(MIGRATIONS):
        raise CheckpointError(
            f"The server's tables are at version {current}, newer than this haystack-state supports "
            f"({len(MIGRATIONS)}); upgrade haystack-state."
        )
    for version in range(current + 1, len(MIGRATIONS) + 1):
        for statement in MIGRATIONS[version - 1]:
            yield Change(statement)
        yield Change("INSERT INTO {migrations} VALUES (:v, :at)", {"v": version, "at": now_text()})


def reads(method: Callable[Concatenate[S, P], Flow[T]]) -> Callable[Concatenate[S, P], Work[T]]:
    """
    A table method written as a flow that only reads: calling it returns its :class:`Work` (each statement runs on
    its own), which the caller awaits or runs with ``result()``.
    """
    return _work_of(method, write=False)


def writes(method: Callable[Concatenate[S, P], Flow[T]]) -> Callable[Concatenate[S, P], Work[T]]:
    """A table method written as a flow that writes: calling it returns its :class:`Work`, one transaction."""
    return _work_of(method, write=True)


def writes_alone(method: Callable[Concatenate[S, P], Flow[T]]) -> Callable[Concatenate[S, P], Work[T]]:
    """
    A table method written as a flow whose writes each stand alone (one statement, or statements that need not
    commit together): on PostgreSQL each commits on its own, one round trip, with no ``BEGIN`` and ``COMMIT``.
    """
    return _work_of(method, write=True, alone=True)


def _work_of(
    method: Callable[Concatenate[S, P], Flow[T]], *, write: bool, alone: bool = False
) -> Callable[Concatenate[S, P], Work[T]]:
    @functools.wraps(method)
    def work(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Work[T]:
        return Work(self.database, functools.partial(method, self, *args, **kwargs), write=write, alone=alone)

    return work


class Tables:
    """
    The base of the classes that query the server's tables: they share one database. Their methods return a
    :class:`~haystack_state.server._database.Work`: await it on the event loop, or call its ``result()``.

    :param database: The database.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
