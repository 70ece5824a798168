"""
What a store holds and what it is given: :class:`Item`, and the checks of namespaces, keys, values, TTLs and paging
that every backend shares. A bad argument is a :class:`~haystack_state.errors.StoreInputError` naming it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from haystack_state._text import find_bad_text, surrogate_at
from haystack_state.errors import CodecError, StoreInputError, UnstorableTextError
from haystack_state.persistence.codec import TYPE_KEY, encode, to_json

__all__ = [
    "MAX_KEY_LENGTH",
    "MAX_LABEL_LENGTH",
    "Item",
    "Row",
    "check_key",
    "check_namespace",
    "check_paging",
    "check_prefix",
    "check_ttl",
    "encode_value",
    "join_namespace",
    "split_namespace",
]

MAX_LABEL_LENGTH = 256
MAX_KEY_LENGTH = 1024
SEPARATOR = "."


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    """
    One stored item.

    :param namespace: Its namespace, a tuple of labels such as ``("users", "u1", "memories")``.
    :param key: Its key, unique within the namespace.
    :param value: Its value (a dict; a fresh copy on every read).
    :param created_at: When the key was first written (UTC).
    :param updated_at: When it was last written (UTC).
    :param score: The relevance of the item to a search's ``query`` (higher is better); None outside such a search.
    """

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The item as JSON-ready data (the Agent Protocol's shape): lists, ISO times, the value as stored JSON."""
        data: dict[str, Any] = {
            "namespace": list(self.namespace),
            "key": self.key,
            "value": encode(self.value),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }
        if self.score is not None:
            data["score"] = self.score
        return data


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """
    A stored item as a backend reads it: the joined namespace, the value's JSON text, epoch times, and (for a
    semantic search) the stored embedding as JSON text.
    """

    namespace: str
    key: str
    value: str
    created_at: float
    updated_at: float
    ttl: float | None = None
    score: float | None = None
    vector: str | None = None


def _label_problem(label: object) -> str | None:
    if not isinstance(label, str):
        return f"is a {type(label).__name__}, not a string"
    if not label:
        return "is empty"
    if SEPARATOR in label:
        return "contains '.' (labels are joined with '.' on the wire and in storage)"
    if "\x00" in label:
        return "contains a NUL character"
    if surrogate_at(label) >= 0:
        return "contains a lone surrogate (it is not valid Unicode text)"
    if len(label) > MAX_LABEL_LENGTH:
        return f"is longer than {MAX_LABEL_LENGTH} characters"
    return None


def _labels(namespace: object, what: str, *, allow_empty: bool) -> tuple[str, ...]:
    if isinstance(namespace, str) or not isinstance(namespace, Sequence):
        raise StoreInputError(
            f"The {what} {namespace!r} must be a tuple of strings, for example ('users', 'u1', 'memories')."
        )
    labels = tuple(namespace)
    if not labels and not allow_empty:
        raise StoreInputError(f"The {what} is empty: give at least one label, for example ('memories',).")
    for index, label in enumerate(labels):
        problem = _label_problem(label)
        if problem is not None:
            raise StoreInputError(f"The {what} {labels!r} is invalid: label {index} ({label!r}) {problem}.")
    return labels


def check_namespace(namespace: object) -> tuple[str, ...]:
    """
    Check a namespace: a non-empty tuple (or list) of non-empty strings without '.' or NUL.

    :returns: The namespace as a tuple.
    :raises StoreInputError: Naming the namespace and the label at fault.
    """
    return _labels(namespace, "namespace", allow_empty=False)


def check_prefix(prefix: object, what: str = "namespace prefix") -> tuple[str, ...]:
    """Check a namespace prefix or suffix (may be empty: every namespace)."""
    if prefix is None:
        return ()
    return _labels(prefix, what, allow_empty=True)


def check_key(key: object, namespace: tuple[str, ...]) -> str:
    """
    Check a key: a non-empty string without NUL, at most ``MAX_KEY_LENGTH`` characters.

    :raises StoreInputError: Naming the key and its namespace.
    """
    if not isinstance(key, str):
        raise StoreInputError(f"The key {key!r} in namespace {namespace!r} must be a string, not {type(key).__name__}.")
    problem = None
    if not key:
        problem = "is empty"
    elif "\x00" in key:
        problem = "contains a NUL character"
    elif surrogate_at(key) >= 0:
        problem = "contains a lone surrogate (it is not valid Unicode text)"
    elif len(key) > MAX_KEY_LENGTH:
        problem = f"is longer than {MAX_KEY_LENGTH} characters"
    if problem is not None:
        raise StoreInputError(f"The key {key[:60]!r} in namespace {namespace!r} {problem}.")
    return key


def encode_value(value: object, namespace: tuple[str, ...], key: str) -> tuple[dict[str, Any], str]:
    """
    Check and encode a value: a dict with string keys, encodable by the checkpoint codec.

    :returns: The encoded value (JSON-ready data) and its JSON text.
    :raises StoreInputError: Naming the namespace, the key and the part of the value at fault.
    """
    where = f"the value of key {key!r} in namespace {namespace!r}"
    if not isinstance(value, Mapping):
        raise StoreInputError(f"{where[0].upper()}{where[1:]} must be a dict, not {type(value).__name__}.")
    for field in value:
        if not isinstance(field, str):
            raise StoreInputError(f"In {where}: field {field!r} must be a string, not {type(field).__name__}.")
        if field == TYPE_KEY:
            raise StoreInputError(f"In {where}: the field name {TYPE_KEY!r} is reserved by the codec.")
    try:
        encoded = encode(dict(value), where=where)
        return encoded, to_json(encoded, strict=True)
    except CodecError as error:
        raise StoreInputError(str(error)) from None
    except UnstorableTextError as error:
        found = find_bad_text(value)
        at = f" at {found.python_path()}" if found is not None else ""
        problem = found.problem if found is not None else error.reason
        raise StoreInputError(f"In {where}{at}: {problem}.") from None
    except RecursionError:
        raise StoreInputError(f"{where[0].upper()}{where[1:]} is nested too deeply to store.") from None


def check_ttl(ttl: object, namespace: tuple[str, ...], key: str | None = None) -> float | None:
    """A TTL in seconds (or a timedelta), positive and finite, or None."""
    if ttl is None:
        return None
    if isinstance(ttl, dt.timedelta):
        ttl = ttl.total_seconds()
    subject = f"key {key!r} in namespace {namespace!r}" if key is not None else f"namespace {namespace!r}"
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
        raise StoreInputError(f"The ttl {ttl!r} for {subject} must be a positive number of seconds, or None.")
    return float(ttl)


def check_paging(limit: Any, offset: Any, *, most: int = 10_000) -> tuple[int, int]:
    """``limit`` in 1..``most`` and ``offset`` >= 0, both integers."""
    for name, number, low in (("limit", limit, 1), ("offset", offset, 0)):
        if isinstance(number, bool) or not isinstance(number, int) or number < low:
            raise StoreInputError(f"{name} must be an integer of at least {low}, got {number!r}.")
    if limit > most:
        raise StoreInputError(f"limit must be at most {most}, got {limit}.")
    return int(limit), int(offset)


def join_namespace(namespace: tuple[str, ...]) -> str:
    """The stored form of a namespace: its labels joined with '.' (labels cannot contain one)."""
    return SEPARATOR.join(namespace)


def split_namespace(text: str) -> tuple[str, ...]:
    """The namespace of a stored, joined namespace."""
    return tuple(text.split(SEPARATOR))
