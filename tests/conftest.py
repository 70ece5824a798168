"""
The suite's root fixtures.

- ``tests/`` is on ``sys.path`` (pytest's rootdir insertion), so shared helpers import by their folder's name:
  ``persistence.harness`` (checkpointer harnesses, PostgreSQL fixtures), ``workers.harness`` (worker processes),
  ``server.conftest`` (live servers), ``compat.agent_helpers``, ``fake_openai`` and ``without_ids``.
- ``postgres_dsn`` and ``postgres_schema`` are available to every test: a reachable server and a fresh schema,
  skipped without a server unless ``HAYSTACK_STATE_REQUIRE_POSTGRES=1`` (as in CI).
- ``exporter`` (``tracing_harness``): haystack's tracing on, through OpenTelemetry, into an in-memory span exporter.
- haystack-ai's usage telemetry is off for every test and every process a test starts.
"""

from __future__ import annotations

import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from persistence.harness import postgres_dsn, postgres_schema
from tracing_harness import exporter

__all__ = ["exporter", "postgres_dsn", "postgres_schema"]
