"""
The SQL of :class:`~haystack_state.persistence.postgres.PostgresCheckpointer`, one *script* per operation: a
generator that yields statements (:class:`Stmt`) and receives their results, so the sync and the async connection
run the same script.
"""

from __future__ import annotations

import datetime as dt
import json

from psycopg import sql

from haystack_state._db.postgres import ALL, COUNT, ONE, Script, Stmt
from haystack_state.errors import CheckpointError, CheckpointNotFoundError, ThreadNotFoundError
from haystack_state.persistence import ops
from haystack_state.persistence._leases import busy_error
from haystack_state.persistence._sql import META_COLUMNS, epoch, from_epoch, history_query, stored_row
from haystack_state.persistence.base import check_commit, conflict_error
from haystack_state.persistence.records import (
    ChainLink,
    LeaseHolder,
    ThreadInfo,
    string_list_json,
)

__all__ = ["PostgresScripts"]

_C_META = ", ".join("c." + column for column in META_COLUMNS.split(", "))

# The usual commits (see PostgresScripts.appends) of one run or of several, in one statement, their rows given as one
# JSON parameter: one round trip, a row back per commit applied. A child of the expected head moves the head if it is
# the expected one and no other owner holds a live lease; a new thread's first commit creates the thread unless it
# exists (an expired one too: the full script replaces it) or another owner holds its lease. Two commits to one thread
# in a batch: one applies, the other gets no row (then the full script finds out why).
_BATCH = """
    WITH input AS (
        SELECT * FROM json_to_recordset(%s::json) AS i(thread text, id text, expected text, owner text,
            now double precision, parent text, step bigint, source text, tools text, keys text, created timestamptz,
            metadata text, delta text, snapshot text, chain bigint, base bigint, ttl double precision)
    ), free AS (
        SELECT * FROM input AS i WHERE i.owner IS NULL OR NOT EXISTS (
            SELECT 1 FROM {leases} AS l WHERE l.thread_id = i.thread AND l.owner <> i.owner AND l.expires_at > i.now)
    ), moved AS (
        UPDATE {threads} AS t SET head_id = i.id, last_seq = t.last_seq + 1, updated_at = i.created,
            expires_at = CASE WHEN t.ttl IS NULL THEN NULL ELSE i.now + t.ttl END
        FROM free AS i
        WHERE i.expected IS NOT NULL AND t.thread_id = i.thread AND t.head_id = i.expected
            AND (t.expires_at IS NULL OR t.expires_at > i.now)
        RETURNING t.thread_id, t.head_id, t.last_seq
    ), created AS (
        INSERT INTO {threads} (thread_id, head_id, last_seq, created_at, updated_at, ttl, expires_at)
        SELECT i.thread, i.id, 1, i.created, i.created, i.ttl, i.now + i.ttl FROM free AS i WHERE i.expected IS NULL
        ON CONFLICT (thread_id) DO NOTHING
        RETURNING thread_id, head_id, last_seq
    )
    INSERT INTO {checkpoints} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, changed_keys,
        created_at, metadata, delta, snapshot, chain_bytes, base_bytes)
    SELECT i.thread, i.id, w.last_seq, i.parent, i.step, i.source, i.tools, i.keys, i.created, i.metadata, i.delta,
        i.snapshot, i.chain, i.base
    FROM input AS i JOIN (SELECT * FROM moved UNION ALL SELECT * FROM created) AS w
        ON w.thread_id = i.thread AND w.head_id = i.id
    RETURNING thread_id, checkpoint_id
"""
# Insert the lease, or take over an expired one or one's own; otherwise nothing comes back (another owner holds it).
_ACQUIRE = (
    "INSERT INTO {leases} AS l (thread_id, owner, expires_at) VALUES (%(thread)s, %(owner)s, %(expires)s) "
    "ON CONFLICT (thread_id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at, "
    "stop_requested = false WHERE l.owner = excluded.owner OR l.expires_at <= %(now)s RETURNING 1"
)
_VISIBLE = "(expires_at IS NULL OR expires_at > %(now)s)"


