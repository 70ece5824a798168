"""
The SQL of :class:`~haystack_state.persistence.sqlite.SQLiteCheckpointer`: its tables and their append-only
migrations, and :class:`SQLiteOperations`, one method per operation of :mod:`haystack_state.persistence.ops`
(named as :data:`~haystack_state.persistence.ops.HANDLERS` says), each run on a connection inside the transaction
the checkpointer opened. The checkpointer adds the connections, the transactions and the event loops.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import zlib

from haystack_state.errors import CheckpointNotFoundError, ThreadNotFoundError
from haystack_state.persistence import ops
from haystack_state.persistence._leases import busy_error
from haystack_state.persistence._sql import epoch, from_epoch, history_query, stored_row
from haystack_state.persistence.base import check_commit
from haystack_state.persistence.records import (
    ChainLink,
    LeaseHolder,
    StoredCheckpoint,
    ThreadInfo,
    string_list_json,
)

__all__ = ["CHECKPOINTS", "LEASES", "MIGRATIONS", "MIGRATIONS_TABLE", "THREADS", "SQLiteOperations"]

THREADS = "haystack_state_threads"
CHECKPOINTS = "haystack_state_checkpoints"
LEASES = "haystack_state_leases"
MIGRATIONS_TABLE = "haystack_state_migrations"

#: Append-only: the schema version is the number of migrations applied. Never edit or reorder an entry.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        f"""CREATE TABLE {THREADS} (
            thread_id TEXT PRIMARY KEY,
            head_id TEXT NOT NULL,
            last_seq INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        f"""CREATE TABLE {CHECKPOINTS} (
            thread_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            parent_id TEXT,
            step INTEGER NOT NULL,
            source TEXT NOT NULL,
            tool_names TEXT NOT NULL,
            changed_keys TEXT NOT NULL,
            created_at TEXT NOT NULL,
            metadata TEXT NOT NULL,
            delta TEXT NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_id),
            UNIQUE (thread_id, seq)
        )""",
        f"CREATE INDEX {THREADS}_updated ON {THREADS} (updated_at)",
    ),
    (  # snapshots, thread TTLs and leases
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN snapshot TEXT",
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN chain_bytes INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE {CHECKPOINTS} ADD COLUMN base_bytes INTEGER NOT NULL DEFAULT 0",
        f"ALTER TABLE {THREADS} ADD COLUMN ttl REAL",
        f"ALTER TABLE {THREADS} ADD COLUMN expires_at REAL",
        f"""CREATE TABLE {LEASES} (
            thread_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
    ),
    (  # snapshots written from now on are zlib-compressed UTF-8 (a BLOB); older ones (TEXT) still read as they are
        f"CREATE INDEX {CHECKPOINTS}_snapshots ON {CHECKPOINTS} (thread_id, seq) WHERE snapshot IS NOT NULL",
    ),
    (  # a stop asked of the run holding the lease (Agent.cancel, from any process)
        f"ALTER TABLE {LEASES} ADD COLUMN stop_requested INTEGER NOT NULL DEFAULT 0",
    ),
]

# A checkpoint's record (the head's if :checkpoint is NULL) and the thread's visible head: no row if the thread is
# not visible; the head and NULLs if the checkpoint is not in it.
_READ_META = f"""
    SELECT t.head_id, c.thread_id, c.checkpoint_id, c.parent_id, c.step, c.source, c.tool_names, c.created_at,
        c.changed_keys, c.metadata, '', NULL, c.chain_bytes, c.base_bytes
    FROM {THREADS} AS t LEFT JOIN {CHECKPOINTS} AS c
        ON c.thread_id = t.thread_id AND c.checkpoint_id = COALESCE(:checkpoint, t.head_id)
    WHERE t.thread_id = :thread AND (t.expires_at IS NULL OR t.expires_at > :now)
"""
_VISIBLE = "(expires_at IS NULL OR expires_at > :now)"
# Each step of the walk is one primary-key lookup; it stops at a snapshot, at ``stop`` or at the root. SQLite yields
# the rows as it walks, and the reader stops at the first repeated id (a corrupt, cyclic chain).
_CHAIN = f"""
    WITH RECURSIVE chain(checkpoint_id, parent_id, delta, snapshot) AS (
        SELECT checkpoint_id, parent_id, delta, snapshot FROM {CHECKPOINTS}
        WHERE thread_id = :thread AND checkpoint_id = :checkpoint
        UNION ALL
        SELECT c.checkpoint_id, c.parent_id, c.delta, c.snapshot
        FROM chain JOIN {CHECKPOINTS} AS c ON c.thread_id = :thread AND c.checkpoint_id = chain.parent_id
        WHERE chain.parent_id IS NOT :stop AND chain.snapshot IS NULL
    )
    SELECT checkpoint_id, parent_id, delta, snapshot FROM chain
"""


#: The operations done inline on the event loop (when they need not wait): each is a few statements on one thread's


def pack_snapshot(snapshot: str | None) -> bytes | None:
    """A snapshot as stored: its UTF-8 text compressed with zlib (a state's JSON shrinks several times)."""
    if snapshot is None:
        return None
    packer = zlib.compressobj(1)
    step = 1 << 20  # encoded a slice at a time: never a second whole copy of a large state's text
    chunks = [
        packer.compress(snapshot[start : start + step].encode("utf-8")) for start in range(0, len(snapshot), step)
    ]
    chunks.append(packer.flush())
    return b"".join(chunks)


def unpack_snapshot(stored: str | bytes | None) -> str | None:
    """A stored snapshot's text: a compressed BLOB (schema version 3), or TEXT as earlier versions wrote it."""
    if stored is None or isinstance(stored, str):
        return stored
    try:
        return zlib.decompress(stored).decode("utf-8")
    except (zlib.error, UnicodeDecodeError, TypeError) as error:
        return f"<unreadable compressed snapshot: {error}>"  # not JSON: reading it reports the checkpoint


class SQLiteOperations:
    """The checkpointer's operations on a SQLite connection (see the module docstring)."""

    def _insert(self, conn: sqlite3.Connection, op: ops.Insert) -> None:
        row, expected_head, now = op.row, op.expected_head, epoch(op.now)
        created = row.created_at.isoformat()
        if expected_head is not None and row.parent_id == expected_head:
            # The usual commit, in two statements: move the head (unless another run holds the thread's lease),
            # then insert the row. Anything else takes the checks below, which say what is wrong.
            moved = conn.execute(
                f"UPDATE {THREADS} SET head_id = ?, last_seq = last_seq + 1, updated_at = ?, "
                "expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE ? + ttl END "
                f"WHERE thread_id = ? AND head_id = ? AND {_VISIBLE.replace(':now', '?')} AND NOT EXISTS "
                f"(SELECT 1 FROM {LEASES} WHERE thread_id = ? AND owner IS NOT ? AND expires_at > ?) "
                "RETURNING last_seq",
                (
                    row.checkpoint_id,
                    created,
                    now,
                    row.thread_id,
                    expected_head,
                    now,
                    row.thread_id,
                    op.lease_owner if op.lease_owner is not None else "",
                    now if op.lease_owner is not None else float("inf"),
                ),
            ).fetchall()
            if len(moved) == 1:
                self._insert_row(conn, row, "?", (moved[0][0],))
                return
        if op.lease_owner is not None:
            holder = conn.execute(f"SELECT owner, expires_at FROM {LEASES} WHERE thread_id = ?", (row.thread_id,))
            found = holder.fetchone()
            if found is not None and found[0] != op.lease_owner and found[1] > now:
                raise busy_error(row.thread_id, found[0], from_epoch(found[1]))
        found = conn.execute(
            f"SELECT head_id, last_seq, expires_at FROM {THREADS} WHERE thread_id = ?", (row.thread_id,)
        ).fetchone()
        expired = found is not None and found[2] is not None and found[2] <= now
        if expired and expected_head is None:  # invisible already: the new thread replaces it
            conn.execute(f"DELETE FROM {CHECKPOINTS} WHERE thread_id = ?", (row.thread_id,))
            conn.execute(f"DELETE FROM {THREADS} WHERE thread_id = ?", (row.thread_id,))
            found = None
        head, last_seq = (found[0], int(found[1])) if found is not None and not expired else (None, 0)

        def parent_exists() -> bool:
            query = f"SELECT 1 FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?"
            return conn.execute(query, (row.thread_id, row.parent_id)).fetchone() is not None

        check_commit(row, expected_head, head, parent_exists)
        self._insert_row(conn, row, "?", (last_seq + 1,))
        conn.execute(
            f"INSERT INTO {THREADS} (thread_id, head_id, last_seq, created_at, updated_at, ttl, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET head_id = excluded.head_id, "
            "last_seq = excluded.last_seq, updated_at = excluded.updated_at, "
            f"expires_at = CASE WHEN {THREADS}.ttl IS NULL THEN NULL ELSE ? + {THREADS}.ttl END",
            (
                row.thread_id,
                row.checkpoint_id,
                last_seq + 1,
                created,
                created,
                op.ttl,
                now + op.ttl if op.ttl is not None else None,
                now,
            ),
        )

    @staticmethod
    def _insert_row(conn: sqlite3.Connection, row: StoredCheckpoint, seq: str, seq_params: tuple[object, ...]) -> None:
        conn.execute(
            f"INSERT INTO {CHECKPOINTS} (thread_id, checkpoint_id, seq, parent_id, step, source, tool_names, "
            f"changed_keys, created_at, metadata, delta, snapshot, chain_bytes, base_bytes) VALUES (?, ?, {seq}, "
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.thread_id,
                row.checkpoint_id,
                *seq_params,
                row.parent_id,
                row.step,
                row.source,
                string_list_json(row.tool_names),
                string_list_json(row.changed_keys),
                row.created_at.isoformat(),
                row.metadata,
                row.delta,
                pack_snapshot(row.snapshot),
                row.chain_bytes,
                row.base_bytes,
            ),
        )

    @staticmethod
    def _visible_head(conn: sqlite3.Connection, thread_id: str, now: dt.datetime) -> str | None:
        found = conn.execute(
            f"SELECT head_id FROM {THREADS} WHERE thread_id = :thread AND {_VISIBLE}",
            {"thread": thread_id, "now": epoch(now)},
        ).fetchone()
        return str(found[0]) if found is not None else None

    def _read_head(self, conn: sqlite3.Connection, op: ops.ReadHead) -> str | None:
        return self._visible_head(conn, op.thread_id, op.now)

    def _read_meta(self, conn: sqlite3.Connection, op: ops.ReadMeta) -> StoredCheckpoint:
        # One statement (a consistent read without a transaction): the visible head and the checkpoint's record.
        found = conn.execute(_READ_META, {"thread": op.thread_id, "now": epoch(op.now), "checkpoint": op.checkpoint_id})
        row = found.fetchone()
        if row is None:
            raise ThreadNotFoundError(op.thread_id)
        if row[1] is None:
            raise CheckpointNotFoundError(op.thread_id, row[0] if op.checkpoint_id is None else op.checkpoint_id)
        return stored_row(row[1:])

    def _open_thread(
        self, conn: sqlite3.Connection, op: ops.OpenThread
    ) -> tuple[LeaseHolder | None, StoredCheckpoint | None]:
        holder = self._read_lease(conn, ops.ReadLease(op.thread_id))
        try:
            return holder, self._read_meta(conn, ops.ReadMeta(op.thread_id, op.checkpoint_id, op.now))
        except ThreadNotFoundError:
            return holder, None

    def _read_chain(self, conn: sqlite3.Connection, op: ops.ReadChain) -> list[ChainLink]:
        if op.stop_at is None:
            chain = self._read_chain_by_range(conn, op)
            if chain is not None:
                return chain
        chain = []
        seen: set[str] = set()
        cursor = conn.execute(_CHAIN, {"thread": op.thread_id, "checkpoint": op.checkpoint_id, "stop": op.stop_at})
        for found in cursor:
            chain.append(ChainLink(found[0], found[1], found[2], unpack_snapshot(found[3])))
            if found[0] in seen:  # a cycle: check_chain reports it
                break
            seen.add(found[0])
        cursor.close()
        chain.reverse()
        return chain

    @staticmethod
    def _read_chain_by_range(conn: sqlite3.Connection, op: ops.ReadChain) -> list[ChainLink] | None:
        """
        The chain from the nearest snapshot, read as one range of rows by sequence number (a child is always
        written after its parent) instead of one lookup per link, then walked by parent links in memory. None if the
        walk leaves the range (a branch forked from before the snapshot): the recursive walk reads it then.
        """
        conn.execute("BEGIN")
        try:
            found = conn.execute(
                f"SELECT seq FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?",
                (op.thread_id, op.checkpoint_id),
            ).fetchone()
            if found is None:
                return []
            top = found[0]
            base = conn.execute(
                f"SELECT max(seq) FROM {CHECKPOINTS} WHERE thread_id = ? AND seq <= ? AND snapshot IS NOT NULL",
                (op.thread_id, top),
            ).fetchone()[0]
            rows = conn.execute(
                f"SELECT checkpoint_id, parent_id, delta, snapshot FROM {CHECKPOINTS} "
                "WHERE thread_id = ? AND seq BETWEEN ? AND ?",
                (op.thread_id, base if base is not None else -(2**62), top),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        by_id = {row[0]: row for row in rows}
        chain: list[ChainLink] = []
        link = by_id.get(op.checkpoint_id)
        while link is not None:
            chain.append(ChainLink(link[0], link[1], link[2], unpack_snapshot(link[3])))
            if link[3] is not None or link[1] is None:
                chain.reverse()
                return chain
            if len(chain) > len(rows):  # a cycle: check_chain reports it
                chain.reverse()
                return chain
            link = by_id.get(link[1])
        return None

    def _read_history(self, conn: sqlite3.Connection, op: ops.ReadHistory) -> list[StoredCheckpoint]:
        conn.execute("BEGIN")
        if self._visible_head(conn, op.thread_id, op.now) is None:
            raise ThreadNotFoundError(op.thread_id)
        params = [op.thread_id]
        if op.before is not None:
            found = conn.execute(
                f"SELECT seq FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id = ?", (op.thread_id, op.before)
            ).fetchone()
            if found is None:
                raise CheckpointNotFoundError(op.thread_id, op.before)
            params.append(found[0])
        query = history_query(CHECKPOINTS, "?", before=op.before is not None, limit=op.limit)
        rows = conn.execute(query, params).fetchall()
        conn.execute("COMMIT")
        return [stored_row(found) for found in rows]

    def _read_threads(self, conn: sqlite3.Connection, op: ops.ReadThreads) -> list[ThreadInfo]:
        rows = conn.execute(
            f"SELECT t.thread_id, t.head_id, (SELECT count(*) FROM {CHECKPOINTS} AS c "
            f"WHERE c.thread_id = t.thread_id), t.created_at, t.updated_at FROM {THREADS} AS t WHERE {_VISIBLE} "
            "ORDER BY t.updated_at DESC, t.thread_id",
            {"now": epoch(op.now)},
        ).fetchall()
        return [ThreadInfo(r[0], r[1], int(r[2]), _time(r[3]), _time(r[4])) for r in rows]

    def _delete(self, conn: sqlite3.Connection, op: ops.DeleteThread) -> bool:
        params = {"thread": op.thread_id, "now": epoch(op.now)}
        if op.only_expired:
            condition = (
                f"expires_at IS NOT NULL AND expires_at <= :now AND NOT EXISTS (SELECT 1 FROM {LEASES} AS l "
                "WHERE l.thread_id = :thread AND l.expires_at > :now)"
            )
        else:
            condition = _VISIBLE
        found = conn.execute(f"SELECT 1 FROM {THREADS} WHERE thread_id = :thread AND {condition}", params).fetchone()
        exists = conn.execute(f"SELECT 1 FROM {THREADS} WHERE thread_id = ?", (op.thread_id,)).fetchone()
        if exists is None or (found is None and op.only_expired):
            return False
        conn.execute(f"DELETE FROM {CHECKPOINTS} WHERE thread_id = ?", (op.thread_id,))
        conn.execute(f"DELETE FROM {THREADS} WHERE thread_id = ?", (op.thread_id,))
        conn.execute(f"DELETE FROM {LEASES} WHERE thread_id = ?", (op.thread_id,))
        return found is not None

    def _prune_candidates(self, conn: sqlite3.Connection, op: ops.ReadPruneCandidates) -> tuple[list[str], list[str]]:
        where = "WHERE thread_id = :thread" if op.thread_id is not None else ""
        rows = conn.execute(
            f"SELECT thread_id, expires_at IS NOT NULL AND expires_at <= :now FROM {THREADS} {where} "
            "ORDER BY thread_id",
            {"thread": op.thread_id, "now": epoch(op.now)},
        ).fetchall()
        return [r[0] for r in rows if not r[1]], [r[0] for r in rows if r[1]]

    def _set_snapshot(self, conn: sqlite3.Connection, op: ops.SetSnapshot) -> None:
        conn.execute(
            f"UPDATE {CHECKPOINTS} SET snapshot = ?, chain_bytes = 0, base_bytes = ? "
            "WHERE thread_id = ? AND checkpoint_id = ?",
            (pack_snapshot(op.snapshot), len(op.snapshot), op.thread_id, op.checkpoint_id),
        )

    def _delete_checkpoints(self, conn: sqlite3.Connection, op: ops.DeleteCheckpoints) -> int:
        deleted = 0
        for start in range(0, len(op.checkpoint_ids), 500):
            batch = op.checkpoint_ids[start : start + 500]
            marks = ", ".join("?" * len(batch))
            deleted += conn.execute(
                f"DELETE FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_id IN ({marks}) AND checkpoint_id "
                f"NOT IN (SELECT head_id FROM {THREADS} WHERE thread_id = ?)",
                (op.thread_id, *batch, op.thread_id),
            ).rowcount
        return deleted

    def _set_ttl(self, conn: sqlite3.Connection, op: ops.SetTTL) -> bool:
        found = conn.execute(
            f"SELECT updated_at FROM {THREADS} WHERE thread_id = :thread AND {_VISIBLE}",
            {"thread": op.thread_id, "now": epoch(op.now)},
        ).fetchone()
        if found is None:
            return False
        expires = _time(found[0]).timestamp() + op.ttl if op.ttl is not None else None
        conn.execute(
            f"UPDATE {THREADS} SET ttl = ?, expires_at = ? WHERE thread_id = ?", (op.ttl, expires, op.thread_id)
        )
        return True

    def _acquire(self, conn: sqlite3.Connection, op: ops.AcquireLease) -> LeaseHolder | None:
        # Taken unless another owner's live lease holds the thread (one statement; the holder is read if so).
        taken = conn.execute(
            f"INSERT INTO {LEASES} (thread_id, owner, expires_at) VALUES (?, ?, ?) ON CONFLICT (thread_id) "
            "DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at, stop_requested = 0 "
            f"WHERE {LEASES}.owner = excluded.owner OR {LEASES}.expires_at <= ?",
            (op.thread_id, op.owner, epoch(op.expires_at), epoch(op.now)),
        ).rowcount
        if taken:
            return None
        found = conn.execute(f"SELECT owner, expires_at FROM {LEASES} WHERE thread_id = ?", (op.thread_id,)).fetchone()
        return LeaseHolder(found[0], from_epoch(found[1]))

    def _hold(self, conn: sqlite3.Connection, op: ops.HoldThread) -> tuple[LeaseHolder | None, str | None]:
        holder = self._acquire(conn, ops.AcquireLease(op.thread_id, op.owner, op.now, op.expires_at))
        if holder is not None:
            return holder, None
        return None, self._visible_head(conn, op.thread_id, op.now)

    def _renew(self, conn: sqlite3.Connection, op: ops.RenewLease) -> bool | None:
        found = conn.execute(
            f"UPDATE {LEASES} SET expires_at = ? WHERE thread_id = ? AND owner = ? RETURNING stop_requested",
            (epoch(op.expires_at), op.thread_id, op.owner),
        ).fetchone()
        return bool(found[0]) if found is not None else None

    def _request_stop(self, conn: sqlite3.Connection, op: ops.RequestStop) -> bool:
        query = f"UPDATE {LEASES} SET stop_requested = 1 WHERE thread_id = ? AND expires_at > ?"
        return conn.execute(query, (op.thread_id, epoch(op.now))).rowcount == 1

    def _release(self, conn: sqlite3.Connection, op: ops.ReleaseLease) -> bool:
        query = f"DELETE FROM {LEASES} WHERE thread_id = ? AND owner = ?"
        return conn.execute(query, (op.thread_id, op.owner)).rowcount == 1

    def _read_lease(self, conn: sqlite3.Connection, op: ops.ReadLease) -> LeaseHolder | None:
        found = conn.execute(f"SELECT owner, expires_at FROM {LEASES} WHERE thread_id = ?", (op.thread_id,)).fetchone()
        return LeaseHolder(found[0], from_epoch(found[1])) if found is not None else None


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)
