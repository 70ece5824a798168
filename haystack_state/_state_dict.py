"""
A State in haystack-ai's ``to_dict`` format: ``{"schema": ..., "data": ...}``, written and read back.

Kept apart from :mod:`haystack_state.state` because it is a format, not a behaviour of the State: the schema goes
through :mod:`haystack_state._schema`, each value through haystack's ``_serialize_value_with_schema``. Durable threads
do not use it (checkpoints have their own codec, :mod:`haystack_state.persistence.codec`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from haystack import logging
from haystack.utils import _deserialize_value_with_schema, _serialize_value_with_schema

from haystack_state._schema import FieldSpec, schema_from_dict, schema_to_dict
from haystack_state._typecheck import type_check
from haystack_state.errors import StateSchemaError, StateSerializationError, StateTypeError, UnknownStateKeyError

__all__ = ["state_from_dict", "state_to_dict"]

logger = logging.getLogger(__name__)

S = TypeVar("S")


def state_to_dict(specs: Mapping[str, FieldSpec], values: Mapping[str, object]) -> dict[str, Any]:
    """
    Serialise a schema and its values. A value that cannot be serialised is left out, with a
    warning naming its key, as haystack-ai does.

    :param specs: The field specs to write.
    :param values: The values of those keys, thawed (see :func:`haystack_state.values.thaw`).
    :returns: ``{"schema": ..., "data": ...}``.
    :raises StateSerializationError: If a handler or a default factory cannot be serialised.
    """
    schema = schema_to_dict(specs)
    per_key: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        try:
            per_key[key] = _serialize_value_with_schema(value)
        except Exception as exc:
            logger.warning(
                "Failed to serialize the '{field_name}' field of the agent's State data. The field will be "
                "omitted from the snapshot. Error: {error}",
                field_name=key,
                error=exc,
            )
    properties = {key: item["serialization_schema"] for key, item in per_key.items()}
    data = {
        "serialization_schema": {"type": "object", "properties": properties},
        "serialized_data": {key: item["serialized_data"] for key, item in per_key.items()},
    }
    return {"schema": schema, "data": data}


def state_from_dict(build: Callable[[dict[str, Any], dict[str, Any]], S], data: Mapping[str, Any]) -> S:
    """
    Read :func:`state_to_dict` output (or haystack-ai's ``State.to_dict``) and call ``build(schema, values)``.

    Where JSON lost a type the declared type can restore (a ``Counter`` stored as an object, ...), the value is
    converted back.

    :param build: Makes the state, e.g. the ``State`` subclass itself.
    :param data: The serialised state.
    :returns: What ``build`` returns.
    :raises StateSerializationError: If the input is malformed (see ``State.from_dict``); the cause is chained.
    """
    if not isinstance(data, Mapping) or "schema" not in data:
        raise StateSerializationError("State.from_dict expects a dict with 'schema' and 'data' entries.")
    schema = schema_from_dict(data["schema"])
    raw = data.get("data") or {}
    try:
        values = _deserialize_value_with_schema(raw) if raw else {}
    except Exception as exc:
        raise StateSerializationError(f"State.from_dict cannot read the 'data' entry: {exc}") from exc
    if not isinstance(values, dict):
        raise StateSerializationError(f"State.from_dict: 'data' must hold an object, got {type(values).__name__}.")
    try:
        for key, value in values.items():
            entry = schema.get(key)
            if isinstance(entry, Mapping) and "type" in entry:
                values[key] = type_check(entry["type"]).convert(key, value)
        return build(schema, values)
    except (StateSchemaError, StateTypeError, UnknownStateKeyError, TypeError) as exc:
        raise StateSerializationError(f"State.from_dict: {exc}") from exc
