"""
Pure helpers shared by every checkpointer: delta operations, their encoding, materialization and checkpoint ids.

A *delta* maps each state key that a checkpoint changed to one operation:

- ``{"op": "extend", "items": [...]}``: the items are appended to the key's list (an absent key starts empty);
- ``{"op": "replace", "value": ...}``: the key is set to the value;
- ``{"op": "delete"}``: the key is removed.

The state of a checkpoint is the result of applying the deltas of its ancestors, root first, and then its own.
These functions work on decoded values and on encoded (JSON) data alike, because the codec encodes a list as a JSON
array of its encoded items; the checkpointers materialize encoded data and decode it once at the end.
"""

from __future__ import annotations

import datetime as dt
import secrets
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from haystack_state.persistence.codec import encode

Source = Literal["input", "model", "tools", "update"]
SOURCES: tuple[str, ...] = ("input", "model", "tools", "update")
OPS: tuple[str, ...] = ("extend", "replace", "delete")

Delta = Mapping[str, Mapping[str, Any]]


def extend(items: Iterable[Any]) -> dict[str, Any]:
    """
    Build an ``extend`` operation.

    :param items: The items appended to the key's list.
    :returns: ``{"op": "extend", "items": [...]}``.
    """
    return {"op": "extend", "items": list(items)}


def replace(value: Any) -> dict[str, Any]:
    """
    Build a ``replace`` operation.

    :param value: The key's new value.
    :returns: ``{"op": "replace", "value": value}``.
    """
    return {"op": "replace", "value": value}


def delete() -> dict[str, Any]:
    """
    Build a ``delete`` operation.

    :returns: ``{"op": "delete"}``.
    """
    return {"op": "delete"}


def validate_delta(delta: Any) -> None:
    """
    Check the shape of a delta.

    :param delta: The delta to check.
    :raises ValueError: If the delta is not a mapping from string keys to well-formed operations.
    """
    if not isinstance(delta, Mapping):
        raise ValueError(f"A delta must be a mapping from state keys to operations, got {type(delta).__name__}.")
    for key, op in delta.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"Delta keys must be non-empty strings, got {key!r}.")
        kind = op.get("op") if isinstance(op, Mapping) else None
        if kind not in OPS:
            raise ValueError(f"Delta for state key '{key}': expected an operation with op in {OPS}, got {op!r}.")
        expected = {"op", "items"} if kind == "extend" else {"op", "value"} if kind == "replace" else {"op"}
        if set(op) != expected:
            raise ValueError(
                f"Delta for state key '{key}': a '{kind}' operation has exactly the fields {sorted(expected)}, "
                f"got {sorted(op)}."
            )
        if kind == "extend" and (
            isinstance(op["items"], str | bytes | Mapping) or not isinstance(op["items"], Iterable)
        ):
            raise ValueError(f"Delta for state key '{key}': 'items' must be a list, got {type(op['items']).__name__}.")


def encode_delta(delta: Delta) -> dict[str, dict[str, Any]]:
    """
    Validate a delta and encode its values with the codec, before anything is written.

    :param delta: The delta, with decoded values.
    :returns: The same delta with encoded (JSON-compatible) values.
    :raises ValueError: If the delta is malformed.
    :raises CodecError: If a value cannot be encoded; the message names the state key and the path.
    """
    validate_delta(delta)
    encoded: dict[str, dict[str, Any]] = {}
    for key, op in delta.items():
        if op["op"] == "extend":
            encoded[key] = {"op": "extend", "items": encode(list(op["items"]), key=key)}
        elif op["op"] == "replace":
            encoded[key] = {"op": "replace", "value": encode(op["value"], key=key)}
        else:
            encoded[key] = {"op": "delete"}
    return encoded


def apply_delta(state: Mapping[str, Any], delta: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """
    Apply a delta to a state and return the new state; the given state is not modified.

    Only the changed keys are copied (an extended list is copied once), so the states of earlier checkpoints can be
    kept and shared safely.

    :param state: The state before the delta.
    :param delta: The delta (validated).
    :returns: The state after the delta.
    :raises ValueError: If an ``extend`` targets a key whose value is not a list.
    """
    new = dict(state)
    for key, op in delta.items():
        kind = op["op"]
        if kind == "extend":
            current = new.get(key, [])
            if not isinstance(current, list):
                raise ValueError(
                    f"cannot extend state key '{key}': its value is a {type(current).__name__}, not a list"
                )
            new[key] = [*current, *op["items"]]
        elif kind == "replace":
            new[key] = op["value"]
        elif kind == "delete":
            new.pop(key, None)
        else:
            raise ValueError(f"unknown operation {kind!r} on state key '{key}'")
    return new


def materialize(
    deltas: Iterable[Mapping[str, Mapping[str, Any]]], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """
    Apply deltas in order, starting from ``base`` (an empty state by default).

    :param deltas: The deltas, oldest first.
    :param base: The state before the first delta.
    :returns: The resulting state.
    """
    state: dict[str, Any] = dict(base or {})
    for delta in deltas:
        state = apply_delta(state, delta)
    return state


_id_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_checkpoint_id() -> str:
    """
    Return a new checkpoint id: a UUID version 7 string (48-bit Unix milliseconds, a 12-bit counter, 62 random bits).

    Ids sort by creation time as strings; ids made in the same process are strictly increasing, even within one
    millisecond or when the clock steps back.

    :returns: The id, such as ``"01890a5d-ac96-774b-bcce-b302099a8057"``.
    """
    global _last_ms, _counter
    with _id_lock:
        now = time.time_ns() // 1_000_000
        if now > _last_ms:
            _last_ms, _counter = now, 0
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    value = (ms & (2**48 - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | secrets.randbits(62)
    return str(uuid.UUID(int=value))


def utc_now() -> dt.datetime:
    """Return the current time as a timezone-aware UTC datetime."""
    return dt.datetime.now(dt.UTC)