class PostgresScripts:
    """The scripts of each operation; the checkpointer provides ``_q`` (a template with the table names filled in)."""

    def _q(self, template: str) -> sql.Composed:
        raise NotImplementedError

    def _insert(self, op: ops.Insert) -> Script:
        row, expected_head, now = op.row, op.expected_head, epoch(op.now)
        if self.appends(op):
            # The common commits in one statement (one round trip): a child of the expected head (move the head if it
            # is the expected one and no other owner holds a live lease, and insert the row), or a new thread's first
            # (create it unless it exists or another owner holds its lease). If nothing was written, the full path
            # below finds out why.
            inserted = yield Stmt(*self.batch_statement([op]), COUNT, alone=True)
            if inserted == 1:
                return None
        if op.lease_owner is not None:
            query = self._q("SELECT owner, expires_at FROM {leases} WHERE thread_id = %s")
            holder = yield Stmt(query, (row.thread_id,), ONE)
            if holder is not None and holder[0] != op.lease_owner and holder[1] > now:
                raise busy_error(row.thread_id, holder[0], from_epoch(holder[1]))
        query = self._q("SELECT head_id, last_seq, expires_at FROM {threads} WHERE thread_id = %s FOR UPDATE")
        found = yield Stmt(query, (row.thread_id,), ONE)
        expired = found is not None and found[2] is not None and found[2] <= now
        if expired and expected_head is None:  # invisible already: the new thread replaces it
            yield Stmt(self._q("DELETE FROM {checkpoints} WHERE thread_id = %s"), (row.thread_id,))
            yield Stmt(self._q("DELETE FROM {threads} WHERE thread_id = %s"), (row.thread_id,))
            found = None
        head, last_seq = (found[0], int(found[1])) if found is not None and not expired else (None, 0)
        parent_exists = True
        if row.parent_id is not None and head is not None and row.parent_id != head:
            query = self._q("SELECT 1 FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = %s")
            parent_exists = (yield Stmt(query, (row.thread_id, row.parent_id), ONE)) is not None
        check_commit(row, expected_head, head, lambda: parent_exists)
        if found is None:
            # A new thread: the primary key decides between concurrent creators (the loser inserts nothing).
            created = yield Stmt(
                self._q(
                    "INSERT INTO {threads} (thread_id, head_id, last_seq, created_at, updated_at, ttl, expires_at) "
                    "VALUES (%s, %s, 1, %s, %s, %s, %s) ON CONFLICT (thread_id) DO NOTHING"
                ),
                (
                    row.thread_id,
                    row.checkpoint_id,
                    row.created_at,
                    row.created_at,
                    op.ttl,
                    now + op.ttl if op.ttl is not None else None,
                ),
                COUNT,
            )
            if created != 1:
                actual = yield Stmt(
                    self._q("SELECT head_id FROM {threads} WHERE thread_id = %s"), (row.thread_id,), ONE
                )
                raise conflict_error(row.thread_id, expected_head, actual[0] if actual is not None else None)
        else:
            yield Stmt(
                self._q(
                    "UPDATE {threads} SET head_id = %s, last_seq = %s, updated_at = %s, "
                    "expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE %s + ttl END WHERE thread_id = %s"
                ),
                (row.checkpoint_id, last_seq + 1, row.created_at, now, row.thread_id),
            )
        yield Stmt(
            self._q(
                "INSERT INTO {checkpoints} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, "
                "changed_keys, created_at, metadata, delta, snapshot, chain_bytes, base_bytes) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            ),
            (
                row.thread_id,
                row.checkpoint_id,
                last_seq + 1,
                row.parent_id,
                row.step,
                row.source,
                string_list_json(row.tool_names),
                string_list_json(row.changed_keys),
                row.created_at,
                row.metadata,
                row.delta,
                row.snapshot,
                row.chain_bytes,
                row.base_bytes,
            ),
        )

    @staticmethod
    def appends(op: ops.Insert) -> bool:
        """
        Whether a commit is a usual one that ``batch_statement`` applies: a child of the expected head, or the first
        checkpoint of a new thread.
        """
        return op.row.parent_id == op.expected_head

    def batch_statement(self, batch: list[ops.Insert]) -> tuple[sql.Composed, tuple[str]]:
        """
        The statement that applies usual commits (see :meth:`appends`); it returns the ``(thread_id, checkpoint_id)``
        of each one it applied (none for a commit whose head moved, whose thread exists, or whose thread another run
        holds: the full script finds out which).
        """
        rows = []
        for op in batch:
            row = op.row
            rows.append(
                {
                    "thread": row.thread_id,
                    "id": row.checkpoint_id,
                    "expected": op.expected_head,
                    "owner": op.lease_owner,
                    "now": epoch(op.now),
                    "parent": row.parent_id,
                    "step": row.step,
                    "source": row.source,
                    "tools": string_list_json(row.tool_names),
                    "keys": string_list_json(row.changed_keys),
                    "created": row.created_at.isoformat(),
                    "metadata": row.metadata,
                    "delta": row.delta,
                    "snapshot": row.snapshot,
                    "chain": row.chain_bytes,
                    "base": row.base_bytes,
                    "ttl": op.ttl,
                }
            )
        return self._q(_BATCH), (json.dumps(rows),)

    def _visible_head(self, thread_id: str, now: dt.datetime) -> Script:
        query = self._q(f"SELECT head_id FROM {{threads}} WHERE thread_id = %(thread)s AND {_VISIBLE}")
        found = yield Stmt(query, {"thread": thread_id, "now": epoch(now)}, ONE)
        return str(found[0]) if found is not None else None

    def _read_head(self, op: ops.ReadHead) -> Script:
        return (yield from self._visible_head(op.thread_id, op.now))

    def _read_meta(self, op: ops.ReadMeta) -> Script:
        _, row = yield from self._open_thread(op)
        if row is None:
            raise ThreadNotFoundError(op.thread_id)
        return row

    def _open_thread(self, op: ops.OpenThread | ops.ReadMeta) -> Script:
        # One round trip: the lease, the thread's visible head and the row, in one snapshot.
        query = self._q(
            f"SELECT l.owner, l.expires_at, {_C_META}, '', NULL, "
            "c.chain_bytes, c.base_bytes, t.head_id FROM (SELECT 1) AS one "
            "LEFT JOIN {leases} AS l ON l.thread_id = %(thread)s "
            "LEFT JOIN {threads} AS t ON t.thread_id = %(thread)s AND (t.expires_at IS NULL OR t.expires_at > %(now)s) "
            "LEFT JOIN {checkpoints} AS c ON c.thread_id = t.thread_id "
            "AND c.checkpoint_id = COALESCE(%(checkpoint)s, t.head_id)"
        )
        params = {"thread": op.thread_id, "checkpoint": op.checkpoint_id, "now": epoch(op.now)}
        found = yield Stmt(query, params, ONE)
        holder = LeaseHolder(found[0], from_epoch(found[1])) if found[0] is not None else None
        if found[-1] is None:
            return holder, None
        if found[3] is None:  # no such row: a checkpoint not in the thread (or a head whose row is gone)
            raise CheckpointNotFoundError(op.thread_id, op.checkpoint_id or found[-1])
        return holder, stored_row(found[2:-1])

    def _read_chain(self, op: ops.ReadChain) -> Script:
        # Each step of the walk is one primary-key lookup (LATERAL ... LIMIT 1 keeps the planner from hash-joining
        # the whole thread at every step); it stops at a snapshot, at ``stop`` or at the root. PostgreSQL evaluates
        # only the rows the outer LIMIT takes, so a corrupt, cyclic chain stops after as many rows as the thread has.
        query = self._q(
            "WITH RECURSIVE chain AS ("
            " SELECT checkpoint_id, parent_id, delta, snapshot FROM {checkpoints}"
            " WHERE thread_id = %(thread)s AND checkpoint_id = %(checkpoint)s"
            " UNION ALL"
            " SELECT p.* FROM chain CROSS JOIN LATERAL ("
            " SELECT checkpoint_id, parent_id, delta, snapshot FROM {checkpoints} AS c"
            " WHERE c.thread_id = %(thread)s AND c.checkpoint_id = chain.parent_id LIMIT 1) AS p"
            " WHERE chain.parent_id IS DISTINCT FROM %(stop)s::text AND chain.snapshot IS NULL"
            ") SELECT checkpoint_id, parent_id, delta, snapshot FROM chain"
            " LIMIT (SELECT count(*) + 1 FROM {checkpoints} WHERE thread_id = %(thread)s)"
        )
        rows = yield Stmt(query, {"thread": op.thread_id, "checkpoint": op.checkpoint_id, "stop": op.stop_at}, ALL)
        return [ChainLink(found[0], found[1], found[2], found[3]) for found in reversed(rows)]

    def _read_history(self, op: ops.ReadHistory) -> Script:
        if (yield from self._visible_head(op.thread_id, op.now)) is None:
            raise ThreadNotFoundError(op.thread_id)
        params = [op.thread_id]
        if op.before is not None:
            query = self._q("SELECT seq FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = %s")
            found = yield Stmt(query, (op.thread_id, op.before), ONE)
            if found is None:
                raise CheckpointNotFoundError(op.thread_id, op.before)
            params.append(found[0])
        query = self._q(history_query("{checkpoints}", "%s", before=op.before is not None, limit=op.limit))
        rows = yield Stmt(query, params, ALL)
        return [stored_row(found) for found in rows]

    def _read_threads(self, op: ops.ReadThreads) -> Script:
        query = self._q(
            "SELECT t.thread_id, t.head_id, (SELECT count(*) FROM {checkpoints} AS c WHERE c.thread_id = t.thread_id), "
            f"t.created_at, t.updated_at FROM {{threads}} AS t WHERE {_VISIBLE} ORDER BY t.updated_at DESC, t.thread_id"
        )
        rows = yield Stmt(query, {"now": epoch(op.now)}, ALL)
        return [ThreadInfo(r[0], r[1], int(r[2]), _utc(r[3]), _utc(r[4])) for r in rows]

    def _delete(self, op: ops.DeleteThread) -> Script:
        params = {"thread": op.thread_id, "now": epoch(op.now)}
        if op.only_expired:
            condition = (
                "expires_at IS NOT NULL AND expires_at <= %(now)s AND NOT EXISTS (SELECT 1 FROM {leases} AS l "
                "WHERE l.thread_id = %(thread)s AND l.expires_at > %(now)s)"
            )
        else:
            condition = _VISIBLE
        query = self._q(f"SELECT {condition} FROM {{threads}} WHERE thread_id = %(thread)s FOR UPDATE")
        found = yield Stmt(query, params, ONE)
        if found is None or (op.only_expired and not found[0]):
            return False
        yield Stmt(self._q("DELETE FROM {checkpoints} WHERE thread_id = %s"), (op.thread_id,))
        yield Stmt(self._q("DELETE FROM {threads} WHERE thread_id = %s"), (op.thread_id,))
        yield Stmt(self._q("DELETE FROM {leases} WHERE thread_id = %s"), (op.thread_id,))
        return bool(found[0])

    def _prune_candidates(self, op: ops.ReadPruneCandidates) -> Script:
        where = "WHERE thread_id = %(thread)s" if op.thread_id is not None else ""
        query = self._q(
            f"SELECT thread_id, expires_at IS NOT NULL AND expires_at <= %(now)s FROM {{threads}} {where} "
            "ORDER BY thread_id"
        )
        rows = yield Stmt(query, {"thread": op.thread_id, "now": epoch(op.now)}, ALL)
        return [r[0] for r in rows if not r[1]], [r[0] for r in rows if r[1]]

    def _set_snapshot(self, op: ops.SetSnapshot) -> Script:
        query = self._q(
            "UPDATE {checkpoints} SET snapshot = %s, chain_bytes = 0, base_bytes = %s "
            "WHERE thread_id = %s AND checkpoint_id = %s"
        )
        yield Stmt(query, (op.snapshot, len(op.snapshot), op.thread_id, op.checkpoint_id), alone=True)

    def _delete_checkpoints(self, op: ops.DeleteCheckpoints) -> Script:
        query = self._q(
            "DELETE FROM {checkpoints} WHERE thread_id = %s AND checkpoint_id = ANY(%s) AND checkpoint_id NOT IN "
            "(SELECT head_id FROM {threads} WHERE thread_id = %s)"
        )
        return (yield Stmt(query, (op.thread_id, list(op.checkpoint_ids), op.thread_id), COUNT))

    def _set_ttl(self, op: ops.SetTTL) -> Script:
        query = self._q(
            "UPDATE {threads} SET ttl = %(ttl)s, expires_at = CASE WHEN %(ttl)s::double precision IS NULL THEN NULL "
            f"ELSE extract(epoch FROM updated_at) + %(ttl)s END WHERE thread_id = %(thread)s AND {_VISIBLE}"
        )
        params = {"ttl": op.ttl, "thread": op.thread_id, "now": epoch(op.now)}
        return (yield Stmt(query, params, COUNT, alone=True)) == 1

    def _acquire(self, op: ops.AcquireLease) -> Script:
        holder, _ = yield from self._hold(op)
        return holder

    def _hold(self, op: ops.HoldThread | ops.AcquireLease) -> Script:
        # Two statements sent together (one round trip); the second sees what the first did, and every commit made
        # before it (each statement reads its own snapshot): the head, once the lease is taken, or the holder.
        params = {"thread": op.thread_id, "owner": op.owner, "expires": epoch(op.expires_at), "now": epoch(op.now)}
        after = self._q(
            f"SELECT (SELECT head_id FROM {{threads}} WHERE thread_id = %(thread)s AND {_VISIBLE}), "
            "l.owner, l.expires_at FROM (SELECT 1) AS one LEFT JOIN {leases} AS l ON l.thread_id = %(thread)s"
        )
        for _ in range(3):  # a holder that releases between the two statements: try again
            taken, found = yield (Stmt(self._q(_ACQUIRE), params, ONE, alone=True), Stmt(after, params, ONE))
            if taken is not None:
                return None, (str(found[0]) if found[0] is not None else None)
            if found[1] is not None:
                return LeaseHolder(found[1], from_epoch(found[2])), None
        raise CheckpointError(f"Thread '{op.thread_id}': the lease could not be acquired (it kept changing hands).")

    def _renew(self, op: ops.RenewLease) -> Script:
        query = self._q(
            "UPDATE {leases} SET expires_at = %s WHERE thread_id = %s AND owner = %s RETURNING stop_requested"
        )
        found = yield Stmt(query, (epoch(op.expires_at), op.thread_id, op.owner), ONE, alone=True)
        return bool(found[0]) if found is not None else None

    def _request_stop(self, op: ops.RequestStop) -> Script:
        query = self._q("UPDATE {leases} SET stop_requested = true WHERE thread_id = %s AND expires_at > %s")
        return (yield Stmt(query, (op.thread_id, epoch(op.now)), COUNT, alone=True)) == 1

    def release_statement(self, batch: list[ops.ReleaseLease]) -> tuple[sql.Composed, tuple[list[str], list[str]]]:
        """The statement that releases several leases at once; it returns a row per lease it released."""
        query = self._q(
            "DELETE FROM {leases} AS l USING unnest(%s::text[], %s::text[]) AS r(thread_id, owner) "
            "WHERE l.thread_id = r.thread_id AND l.owner = r.owner RETURNING l.thread_id, l.owner"
        )
        return query, ([op.thread_id for op in batch], [op.owner for op in batch])

    def _release(self, op: ops.ReleaseLease) -> Script:
        query = self._q("DELETE FROM {leases} WHERE thread_id = %s AND owner = %s")
        return (yield Stmt(query, (op.thread_id, op.owner), COUNT, alone=True)) == 1

    def _read_lease(self, op: ops.ReadLease) -> Script:
        found = yield Stmt(self._q("SELECT owner, expires_at FROM {leases} WHERE thread_id = %s"), (op.thread_id,), ONE)
        return LeaseHolder(found[0], from_epoch(found[1])) if found is not None else None


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC)
