"""
The SQL that both SQL stores (:class:`~haystack_state.store.sqlite.SQLiteStore` and
:class:`~haystack_state.store.postgres.PostgresStore`) build alike, in the driver's parameter style: ``mark`` turns a
parameter's name into its placeholder (``:name`` on SQLite, ``%(name)s`` on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from haystack_state.store import ops
from haystack_state.store._search import Condition

__all__ = ["ConditionSQL", "Mark", "prefix_sql", "search_clauses"]

#: A parameter's placeholder from its name.
Mark = Callable[[str], str]
#: The SQL of one pushable condition (its index, the condition), adding its parameters to the dict given.
ConditionSQL = Callable[[int, Condition, dict[str, Any]], str]


def prefix_sql(prefix: str, params: dict[str, Any], mark: Mark) -> str:
    """The test of ``s.namespace`` for the namespaces under ``prefix`` (``""``: all), its parameters added."""
    if not prefix:
        return "1 = 1"
    params["prefix"], params["low"], params["high"] = prefix, prefix + ".", prefix + "/"  # '/' follows '.'
    return f"(s.namespace = {mark('prefix')} OR (s.namespace > {mark('low')} AND s.namespace < {mark('high')}))"


def search_clauses(
    op: ops.Search, mark: Mark, condition_sql: ConditionSQL, *, unchecked: str, no_limit: str
) -> tuple[str, str, dict[str, Any]]:
    """
    A search's WHERE condition (the live items under the prefix that pass the conditions the database can test), its
    ``LIMIT ... OFFSET ...`` clause (or ``""``) and their parameters.

    :param op: The search.
    :param mark: A parameter's placeholder from its name.
    :param condition_sql: The SQL of one pushable condition.
    :param unchecked: The SQL that is true for an item whose value the database cannot test (it passes: the store
        checks every row again).
    :param no_limit: The ``LIMIT`` of an offset without a limit (``ALL`` on PostgreSQL, ``-1`` on SQLite).
    """
    params: dict[str, Any] = {"now": op.now}
    where = [prefix_sql(op.prefix, params, mark), f"(s.expires_at IS NULL OR s.expires_at > {mark('now')})"]
    if op.conditions:
        tests = " AND ".join(condition_sql(i, c, params) for i, c in enumerate(op.conditions))
        where.append(f"({unchecked} OR ({tests}))")
    page = ""
    if op.limit is not None or op.offset:
        page = f" LIMIT {no_limit if op.limit is None else mark('limit')} OFFSET {mark('offset')}"
        params["limit"], params["offset"] = op.limit, op.offset
    return " AND ".join(where), page, params
