"""
The server's own records, kept in the checkpointer's database beside the checkpoints: one row per thread (its owner,
assistant, metadata and last outcome) and the run queue (one row per run). The SQL is written once for SQLite and
PostgreSQL (see :mod:`haystack_state.server._database`); the schema grows by an append-only list of migrations
(:mod:`haystack_state.server._tables`).

:class:`ServerStorage` joins the queries, which live by concern beside it: thread records
(:mod:`haystack_state.server._thread_table`), the run queue (:mod:`haystack_state.server._run_queue`: one running run
per thread, claims, ends), requests on running runs and their relayed events (:mod:`haystack_state.server._run_relay`),
and the leases of running runs (:mod:`haystack_state.server._run_leases`). The records are in
:mod:`haystack_state.server._records`.
"""

from __future__ import annotations

from haystack_state.server._database import Database
from haystack_state.server._records import Idempotency, IdempotencyConflict, RunRecord, ThreadRecord
from haystack_state.server._run_leases import RunLeases
from haystack_state.server._run_queue import RunQueue
from haystack_state.server._run_relay import RunRelay
from haystack_state.server._tables import migrate
from haystack_state.server._thread_table import ThreadTable

# (The records are re-exported from here, where they were defined before.)
__all__ = ["Idempotency", "IdempotencyConflict", "RunRecord", "ServerStorage", "ThreadRecord"]


class ServerStorage(ThreadTable, RunQueue, RunRelay, RunLeases):
    """
    Thread records and the run queue, in the checkpointer's database. Thread-safe; each method returns one
    transaction as a :class:`~haystack_state.server._database.Work`: ``await storage.get_run(run_id)`` on the event
    loop, ``storage.get_run(run_id).result()`` from a thread.

    :param database: The database (its tables are created or migrated here).
    """

    def __init__(self, database: Database) -> None:
        super().__init__(database)
        migrate(database)

    def close(self) -> None:
        """Release the database connections."""
        self.database.close()
