"""
The backend fixture of the durable-thread tests, on the harnesses of ``tests/persistence/harness.py``: in memory,
SQLite (a file in ``tmp_path``) and PostgreSQL (a fresh schema per test, marked ``postgres``; skipped when no server
answers, unless ``HAYSTACK_STATE_REQUIRE_POSTGRES=1``).

Test modules bind the fixtures by assignment (``store = harness.store``), so that fixture arguments do not shadow
imports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from persistence.harness import (
    POSTGRES_DSN,
    Harness,
    MemoryHarness,
    PostgresHarness,
    SQLiteHarness,
    postgres_dsn,
    postgres_schema,
)

__all__ = [
    "POSTGRES_DSN",
    "TESTS_DIR",
    "Harness",
    "Worker",
    "persistent_store",
    "postgres_dsn",
    "postgres_schema",
    "store",
    "store_spec",
    "wait_for_leases",
]

TESTS_DIR = Path(__file__).resolve().parent.parent


def wait_for_leases(cp: Any, thread_ids: list[str], timeout: float = 30.0) -> float:
    """
    Wait until no run holds a lease on these threads (a killed worker's lease expires on its own).

    :returns: The seconds waited.
    """
    started = time.monotonic()
    while any(cp.read_lease(thread_id) is not None for thread_id in thread_ids):
        if time.monotonic() - started > timeout:
            raise AssertionError(f"leases on {thread_ids} still held after {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _harness(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    if kind == "memory":
        return MemoryHarness()
    if kind == "sqlite":
        return SQLiteHarness(tmp_path / "threads.sqlite")
    return PostgresHarness(request.getfixturevalue("postgres_dsn"), request.getfixturevalue("postgres_schema"))


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A harness of each backend; every checkpointer it made is closed after the test."""
    harness = _harness(request.param, request, tmp_path)
    yield harness
    harness.close_all()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def persistent_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A harness of each backend that another process can open (SQLite file, PostgreSQL schema)."""
    harness = _harness(request.param, request, tmp_path)
    yield harness
    harness.close_all()


def store_spec(harness: Harness) -> str:
    """The worker's ``--store`` argument for a persistent harness."""
    if isinstance(harness, SQLiteHarness):
        return f"sqlite:{harness.path}"
    assert isinstance(harness, PostgresHarness)
    return f"postgres:{harness.dsn}#{harness.schema}"


class Worker:
    """
    A ``workers.thread_worker`` process, bounded in time and killed (if still alive) on exit.

    :param args: The worker's command-line arguments.
    """

    def __init__(self, *args: str) -> None:
        env = {
            **os.environ,
            "HAYSTACK_TELEMETRY_ENABLED": "False",
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)]),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "workers.thread_worker", *args],
            cwd=TESTS_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_for(self, path: Path, timeout: float = 30.0) -> None:
        """Wait until the worker writes ``path`` (it reached its blocking point)."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None:
                out, err = self.process.communicate()
                raise AssertionError(f"the worker exited ({self.process.returncode}) early:\n{out}\n{err}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker did not reach its blocking point within {timeout}s")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the worker, as a crash would, and reap it."""
        self.process.send_signal(signal.SIGKILL)
        self.process.communicate(timeout=30)
        assert self.process.returncode == -signal.SIGKILL

    def finish(self, timeout: float = 60.0) -> str:
        """Wait for the worker to exit successfully; return its stdout."""
        out, err = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, f"the worker failed ({self.process.returncode}):\n{out}\n{err}"
        return out

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=30)  # reaps the process and closes its pipes (a no-op if done already)
