"""
The server's thread records (:class:`ThreadTable`): one row per thread, with its owner, assistant, metadata and last
outcome; a thread is ``busy`` while one of its runs is pending or running. Searches filter on metadata in SQL, and
match in Python the rows whose metadata the database cannot query (see :mod:`haystack_state.server._metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from haystack_state._driver import Flow
from haystack_state._text import text_problem
from haystack_state.server._database import Change, Row, Rows
from haystack_state.server._metadata import check_metadata, dumps, filter_sql, loads, matches, unqueryable_sql
from haystack_state.server._records import ThreadBusy, ThreadRecord, now_text, thread_record
from haystack_state.server._tables import THREAD_SORT, THREADS, Tables, reads, writes, writes_alone

__all__ = ["ThreadTable"]


class ThreadTable(Tables):
    """The server's thread records. Thread-safe; each method is one :class:`~haystack_state.server._database.Work`."""

    @writes_alone
    def create_thread(
        self, thread_id: str, owner: str, metadata: Mapping[str, Any], *, if_exists: str = "raise"
    ) -> Flow[ThreadRecord | None]:
        """
        Create a thread record (one statement: the insert, unless the id is taken).

        :returns: The new record; with ``if_exists="do_nothing"``, the owner's existing record; None if the id is
            taken (by this owner with ``if_exists="raise"``, or by another owner).
        """
        at, stored = now_text(), dumps(metadata)
        for _ in range(3):  # (the id is taken, and that thread is deleted before it is read: insert again)
            added: list[Row] = yield Rows(
                "INSERT INTO {threads} (thread_id, owner, assistant_id, metadata, status, created_at, updated_at) "
                "VALUES (:id, :owner, NULL, :metadata, 'idle', :at, :at) ON CONFLICT (thread_id) DO NOTHING "
                "RETURNING thread_id",
                {"id": thread_id, "owner": owner, "metadata": stored, "at": at},
            )
            if added:  # as read back (a new thread has no runs: idle)
                return ThreadRecord(thread_id, owner, None, loads(stored, thread_id), "idle", at, at)
            found = yield from self._thread(thread_id)
            if found is not None:
                return found if found.owner == owner and if_exists == "do_nothing" else None
        return None

    @reads
    def get_thread(self, thread_id: str, owner: str) -> Flow[ThreadRecord | None]:
        """The owner's thread, or None (also for another owner's thread)."""
        found = yield from self._thread(thread_id)
        return found if found is not None and found.owner == owner else None

    def _thread(self, thread_id: str) -> Flow[ThreadRecord | None]:
        rows: list[Row] = yield Rows(f"{THREADS} WHERE t.thread_id = :id", {"id": thread_id})
        return thread_record(rows[0]) if rows else None

    @reads
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
    ) -> Flow[list[ThreadRecord]]:
        """The owner's threads matching every filter (metadata: each top-level key equal), sorted and paged."""
        if sort_by not in THREAD_SORT or sort_order not in ("asc", "desc"):
            raise ValueError(f"cannot sort threads by {sort_by!r} {sort_order!r}")
        where, params = self._thread_filters(owner, metadata, status, ids)
        order = "current_status" if sort_by == "status" else sort_by
        query = (
            f"SELECT * FROM ({THREADS} WHERE t.owner = :owner) AS s WHERE {where} "
            f"ORDER BY {order} {sort_order}, thread_id {sort_order} LIMIT :limit OFFSET :offset"
        )
        unqueryable = yield from self._unqueryable_matches(owner, metadata, status, ids)
        if unqueryable:  # matched in Python: page the database's matches and these together
            params.update(limit=offset + limit, offset=0)
        rows: list[Row] = yield Rows(query, {"limit": limit, "offset": offset, **params})
        records = [thread_record(row) for row in rows]
        if not unqueryable:
            return records
        field = "status" if sort_by == "status" else sort_by
        records += unqueryable
        records.sort(key=lambda r: (getattr(r, field), r.thread_id), reverse=sort_order == "desc")
        return records[offset : offset + limit]

    @reads
    def count_threads(
        self, owner: str, *, metadata: Mapping[str, Any] | None = None, status: str | None = None
    ) -> Flow[int]:
        """How many of the owner's threads match the filters."""
        where, params = self._thread_filters(owner, metadata, status, None)
        query = f"SELECT COUNT(*) FROM ({THREADS} WHERE t.owner = :owner) AS s WHERE {where}"
        unqueryable = yield from self._unqueryable_matches(owner, metadata, status, None)
        rows: list[Row] = yield Rows(query, params)
        return int(rows[0][0]) + len(unqueryable)

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
        self, owner: str, metadata: Mapping[str, Any] | None, status: str | None, ids: Sequence[str] | None
    ) -> Flow[list[ThreadRecord]]:
        """
        The threads a metadata filter matches among those whose stored metadata the database cannot query (written
        before text was checked; the database's filter leaves them out): matched here on their repaired metadata.
        """
        if not metadata:
            return []
        where, params = self._thread_filters(owner, None, status, ids)
        condition, extra = unqueryable_sql(self.database.dialect)
        rows: list[Row] = yield Rows(
            f"SELECT * FROM ({THREADS} WHERE t.owner = :owner) AS s WHERE {where} AND {condition}", {**params, **extra}
        )
        records = [thread_record(row) for row in rows]
        return [r for r in records if matches(self.database.dialect, r.metadata, metadata)]

    @writes
    def update_thread(
        self,
        thread_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        status: str | None = None,
        assistant_id: str | None = None,
    ) -> Flow[None]:
        """Merge metadata into a thread record, and/or set its last outcome or assistant; bump ``updated_at``."""
        found = yield from self._thread(thread_id)
        if found is None:
            return
        merged = {**found.metadata, **(metadata or {})}
        yield Change(
            "UPDATE {threads} SET metadata = :metadata, status = COALESCE(:status, status), "
            "assistant_id = COALESCE(:assistant, assistant_id), updated_at = :at WHERE thread_id = :id",
            {"metadata": dumps(merged), "status": status, "assistant": assistant_id, "at": now_text(), "id": thread_id},
        )

    @writes
    def delete_thread(self, thread_id: str, owner: str) -> Flow[bool]:
        """
        Delete the owner's thread record and its runs.

        :returns: Whether it existed.
        :raises ThreadBusy: If a run of the thread is running (nothing is deleted).
        """
        found = yield from self._thread(thread_id)
        if found is None or found.owner != owner:
            return False
        running: list[Row] = yield Rows(
            "SELECT run_id FROM {runs} WHERE thread_id = :id AND status = 'running'", {"id": thread_id}
        )
        if running:
            raise ThreadBusy(f"Thread '{thread_id}' has a running run ({running[0][0]}); delete it when it ends.")
        yield Change(
            "DELETE FROM {run_events} WHERE run_id IN (SELECT run_id FROM {runs} WHERE thread_id = :id)",
            {"id": thread_id},
        )
        yield Change("DELETE FROM {runs} WHERE thread_id = :id", {"id": thread_id})
        yield Change("DELETE FROM {threads} WHERE thread_id = :id", {"id": thread_id})
        return True
