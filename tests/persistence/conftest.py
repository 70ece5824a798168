"""Fixtures of the persistence tests: a harness and a checkpointer of each backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from haystack_state.persistence import Checkpointer
from persistence.harness import Harness, MemoryHarness, PostgresHarness, SQLiteHarness


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A harness of each backend; every checkpointer it made is closed after the test."""
    harness: Harness
    if request.param == "memory":
        harness = MemoryHarness()
    elif request.param == "sqlite":
        harness = SQLiteHarness(tmp_path / "checkpoints.sqlite")
    else:
        harness = PostgresHarness(request.getfixturevalue("postgres_dsn"), request.getfixturevalue("postgres_schema"))
    yield harness
    harness.close_all()


@pytest.fixture
def checkpointer(backend: Harness) -> Checkpointer:
    """A checkpointer of each backend."""
    return backend.make()
