"""
Comparing what two runs wrote: every message gets a fresh id (``meta["id"]``) when it enters a thread, so the same
conversation written twice differs only in its ids. :func:`without_ids` takes them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from haystack.dataclasses import ChatMessage


def without_ids(value: Any) -> Any:
    """``value`` with ``meta["id"]`` taken out of every ChatMessage in it (in lists, tuples and dicts too)."""
    if isinstance(value, ChatMessage):
        meta = {key: item for key, item in value.meta.items() if key != "id"}
        return ChatMessage(_role=value.role, _content=list(value._content), _name=value.name, _meta=meta)
    if isinstance(value, Mapping):
        return {key: without_ids(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_ids(item) for item in value]
    return value
