"""
Thread metadata as the server stores and queries it: JSON text in its threads table, filtered on top-level keys
(``jsonb`` containment on PostgreSQL; each key's value equal on SQLite, a missing key equal to null).

What the server writes can always be queried: requests are checked at the edge (see
:mod:`haystack_state.server._text` and the request models). A row that the database cannot query, written before that
check (a NUL character, which PostgreSQL's jsonb cannot hold; a lone surrogate; ``NaN``, which is not JSON) never
fails a search: the database leaves it out of its filter, and :meth:`ThreadTable.search_threads
<haystack_state.server._thread_table.ThreadTable.search_threads>` matches it here, in Python, on its repaired metadata.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from haystack import logging

from haystack_state._text import find_bad_text, repaired

__all__ = ["check_metadata", "dumps", "filter_sql", "loads", "matches", "unqueryable_sql"]

logger = logging.getLogger(__name__)

# Text that PostgreSQL cannot cast to jsonb, as Python's json writes it: a NUL or surrogate escape, NaN, Infinity. It
# may also match text that holds these words: such rows are only matched in Python, exactly, rather than in SQL.
_UNQUERYABLE_POSTGRES = r"\\u(0000|[dD][89a-fA-F])|NaN|Infinity"


def dumps(value: object) -> str:
    """Metadata as stored: compact JSON text, non-ASCII text kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def loads(text: object, thread_id: str | None = None) -> dict[str, Any]:
    """
    Stored metadata (or a run's stored JSON), as it may be read: never fails. Lone surrogates stored before they
    were refused read as U+FFFD and ``NaN``/``Infinity`` (not JSON) as null, with a warning naming the thread; text
    that is not a JSON object reads as ``{}``, with a warning.

    :param text: The stored JSON text (or already parsed data).
    :param thread_id: The thread it belongs to, for the warnings.
    """
    if not isinstance(text, str):
        return dict(text) if isinstance(text, dict) else {}
    constants: list[str] = []
    try:
        if "NaN" in text or "Infinity" in text:  # (else there is none to find: the plain, cached decoder reads it)
            value = json.loads(text, parse_constant=lambda name: constants.append(name))
        else:
            value = json.loads(text)
    except ValueError as error:
        logger.warning(
            "Thread {thread_id}: its stored metadata is not valid JSON ({error}); it reads as empty.",
            thread_id=repr(thread_id),
            error=error,
        )
        return {}
    if constants:
        logger.warning(
            "Thread {thread_id}: its stored metadata holds {constants}, which JSON has no number for (written before "
            "requests were checked); it reads as null.",
            thread_id=repr(thread_id),
            constants=", ".join(sorted(set(constants))),
        )
    value = repaired(value, text, thread_id=thread_id, what="thread metadata")
    return dict(value) if isinstance(value, dict) else {}


def check_metadata(metadata: Mapping[str, Any], what: str = "metadata") -> None:
    """
    Refuse metadata that could not be stored and queried as JSON on every backend.

    :raises ValueError: For a NUL character or a lone surrogate in a key or a string, or a non-finite number, naming
        where it is.
    """
    found = find_bad_text(metadata, nul=True, finite=True)
    if found is not None:
        path = found.python_path()
        raise ValueError(f"Thread {what}{' at ' + path if path else ''}: {found.problem}.")


def filter_sql(dialect: str, metadata: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """
    The SQL conditions of a metadata filter (one containment test, or one per top-level key), guarded so that a row
    the database cannot query is left out instead of failing the query (see :func:`unqueryable_sql`).

    :param dialect: ``"sqlite"`` or ``"postgres"``.
    :param metadata: The filter (checked with :func:`check_metadata`).
    :returns: The conditions, and their parameters.
    """
    guard, params = unqueryable_sql(dialect)
    if dialect == "postgres":
        clause = f"CASE WHEN {guard} THEN false ELSE CAST(metadata AS jsonb) @> CAST(:metadata_filter AS jsonb) END"
        return [clause], {**params, "metadata_filter": dumps(dict(metadata))}
    clauses = []
    for i, (key, value) in enumerate(metadata.items()):
        # json_each finds any key (a JSON path cannot name one holding '"'); a missing key equals null, as before.
        clauses.append(
            f"CASE WHEN {guard} THEN 0 ELSE COALESCE((SELECT m.value IS json_extract(:value_{i}, '$') "
            f"FROM json_each(metadata) AS m WHERE m.key = :key_{i}), json_extract(:value_{i}, '$') IS NULL) END"
        )
        params[f"key_{i}"] = str(key)
        params[f"value_{i}"] = dumps(value)
    return clauses, params


def unqueryable_sql(dialect: str) -> tuple[str, dict[str, Any]]:
    """
    The SQL condition that selects the rows whose metadata the database cannot query as stored (it cannot parse
    them, or they hold lone surrogates, which it would compare undecoded), and its parameters.
    """
    if dialect == "postgres":
        return "metadata ~ :unqueryable", {"unqueryable": _UNQUERYABLE_POSTGRES}
    condition = "(NOT json_valid(metadata) OR instr(metadata, :escape_lower) > 0 OR instr(metadata, :escape_upper) > 0)"
    return condition, {"escape_lower": "\\ud", "escape_upper": "\\uD"}


def matches(dialect: str, stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """
    Whether metadata matches a filter, as the database would decide (for the rows it cannot query).

    :param dialect: ``"postgres"`` (jsonb containment) or ``"sqlite"`` (each key's value equal; missing means null).
    """
    if dialect == "postgres":
        return _contains(dict(stored), dict(wanted))
    return all(_equal(stored.get(key), value) for key, value in wanted.items())


def _scalar_equal(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b and not (isinstance(a, float) and math.isnan(a))
    return type(a) is type(b) and a == b


def _equal(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return _scalar_equal(a, b)


def _contains(stored: object, wanted: object) -> bool:
    """PostgreSQL's ``jsonb @>``: objects by key, arrays by element (each wanted one in some stored one)."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(key in stored and _contains(stored[key], wanted[key]) for key in wanted)
    if isinstance(wanted, list):
        return isinstance(stored, list) and all(any(_contains(item, each) for item in stored) for each in wanted)
    if isinstance(stored, dict | list):
        return False
    return _scalar_equal(stored, wanted)
