"""
The events a run emits besides its own progress (see :mod:`haystack_state.agent.events`): the tool runner's per-call
reports as ``ToolCallStarted``/``Retrying``/``ToolCallFinished``, and a journal delta as ``StateChanged`` events. Made
only when someone listens (a run without a sink calls none of this).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from haystack_state.agent.events import (
    CustomEvent,
    EventSink,
    Retrying,
    StateChanged,
    ToolCallFinished,
    ToolCallStarted,
)

__all__ = ["emit_custom", "emit_state_changes", "emit_tool_call"]


def emit_custom(sink: EventSink, name: str, data: object = None) -> None:
    """Deliver a ``CustomEvent`` (``RunContext.emit``, ``RunState.emit``) to the run's listener."""
    sink.emit(CustomEvent, name=str(name), data=data)


def emit_tool_call(sink: EventSink, step: int, kind: str, data: dict[str, Any]) -> None:
    """
    Emit the event of one of the tool runner's per-call reports.

    :param sink: Where the run's events go.
    :param step: The step under way.
    :param kind: ``"started"``, ``"retrying"`` or ``"finished"``.
    :param data: The report.
    """
    if kind == "started":
        sink.emit(
            ToolCallStarted,
            step=step,
            tool_name=data["tool_name"],
            call_id=data["call_id"],
            arguments=dict(data.get("arguments") or {}),
        )
    elif kind == "retrying":
        sink.emit(
            Retrying,
            step=step,
            kind="tool",
            attempt=int(data["attempt"]),
            max_attempts=int(data["max_attempts"]),
            delay=float(data["delay"]),
            error=str(data["error"]),
            error_type=str(data["error_type"]),
            tool_name=data["tool_name"],
            call_id=data["call_id"],
        )
    elif kind == "finished":
        message = data.get("message")
        result = message.tool_call_result if message is not None else None
        sink.emit(
            ToolCallFinished,
            step=step,
            tool_name=data["tool_name"],
            call_id=data["call_id"],
            result=result.result if result is not None else str(data.get("result")),
            error=bool(data.get("error")),
            duration=float(data.get("duration_s") or 0.0),
        )


def emit_state_changes(sink: EventSink, delta: Mapping[str, Mapping[str, Any]]) -> None:
    """Emit a ``StateChanged`` event per key of a journal delta (see :meth:`State.peek_changes`)."""
    for key, op in delta.items():
        if op["op"] == "extend":
            sink.emit(StateChanged, key=key, op="append", items=list(op["items"]))
        elif op["op"] == "replace":
            sink.emit(StateChanged, key=key, op="replace", value=op["value"])
        else:
            sink.emit(StateChanged, key=key, op="reset")
