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
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from haystack_state._text import find_bad_text, shown, text_problem
from haystack_state.errors import UnstorableTextError
from haystack_state.persistence.codec import encode, to_json

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


def replace(value: object) -> dict[str, Any]:
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


def validate_delta(delta: object) -> None:
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
            encoded[key] = {"op": "extend", "items": encode(list(op["items"]), key=key, compact=True)}
        elif op["op"] == "replace":
            encoded[key] = {"op": "replace", "value": encode(op["value"], key=key, compact=True)}
        else:
            encoded[key] = {"op": "delete"}
    return encoded


def delta_json(delta: Delta, encoded: Mapping[str, Mapping[str, Any]]) -> str:
    """
    The JSON text a commit stores for its delta (see :func:`encode_delta`), refusing text that is not valid Unicode.

    :param delta: The delta, with decoded values.
    :param encoded: The same delta encoded.
    :returns: The JSON text.
    :raises UnstorableTextError: Naming the state key and where in its value the text is.
    """
    try:
        return to_json(encoded, strict=True)
    except UnstorableTextError:
        raise _delta_text_error(delta, encoded) from None


def _delta_text_error(delta: Delta, encoded: Mapping[str, Mapping[str, Any]]) -> UnstorableTextError:
    for key, op in delta.items():
        problem = text_problem(key)
        if problem is not None:
            return UnstorableTextError(key, problem, subject=f"The name of state key {shown(key)}", value=key)
        extend = op["op"] == "extend"
        found = find_bad_text(list(op["items"]) if extend else op.get("value"))
        where = " of the appended items" if extend else ""
        if found is None:  # inside an object the walk does not look into: where it is as stored
            found = find_bad_text(encoded[key].get("items", encoded[key].get("value")))
            where += " (as stored)"
        if found is not None:
            return UnstorableTextError(key, found.problem, path=(found.python_path() + where).strip())
    return UnstorableTextError(None, "text that is not valid Unicode", subject="The delta")


def checked_json(data: object, value: object, subject: str) -> str:
    """
    The JSON text of encoded data (checkpoint metadata), refusing text that is not valid Unicode.

    :param data: The encoded data.
    :param value: The value it was encoded from (searched for the text when it is refused).
    :param subject: What the value is, for the error (``"The checkpoint metadata"``).
    :raises UnstorableTextError: Naming ``subject`` and where in the value the text is.
    """
    try:
        return to_json(data, strict=True)
    except UnstorableTextError as error:
        found = find_bad_text(value) or find_bad_text(data)
        if found is None:
            raise UnstorableTextError(None, error.reason, subject=subject) from None
        raise UnstorableTextError(None, found.problem, path=found.python_path(), subject=subject) from None


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
                raise ExtendError(key, current)
            new[key] = [*current, *op["items"]]
        elif kind == "replace":
            new[key] = op["value"]
        elif kind == "delete":
            new.pop(key, None)
        else:
            raise ValueError(f"unknown operation {kind!r} on state key '{key}'")
    return new


class ExtendError(ValueError):
    """
    An ``extend`` operation met a value that is not a list.

    :param key: The state key.
    :param value: The value the key held.
    :param checkpoint_id: The checkpoint whose delta holds the ``extend`` (None if unknown).
    """

    def __init__(self, key: str, value: object, checkpoint_id: str | None = None) -> None:
        super().__init__(f"cannot extend state key '{key}': its value is a {type(value).__name__}, not a list")
        self.key = key
        self.checkpoint_id = checkpoint_id


def compose_deltas(
    deltas: Iterable[tuple[str, Mapping[str, Mapping[str, Any]]]],
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """
    Fold a run of deltas into one delta that has the same effect on any state.

    Applying the result costs one pass over the surviving values, however many deltas it folds (applying the deltas
    one by one copies an extended list once per delta), and a value that a later delta replaces or deletes is dropped
    before anything decodes it. Works on encoded and on decoded deltas alike. The lists in the result are new (the
    given deltas are not modified), but the items and replaced values are the given ones.

    An ``extend`` that a later ``replace`` or ``delete`` overrides leaves no trace in the composed delta, so check the
    state it is applied to with :func:`check_extends` first: applied one by one, such an extend fails if that state
    holds something other than a list.

    :param deltas: ``(checkpoint_id, delta)`` pairs, oldest first; the deltas validated.
    :returns: The composed delta, and the keys whose first operation is an ``extend``, each with the id of the
        checkpoint that holds it: the state the composed delta is applied to must hold a list (or nothing) there.
    :raises ExtendError: If a delta extends a value that an earlier one replaced with something other than a list.
    """
    composed: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    for checkpoint_id, delta in deltas:
        for key, op in delta.items():
            kind = op["op"]
            if kind == "extend":
                previous = composed.get(key)
                if previous is None:
                    composed[key] = {"op": "extend", "items": list(op["items"])}
                    origins.setdefault(key, checkpoint_id)
                elif previous["op"] == "extend":
                    previous["items"].extend(op["items"])
                elif previous["op"] == "replace":
                    if not isinstance(previous["value"], list):
                        raise ExtendError(key, previous["value"], checkpoint_id)
                    previous["value"].extend(op["items"])
                else:  # extending a deleted key starts a new list
                    composed[key] = {"op": "replace", "value": list(op["items"])}
            elif kind == "replace":
                value = op["value"]
                # A list is copied, since later extends grow it in place.
                composed[key] = {"op": "replace", "value": list(value) if isinstance(value, list) else value}
                origins.setdefault(key, "")
            elif kind == "delete":
                composed[key] = {"op": "delete"}
                origins.setdefault(key, "")
            else:
                raise ValueError(f"unknown operation {kind!r} on state key '{key}'")
    return composed, {key: checkpoint_id for key, checkpoint_id in origins.items() if checkpoint_id}


def check_extends(state: Mapping[str, Any], origins: Mapping[str, str]) -> None:
    """
    Check that a state can take the extends a composed delta began with (see :func:`compose_deltas`).

    :param state: The state the composed delta is to be applied to.
    :param origins: The keys whose first operation is an ``extend``, with its checkpoint.
    :raises ExtendError: If the state holds something other than a list at one of them (naming its checkpoint).
    """
    for key, checkpoint_id in origins.items():
        current = state.get(key)
        if key in state and not isinstance(current, list):
            raise ExtendError(key, current, checkpoint_id)


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
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"  # str(uuid.UUID(int=value))


def utc_now() -> dt.datetime:
    """Return the current time as a timezone-aware UTC datetime."""
    return dt.datetime.now(dt.UTC)
