"""
How an interrupted thread looks to a client, and how the client's ``command.resume`` becomes ``Agent.resume``'s
decisions.

A thread that stopped before an ``interrupt_before`` tool has one interrupt, whose id is the thread's head
checkpoint and whose value follows LangChain's human-in-the-loop shape::

    {"action_requests": [{"name": "send_email", "args": {...}, "id": "call_1", "description": "..."}],
     "review_configs": [{"action_name": "send_email", "allowed_decisions": ["approve", "edit", "reject"]}]}

``command.resume`` answers it in any of these forms:

- ``"approve"`` or ``"reject"``: the same decision for every pending call;
- ``{"decisions": [{"type": "approve"} | {"type": "reject"} | {"type": "edit", "edited_action": {"name", "args"}},
  ...]}``: one decision per action request, in order (LangChain's shape);
- ``{call_id: "approve" | "reject" | {"arguments": {...}} | one of the decisions above}``: by call id (the Agent's
  own shape);
- ``{interrupt_id: any of the above}``: keyed by the interrupt's id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from haystack.dataclasses import ToolCall

from haystack_state.agent.session import ThreadSnapshot, apply_decisions
from haystack_state.server.wire import WireError

__all__ = ["ALLOWED_DECISIONS", "decisions_from_resume", "interrupt_of"]

ALLOWED_DECISIONS = ["approve", "edit", "reject"]
FIELD = "command.resume"


def interrupt_of(snapshot: ThreadSnapshot) -> dict[str, Any] | None:
    """
    The interrupt a thread waits on, or None if it is not interrupted.

    :param snapshot: The thread's head.
    :returns: ``{"id": ..., "value": {"action_requests": [...], "review_configs": [...]}}``.
    """
    if not snapshot.interrupted:
        return None
    calls = snapshot.pending_tool_calls
    names = list(dict.fromkeys(call.tool_name for call in calls))
    return {
        "id": snapshot.checkpoint.checkpoint_id,
        "value": {
            "action_requests": [
                {
                    "name": call.tool_name,
                    "args": dict(call.arguments),
                    "id": call.id,
                    "description": f"Tool execution pending approval: {call.tool_name}",
                }
                for call in calls
            ],
            "review_configs": [{"action_name": name, "allowed_decisions": list(ALLOWED_DECISIONS)} for name in names],
        },
    }


def decisions_from_resume(resume: Any, calls: Sequence[ToolCall], interrupt_id: str) -> dict[str, Any]:
    """
    Turn a ``command.resume`` value into ``Agent.resume`` decisions, checked against the pending calls.

    :param resume: The client's value.
    :param calls: The pending tool calls, in order.
    :param interrupt_id: The interrupt's id (a resume value may be keyed by it).
    :returns: ``{call_id: "approve" | "reject" | {"arguments": {...}}}``, one per pending call.
    :raises WireError: Naming ``command.resume`` and what does not fit.
    """
    if isinstance(resume, Mapping) and set(resume) == {interrupt_id}:
        resume = resume[interrupt_id]
    ids = [call.id for call in calls]
    if resume in ("approve", "reject"):
        decisions: dict[str, Any] = {str(call_id): resume for call_id in ids}
    elif isinstance(resume, Mapping) and set(resume) == {"decisions"}:
        listed = resume["decisions"]
        if not isinstance(listed, list) or len(listed) != len(calls):
            raise WireError(
                f"{FIELD}.decisions", f"needs one decision per action request ({len(calls)}), in order, got {listed!r}"
            )
        decisions = {
            str(call.id): _decision(item, call, f"{FIELD}.decisions.{i}")
            for i, (item, call) in enumerate(zip(listed, calls, strict=True))
        }
    elif isinstance(resume, Mapping):
        by_id = {str(call.id): call for call in calls}
        decisions = {}
        for key, item in resume.items():
            call = by_id.get(str(key))
            if call is None:
                raise WireError(f"{FIELD}.{key}", f"names no pending tool call; pending: {ids}")
            decisions[str(key)] = _decision(item, call, f"{FIELD}.{key}")
    else:
        raise WireError(
            FIELD,
            "must be 'approve', 'reject', {'decisions': [...]} (one per action request) or {call_id: decision}, "
            f"got {resume!r}",
        )
    try:
        apply_decisions(list(calls), decisions)
    except ValueError as error:
        raise WireError(FIELD, str(error)) from None
    return decisions


def _decision(item: Any, call: ToolCall, field: str) -> Any:
    if item in ("approve", "reject"):
        return item
    if isinstance(item, Mapping) and set(item) == {"arguments"} and isinstance(item["arguments"], dict):
        return {"arguments": dict(item["arguments"])}
    kind = item.get("type") if isinstance(item, Mapping) else None
    if kind == "approve":
        return "approve"
    if kind == "reject":
        return "reject"
    if kind == "edit":
        action = item.get("edited_action") if isinstance(item, Mapping) else None
        if not isinstance(action, Mapping) or not isinstance(action.get("args"), dict):
            raise WireError(f"{field}.edited_action", "an edit needs {'name': ..., 'args': {...}}")
        if action.get("name", call.tool_name) != call.tool_name:
            raise WireError(
                f"{field}.edited_action.name",
                f"an edit keeps the tool ('{call.tool_name}'); got '{action.get('name')}'",
            )
        return {"arguments": dict(action["args"])}
    raise WireError(field, f"must be approve, reject or edit, got {item!r}")
