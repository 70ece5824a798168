"""
Latency of the long-term memory store's ``put`` and ``search``, ours beside LangGraph's ``SqliteStore`` and
``PostgresStore``, on the same data in one process.

Every store gets the same N items (``("users", "u<k>", "memories")`` for 100 users, values ``{"text": 12 words,
"n": i, "tag": "a"|"b"|"c"}``), put one call at a time: that is the put latency. Then each store answers the same
searches, one call at a time (limit 10):

- ``prefix``: the newest items of one user (``search(("users", "u<k>"))``);
- ``filter``: the same with ``filter={"tag": "b"}``;
- ``query``: ours only, full-text search for one word under one user (FTS5 / ``tsvector``, ranked). LangGraph's
  stores without an embedding index ignore ``query``, so there is nothing to compare it with.

Reports p50 and p99 per operation and backend, and our p50 / LangGraph's p50 (below 1 is faster). Needs
``langgraph-checkpoint-sqlite`` and ``langgraph-checkpoint-postgres`` (the ``bench`` extra) and, for PostgreSQL, the
server at ``HAYSTACK_STATE_POSTGRES_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``).

Usage::

    python benchmarks/bench_store.py              # 10,000 and 100,000 items
    python benchmarks/bench_store.py --quick      # 1,000 items, a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DSN = os.environ.get("HAYSTACK_STATE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
USERS = 100
SEARCHES = 200


def make_data(count: int, seed: int = 7) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(2000)] + ["coffee", "tea", "rain", "holiday", "allergy"] * 40
    return [
        (
            ("users", f"u{i % USERS}", "memories"),
            f"m{i}",
            {"text": " ".join(rng.choice(words) for _ in range(12)), "n": i, "tag": "abc"[i % 3]},
        )
        for i in range(count)
    ]


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3


def timed(calls: Iterator[Callable[[], Any]]) -> list[float]:
    samples = []
    for call in calls:
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    import psycopg
    from psycopg import sql

    name = f"bench_store_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@contextlib.contextmanager
def stores(backend: str, folder: Path) -> Iterator[tuple[Any, Any]]:
    """(ours, LangGraph's) on the backend, each on its own database or schema."""
    if backend == "sqlite":
        from langgraph.store.sqlite import SqliteStore

        from haystack_state.store import SQLiteStore

        conn = sqlite3.connect(folder / "langgraph.db", check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # as ours: durable against a crash of the process
        theirs = SqliteStore(conn)
        theirs.setup()
        with SQLiteStore(folder / "ours.db") as ours:
            yield ours, theirs
        conn.close()
        return
    import psycopg
    from langgraph.store.postgres import PostgresStore as LangGraphPostgresStore
    from psycopg.rows import dict_row

    from haystack_state.store.postgres import PostgresStore

    with postgres_schema() as mine, postgres_schema() as other:
        conn = psycopg.connect(
            DSN, autocommit=True, prepare_threshold=0, row_factory=dict_row, options=f"-c search_path={other}"
        )
        theirs = LangGraphPostgresStore(conn)
        theirs.setup()
        with PostgresStore(DSN, schema=mine) as ours:
            yield ours, theirs
        conn.close()


def run(backend: str, count: int) -> list[tuple[str, str, float, float, float | None, float | None]]:
    data = make_data(count)
    rng = random.Random(11)
    users = [("users", f"u{rng.randrange(USERS)}") for _ in range(SEARCHES)]
    rows = []
    with tempfile.TemporaryDirectory() as folder, stores(backend, Path(folder)) as (ours, theirs):
        results: dict[str, dict[str, list[float]]] = {"ours": {}, "langgraph": {}}
        for name, store in (("ours", ours), ("langgraph", theirs)):
            results[name]["put"] = timed((lambda ns=ns, k=k, v=v, s=store: s.put(ns, k, v)) for ns, k, v in data)
            results[name]["prefix"] = timed((lambda u=u, s=store: s.search(u, limit=10)) for u in users)
            results[name]["filter"] = timed(
                (lambda u=u, s=store: s.search(u, filter={"tag": "b"}, limit=10)) for u in users
            )
        results["ours"]["query"] = timed((lambda u=u: ours.search(u, query="coffee", limit=10)) for u in users)
        assert len(ours.search((), query="coffee", limit=10)) == 10  # the query does find items
        for operation in ("put", "prefix", "filter", "query"):
            p50, p99 = percentiles(results["ours"][operation])
            theirs_p = results["langgraph"].get(operation)
            t50, t99 = percentiles(theirs_p) if theirs_p else (None, None)
            rows.append((operation, backend, p50, p99, t50, t99))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 items only")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    args = parser.parse_args()
    counts = [1_000] if args.quick else [10_000, 100_000]
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'items':>8} {'backend':>9} {'op':>7} {'ours p50':>9} {'p99':>7} {'LG p50':>8} {'p99':>7} {'ratio':>6}")
    for count in counts:
        for backend in args.backends.split(","):
            for operation, name, p50, p99, t50, t99 in run(backend, count):
                theirs = f"{t50:8.3f} {t99:7.3f} {p50 / t50:6.2f}" if t50 and t99 else f"{'-':>8} {'-':>7} {'-':>6}"
                print(f"{count:>8} {name:>9} {operation:>7} {p50:9.3f} {p99:7.3f} {theirs}", flush=True)


if __name__ == "__main__":
    main()
