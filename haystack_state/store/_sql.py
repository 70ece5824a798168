"""
The SQL that both SQL stores (:class:`~haystack_state.store.sqlite.SQLiteStore` and
:class:`~haystack_state.store.postgres.PostgresStore`) build alike, in the driver's parameter style: ``mark`` turns a
parameter's name into its placeholder (``:name`` on SQLite, ``%(name)s`` on PostgreSQL).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from haystack_state.store import ops
from haystack_state.store._search import Condition

__all__ = ["COLUMNS", "ConditionSQL", "Placeholder", "SearchSQL", "prefix_sql", "search_query"]

#: A parameter's placeholder from its name.
Placeholder = Callable[[str], str]
#: The SQL of one pushable condition (its index, the condition), adding its parameters to the dict given.
ConditionSQL = Callable[[int, Condition, dict[str, Any]], str]
#: An item's columns, in the order of :class:`~haystack_state.store.records.Row` (a search adds the score and vector).
COLUMNS = "s.namespace, s.key, s.value, s.created_at, s.updated_at, s.ttl"


@dataclasses.dataclass(frozen=True)
class SearchSQL:
    """How one database writes a store search; :func:`search_query` builds the statement from it."""

    #: A parameter's placeholder from its name.
    mark: Placeholder
    #: The SQL of one pushable condition.
    condition_sql: ConditionSQL
    #: The items' table.
    items: str
    #: The SQL that is true for an item whose value the database cannot test (it passes: the store checks every row
    #: again).
    unchecked: str
    #: The ``LIMIT`` of an offset without a limit (``ALL`` on PostgreSQL, ``-1`` on SQLite).
    no_limit: str
    #: The score of an item when the search has no query (a typed NULL).
    no_score: str
    #: For a full-text query's terms: its score, the tables to select from (the items as ``s``), the match condition
    #: and the first ``ORDER BY`` key (best first), its parameters added to the dict given.
    ranked: Callable[[Sequence[str], dict[str, Any]], tuple[str, str, str, str]]


def search_query(op: ops.Search, sql: SearchSQL) -> tuple[str, dict[str, Any]]:
    """
    A search's statement and its parameters: the live items under the prefix that pass the conditions the database
    can test, best match first for a query (most recently updated first otherwise), one page of them.
    """
    where, page, params = _search_clauses(op, sql)
    vector = ", s.vector" if op.vectors else ", NULL"
    score, source, order = sql.no_score, f"{sql.items} AS s", ""
    if op.terms is not None:
        score, source, match, first = sql.ranked(op.terms, params)
        where, order = f"{match} AND {where}", f"{first}, "
    query = (
        f"SELECT {COLUMNS}, {score}{vector} FROM {source} WHERE {where} "
        f"ORDER BY {order}s.updated_at DESC, s.namespace, s.key{page}"
    )
    return query, params


def prefix_sql(prefix: str, params: dict[str, Any], mark: Placeholder) -> str:
    """The test of ``s.namespace`` for the namespaces under ``prefix`` (``""``: all), its parameters added."""
    if not prefix:
        return "1 = 1"
    params["prefix"], params["low"], params["high"] = prefix, prefix + ".", prefix + "/"  # '/' follows '.'
    return f"(s.namespace = {mark('prefix')} OR (s.namespace > {mark('low')} AND s.namespace < {mark('high')}))"


def _search_clauses(op: ops.Search, sql: SearchSQL) -> tuple[str, str, dict[str, Any]]:
    """A search's WHERE condition, its ``LIMIT ... OFFSET ...`` clause (or ``""``) and their parameters."""
    mark = sql.mark
    params: dict[str, Any] = {"now": op.now}
    where = [prefix_sql(op.prefix, params, mark), f"(s.expires_at IS NULL OR s.expires_at > {mark('now')})"]
    if op.conditions:
        tests = " AND ".join(sql.condition_sql(i, c, params) for i, c in enumerate(op.conditions))
        where.append(f"({sql.unchecked} OR ({tests}))")
    page = ""
    if op.limit is not None or op.offset:
        page = f" LIMIT {sql.no_limit if op.limit is None else mark('limit')} OFFSET {mark('offset')}"
        params["limit"], params["offset"] = op.limit, op.offset
    return " AND ".join(where), page, params
