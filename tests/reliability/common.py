"""Helpers shared by the reliability tests: figures and counts from the environment."""

from __future__ import annotations

import os

import pytest

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
