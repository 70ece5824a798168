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

A tool that asks a human (``interrupt(value)`` inside the tool, when the Agent supports it) makes an interrupt of its
own, ``{"id": interrupt_id, "value": value}``; ``command.resume`` answers it with ``{interrupt_id: answer}`` (or with
the bare answer when it is the only one), which goes to ``Agent.resume(thread_id, answers=...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from haystack.dataclasses import ToolCall

from haystack_state.agent import Agent
from haystack_state.agent._continuation import apply_decisions, check_unfinished_calls, unfinished_policy
from haystack_state.agent._session import ThreadSnapshot
from haystack_state.server._wire import WireError

__all__ = [
    "ALLOWED_DECISIONS",
    "Resume",
    "decisions_from_resume",
    "interrupt_from_requests",
    "interrupts_of",
    "pending_requests",
    "resume_from_command",
    "unfinished_policy_of",
]

ALLOWED_DECISIONS = ["approve", "edit", "reject"]
FIELD = "command.resume"


def pending_requests(snapshot: ThreadSnapshot) -> list[dict[str, Any]]:
    """
    The requests a thread waits on, as JSON-ready dicts (``id``, ``kind``, ``tool_name``, ``call_id``, ``value``), the
    shape of the Agent's ``Interrupted`` event (see ``ThreadSnapshot.interrupts``): a ``before`` request per pending
    call of an ``interrupt_before`` tool (its id is the call's, its value the call's arguments), an ``interrupt`` or
    ``hook`` request per question asked with ``interrupt(value)``, an ``after`` request per result to review.

    :param snapshot: The thread's head.
    :returns: The requests, in order (none if the thread is not interrupted).
    """
    if not snapshot.interrupted:
        return []
    requests = []
    for item in snapshot.interrupts:
        request = _as_request(item)
        if request.get("kind") == "before" and request.get("value") is None:
            request["value"] = item.get("arguments")
        requests.append(request)
    return requests


def _as_request(item: object) -> dict[str, Any]:
    data: Mapping[str, Any]
    if hasattr(item, "to_dict"):  # an InterruptRequest
        data = item.to_dict()
    elif isinstance(item, Mapping):
        data = item
    else:
        data = {name: getattr(item, name, None) for name in ("id", "kind", "tool_name", "call_id", "value")}
    return {
        "id": data.get("id"),
        "kind": data.get("kind", "interrupt"),
        "tool_name": data.get("tool_name"),
        "call_id": data.get("call_id"),
        "value": data.get("value"),
    }


def interrupt_from_requests(requests: Sequence[Mapping[str, Any]], checkpoint_id: str) -> list[dict[str, Any]]:
    """
    The interrupts a client sees for pending requests, in LangGraph's ``Interrupt`` shape (``{"id", "value"}``):
    the ``before`` requests together as one interrupt (id: the checkpoint) in LangChain's human-in-the-loop shape,
    and each in-tool interrupt as its own (id: the Agent's interrupt id; value: what the tool asked).

    :param requests: The pending requests (see :func:`pending_requests`).
    :param checkpoint_id: The checkpoint the thread waits at.
    :returns: The interrupts.
    """
    before = [request for request in requests if request.get("kind") == "before"]
    interrupts: list[dict[str, Any]] = []
    if before:
        names = list(dict.fromkeys(str(request["tool_name"]) for request in before))
        interrupts.append(
            {
                "id": checkpoint_id,
                "value": {
                    "action_requests": [
                        {
                            "name": request["tool_name"],
                            "args": dict(request.get("value") or {}),
                            "id": request["call_id"],
                            "description": f"Tool execution pending approval: {request['tool_name']}",
                        }
                        for request in before
                    ],
                    "review_configs": [
                        {"action_name": name, "allowed_decisions": list(ALLOWED_DECISIONS)} for name in names
                    ],
                },
            }
        )
    interrupts.extend(
        {"id": request["id"], "value": request.get("value")} for request in requests if request.get("kind") != "before"
    )
    return interrupts


def interrupts_of(snapshot: ThreadSnapshot) -> list[dict[str, Any]]:
    """
    The interrupts a thread waits on (none if it is not interrupted).

    :param snapshot: The thread's head.
    :returns: ``[{"id": ..., "value": ...}, ...]`` (see :func:`interrupt_from_requests`).
    """
    requests = pending_requests(snapshot)
    return interrupt_from_requests(requests, snapshot.checkpoint.checkpoint_id) if requests else []


@dataclasses.dataclass(frozen=True)
class Resume:
    """
    What ``Agent.resume`` gets for a ``command.resume``.

    :param decisions: ``{call_id: "approve" | "reject" | {"arguments": {...}}}`` for ``interrupt_before`` calls.
    :param answers: ``{interrupt_id: answer}`` for in-tool interrupts.
    """

    decisions: dict[str, Any] | None = None
    answers: dict[str, Any] | None = None

    def to_kwargs(self) -> dict[str, Any]:
        """The run's stored kwargs for it."""
        out: dict[str, Any] = {}
        if self.decisions is not None:
            out["decisions"] = self.decisions
        if self.answers is not None:
            out["answers"] = self.answers
        return out


def resume_from_command(
    resume: object,
    requests: Sequence[Mapping[str, Any]],
    calls: Sequence[ToolCall],
    interrupt_id: str,
    *,
    takes_answers: bool,
) -> Resume:
    """
    Turn a ``command.resume`` value into ``Agent.resume``'s decisions and answers, checked against what the thread
    waits on.

    - With in-tool interrupts only: ``{interrupt_id: answer, ...}`` (one answer per interrupt), or, when one
      interrupt waits, the answer itself (LangGraph's ``Command(resume=value)``).
    - With ``interrupt_before`` calls only: see :func:`decisions_from_resume`.
    - With both: one object keyed by interrupt ids (answers) and call ids (decisions).

    :param resume: The client's value.
    :param requests: The pending requests (see :func:`pending_requests`).
    :param calls: The pending tool calls, in order.
    :param interrupt_id: The id of the interrupt of the ``interrupt_before`` calls (a resume value may be keyed by it).
    :param takes_answers: Whether the Agent's ``resume`` takes ``answers`` (in-tool interrupts).
    :returns: The decisions and answers.
    :raises WireError: Naming ``command.resume`` and what does not fit.
    """
    asks = [str(request["id"]) for request in requests if request.get("kind") != "before"]
    waits_before = any(request.get("kind") == "before" for request in requests)
    if not asks:
        return Resume(decisions=decisions_from_resume(resume, calls, interrupt_id))
    if not takes_answers:
        raise WireError(FIELD, "this server's Agent cannot answer in-tool interrupts (its resume takes no answers)")
    if isinstance(resume, Mapping) and any(str(key) in asks for key in resume):
        answers = {str(key): value for key, value in resume.items() if str(key) in asks}
        rest = {key: value for key, value in resume.items() if str(key) not in asks}
    elif len(asks) == 1 and not waits_before:
        answers, rest = {asks[0]: resume}, {}
    else:
        raise WireError(FIELD, f"answer each pending interrupt by its id: {{interrupt_id: answer}}; pending: {asks}")
    missing = [ask for ask in asks if ask not in answers]
    if missing:
        raise WireError(FIELD, f"has no answer for interrupt(s) {missing}; every pending interrupt needs one")
    if not waits_before:
        if rest:
            raise WireError(f"{FIELD}.{next(iter(rest))}", f"names no pending interrupt; pending: {asks}")
        return Resume(answers=answers)
    # The decisions are for the calls held before they ran; a call that asked a question is answered, not decided.
    held = {request.get("call_id") for request in requests if request.get("kind") == "before"}
    reviewed = [call for call in calls if call.id in held]
    return Resume(decisions=decisions_from_resume(rest, reviewed, interrupt_id), answers=answers)


def decisions_from_resume(resume: object, calls: Sequence[ToolCall], interrupt_id: str) -> dict[str, Any]:
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


def _decision(item: object, call: ToolCall, field: str) -> str | dict[str, object]:
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


def unfinished_policy_of(agent: Agent, snapshot: ThreadSnapshot, policy: str | None) -> str | None:
    """
    What new messages would do on a thread (``finish``, ``close`` or ``refuse``; see the Agent's
    ``on_unfinished_calls``), or None if its last run did not stop mid-tools.

    :param agent: The thread's Agent.
    :param snapshot: The thread's head.
    :param policy: The run's own policy, if it sends one.
    """
    meta = snapshot.checkpoint.metadata
    if snapshot.interrupts or not (snapshot.pending_tool_calls or meta.get("continues")):
        return None
    return unfinished_policy(meta, check_unfinished_calls(policy or agent.on_unfinished_calls, "run"))
