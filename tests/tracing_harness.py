"""
Tracing for tests: ``exporter`` turns on haystack's tracing through OpenTelemetry (content tracing too) and yields an
in-memory exporter of the spans; tracing is off again after the test. Every test can take it (``tests/conftest.py``).
OpenTelemetry is imported when a test takes the fixture: the Hayhooks environment of ``.ci/run`` does not have it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["exporter"]


@pytest.fixture
def exporter() -> Iterator[Any]:
    from haystack import tracing
    from haystack_integrations.tracing.opentelemetry import OpenTelemetryTracer
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.enable_tracing(OpenTelemetryTracer(provider.get_tracer("test")))
    tracing.tracer.is_content_tracing_enabled = True
    try:
        yield exported
    finally:
        tracing.disable_tracing()
        tracing.tracer.is_content_tracing_enabled = False
