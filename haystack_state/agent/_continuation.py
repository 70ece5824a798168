"""
Continuation planning: how a run goes on from a thread whose last run did not finish. A run that stopped for a human
(``interrupt_before``, ``interrupt_after``, ``interrupt()``) is resumed with decisions and answers
(:func:`apply_decisions`, checked against the requests it waits for); one that stopped early (a crash, a cancel)
is finished, closed or refused by the ``on_unfinished_calls`` policy (:data:`.protocols.UnfinishedCalls`). All of it
is decided by :func:`plan_continuation` before anything is committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, get_args

from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state.agent.protocols import (
    Approve,
    DecisionLike,
    Edit,
    InterruptRequest,
    Reject,
    UnfinishedCalls,
    as_decision,
)
from haystack_state.errors import ThreadBusyError

if TYPE_CHECKING:
    from haystack_state.agent._session import ThreadSession

__all__ = [
    "HOOK_ANSWERS",
    "REJECTED",
    "UNFINISHED_CALLS",
    "Continuation",
    "apply_decisions",
    "check_unfinished_calls",
    "in_call_order",
    "plan_continuation",
    "unfinished_policy",
]

REJECTED = "A human reviewer rejected this tool call; it was not run."
#: The error result of a call closed by ``on_unfinished_calls="close"``: ``{why}`` says how its run stopped.
CLOSED = "This tool call was not run: the run that asked for it {why} before its tools ran, and the thread went on."

#: The values of :data:`.protocols.UnfinishedCalls`.
UNFINISHED_CALLS: tuple[UnfinishedCalls, ...] = get_args(UnfinishedCalls)


#: The key, in the ``answers`` metadata, of the answers given to ``interrupt()`` calls of ``before_tool`` hooks.
HOOK_ANSWERS = "before_tool"


def apply_decisions(
    calls: list[ToolCall], decisions: Mapping[str, DecisionLike]
) -> tuple[list[ChatMessage], dict[str, ChatMessage]]:
    """
    Apply a human's decisions to interrupted tool calls.

    :param calls: The pending calls, in order.
    :param decisions: ``{call_id: Approve() | Reject() | Edit(arguments)}`` (or the old forms ``"approve"``,
        ``"reject"``, ``{"arguments": {...}}``); every pending call needs one.
    :returns: An assistant message holding the calls to run (with edited arguments where asked), and the error tool
        results of the rejected calls, by call id.
    :raises ValueError: For a missing decision, an unknown call id or a malformed decision.
    """
    ids = [call.id for call in calls]
    unknown = sorted(str(k) for k in decisions if k not in ids)
    missing = [str(call_id) for call_id in ids if call_id not in decisions]
    if unknown or missing:
        problems = []
        if missing:
            problems.append(f"no decision for pending call(s) {missing}")
        if unknown:
            problems.append(f"decisions name unknown call id(s) {unknown}")
        raise ValueError(f"resume: {'; '.join(problems)}. Pending calls: {ids}.")
    to_run: list[ToolCall] = []
    rejected: dict[str, ChatMessage] = {}
    for call in calls:
        given = decisions[call.id]  # type: ignore[index]
        decision = as_decision(given)
        if isinstance(decision, Approve):
            to_run.append(call)
        elif isinstance(decision, Reject):
            rejected[call.id] = ChatMessage.from_tool(tool_result=REJECTED, origin=call, error=True)  # type: ignore[index]
        elif isinstance(decision, Edit):
            to_run.append(dataclasses.replace(call, arguments=dict(decision.arguments)))  # keeps id and extra
        else:
            raise ValueError(
                f"resume: the decision for call '{call.id}' must be 'approve', 'reject' or {{'arguments': {{...}}}}, "
                f"got {given!r}."
            )
    return ([ChatMessage.from_assistant(tool_calls=to_run)] if to_run else []), rejected


def in_call_order(
    order: Sequence[str | None], executed: list[ChatMessage], rejected: Mapping[str, ChatMessage]
) -> list[ChatMessage]:
    """
    The tool results of the executed calls and the rejected ones, in the order the model listed the calls.

    :param order: The call ids, in the model's order.
    :param executed: The results of the calls that ran.
    :param rejected: The error results of the rejected calls, by call id.
    :returns: The results.
    """
    if not rejected:
        return executed
    by_id: dict[str | None, ChatMessage] = {
        m.tool_call_result.origin.id: m for m in executed if m.tool_call_result is not None
    }
    by_id.update(rejected)
    return [by_id[call_id] for call_id in order if call_id in by_id]


@dataclasses.dataclass
class Continuation:
    """
    How a run continues the thread's unfinished step (see :func:`plan_continuation`).

    :param calling: An assistant message holding the calls to run (approved, edited or waiting for no one), or [].
    :param rejected: The error results of the calls a human rejected, by call id.
    :param order: The pending calls' ids, in the model's order (the results are put in this order).
    :param answers: The answers to ``interrupt()`` calls so far, per call id (and :data:`HOOK_ANSWERS`).
    :param hooks: Whether the ``before_tool`` hooks run (again) before the calls.
    :param then_input: Whether the run's new messages are taken once the unfinished step is finished or closed
        (see :data:`.protocols.UnfinishedCalls`), rather than at the start.
    """

    calling: list[ChatMessage]
    rejected: dict[str, ChatMessage]
    order: list[str | None]
    answers: dict[str, list[object]]
    hooks: bool
    then_input: bool = False


def check_unfinished_calls(policy: object, where: str) -> UnfinishedCalls | None:
    """An ``on_unfinished_calls`` value, checked: one of :data:`UNFINISHED_CALLS`, or None; else ValueError."""
    if policy is None or policy in UNFINISHED_CALLS:
        return policy
    raise ValueError(
        f"{where} on_unfinished_calls must be one of {', '.join(UNFINISHED_CALLS)} or None, got {policy!r}."
    )


def unfinished_policy(head: Mapping[str, object] | None, policy: UnfinishedCalls | None) -> UnfinishedCalls:
    """
    The policy that applies to new messages on an unfinished thread: ``policy``, else ``"close"`` after a cancel
    (its head is marked ``cancelled``) and ``"finish"`` after a crash.

    :param head: The metadata of the thread's head checkpoint.
    :param policy: The run's or the Agent's policy, if any.
    """
    if policy is not None:
        return policy
    return "close" if head is not None and head.get("cancelled") else "finish"


def _closed(session: ThreadSession, calls: Sequence[ToolCall]) -> dict[str, ChatMessage]:
    cancelled = session.loaded is not None and bool(session.loaded.metadata.get("cancelled"))
    text = CLOSED.format(why="was cancelled" if cancelled else "stopped (its worker or process died)")
    return {
        str(call.id): ChatMessage.from_tool(tool_result=text, origin=call, error=True)
        for call in calls
        if call.id is not None
    }


def plan_continuation(
    session: ThreadSession,
    messages: Sequence[ChatMessage],
    decisions: Mapping[str, DecisionLike] | None,
    answers: Mapping[str, object] | None = None,
    policy: UnfinishedCalls | None = None,
) -> Continuation | None:
    """
    Check a run against the thread's pending tool calls and interrupt requests, and plan how it continues, before
    anything is committed.

    :param session: The run's thread.
    :param messages: The run's new messages.
    :param decisions: ``Agent.resume``'s decisions on calls held by ``interrupt_before`` (and reviews of
        ``interrupt_after``), by call id; None for ``run``.
    :param answers: ``Agent.resume``'s answers to ``interrupt()`` requests (and reviews), by request id.
    :param policy: What new messages do on a thread whose last run stopped early (see
        :data:`.protocols.UnfinishedCalls`); ``"close"`` after a cancel and ``"finish"`` after a crash if None.
        Without new messages, ``"close"`` answers the pending calls with error results instead of running them.
    :returns: None if nothing is pending; otherwise the :class:`Continuation`.
    :raises ThreadBusyError: With ``policy="refuse"``, if new messages come while the thread's last run has not
        finished (it stopped early): a ``ThreadConflictError``, so a caller that retries on conflicts retries.
    :raises ValueError: If the thread is interrupted and ``run`` was called (not ``resume``), if ``resume`` is called
        on a thread that is not interrupted, or for decisions and answers that do not fit the pending requests.
    """
    pending = session.pending
    names = ", ".join(sorted({call.tool_name for call in pending}))
    requests = session.requests if session.interrupted else []
    resuming = decisions is not None or answers is not None
    if session.interrupted and not resuming:
        where = f"before tool call(s) to {names}" if pending else "after a tool call"
        raise ValueError(
            f"Thread '{session.thread_id}' is interrupted {where}, waiting for {_describe(requests)}; continue it with "
            "agent.resume(thread_id, decisions={call_id: 'approve' | 'reject' | {'arguments': {...}}}, "
            "answers={interrupt_id: answer})."
        )
    order: list[str | None] = [call.id for call in pending]
    if messages and (pending or session.continues) and not resuming:
        chosen = unfinished_policy(session.loaded.metadata if session.loaded is not None else None, policy)
        if chosen == "refuse":
            unfinished = f"tool call(s) to {names} whose results are not committed" if pending else "an unfinished run"
            raise ThreadBusyError(
                f"Thread '{session.thread_id}' has {unfinished}: its last run stopped early (a crash or a cancel) and "
                "no run holds the thread now. Nothing was written. Finish that run first with "
                "agent.run(messages=[], thread_id=...) (over HTTP: a run with input null), or send the messages "
                "with on_unfinished_calls='finish' (run the calls first) or 'close' (answer them with errors) (over "
                "HTTP: config={'configurable': {'on_unfinished_calls': ...}})."
            )
        if chosen == "close":
            return Continuation([], _closed(session, pending), order, {}, False, then_input=True)
        calling = [ChatMessage.from_assistant(tool_calls=list(pending))] if pending else []
        return Continuation(calling, {}, order, {}, bool(pending), then_input=True)
    if resuming and not session.interrupted:
        hint = (
            f" Its pending tool call(s) to {names} come from a run that stopped early; agent.run(messages=[], "
            "thread_id=...) finishes them."
            if pending
            else ""
        )
        raise ValueError(f"Thread '{session.thread_id}' is not interrupted: there is nothing to resume.{hint}")
    if not resuming:
        if not pending:
            return None
        if policy == "close":
            return Continuation([], _closed(session, pending), order, {}, False)
        return Continuation([ChatMessage.from_assistant(tool_calls=list(pending))], {}, order, {}, True)
    for name, given in (("decisions", decisions), ("answers", answers)):
        if given is not None and not isinstance(given, Mapping):
            raise ValueError(f"resume: {name} must be a dict, got {type(given).__name__}.")
    decided = dict(decisions or {})
    answered = dict(answers or {})
    _check_resume(requests, decided, answered)
    # Calls held before they ran get their decision; the others (asked from inside, or waiting for those) run as
    # they are, with the answers so far.
    before_ids = {r.call_id for r in requests if r.kind == "before"}
    held = [call for call in pending if call.id in before_ids]
    approved, rejected = apply_decisions(held, {k: v for k, v in decided.items() if k in before_ids})
    replaced = {call.id: call for message in approved for call in message.tool_calls}
    to_run = [replaced.get(call.id, call) for call in pending if call.id not in rejected]
    to_run = [call for call in to_run if call.id not in before_ids or call.id in replaced]
    # A call that asked from inside runs again with the arguments it ran with (a human may have edited them before).
    ran_with = {r.call_id: r.arguments for r in requests if r.kind == "interrupt"}
    to_run = [dataclasses.replace(c, arguments=dict(ran_with[c.id])) if c.id in ran_with else c for c in to_run]
    given = session.answers
    hooks = False
    for request in requests:
        if request.kind not in ("interrupt", "hook"):
            continue
        key = HOOK_ANSWERS if request.kind == "hook" else str(request.call_id)
        index = request.index
        so_far = given.get(key, [])
        if index is not None and 0 <= index <= len(so_far):
            so_far = so_far[:index]
        given[key] = [*so_far, answered[request.id]]
        hooks = hooks or request.kind == "hook"
    calling = [ChatMessage.from_assistant(tool_calls=to_run)] if to_run else []
    return Continuation(calling, rejected, order, given, hooks)


def _describe(requests: Sequence[InterruptRequest]) -> str:
    if not requests:
        return "a human"
    return ", ".join(f"{r.kind} '{r.id}' ({r.tool_name})" for r in requests)


def _check_resume(
    requests: list[InterruptRequest], decisions: dict[str, DecisionLike], answers: dict[str, object]
) -> None:
    """Every request has a decision or an answer of the right kind, and nothing else is given; else ValueError."""
    needs_decision = [str(r.call_id) for r in requests if r.kind == "before"]
    needs_answer = [r.id for r in requests if r.kind in ("interrupt", "hook")]
    reviews = {r.id: str(r.call_id) for r in requests if r.kind == "after"}
    problems = []
    missing = [i for i in needs_decision if i not in decisions]
    missing += [i for i in needs_answer if i not in answers]
    missing += [i for i, call_id in reviews.items() if i not in answers and call_id not in decisions]
    if missing:
        problems.append(f"no decision or answer for pending request(s) {missing}")
    unknown_decisions = sorted(str(k) for k in decisions if k not in needs_decision and k not in reviews.values())
    unknown_answers = sorted(str(k) for k in answers if k not in needs_answer and k not in reviews)
    if unknown_decisions:
        problems.append(f"decisions name unknown call id(s) {unknown_decisions}")
    if unknown_answers:
        problems.append(f"answers name unknown interrupt id(s) {unknown_answers}")
    if problems:
        raise ValueError(f"resume: {'; '.join(problems)}. Pending: {_describe(requests)}. Nothing was written.")
