"""
JSON text of encoded data, as the checkpointers store it: compact, UTF-8 (text that UTF-8 cannot hold is escaped, or
refused where a commit writes it), and strict when read back (``NaN`` and ``Infinity`` are not JSON). The encoding of
values into JSON-ready data is :mod:`haystack_state.persistence.codec`'s.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from haystack_state._text import text_problem
from haystack_state.errors import CodecError, UnstorableTextError

__all__ = ["from_json", "to_json"]


def to_json(data: object, *, strict: bool = False) -> str:
    """
    Serialize already-encoded data to compact JSON text.

    Non-ASCII text is kept as is; if the text cannot be stored as UTF-8 (lone surrogates), it is escaped instead, or
    refused with ``strict``.

    :param data: JSON-compatible data, as returned by :func:`~haystack_state.persistence.codec.encode`.
    :param strict: Refuse text that is not valid Unicode (see :mod:`haystack_state._text`) instead of escaping it, as
        a checkpointer does for what a commit writes. The check is the UTF-8 test that serializing does anyway.
    :returns: The JSON text.
    :raises CodecError: If the data is not JSON-compatible.
    :raises UnstorableTextError: With ``strict``, for text that is not valid Unicode (naming no key: the caller
        knows which value it serialized).
    """
    try:
        text = _ENCODER.encode(data)
    except (TypeError, ValueError) as error:
        raise CodecError(f"Cannot serialize encoded data to JSON: {error}") from None
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        if strict:
            raise UnstorableTextError(None, text_problem(text) or str(error)) from None
        text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text


# One encoder for all data (json.dumps builds a new one per call when given options).
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def from_json(text: str | bytes) -> Any:
    """
    Parse JSON text into data (not yet decoded: tagged objects are still dicts).

    :param text: The JSON text.
    :returns: The parsed data.
    :raises CodecError: If the text is not valid JSON.
    """
    try:
        if type(text) is str:
            return _DECODER.decode(text)
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        raise CodecError(f"Stored data is not valid JSON: {error}") from None


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON constant {name}")


# One decoder for all text (json.loads builds a new one per call when given parse_constant).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
