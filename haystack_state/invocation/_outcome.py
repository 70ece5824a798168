"""
What a batch of tool calls leaves waiting for a human, as plain data and pure functions: the calls held before they
run (an ``Agent``'s ``interrupt_before``), the calls stopped by ``interrupt()``, and the calls that depend on either
(they read what those would write). :func:`~haystack_state.invocation._run.run_tool_batch` returns them in a
:class:`BatchOutcome` beside the result messages of the calls that did run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state.errors import ToolInterruptedError
from haystack_state.interrupts import ToolInterrupt
from haystack_state.invocation._calls import PlannedCall

__all__ = [
    "BatchOutcome",
    "CallEventCallback",
    "InterruptedCall",
    "PendingCall",
    "PendingReason",
    "blocked_calls",
    "block_dependents",
    "interrupted_error",
    "model_arguments",
    "pending_call",
    "waits_for",
]

#: Why a call did not run: it called ``interrupt()``, it was held (``hold=``), or it depends on such a call.
PendingReason = Literal["interrupt", "held", "depends"]

#: ``on_call(kind, data)``: ``("started", {call_id, tool_name, arguments})`` when a call starts;
#: ``("finished", {call_id, tool_name, arguments, message, result, error, duration_s})`` when its result is merged;
#: ``("interrupted", {call_id, tool_name, arguments, value, index, duration_s})`` when it stopped at ``interrupt()``;
#: ``("retrying", {call_id, tool_name, arguments, attempt, max_attempts, delay, error, error_type})`` when an attempt
#: failed and the call is made again after ``delay`` seconds (a retry policy's).
CallEventCallback = Callable[[str, dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class PendingCall:
    """
    A tool call of the batch that produced no result: it waits for a human.

    :param call_id: The id of the tool call.
    :param tool_name: The tool the model called.
    :param arguments: The model's arguments, as it sent them.
    :param reason: ``"interrupt"`` (the tool, or a hook, called ``interrupt()``), ``"held"`` (the runner was told not
        to run it, ``hold=``) or ``"depends"`` (it reads what a pending call of the batch would write, so it waits
        for it).
    :param tool_call: The model's call.
    :param value: What ``interrupt()`` asked (``"interrupt"`` only).
    :param index: Which ``interrupt()`` of the call it was, from 0 (``"interrupt"`` only); the answers to resume it
        with are ``index + 1`` long.
    :param source: Where ``interrupt()`` was called: ``"tool"`` or ``"hook"`` (``"interrupt"`` only).
    :param waits_for: For ``"depends"``, the ids of the pending calls it waits for.
    """

    call_id: str | None
    tool_name: str
    arguments: dict[str, Any]
    reason: PendingReason
    tool_call: ToolCall
    value: Any = None
    index: int | None = None
    source: str | None = None
    waits_for: tuple[str | None, ...] = ()


@dataclasses.dataclass
class BatchOutcome:
    """
    What a batch of tool calls did.

    :param messages: The tool result messages of the calls that ran (or failed), in the order the model listed them.
        Their state writes are merged.
    :param interrupts: The calls that did not produce a result, in call order: stopped by ``interrupt()``, held, or
        depending on one of those. Nothing of theirs was merged.
    :param retries: The calls that were retried (a retry policy's), in call order: ``{"kind": "tool", "tool_name",
        "call_id", "attempts", "succeeded", "errors"}`` each, ``errors`` the failed attempts' ``"Type: message"``.
    """

    messages: list[ChatMessage]
    interrupts: list[PendingCall] = dataclasses.field(default_factory=list)
    retries: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        """Whether some call waits for a human."""
        return bool(self.interrupts)


@dataclasses.dataclass(frozen=True)
class InterruptedCall:
    """The outcome of a call that stopped at ``interrupt()``: returned by the runner in place of a result."""

    stop: ToolInterrupt


def model_arguments(call: PlannedCall) -> dict[str, Any]:
    """The arguments the model sent for a call, as a dict (JSON text parsed; anything else is ``{}``)."""
    raw: Any = call.tool_call.arguments
    if isinstance(raw, str):  # some providers hand over the JSON text
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return dict(raw) if isinstance(raw, Mapping) else {}


def pending_call(
    call: PlannedCall, reason: PendingReason, stop: ToolInterrupt | None = None, waits_for: tuple[str | None, ...] = ()
) -> PendingCall:
    """
    Describe a call that did not produce a result.

    :param call: The call.
    :param reason: Why.
    :param stop: The ``ToolInterrupt`` it raised, for ``"interrupt"``.
    :param waits_for: The ids of the pending calls it waits for, for ``"depends"``.
    :returns: The pending call.
    """
    return PendingCall(
        call_id=call.tool_call.id,
        tool_name=call.tool_call.tool_name,
        arguments=model_arguments(call),
        reason=reason,
        tool_call=call.tool_call,
        value=stop.value if stop is not None else None,
        index=stop.index if stop is not None else None,
        source=stop.source if stop is not None else None,
        waits_for=waits_for,
    )


def blocked_calls(calls: list[PlannedCall], hold: Collection[str]) -> dict[int, PendingReason]:
    """
    The calls that must not run because they are held, or depend on a held call.

    :param calls: The planned calls of the batch, in order.
    :param hold: The ids of the calls to hold.
    :returns: ``{index: "held" | "depends"}``.
    :raises ValueError: If ``hold`` names a call id that is not in the batch.
    """
    if not hold:
        return {}
    ids = {call.tool_call.id for call in calls}
    unknown = sorted(str(call_id) for call_id in hold if call_id not in ids)
    if unknown:
        known = ", ".join(sorted(str(call_id) for call_id in ids)) or "none"
        raise ValueError(f"hold names tool call id(s) {', '.join(unknown)}, which the batch does not have ({known}).")
    blocked: dict[int, PendingReason] = {call.index: "held" for call in calls if call.tool_call.id in hold}
    block_dependents(calls, blocked, after=-1)
    return blocked


def block_dependents(calls: list[PlannedCall], blocked: dict[int, PendingReason], after: int) -> None:
    """
    Mark ``"depends"`` every call after position ``after`` that depends, directly or through another, on a blocked
    call. In place.

    :param calls: The planned calls of the batch, in order.
    :param blocked: ``{index: reason}`` of the calls blocked so far; extended.
    :param after: Only calls after this position are considered.
    """
    for call in calls[after + 1 :]:
        if call.index not in blocked and not blocked.keys().isdisjoint(call.after):
            blocked[call.index] = "depends"


def waits_for(
    call: PlannedCall, calls: list[PlannedCall], blocked: Mapping[int, PendingReason]
) -> tuple[str | None, ...]:
    """The ids of the blocked calls that ``call`` depends on directly."""
    return tuple(calls[index].tool_call.id for index in sorted(call.after) if index in blocked)


def interrupted_error(call: PlannedCall, stop: ToolInterrupt) -> ToolInterruptedError:
    """
    The error for a call that asked for human input where no human can answer (``ToolInvoker``).

    :param call: The call.
    :param stop: What it raised.
    :returns: The error, naming the tool, the call and the question.
    """
    name = call.tool_call.tool_name
    shown = repr(stop.value)
    if len(shown) > 200:
        shown = shown[:197] + "..."
    return ToolInterruptedError(
        name,
        f"Tool '{name}' asked for human input (interrupt({shown})), which this runner cannot give: run it in an Agent "
        f"with a checkpointer, or pass the answer up front as answers={{{call.tool_call.id!r}: [...]}}.",
        call_id=call.tool_call.id,
        value=stop.value,
        index=stop.index,
    )
