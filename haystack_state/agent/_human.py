"""
Human-in-the-loop, inside a run: the requests a step leaves for a human (:class:`InterruptRequest`: calls held by
``interrupt_before``, ``interrupt()`` asked by a tool or a ``before_tool`` hook, results to review for
``interrupt_after``) and the check of a resume's edited arguments. Pure functions: the loop
(:mod:`haystack_state.agent._loop`) commits what they return; how a resumed run goes on is
:mod:`haystack_state.agent._continuation`'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state.agent._continuation import Continuation
from haystack_state.agent._session import before_request
from haystack_state.agent.protocols import DecisionLike, Edit, InterruptRequest
from haystack_state.errors import ToolInvocationError
from haystack_state.invocation._calls import check_arguments
from haystack_state.invocation._outcome import PendingCall
from haystack_state.tools.spec import ToolSpec

__all__ = ["check_edits", "hook_request", "review_requests", "waiting_requests"]


def _interrupt_id() -> str:
    return f"int-{uuid.uuid4().hex[:12]}"


def check_edits(planned: Continuation, specs: Mapping[str, ToolSpec], decisions: Mapping[str, DecisionLike]) -> None:
    """
    Edited arguments (``resume``'s ``Edit(arguments)`` or ``{"arguments": {...}}``) must fit the tool's parameters.

    :param planned: The run's continuation (its calls carry the edited arguments).
    :param specs: The run's tools.
    :param decisions: ``resume``'s decisions, by call id.
    :raises ValueError: If they do not.
    """
    calls = {call.id: call for message in planned.calling for call in message.tool_calls}
    for call_id, decision in decisions.items():
        call = calls.get(call_id)
        if call is None or not isinstance(decision, Mapping | Edit):
            continue
        spec = specs.get(call.tool_name)
        if spec is None:
            continue
        try:
            check_arguments(spec, dict(call.arguments))
        except ToolInvocationError as error:
            raise ValueError(
                f"resume: the edited arguments of call '{call_id}' do not fit tool '{call.tool_name}': {error} "
                "Nothing was written; the thread is still interrupted."
            ) from error


def waiting_requests(pending: Sequence[PendingCall]) -> list[InterruptRequest]:
    """The requests of the calls a step's tool batch left waiting: held (``interrupt_before``) or asking."""
    requests = []
    for waiting in pending:
        if waiting.reason == "held":
            requests.append(before_request(waiting.tool_call))
        elif waiting.reason == "interrupt":
            requests.append(
                InterruptRequest(
                    _interrupt_id(),
                    "interrupt",
                    waiting.tool_name,
                    waiting.call_id,
                    dict(waiting.arguments),
                    waiting.value,
                    waiting.index,
                )
            )
    return requests


def review_requests(tool_messages: Sequence[ChatMessage], interrupt_after: frozenset[str]) -> list[InterruptRequest]:
    """The ``interrupt_after`` requests of a step's results: a human reviews them before the run goes on."""
    return [
        InterruptRequest(
            f"review-{result.origin.id}",
            "after",
            result.origin.tool_name,
            result.origin.id,
            dict(result.origin.arguments),
            result.result,
        )
        for message in tool_messages
        if (result := message.tool_call_result) is not None and result.origin.tool_name in interrupt_after
    ]


def hook_request(waiting: Sequence[ToolCall], value: object, index: int) -> InterruptRequest:
    """The request of a ``before_tool`` hook that called ``interrupt(value)`` (its ``index``-th) without an answer."""
    return InterruptRequest(
        _interrupt_id(), "hook", ", ".join(call.tool_name for call in waiting), None, {}, value, index
    )
