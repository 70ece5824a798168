"""Helpers shared by the reliability tests: figures, counts from the environment, and a thread's branch."""

from __future__ import annotations

import os
from typing import Any

import pytest

from haystack_state.persistence import Checkpointer

#: The figure lines the tests reported, printed at the end of the session (see ``conftest.py``).
FIGURES: list[str] = []


def record(line: str) -> None:
    """Record a figure line, printed in the terminal summary (and on stdout with ``-s``)."""
    FIGURES.append(line)
    print(line)


def env_count(name: str, default: int) -> int:
    """
    A positive count read from the environment variable ``name``, or ``default``.

    :param name: The variable.
    :param default: The count when the variable is unset or empty.
    :returns: The count.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(f"{name} must be a positive integer, got {text!r}")
    return int(text)


def branch(cp: Checkpointer, thread_id: str) -> list[Any]:
    """The checkpoints from the thread's root to its head, oldest first."""
    by_id = {meta.checkpoint_id: meta for meta in cp.history(thread_id)}
    current: str | None = cp.head(thread_id)
    result = []
    while current is not None:
        result.append(by_id[current])
        current = by_id[current].parent_id
    return result[::-1]


def shape(cp: Checkpointer, thread_id: str) -> list[tuple[str, int, tuple[str, ...], tuple[str, ...]]]:
    """What each checkpoint of the thread's branch records: source, step, tools, changed keys."""
    return [(m.source, m.step, m.tool_names, m.changed_keys) for m in branch(cp, thread_id)]
