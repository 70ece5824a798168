"""
The server's own records, kept in the checkpointer's database beside the checkpoints: one row per thread (its owner,
assistant, metadata and last outcome) and the run queue (one row per run). The SQL is written once for SQLite and
PostgreSQL (see :mod:`haystack_state.server.database`); the schema grows by an append-only list of migrations.

The queue keeps one run per thread at a time: a partial unique index allows one ``running`` row per thread, so two
workers (in one process or several sharing a PostgreSQL database) can never run the same thread at once. Workers
claim the oldest pending run of a free thread (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite serializes writers)
and hold a lease on it that they renew; a run whose worker stopped renewing is marked as failed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from haystack_state.errors import CheckpointError
from haystack_state.server.database import Cursor, Database, UniqueViolation
from haystack_state.server.metadata import check_metadata, filter_sql, matches, unqueryable_sql
from haystack_state.server.metadata import dumps as dump_json
from haystack_state.server.metadata import loads as load_json
from haystack_state.text import text_problem

__all__ = ["Idempotency", "IdempotencyConflict", "RunRecord", "ServerStorage", "ThreadRecord"]

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
RunStatus = Literal["pending", "running", "success", "error", "timeout", "interrupted"]
ACTIVE = ("pending", "running")
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
_THREADS = (
    f"SELECT {_THREAD_COLUMNS}, CASE WHEN {_BUSY} THEN 'busy' ELSE t.status END AS current_status FROM {{threads}} AS t"
)
_RUN_COLUMNS = (
    "run_id, thread_id, assistant_id, owner, status, multitask_strategy, kwargs, metadata, error, worker, "
    "created_at, updated_at, attempt"
)
# A run older than q in its thread's queue (runs are taken in the order they were created; a resumed run keeps its
# place, ahead of the runs queued behind it).
_OLDER = "(o.created_at < q.created_at OR (o.created_at = q.created_at AND o.run_id < q.run_id))"
# The oldest pending run of a thread with no running run, among the assistants a worker serves.
_NEXT_PENDING = (
    "SELECT run_id FROM {runs} AS q WHERE q.status = 'pending' AND q.assistant_id IN ({assistants})"
    " AND NOT EXISTS (SELECT 1 FROM {runs} AS o WHERE o.thread_id = q.thread_id"
    f" AND (o.status = 'running' OR (o.status = 'pending' AND {_OLDER})))"
    " ORDER BY q.created_at, q.run_id LIMIT 1"
)
#: Why a resumed run's previous attempt ended.
LEASE_EXPIRED = "its worker stopped before the run ended (lease expired)"
#: What the workers of every process are told (PostgreSQL ``NOTIFY``; see ``Database.notify``): a run may be
#: claimable, or a running run has a new request (cancel, relay).
QUEUE = "queue"
REQUESTS = "requests"


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
    multitask_strategy: str
    kwargs: dict[str, Any]
    metadata: dict[str, Any]
    error: str | None
    worker: str | None
    created_at: str
    updated_at: str
    attempt: int = 1
    #: Not stored: True when :meth:`ServerStorage.create_run` found this run by its idempotency key instead of
    #: creating it.
    replayed: bool = dataclasses.field(default=False, compare=False)

    @property
    def done(self) -> bool:
        """Whether the run reached an end (it is neither pending nor running)."""
        return self.status not in ACTIVE


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


class ServerStorage:
    """
    Thread records and the run queue, in the checkpointer's database. Thread-safe; every method is one transaction.

    :param database: The database (its tables are created or migrated here).
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        self._migrate()

    def close(self) -> None:
        """Release the database connections."""
        self.database.close()

    def _migrate(self) -> None:
        with self.database.transaction() as cur:
            if self.database.dialect == "postgres":
                cur.rows("SELECT pg_advisory_xact_lock(hashtext('haystack_state_server_migrations'))")
                cur.change(f'CREATE SCHEMA IF NOT EXISTS "{getattr(self.database, "schema", "public")}"')
            cur.change(
                "CREATE TABLE IF NOT EXISTS {migrations} (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
            )
            current = int(cur.rows("SELECT COALESCE(MAX(version), 0) FROM {migrations}")[0][0])
            if current > len(MIGRATIONS):
                raise CheckpointError(
                    f"The server's tables are at version {current}, newer than this haystack-state supports "
                    f"({len(MIGRATIONS)}); upgrade haystack-state."
                )
            for version in range(current + 1, len(MIGRATIONS) + 1):
                for statement in MIGRATIONS[version - 1]:
                    cur.change(statement)
                cur.change("INSERT INTO {migrations} VALUES (:v, :at)", {"v": version, "at": now_text()})

    # --- threads ---------------------------------------------------------------------------------------------

    def create_thread(
        self, thread_id: str, owner: str, metadata: Mapping[str, Any], *, if_exists: str = "raise"
    ) -> ThreadRecord | None:
        """
        Create a thread record.

        :returns: The new record; with ``if_exists="do_nothing"``, the owner's existing record; None if the id is
            taken (by this owner with ``if_exists="raise"``, or by another owner).
        """
        at = now_text()
        with self.database.transaction() as cur:
            found = self._thread(cur, thread_id)
            if found is not None:
                return found if found.owner == owner and if_exists == "do_nothing" else None
            stored = _dumps(metadata)
            cur.change(
                "INSERT INTO {threads} (thread_id, owner, assistant_id, metadata, status, created_at, updated_at) "
                "VALUES (:id, :owner, NULL, :metadata, 'idle', :at, :at)",
                {"id": thread_id, "owner": owner, "metadata": stored, "at": at},
            )
            # As read back (a new thread has no runs: idle).
            return ThreadRecord(thread_id, owner, None, _loads(stored, thread_id), "idle", at, at)

    def get_thread(self, thread_id: str, owner: str) -> ThreadRecord | None:
        """The owner's thread, or None (also for another owner's thread)."""
        rows = self.database.read(f"{_THREADS} WHERE t.thread_id = :id", {"id": thread_id})
        found = _thread_record(rows[0]) if rows else None
        return found if found is not None and found.owner == owner else None

    def _thread(self, cur: Cursor, thread_id: str) -> ThreadRecord | None:
        rows = cur.rows(f"{_THREADS} WHERE t.thread_id = :id", {"id": thread_id})
        return _thread_record(rows[0]) if rows else None

    def search_threads(
        self,
        owner: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        status: str | None = None,
        ids: Sequence[str] | None = None,
        limit: int = 10,
        offset: int = 0,
        sort_by: str = "created_at",
        sort_order: str = "desc",
    ) -> list[ThreadRecord]:
        """The owner's threads matching every filter (metadata: each top-level key equal), sorted and paged."""
        if sort_by not in THREAD_SORT or sort_order not in ("asc", "desc"):
            raise ValueError(f"cannot sort threads by {sort_by!r} {sort_order!r}")
        where, params = self._thread_filters(owner, metadata, status, ids)
        order = "current_status" if sort_by == "status" else sort_by
        query = (
            f"SELECT * FROM ({_THREADS} WHERE t.owner = :owner) AS s WHERE {where} "
            f"ORDER BY {order} {sort_order}, thread_id {sort_order} LIMIT :limit OFFSET :offset"
        )
        with self.database.transaction(write=False) as cur:
            unqueryable = self._unqueryable_matches(cur, owner, metadata, status, ids)
            if unqueryable:  # matched in Python: page the database's matches and these together
                params.update(limit=offset + limit, offset=0)
            rows = cur.rows(query, {"limit": limit, "offset": offset, **params})
        records = [_thread_record(row) for row in rows]
        if not unqueryable:
            return records
        field = "status" if sort_by == "status" else sort_by
        records += unqueryable
        records.sort(key=lambda r: (getattr(r, field), r.thread_id), reverse=sort_order == "desc")
        return records[offset : offset + limit]

    def count_threads(self, owner: str, *, metadata: Mapping[str, Any] | None = None, status: str | None = None) -> int:
        """How many of the owner's threads match the filters."""
        where, params = self._thread_filters(owner, metadata, status, None)
        query = f"SELECT COUNT(*) FROM ({_THREADS} WHERE t.owner = :owner) AS s WHERE {where}"
        with self.database.transaction(write=False) as cur:
            unqueryable = self._unqueryable_matches(cur, owner, metadata, status, None)
            return int(cur.rows(query, params)[0][0]) + len(unqueryable)

    def _thread_filters(
        self, owner: str, metadata: Mapping[str, Any] | None, status: str | None, ids: Sequence[str] | None
    ) -> tuple[str, dict[str, Any]]:
        clauses, params = ["1 = 1"], {"owner": owner}
        if status is not None:
            clauses.append("current_status = :status")
            params["status"] = status
        if ids:
            ids = [i for i in ids if text_problem(i, nul=True) is None]  # no thread has any other id
            names = [f"id_{i}" for i in range(len(ids))]
            clauses.append(f"thread_id IN ({', '.join(':' + n for n in names)})" if ids else "1 = 0")
            params.update(zip(names, ids, strict=True))
        if metadata:
            check_metadata(metadata, "metadata filter")
            conditions, values = filter_sql(self.database.dialect, metadata)
            clauses += conditions
            params.update(values)
        return " AND ".join(clauses), params

    def _unqueryable_matches(
        self,
        cur: Cursor,
        owner: str,
        metadata: Mapping[str, Any] | None,
        status: str | None,
        ids: Sequence[str] | None,
    ) -> list[ThreadRecord]:
        """
        The threads a metadata filter matches among those whose stored metadata the database cannot query (written
        before text was checked; the database's filter leaves them out): matched here on their repaired metadata.
        """
        if not metadata:
            return []
        where, params = self._thread_filters(owner, None, status, ids)
        condition, extra = unqueryable_sql(self.database.dialect)
        rows = cur.rows(
            f"SELECT * FROM ({_THREADS} WHERE t.owner = :owner) AS s WHERE {where} AND {condition}", {**params, **extra}
        )
        records = [_thread_record(row) for row in rows]
        return [r for r in records if matches(self.database.dialect, r.metadata, metadata)]

    def update_thread(
        self,
        thread_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        status: str | None = None,
        assistant_id: str | None = None,
    ) -> None:
        """Merge metadata into a thread record, and/or set its last outcome or assistant; bump ``updated_at``."""
        with self.database.transaction() as cur:
            found = self._thread(cur, thread_id)
            if found is None:
                return
            merged = {**found.metadata, **(metadata or {})}
            cur.change(
                "UPDATE {threads} SET metadata = :metadata, status = COALESCE(:status, status), "
                "assistant_id = COALESCE(:assistant, assistant_id), updated_at = :at WHERE thread_id = :id",
                {
                    "metadata": _dumps(merged),
                    "status": status,
                    "assistant": assistant_id,
                    "at": now_text(),
                    "id": thread_id,
                },
            )

    def delete_thread(self, thread_id: str, owner: str) -> bool:
        """
        Delete the owner's thread record and its runs.

        :returns: Whether it existed.
        :raises ThreadBusy: If a run of the thread is running (nothing is deleted).
        """
        with self.database.transaction() as cur:
            found = self._thread(cur, thread_id)
            if found is None or found.owner != owner:
                return False
            running = cur.rows(
                "SELECT run_id FROM {runs} WHERE thread_id = :id AND status = 'running'", {"id": thread_id}
            )
            if running:
                raise ThreadBusy(f"Thread '{thread_id}' has a running run ({running[0][0]}); delete it when it ends.")
            cur.change(
                "DELETE FROM {run_events} WHERE run_id IN (SELECT run_id FROM {runs} WHERE thread_id = :id)",
                {"id": thread_id},
            )
            cur.change("DELETE FROM {runs} WHERE thread_id = :id", {"id": thread_id})
            cur.change("DELETE FROM {threads} WHERE thread_id = :id", {"id": thread_id})
            return True

    # --- runs --------------------------------------------------------------------------------------------------

    def create_run(
        self,
        run: RunRecord,
        *,
        lease_until: str | None = None,
        max_pending: int | None = None,
        graph_id: str | None = None,
        idempotency: Idempotency | None = None,
    ) -> RunRecord:
        """
        :meth:`_create_run`; when two submissions with one idempotency key race (the second insert breaks the key's
        unique index), the loser looks again and finds the winner's run.
        """
        try:
            return self._create_run(
                run, lease_until=lease_until, max_pending=max_pending, graph_id=graph_id, idempotency=idempotency
            )
        except UniqueViolation:
            if idempotency is None:
                raise
        return self._create_run(
            run, lease_until=lease_until, max_pending=max_pending, graph_id=graph_id, idempotency=idempotency
        )

    def _create_run(
        self,
        run: RunRecord,
        *,
        lease_until: str | None,
        max_pending: int | None,
        graph_id: str | None,
        idempotency: Idempotency | None,
    ) -> RunRecord:
        """
        Add a run to the queue: ``running`` (claimed by ``run.worker`` until ``lease_until``) if ``run.status`` is
        running and its thread is free, else pending. The thread's metadata gets the run's ``assistant_id`` and
        ``graph_id``, as LangGraph's platform stamps them (so that clients list a graph's conversations by them).

        With ``multitask_strategy="interrupt"`` or ``"rollback"``, the thread's other runs are cancelled in the same
        transaction, as LangGraph's platform cancels them: its pending runs leave the queue (``interrupted``, or
        deleted for ``rollback``), and its running run gets a cancel request of that action, which its worker polls;
        the new run waits in the queue until that run has stopped.

        :raises ThreadBusy: With ``multitask_strategy="reject"``, if the thread has a pending or running run; with
            ``"enqueue"``, never (the run waits its turn). Nothing is written then.
        With ``idempotency``, a run its owner created before with the same key is answered instead (``replayed``,
        whatever its status, nothing written), if that run was asked with the same request.

        :raises QueueFull: If ``max_pending`` runs are pending already.
        :raises IdempotencyConflict: If the key was used by the owner for another request (nothing is written).
        """
        with self.database.transaction() as cur:
            if idempotency is not None:
                found = cur.rows(
                    f"SELECT {_RUN_COLUMNS}, request_digest FROM {{runs}} "
                    "WHERE owner = :owner AND idempotency_key = :key",
                    {"owner": run.owner, "key": idempotency.key},
                )
                if found:
                    earlier = _run_record(found[0][:-1])
                    if found[0][-1] != idempotency.digest:
                        raise IdempotencyConflict(
                            f"Idempotency-Key '{idempotency.key}' was used for run {earlier.run_id} (thread "
                            f"'{earlier.thread_id}') with another request; send a new key for a new run."
                        )
                    return dataclasses.replace(earlier, replayed=True)
            active = cur.rows(
                "SELECT run_id, status FROM {runs} WHERE thread_id = :id AND status IN ('pending', 'running')",
                {"id": run.thread_id},
            )
            if active and run.multitask_strategy == "reject":
                raise ThreadBusy(
                    f"Thread '{run.thread_id}' is busy with run {active[0][0]} ({active[0][1]}); retry when it ends, "
                    "or send multitask_strategy='enqueue' to queue this run behind it (or 'interrupt' or 'rollback' "
                    "to cancel it)."
                )
            if active and run.multitask_strategy in ("interrupt", "rollback"):
                active = _cancel_for(cur, active, run)
            if max_pending is not None:
                pending = int(cur.rows("SELECT COUNT(*) FROM {runs} WHERE status = 'pending'")[0][0])
                if pending >= max_pending:
                    raise QueueFull(f"The run queue is full ({pending} pending runs); retry later.")
            status: RunStatus = "running" if run.status == "running" and not active else "pending"
            record = dataclasses.replace(run, status=status, worker=run.worker if status == "running" else None)
            if status == "pending":
                self.database.notify(cur, QUEUE)
            if active and run.multitask_strategy in ("interrupt", "rollback"):
                self.database.notify(cur, REQUESTS)  # the running run's worker, wherever it is, stops it
            cur.change(
                f"INSERT INTO {{runs}} ({_RUN_COLUMNS}, lease_until, idempotency_key, request_digest) VALUES (:run_id, "
                ":thread_id, :assistant_id, :owner, :status, :multitask_strategy, :kwargs, :metadata, :error, "
                ":worker, :created_at, :updated_at, :attempt, :lease_until, :idempotency_key, :request_digest)",
                {
                    **_run_params(record),
                    "lease_until": lease_until if status == "running" else None,
                    "idempotency_key": idempotency.key if idempotency is not None else None,
                    "request_digest": idempotency.digest if idempotency is not None else None,
                },
            )
            stamp = {"assistant_id": run.assistant_id, **({"graph_id": graph_id} if graph_id is not None else {})}
            found = cur.rows("SELECT metadata FROM {threads} WHERE thread_id = :id", {"id": run.thread_id})
            metadata = _loads(found[0][0]) if found else {}
            if all(metadata.get(key) == value for key, value in stamp.items()):
                cur.change(
                    "UPDATE {threads} SET assistant_id = :assistant, updated_at = :at WHERE thread_id = :id",
                    {"assistant": run.assistant_id, "at": run.created_at, "id": run.thread_id},
                )
            else:
                cur.change(
                    "UPDATE {threads} SET assistant_id = :assistant, metadata = :metadata, updated_at = :at "
                    "WHERE thread_id = :id",
                    {
                        "assistant": run.assistant_id,
                        "metadata": _dumps({**metadata, **stamp}),
                        "at": run.created_at,
                        "id": run.thread_id,
                    },
                )
            return record

    def get_run(self, run_id: str, owner: str | None = None) -> RunRecord | None:
        """A run (the owner's, when ``owner`` is given), or None."""
        rows = self.database.read(f"SELECT {_RUN_COLUMNS} FROM {{runs}} WHERE run_id = :id", {"id": run_id})
        run = _run_record(rows[0]) if rows else None
        return run if run is not None and (owner is None or run.owner == owner) else None

    def list_runs(
        self, thread_id: str, owner: str, *, limit: int = 10, offset: int = 0, status: str | None = None
    ) -> list[RunRecord]:
        """The thread's runs, newest first."""
        query = f"SELECT {_RUN_COLUMNS} FROM {{runs}} WHERE thread_id = :id AND owner = :owner"
        params: dict[str, Any] = {"id": thread_id, "owner": owner, "limit": limit, "offset": offset}
        if status is not None:
            query += " AND status = :status"
            params["status"] = status
        rows = self.database.read(query + " ORDER BY run_id DESC LIMIT :limit OFFSET :offset", params)
        return [_run_record(row) for row in rows]

    def claim_next(self, worker: str, assistants: Iterable[str], lease_until: str) -> RunRecord | None:
        """
        Claim the oldest pending run of a thread that has no running run, among ``assistants``.

        :returns: The claimed run (now ``running``), or None if there is none (or another worker won the race).
        """
        return self.next_claim(worker, assistants, lease_until)[0]

    def next_claim(self, worker: str, assistants: Iterable[str], lease_until: str) -> tuple[RunRecord | None, bool]:
        """
        :meth:`claim_next`, and whether any run was pending (claimable or not: its thread may be running). An empty
        queue costs one read (no write transaction, no lock).

        :returns: The claimed run or None, and whether pending runs were found.
        """
        names = sorted(set(assistants))
        if not names:
            return None, False
        if not self.database.read("SELECT 1 FROM {runs} WHERE status = 'pending' LIMIT 1"):
            return None, False
        params: dict[str, Any] = {f"a_{i}": name for i, name in enumerate(names)}
        query = _NEXT_PENDING.replace("{assistants}", ", ".join(f":a_{i}" for i in range(len(names))))
        if self.database.dialect == "postgres":
            query += " FOR UPDATE SKIP LOCKED"
        try:
            with self.database.transaction() as cur:
                rows = cur.rows(query, params)
                if not rows:
                    return None, True
                return self._start(cur, str(rows[0][0]), worker, lease_until), True
        except UniqueViolation:  # another worker started a run of the same thread first
            return None, True

    def claim(self, run_id: str, worker: str, lease_until: str) -> RunRecord | None:
        """Claim one pending run, if its thread has no running run and no older pending run."""
        try:
            with self.database.transaction() as cur:
                rows = cur.rows(
                    "SELECT q.run_id FROM {runs} AS q WHERE q.run_id = :id AND q.status = 'pending' AND NOT EXISTS "
                    "(SELECT 1 FROM {runs} AS o WHERE o.thread_id = q.thread_id AND (o.status = 'running' OR "
                    f"(o.status = 'pending' AND {_OLDER})))",
                    {"id": run_id},
                )
                return self._start(cur, run_id, worker, lease_until) if rows else None
        except UniqueViolation:
            return None

    def _start(self, cur: Cursor, run_id: str, worker: str, lease_until: str) -> RunRecord | None:
        changed = cur.change(
            "UPDATE {runs} SET status = 'running', worker = :worker, lease_until = :lease, updated_at = :at "
            "WHERE run_id = :id AND status = 'pending'",
            {"worker": worker, "lease": lease_until, "at": now_text(), "id": run_id},
        )
        if changed != 1:
            return None
        rows = cur.rows(f"SELECT {_RUN_COLUMNS} FROM {{runs}} WHERE run_id = :id", {"id": run_id})
        return _run_record(rows[0])

    def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        thread_status: str,
        error: str | None = None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> bool:
        """
        Record a run's end and its thread's new outcome (``idle``, ``interrupted`` or ``error``).

        :param worker: With ``attempt``: the worker that executed the run. Its end is recorded only if that worker
            still holds the run at that attempt (a worker that lost its lease, and whose run another worker resumed,
            records nothing).
        :param attempt: The attempt the worker executed.
        :returns: Whether the end was recorded.
        """
        at = now_text()
        fence = ""
        params: dict[str, Any] = {"status": status, "error": error, "at": at, "id": run_id}
        if worker is not None:
            fence = " AND status = 'running' AND worker = :worker AND attempt = :attempt"
            params.update(worker=worker, attempt=attempt or 1)
        with self.database.transaction() as cur:
            rows = cur.rows(
                "UPDATE {runs} SET status = :status, error = :error, lease_until = NULL, updated_at = :at "
                "WHERE run_id = :id" + fence + " RETURNING thread_id",
                params,
            )
            changed = len(rows)
            if rows:
                cur.change(
                    "UPDATE {threads} SET status = :status, updated_at = :at WHERE thread_id = :id",
                    {"status": thread_status, "at": at, "id": rows[0][0]},
                )
                if self.database.listens and cur.rows(
                    "SELECT 1 FROM {runs} WHERE thread_id = :id AND status = 'pending' LIMIT 1", {"id": rows[0][0]}
                ):
                    self.database.notify(cur, QUEUE)  # the thread's next run may start now, in any process
            return bool(changed)

    def cancel_pending(self, run_id: str) -> bool:
        """Cancel a pending run (status ``interrupted``). Returns whether it was pending."""
        with self.database.transaction() as cur:
            return (
                cur.change(
                    "UPDATE {runs} SET status = 'interrupted', error = 'cancelled before it started', "
                    "updated_at = :at WHERE run_id = :id AND status = 'pending'",
                    {"at": now_text(), "id": run_id},
                )
                == 1
            )

    def request_cancel(self, run_id: str, action: str) -> bool:
        """
        Ask the worker of a running run to stop it (it polls :meth:`cancel_requests`).

        :param run_id: The run.
        :param action: ``interrupt`` (stop; the thread keeps what the run committed) or ``rollback`` (stop, restore
            the thread to where the run started, and delete the run).
        :returns: Whether the run was running.
        """
        with self.database.transaction() as cur:
            changed = cur.change(
                "UPDATE {runs} SET cancel = :action, updated_at = :at WHERE run_id = :id AND status = 'running'",
                {"action": action, "at": now_text(), "id": run_id},
            )
            if changed:
                self.database.notify(cur, REQUESTS)
            return changed == 1

    def requests(self, worker: str) -> list[tuple[str, str | None, bool]]:
        """
        The requests on the runs a worker is running: ``(run_id, cancel action or None, relay)`` for each run that
        has a cancel request or a relay request.
        """
        rows = self.database.read(
            "SELECT run_id, cancel, relay FROM {runs} WHERE worker = :worker AND status = 'running' "
            "AND (cancel IS NOT NULL OR relay = 1)",
            {"worker": worker},
        )
        return [(str(run_id), None if action is None else str(action), bool(relay)) for run_id, action, relay in rows]

    def request_relay(self, run_id: str) -> None:
        """Ask the worker of a running run to write its stream events to the database (see :meth:`relay_events`)."""
        with self.database.transaction() as cur:
            if cur.change(
                "UPDATE {runs} SET relay = 1 WHERE run_id = :id AND status = 'running' AND relay IS NULL",
                {"id": run_id},
            ):
                self.database.notify(cur, REQUESTS)

    def relay_requested(self, run_id: str) -> bool:
        """Whether a follower in another process asked for a run's events."""
        rows = self.database.read("SELECT relay FROM {runs} WHERE run_id = :id", {"id": run_id})
        return bool(rows and rows[0][0])

    def relay_events(
        self,
        run_id: str,
        first_seq: int,
        events: Sequence[tuple[str, str]],
        *,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """
        Write a run's stream events, numbered from ``first_seq``.

        :param run_id: The run.
        :param first_seq: The number of the first event.
        :param events: ``(event name, JSON data)`` pairs.
        :param worker: With ``attempt``: write them only if this worker still holds the run at this attempt.
        :param attempt: The attempt the worker executes.
        """
        if not events:
            return
        with self.database.transaction() as cur:
            if worker is not None and not cur.rows(
                "SELECT 1 FROM {runs} WHERE run_id = :id AND worker = :worker AND attempt = :attempt",
                {"id": run_id, "worker": worker, "attempt": attempt or 1},
            ):
                return
            for offset, (event, data) in enumerate(events):
                cur.change(
                    "INSERT INTO {run_events} (run_id, seq, attempt, event, data) "
                    "VALUES (:id, :seq, :attempt, :event, :data)",
                    {"id": run_id, "seq": first_seq + offset, "attempt": attempt or 1, "event": event, "data": data},
                )

    def relayed_events(
        self, run_id: str, after: tuple[int, int] = (0, -1), limit: int = 1000
    ) -> list[tuple[int, int, str, str]]:
        """
        A run's relayed events after the event ``after`` (``(attempt, seq)``; every event by default):
        ``(attempt, seq, event name, JSON data)``, in order. Every event of a later attempt comes after those of an
        earlier one.
        """
        attempt, seq = after
        rows = self.database.read(
            "SELECT attempt, seq, event, data FROM {run_events} WHERE run_id = :id "
            "AND (attempt > :attempt OR (attempt = :attempt AND seq > :seq)) ORDER BY attempt, seq LIMIT :limit",
            {"id": run_id, "attempt": attempt, "seq": seq, "limit": limit},
        )
        return [(int(made_by), int(number), str(event), str(data)) for made_by, number, event, data in rows]

    def relayed_end(self, run_id: str, attempt: int) -> tuple[int | None, bool, bool]:
        """
        What one attempt of a run relayed: the number of its last event (None if none), and whether it relayed a
        ``values`` and an ``error`` event.
        """
        rows = self.database.read(
            "SELECT MAX(seq), MAX(CASE WHEN event = 'values' THEN 1 ELSE 0 END), "
            "MAX(CASE WHEN event = 'error' THEN 1 ELSE 0 END) FROM {run_events} "
            "WHERE run_id = :id AND attempt = :attempt",
            {"id": run_id, "attempt": attempt},
        )
        last, values, error = rows[0] if rows else (None, 0, 0)
        return (None if last is None else int(last)), bool(values), bool(error)

    def forget_relayed(self, before: str) -> int:
        """Delete the relayed events of runs that ended before ``before`` (ISO-8601). Returns how many."""
        with self.database.transaction() as cur:
            return cur.change(
                "DELETE FROM {run_events} WHERE run_id IN (SELECT run_id FROM {runs} WHERE status NOT IN "
                "('pending', 'running') AND updated_at < :before)",
                {"before": before},
            )

    def delete_run(self, run_id: str) -> bool:
        """Delete a run that is not running. Returns whether it was deleted."""
        with self.database.transaction() as cur:
            if cur.change("DELETE FROM {runs} WHERE run_id = :id AND status <> 'running'", {"id": run_id}) != 1:
                return False
            cur.change("DELETE FROM {run_events} WHERE run_id = :id", {"id": run_id})
            return True

    def renew_leases(self, worker: str, run_ids: Iterable[str], lease_until: str) -> None:
        """Extend the leases of the runs a worker is running."""
        ids = list(run_ids)
        if not ids:
            return
        params: dict[str, Any] = {f"r_{i}": run_id for i, run_id in enumerate(ids)}
        placeholders = ", ".join(f":r_{i}" for i in range(len(ids)))
        with self.database.transaction() as cur:
            cur.change(
                f"UPDATE {{runs}} SET lease_until = :lease WHERE worker = :worker AND status = 'running' "
                f"AND run_id IN ({placeholders})",
                {**params, "lease": lease_until, "worker": worker},
            )

    def running_workers(self) -> list[str]:
        """The workers that hold running runs."""
        rows = self.database.read("SELECT DISTINCT worker FROM {runs} WHERE status = 'running' AND worker IS NOT NULL")
        return [str(row[0]) for row in rows]

    def next_event_seq(self, run_id: str) -> int:
        """The number the next relayed event of a run takes (a resumed run's events follow its earlier attempts')."""
        rows = self.database.read("SELECT MAX(seq) FROM {run_events} WHERE run_id = :id", {"id": run_id})
        return int(rows[0][0]) + 1 if rows and rows[0][0] is not None else 0

    def expire_leases(self, max_attempts: int = 1, dead_workers: Sequence[str] = ()) -> tuple[list[str], list[str]]:
        """
        Take back the running runs whose worker stopped: their lease expired, or their worker is one of
        ``dead_workers`` (a process of this host that is gone). A run that has had fewer than ``max_attempts``
        attempts goes back to the queue, ahead of its thread's other runs, to be resumed by any worker; the others
        fail. Each attempt's end is recorded in the run's metadata (``attempts``).

        :returns: The ids of the runs queued again, and of the runs failed.
        """
        at = now_text()
        names = {f"w_{i}": worker for i, worker in enumerate(dead_workers)}
        dead = f" OR worker IN ({', '.join(':' + n for n in names)})" if names else ""
        requeued: list[str] = []
        failed: list[str] = []
        with self.database.transaction() as cur:
            rows = cur.rows(
                "SELECT run_id, thread_id, attempt, worker, metadata, cancel FROM {runs} WHERE status = 'running' "
                f"AND (lease_until < :at{dead})",
                {"at": at, **names},
            )
            for run_id, thread_id, attempt, worker, metadata, cancel in rows:
                record = {"attempt": int(attempt), "worker": worker, "ended_at": at, "outcome": LEASE_EXPIRED}
                meta = _loads(metadata)
                meta["attempts"] = [*(meta.get("attempts") or []), record]
                if cancel is not None:  # a cancelled run is not resumed: it ends as a cancel would have ended it
                    cur.change(
                        "UPDATE {runs} SET status = 'interrupted', error = :error, lease_until = NULL, "
                        "metadata = :metadata, updated_at = :at WHERE run_id = :id AND status = 'running'",
                        {"error": f"cancelled; {LEASE_EXPIRED}", "metadata": _dumps(meta), "at": at, "id": run_id},
                    )
                    failed.append(str(run_id))
                    continue
                if int(attempt) < max_attempts:
                    meta.update(resumed=True, attempt=int(attempt) + 1)
                    cur.change(
                        "UPDATE {runs} SET status = 'pending', worker = NULL, lease_until = NULL, cancel = NULL, "
                        "relay = NULL, attempt = attempt + 1, metadata = :metadata, updated_at = :at "
                        "WHERE run_id = :id AND status = 'running'",
                        {"metadata": _dumps(meta), "at": at, "id": run_id},
                    )
                    requeued.append(str(run_id))
                    self.database.notify(cur, QUEUE)
                    continue
                error = json.dumps(
                    {"error": "RunError", "message": f"{LEASE_EXPIRED}, {attempt} of {max_attempts} attempt(s)"}
                )
                cur.change(
                    "UPDATE {runs} SET status = 'error', error = :error, lease_until = NULL, metadata = :metadata, "
                    "updated_at = :at WHERE run_id = :id AND status = 'running'",
                    {"error": error, "metadata": _dumps(meta), "at": at, "id": run_id},
                )
                cur.change(
                    "UPDATE {threads} SET status = 'error', updated_at = :at WHERE thread_id = :id",
                    {"at": at, "id": thread_id},
                )
                failed.append(str(run_id))
        return requeued, failed

    def pending_count(self) -> int:
        """How many runs wait in the queue."""
        return int(self.database.read("SELECT COUNT(*) FROM {runs} WHERE status = 'pending'")[0][0])


class QueueFull(CheckpointError):
    """The run queue holds its maximum of pending runs."""


def _cancel_for(cur: Cursor, active: list[tuple[Any, ...]], run: RunRecord) -> list[tuple[Any, ...]]:
    """
    Cancel a thread's pending and running runs for a new run of ``multitask_strategy`` ``interrupt`` or
    ``rollback`` (see :meth:`ServerStorage.create_run`). Returns the runs that are still running (until their worker
    sees the request).
    """
    action, at = run.multitask_strategy, now_text()
    running: list[tuple[Any, ...]] = []
    for run_id, status in active:
        params = {"id": run_id, "at": at, "action": action}
        if status == "running":
            cur.change(
                "UPDATE {runs} SET cancel = CASE WHEN cancel = 'rollback' THEN cancel ELSE :action END, "
                "updated_at = :at WHERE run_id = :id AND status = 'running'",
                params,
            )
            running.append((run_id, status))
        elif action == "rollback":
            cur.change("DELETE FROM {runs} WHERE run_id = :id AND status = 'pending'", {"id": run_id})
            cur.change("DELETE FROM {run_events} WHERE run_id = :id", {"id": run_id})
        else:
            cur.change(
                "UPDATE {runs} SET status = 'interrupted', error = :error, updated_at = :at "
                "WHERE run_id = :id AND status = 'pending'",
                {**params, "error": f"cancelled before it started: run {run.run_id} interrupted the thread"},
            )
    return running


def _dumps(value: Any) -> str:
    return dump_json(value)


def _loads(text: Any, thread_id: str | None = None) -> dict[str, Any]:
    return load_json(text, thread_id)  # never fails: a stored lone surrogate reads as U+FFFD, with a warning


def _thread_record(row: Sequence[Any]) -> ThreadRecord:
    thread_id, owner, assistant_id, metadata, _, created_at, updated_at, status = row[:8]
    return ThreadRecord(
        thread_id=str(thread_id),
        owner=str(owner),
        assistant_id=assistant_id,
        metadata=_loads(metadata, str(thread_id)),
        status=status,
        created_at=str(created_at),
        updated_at=str(updated_at),
    )


_RUN_FIELDS = tuple(field.name for field in dataclasses.fields(RunRecord) if field.name != "replayed")


def _run_params(run: RunRecord) -> dict[str, Any]:
    params = {name: getattr(run, name) for name in _RUN_FIELDS}
    params["kwargs"] = _dumps(run.kwargs)
    params["metadata"] = _dumps(run.metadata)
    return params


def _run_record(row: Sequence[Any]) -> RunRecord:
    values = dict(zip(_RUN_FIELDS, row, strict=True))
    values["kwargs"] = _loads(values["kwargs"])
    values["metadata"] = _loads(values["metadata"])
    return RunRecord(**values)
