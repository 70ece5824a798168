"""
Token usage accounting of a run: summing the replies' ``usage`` meta as haystack-ai does (:func:`add_usage`), and the
context window a call used (:func:`context_tokens`). The run reads usage at every step, so these stay cheap.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any, TypeGuard

from haystack.dataclasses import ChatMessage

__all__ = ["add_reply_usage", "add_usage", "context_tokens", "is_mapping"]

_NUMBERS = frozenset({int, float})


def add_usage(total: object, usage: object) -> object:
    """
    Add a reply's ``usage`` meta to a running total, as haystack-ai does: numbers are summed, dicts are merged key by
    key, and any other value (a model name, a tier) is replaced by the newer one.

    :param total: The running total (not modified).
    :param usage: One reply's usage.
    :returns: The new total.
    """
    if type(total) in _NUMBERS and type(usage) in _NUMBERS:
        return total + usage  # type: ignore[operator]
    if is_mapping(total) and is_mapping(usage):
        result = dict(total)
        for key, value in usage.items():
            result[key] = add_usage(result[key], value) if key in result else copy.deepcopy(value)
        return result
    if isinstance(total, int | float) and isinstance(usage, int | float):
        return total + usage
    return copy.deepcopy(usage)


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, dicts first: they skip the ABC check (usage is read at every step)."""
    return isinstance(value, (dict, Mapping))  # (the tuple checks dict first)


def add_reply_usage(values: MutableMapping[str, Any], replies: Iterable[ChatMessage]) -> None:
    """Add the ``usage`` meta of each reply to the run's ``token_usage`` run value."""
    for reply in replies:
        usage = reply.meta.get("usage")
        if is_mapping(usage):
            values["token_usage"] = add_usage(values["token_usage"], usage)


def _first_number(usage: Mapping[str, object], keys: Sequence[str]) -> int:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return 0


def context_tokens(usage: Mapping[str, object]) -> int:
    """
    The size of the context window a call used, from its reply's usage: input plus output tokens (OpenAI's
    ``prompt_tokens``/``completion_tokens``, or ``input_tokens``/``output_tokens``), as haystack-ai counts it.

    :param usage: One reply's usage.
    :returns: The token count (0 if the usage reports neither).
    """
    return _first_number(usage, ("prompt_tokens", "input_tokens")) + _first_number(
        usage, ("completion_tokens", "output_tokens")
    )
