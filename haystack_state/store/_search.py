"""
The pure logic of a store's search, shared by every backend: filters (checked, compared in Python, and the part a
database may evaluate first), the text that full-text search indexes, query terms, a BM25 ranking for the in-memory
store, and cosine similarity for semantic search.

A database backend may narrow the candidates with the *pushable* conditions of a filter, but every candidate is
checked again here, so a filter means the same on every backend.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from haystack_state.errors import StoreInputError

__all__ = [
    "OPERATORS",
    "Condition",
    "bm25_scores",
    "check_filter",
    "cosine",
    "index_text",
    "matches",
    "pushable",
    "query_terms",
]

OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
_WORD = re.compile(r"\w+", re.UNICODE)
_INT64 = 2**63


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    """One condition of a filter: ``value[field] <op> operand``."""

    field: str
    op: str
    operand: Any


def check_filter(filter: object) -> list[Condition]:
    """
    Check a filter: ``{"field": value}`` (equality) or ``{"field": {"$gt": value, ...}}`` with the operators
    ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, on the value's top-level fields.

    :returns: The conditions (all must hold).
    :raises StoreInputError: Naming the field or operator at fault.
    """
    if filter is None:
        return []
    if not isinstance(filter, Mapping):
        raise StoreInputError(f"filter must be a dict of field -> value, got {type(filter).__name__}.")
    conditions: list[Condition] = []
    for field, wanted in filter.items():
        if not isinstance(field, str) or not field:
            raise StoreInputError(f"filter field {field!r} must be a non-empty string.")
        if isinstance(wanted, Mapping) and wanted and all(isinstance(k, str) and k.startswith("$") for k in wanted):
            for op, operand in wanted.items():
                if op not in OPERATORS:
                    raise StoreInputError(
                        f"filter field {field!r}: unknown operator {op!r}; known: {', '.join(OPERATORS)}."
                    )
                if op in ("$gt", "$gte", "$lt", "$lte") and not _orderable(operand):
                    raise StoreInputError(
                        f"filter field {field!r}: {op} needs a number or a string, got {type(operand).__name__}."
                    )
                conditions.append(Condition(field, op, operand))
        else:
            conditions.append(Condition(field, "$eq", wanted))
    return conditions


def _orderable(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool))


def _same(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    try:
        return bool(a == b)
    except Exception:
        return False


def _compare(stored: Any, op: str, operand: Any) -> bool:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (stored, operand))
    if not numbers and not (isinstance(stored, str) and isinstance(operand, str)):
        return False
    if op == "$gt":
        return bool(stored > operand)
    if op == "$gte":
        return bool(stored >= operand)
    if op == "$lt":
        return bool(stored < operand)
    return bool(stored <= operand)


def matches(value: Mapping[str, Any], conditions: Iterable[Condition]) -> bool:
    """
    Whether a (decoded) value meets every condition. Equality is strict about booleans (``True`` is not ``1``); a
    missing field equals nothing (so ``$ne`` holds); order compares numbers with numbers and strings with strings.
    """
    for condition in conditions:
        present = condition.field in value
        stored = value.get(condition.field)
        if condition.op == "$eq":
            ok = present and _same(stored, condition.operand)
        elif condition.op == "$ne":
            ok = not (present and _same(stored, condition.operand))
        else:
            ok = present and _compare(stored, condition.op, condition.operand)
        if not ok:
            return False
    return True


def pushable(condition: Condition) -> bool:
    """
    Whether a database may evaluate the condition itself: a scalar operand that JSON stores as itself (a string
    without NUL or lone surrogates, a 64-bit integer, a finite float, a bool, None) on a plain field name.
    """
    field, operand = condition.field, condition.operand
    if any(ch in field for ch in '"\\\x00') or not field.isprintable():
        return False
    if operand is None or isinstance(operand, bool):
        return condition.op in ("$eq", "$ne")
    if isinstance(operand, int):
        return -_INT64 <= operand < _INT64
    if isinstance(operand, float):
        return math.isfinite(operand)
    if isinstance(operand, str):
        try:
            operand.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return "\x00" not in operand
    return False


def index_text(value: Mapping[str, Any], fields: Sequence[str] | None) -> str:
    """
    The text that full-text search indexes for a value: every string in it (keys excluded), or only in the given
    top-level ``fields`` (``"$"`` means the whole value). NUL characters are dropped.
    """
    parts: list[str] = []
    roots: list[Any] = [value] if not fields or "$" in fields else [value.get(f) for f in fields if f in value]
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            parts.append(node)
        elif isinstance(node, Mapping):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list | tuple | set | frozenset):
            stack.extend(reversed(list(node)))
    return "\n".join(parts).replace("\x00", " ")


def query_terms(query: str) -> list[str]:
    """The words of a search query, lower-cased and de-duplicated, in order (at most 32)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
    return list(seen)[:32]


def bm25_scores(texts: Sequence[str], terms: Sequence[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """
    BM25 relevance of each text to the terms, over this set of texts (0 for a text that has none of them).

    :param texts: The candidate texts.
    :param terms: The query terms (lower case).
    """
    docs = [Counter(_WORD.findall(text.lower())) for text in texts]
    if not docs:
        return []
    lengths = [sum(doc.values()) for doc in docs]
    average = (sum(lengths) / len(docs)) or 1.0
    scores = [0.0] * len(docs)
    for term in terms:
        having = sum(1 for doc in docs if term in doc)
        if not having:
            continue
        idf = math.log(1 + (len(docs) - having + 0.5) / (having + 0.5))
        for i, doc in enumerate(docs):
            tf = doc.get(term, 0)
            if tf:
                scores[i] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths[i] / average))
    return scores


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors (0 if either is all zeros)."""
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
