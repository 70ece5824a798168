"""
The typed records of a human-in-the-loop run: ``Approve``, ``Reject`` and ``Edit`` decisions are taken by ``resume``
as the old ``"approve"``, ``"reject"`` and ``{"arguments": ...}`` are, and interrupt requests keep their stored dict
form through ``InterruptRequest``.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
from haystack.dataclasses import ChatMessage
from without_ids import without_ids
from workers.thread_worker import build_agent

from haystack_state.agent import Agent, Approve, Edit, InterruptRequest, Reject, UnfinishedCalls
from haystack_state.agent.protocols import as_decision
from haystack_state.persistence import InMemoryCheckpointer


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


@pytest.mark.parametrize(
    ("old", "new"),
    [("approve", Approve()), ("reject", Reject()), ({"arguments": {"text": "edited"}}, Edit({"text": "edited"}))],
)
def test_a_typed_decision_resumes_as_its_old_form_does(old: Any, new: Any) -> None:
    results = []
    for decision in (old, new):
        with InMemoryCheckpointer() as cp:
            agent = build_agent(cp, interrupt_before=["write"])
            agent.run(user("alpha:1"), thread_id="t")
            results.append(agent.resume("t", {"c1-0": decision}))
    assert without_ids(results[0]["messages"]) == without_ids(results[1]["messages"])
    assert as_decision(old) == new


def test_a_malformed_decision_is_none() -> None:
    assert as_decision("maybe") is None
    assert as_decision({"arguments": "x"}) is None


@pytest.mark.parametrize(
    "stored",
    [
        {"id": "c1", "kind": "before", "tool_name": "t", "call_id": "c1", "arguments": {"a": 1}, "value": {"a": 1}},
        {
            "id": "int-1",
            "kind": "interrupt",
            "tool_name": "t",
            "call_id": "c1",
            "arguments": {},
            "value": "?",
            "index": 0,
        },
        {"id": "int-2", "kind": "hook", "tool_name": "t, u", "call_id": None, "arguments": {}, "value": 1, "index": 2},
        {"id": "review-c1", "kind": "after", "tool_name": "t", "call_id": "c1", "arguments": {}, "value": "done"},
    ],
)
def test_an_interrupt_request_round_trips_its_stored_dict(stored: dict[str, Any]) -> None:
    request = InterruptRequest.from_dict(stored)
    assert request.to_dict() == stored
    assert list(request.to_dict()) == list(stored)  # the same keys, in the same order


def test_an_unknown_request_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="Not an interrupt request"):
        InterruptRequest.from_dict({"id": "x", "kind": "later"})


def test_the_unfinished_calls_policies_are_the_public_types_values() -> None:
    """``on_unfinished_calls`` is typed by the exported ``UnfinishedCalls``, and exactly its values are taken."""
    assert get_args(UnfinishedCalls) == ("finish", "close", "refuse")
    for method in (Agent.__init__, Agent.run, Agent.run_async, Agent.stream, Agent.stream_async):
        assert method.__annotations__["on_unfinished_calls"] == "UnfinishedCalls | None", method
    with InMemoryCheckpointer() as cp:
        for policy in get_args(UnfinishedCalls):
            assert build_agent(cp, on_unfinished_calls=policy).run(user("alpha:1"), thread_id=policy)["messages"]
        with pytest.raises(ValueError, match="on_unfinished_calls must be one of finish, close, refuse"):
            build_agent(cp, on_unfinished_calls="later")
