"""
Tracing spans through ``haystack.tracing``, with haystack-ai's Agent span names, at no cost when tracing is off.

haystack's tracer wraps every span in two generator-based context managers even when tracing is disabled; an agent
opens several spans per step, so :func:`span` hands out a shared no-op context manager instead whenever no tracer is
enabled. With a tracer enabled (OpenTelemetry, Datadog, Langfuse's), the span is the enabled tracer's own
``trace(...)``, called directly rather than through haystack's ``ProxyTracer`` (which only forwards it, in one more
generator-based context manager per span).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from haystack.tracing.tracer import NullSpan, Span, tracer
from haystack.utils import serialize_callable
from haystack.utils.type_serialization import serialize_type

from haystack_state.invocation._spans import tracing_enabled

__all__ = ["NO_SPAN", "current_span", "schema_tag", "span", "tracing_enabled"]


class _NoSpan:
    """A reusable context manager yielding a ``NullSpan``: what a span costs with tracing off."""

    __slots__ = ()
    null = NullSpan()

    def __enter__(self) -> Span:
        return self.null

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


NO_SPAN = _NoSpan()


def span(
    name: str, tags: Mapping[str, object] | None = None, parent: Span | None = None
) -> AbstractContextManager[Span]:
    """
    Open a span named ``name`` under ``parent`` (or the current span).

    :param name: The operation name (haystack-ai's: ``haystack.agent.run``, ``haystack.agent.step``, ...).
    :param tags: The span's tags.
    :param parent: The parent span; the current one if None.
    :returns: A context manager yielding the span (a ``NullSpan`` when tracing is off).
    """
    if not tracing_enabled():
        return NO_SPAN
    return tracer.actual_tracer.trace(name, tags=dict(tags) if tags is not None else None, parent_span=parent)


def current_span() -> Span | None:
    """The current span, or None when tracing is off."""
    return tracer.actual_tracer.current_span() if tracing_enabled() else None


def schema_tag(schema: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """
    The ``haystack.agent.state_schema`` tag of a run span, as haystack-ai's Agent sets it: each state key of the run
    (``Agent.resolved_state_schema``) with its ``type`` and, when the entry has one, its ``handler``, by import path.
    A handler without an import path (a lambda, a local function) is named by its qualified name: a tag never fails
    a run.

    :param schema: The resolved state schema.
    :returns: The tag's value.
    """
    tag: dict[str, dict[str, str]] = {}
    for key, entry in schema.items():
        item = {"type": serialize_type(entry["type"])}
        handler = entry.get("handler")
        if handler is not None:
            try:
                item["handler"] = serialize_callable(handler)
            except Exception:
                item["handler"] = str(getattr(handler, "__qualname__", None) or repr(handler))
        tag[key] = item
    return tag
