"""
A tracing span for each tool call, as haystack-ai 3.4 opens it (``haystack.components.agents.tool_calling``): named
``haystack.agent.step.tool``, tagged ``haystack.tool.name`` and ``haystack.tool.description``, with the call's
arguments and result as the content tags ``haystack.agent.step.tool.input`` and ``haystack.agent.step.tool.output``,
and ``haystack.tool.error`` set when the call fails. All the spans of a batch are siblings under one parent (the
runner's ``parent_span``, else the span current when the batch starts), whichever thread runs the call.

With tracing off (haystack's ``NullTracer``), a runner calls the tool directly: no span, no wrapper.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from haystack.dataclasses import ToolCall
from haystack.tracing.tracer import NullTracer, Span, tracer

from haystack_state.tools.spec import ToolSpec

__all__ = ["TOOL_SPAN", "batch_parent", "traced_call", "traced_call_async", "tracing_enabled"]

T = TypeVar("T")

#: haystack-ai's name for the span of one tool call.
TOOL_SPAN = "haystack.agent.step.tool"


_ENABLED: dict[type, bool] = {}


def tracing_enabled() -> bool:
    """
    ``haystack.tracing.is_tracing_enabled()``, answered per tracer class from a cache: haystack's check is an ABC
    ``isinstance``, and an agent asks several times a step.
    """
    kind = type(tracer.actual_tracer)
    enabled = _ENABLED.get(kind)
    if enabled is None:
        enabled = _ENABLED[kind] = not issubclass(kind, NullTracer)
    return enabled


def batch_parent(parent_span: Span | None) -> tuple[bool, Span | None]:
    """
    Whether the calls of a batch are traced, and the parent of their spans.

    :param parent_span: The parent given to the runner; the current span if None.
    :returns: ``(traced, parent)``; ``(False, None)`` when tracing is off.
    """
    if not tracing_enabled():
        return False, None
    return True, parent_span if parent_span is not None else tracer.current_span()


def _tags(spec: ToolSpec, tool_call: ToolCall) -> dict[str, Any]:
    return {"haystack.tool.name": tool_call.tool_name, "haystack.tool.description": spec.description}


class _ToolSpan:
    """
    The span of one tool call, for the sync and the async runner alike: the arguments tagged on entry; on a
    failure, the error (the result is tagged by the caller). A class: one is opened per call.
    """

    __slots__ = ("opened", "span", "tool_call")

    def __init__(self, spec: ToolSpec, tool_call: ToolCall, parent: Span | None) -> None:
        self.opened = tracer.actual_tracer.trace(TOOL_SPAN, tags=_tags(spec, tool_call), parent_span=parent)
        self.tool_call = tool_call

    def __enter__(self) -> Span:
        self.span: Span = self.opened.__enter__()
        self.span.set_content_tag("haystack.agent.step.tool.input", self.tool_call.arguments)
        return self.span

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self.span.set_tag("haystack.tool.error", True)
            self.span.set_content_tag("haystack.agent.step.tool.output", {"error": str(exc)})
        self.opened.__exit__(exc_type, exc, tb)


def traced_call(call: Callable[..., T], spec: ToolSpec, tool_call: ToolCall, parent: Span | None, *args: Any) -> T:
    """
    ``call(*args)`` inside the call's span.

    :param call: What runs the tool.
    :param spec: The tool.
    :param tool_call: The model's call.
    :param parent: The parent span.
    :param args: The arguments of ``call``.
    :returns: What ``call`` returns.
    """
    with _ToolSpan(spec, tool_call, parent) as span:
        result = call(*args)
        span.set_content_tag("haystack.agent.step.tool.output", result)
        return result


async def traced_call_async(awaitable: Awaitable[T], spec: ToolSpec, tool_call: ToolCall, parent: Span | None) -> T:
    """
    Await a call inside its span (see :func:`traced_call`).

    :param awaitable: The call.
    :param spec: The tool.
    :param tool_call: The model's call.
    :param parent: The parent span.
    :returns: Its result.
    """
    with _ToolSpan(spec, tool_call, parent) as span:
        result = await awaitable
        span.set_content_tag("haystack.agent.step.tool.output", result)
        return result
