"""
How the ``haystack-state`` command writes things for a person: counts with their plural, scores, short ids, times,
sizes, aligned tables, and the commands it suggests (quoted for the shell, ``--schema`` kept); and checkpoint records
as JSON.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import math
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from haystack_state.persistence.records import CheckpointMeta
from haystack_state.values import to_jsonable

__all__ = [
    "PROG",
    "SHORT_ID",
    "WIDTH",
    "Output",
    "clip",
    "command_line",
    "jsonable",
    "meta_json",
    "plural",
    "score_text",
    "short_ids",
    "shorten",
    "size",
    "table",
    "time_text",
    "type_name",
]

#: Where a command writes its lines (``print``, or a test's list).
Output = Callable[[str], None]

PROG = "haystack-state"
#: The length of a short id: the end of an id (the random end of a checkpoint's UUIDv7).
SHORT_ID = 8
#: The width the text output fits in.
WIDTH = 100


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """
    ``1 checkpoint``, ``2 checkpoints``, ``0 checkpoints``.

    :param count: How many.
    :param noun: The singular.
    :param nouns: The plural, if it is not the singular with an ``s``.
    """
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def score_text(score: float) -> str:
    """
    A search score as a person reads it: 3 significant digits in plain decimals, never an exponent (``0.823``,
    ``12.3``, ``1235``, ``0.000001``).

    :param score: The score.
    """
    if not math.isfinite(score):
        return str(score)
    if score == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(score))))
    text = f"{score:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def command_line(*words: str, schema: str = "public") -> str:
    """
    A ``haystack-state`` command to suggest, quoted for the shell, with ``--schema`` unless it is the default.

    :param words: The command and its arguments.
    :param schema: The PostgreSQL schema the command was given.
    """
    return shlex.join([PROG, *words, *(["--schema", schema] if schema != "public" else [])])


def shorten(ids: Sequence[str]) -> dict[str, str]:
    """
    Short forms of ids: the last 8 characters of each, longer where two would be the same, so each is unique among
    ``ids`` (an id of 8 characters or fewer is its own short form).

    :param ids: The ids.
    :returns: id -> short form.
    """
    unique = list(dict.fromkeys(ids))
    shorts: dict[str, str] = {}
    for length in range(SHORT_ID, max((len(i) for i in unique), default=SHORT_ID) + 1):
        pending = [i for i in unique if i not in shorts]
        counts = collections.Counter(i[-length:] for i in pending)
        for i in pending:
            if counts[i[-length:]] == 1 or length >= len(i):
                shorts[i] = i[-length:]
        if len(shorts) == len(unique):
            break
    return shorts


def short_ids(history: Sequence[CheckpointMeta]) -> dict[str, str]:
    """
    Short ids for a thread's checkpoints: the last 8 characters of each id (the random end of a UUIDv7), longer
    where two would be the same, so each is unique within the thread.

    :param history: The thread's checkpoints.
    :returns: id -> short id.
    """
    return shorten([meta.checkpoint_id for meta in history])


def meta_json(meta: CheckpointMeta) -> dict[str, Any]:
    """A checkpoint's record as JSON (``--json`` output)."""
    return {
        "checkpoint_id": meta.checkpoint_id,
        "parent_id": meta.parent_id,
        "step": meta.step,
        "source": meta.source,
        "tools": list(meta.tool_names),
        "created_at": meta.created_at.isoformat(),
        "changed_keys": list(meta.changed_keys),
    }


def time_text(moment: dt.datetime) -> str:
    """``2025-01-31 12:00:00 UTC``: stored times are UTC."""
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def jsonable(value: object) -> Any:
    """A JSON-safe rendering of a stored value (objects not JSON-native become their ``str``)."""
    return json.loads(json.dumps(to_jsonable(value), ensure_ascii=False, default=str))


def size(value: object) -> int:
    """The UTF-8 bytes of a value's JSON rendering, as ``State.size()`` measures it."""
    return len(json.dumps(to_jsonable(value), ensure_ascii=False, default=str).encode("utf-8"))


def type_name(value: object) -> str:
    """``str``, ``dict``, ``list[ChatMessage]``, ``list[dict | str]``: the stored value's type."""
    if isinstance(value, list | tuple | set | frozenset):
        kinds = sorted({type(item).__name__ for item in value})
        base = type(value).__name__ if type(value) in (list, tuple, set, frozenset) else "list"
        return f"{base}[{' | '.join(kinds)}]" if kinds else base
    return "dict" if isinstance(value, dict) else type(value).__name__


def table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> list[str]:
    """Align rows into columns (the first row is the header); columns in ``right`` are right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def clip(text: str, width: int) -> str:
    """The text, cut to ``width`` characters with ``...`` if it is longer."""
    return text if len(text) <= width else text[: width - 3] + "..."
