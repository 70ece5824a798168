"""
Fixtures of the reliability tests (issue 7): bad input, properties, crashes, load and codec safety.

- This folder is a package (``reliability``), so pytest puts ``tests/`` on ``sys.path``: the shared helpers
  (``workers``, ``persistence.harness``) and the worker modules here (``reliability.*``) import by those names, also
  in the worker processes (which run with ``tests/`` as their working directory and ``PYTHONPATH``).
- The PostgreSQL fixtures are those of ``tests/persistence/harness.py``: a fresh schema per test, skipped without a
  server unless ``HAYSTACK_STATE_REQUIRE_POSTGRES=1``.
- Tests marked ``stress`` (the full counts) are skipped unless the marker expression selects them (``-m stress``);
  the default suite runs the same tests with smaller counts.
- Every test can ``report`` a figure line; the lines are printed at the end of the session under "reliability
  figures" (``docs/RELIABILITY.md`` quotes them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from persistence.harness import postgres_dsn, postgres_schema

from reliability.common import FIGURES, record

__all__ = ["postgres_dsn", "postgres_schema", "report"]

_HERE = Path(__file__).resolve().parent


@pytest.fixture
def report() -> Callable[[str], None]:
    """:func:`record`, as a fixture."""
    return record


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this folder's ``stress`` tests unless the ``-m`` expression names ``stress``."""
    if "stress" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="full counts: run with -m stress (see docs/RELIABILITY.md)")
    for item in items:
        if item.get_closest_marker("stress") is not None and _HERE in item.path.resolve().parents:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the figures the reliability tests reported."""
    if FIGURES:
        terminalreporter.section("reliability figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
