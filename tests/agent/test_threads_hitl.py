"""
Human in the loop on durable threads: ``interrupt_before`` stops a run before a tool runs; ``Agent.resume`` (or
``resume_async``) continues it with a decision per pending call (approve, reject, edited arguments), possibly in
another process; bad decisions are refused before anything is written.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from without_ids import without_ids
from workers.harness import Harness, Worker, store_spec
from workers.thread_worker import SCHEMA as WORKER_SCHEMA
from workers.thread_worker import build_agent

from haystack_state import Agent, State, ThreadNotFoundError, tool
from haystack_state.agent._continuation import REJECTED
from haystack_state.persistence import Checkpointer, InMemoryCheckpointer
from haystack_state.testing import ScriptedChatGenerator


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def uninterrupted(task: str) -> dict[str, Any]:
    """The state a run of ``task`` ends with when nothing stops it."""
    with InMemoryCheckpointer() as cp:
        build_agent(cp).run(user(task), thread_id="reference")
        return build_agent(cp).get_state("reference").values


def sources(cp: Checkpointer, thread_id: str) -> list[str]:
    return [meta.source for meta in reversed(cp.history(thread_id))]


# --- interrupt and resume -------------------------------------------------------------------------------------


def test_a_run_stops_before_an_interrupt_tool_and_resumes_to_the_uninterrupted_state(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, interrupt_before=["write"])
    result = agent.run(user("alpha:2"), thread_id="t", topic="A")
    assert result["exit_reason"] == "interrupted"
    assert [(c.tool_name, c.arguments, c.id) for c in result["pending_tool_calls"]] == [
        ("write", {"text": "alpha-1"}, "c1-0")
    ]
    assert result["step_count"] == 1
    assert "notes" not in result  # the tool did not run
    snapshot = agent.get_state("t")
    assert snapshot.interrupted
    assert snapshot.pending_tool_calls == result["pending_tool_calls"]
    assert snapshot.checkpoint.source == "model"
    assert snapshot.checkpoint.metadata["pending"] == ["c1-0"]
    assert snapshot.checkpoint.checkpoint_id == result["checkpoint_id"]

    second = agent.resume("t", {"c1-0": "approve"})
    assert second["exit_reason"] == "interrupted"  # the model calls write again: a second interrupt
    assert second["notes"] == ["alpha-1"]
    assert second["step_count"] == 2  # steps count over the whole run, across the resume
    assert second["topic"] == "A"  # the run-scoped input survives the interrupt: it is the same run
    final = agent.resume("t", {"c2-0": "approve"})
    assert final["exit_reason"] == "text"
    assert final["step_count"] == 3
    assert not agent.get_state("t").interrupted
    expected = uninterrupted("alpha:2")
    assert without_ids({**agent.get_state("t").values, "topic": "none"}) == without_ids(expected)  # ids differ
    assert sources(cp, "t") == ["input", "model", "tools", "model", "tools", "model"]


def test_reject_tells_the_model_and_runs_nothing(store: Harness) -> None:
    cp = store.make()
    generator = ScriptedChatGenerator(script=[[("write", {"text": "x"})], "understood"])
    agent = Agent(
        generator,
        tools=build_agent(None).tools,
        state_schema=WORKER_SCHEMA,
        checkpointer=cp,
        interrupt_before=["write"],
    )
    agent.run(user("write x"), thread_id="t")
    result = agent.resume("t", {"call_1": "reject"})
    assert result["exit_reason"] == "text"
    assert result["last_message"].text == "understood"
    rejection = result["messages"][-2].tool_call_result
    assert (rejection.result, rejection.error, rejection.origin.id) == (REJECTED, True, "call_1")
    assert generator.calls[-1].messages[-1].tool_call_result == rejection  # the model saw it
    tools_checkpoint = cp.history("t")[1]
    assert (tools_checkpoint.source, tools_checkpoint.tool_names) == ("tools", ("write",))


def test_edited_arguments_run_instead_of_the_models(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, interrupt_before=["write"])
    agent.run(user("alpha:1"), thread_id="t")
    result = agent.resume("t", {"c1-0": {"arguments": {"text": "edited"}}})
    assert result["notes"] == ["edited"]
    result_message = result["messages"][-2]
    assert result_message.tool_call_result.origin.arguments == {"text": "edited"}
    assert result["messages"][2].tool_calls[0].arguments == {"text": "alpha-1"}  # the model's call is kept as made


def test_several_pending_calls_each_get_a_decision_and_results_keep_the_models_order(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, interrupt_before=["write"])
    result = agent.run(user("alpha:1:3"), thread_id="t")
    assert [c.id for c in result["pending_tool_calls"]] == ["c1-0", "c1-1", "c1-2"]
    final = agent.resume("t", {"c1-0": "reject", "c1-1": {"arguments": {"text": "B"}}, "c1-2": "approve"})
    assert final["notes"] == ["B", "alpha-1.2"]
    results = [m.tool_call_result for m in final["messages"] if m.tool_call_result is not None]
    assert [(r.origin.id, r.error) for r in results] == [("c1-0", True), ("c1-1", False), ("c1-2", False)]


def test_resume_async(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, interrupt_before=["write"])
    first = asyncio.run(agent.run_async(user("alpha:1"), thread_id="t"))
    assert first["exit_reason"] == "interrupted"
    final = asyncio.run(agent.resume_async("t", {"c1-0": "approve"}))
    assert final["exit_reason"] == "text"
    assert without_ids(agent.get_state("t").values) == without_ids(uninterrupted("alpha:1"))  # ids differ


def test_only_the_listed_tools_interrupt(store: Harness) -> None:
    @tool
    def send(to: str) -> str:
        """Send a message."""
        return f"sent to {to}"

    cp = store.make()
    script: list[Any] = [[("write", {"text": "a"})], [("send", {"to": "bob"})], "sent"]
    agent = Agent(
        ScriptedChatGenerator(script=script),
        tools=[*build_agent(None).tools, send],
        state_schema={"notes": {"type": list[str]}, "scratch": {"type": list[str]}, "count": {"type": int}},
        checkpointer=cp,
        interrupt_before=["send"],
    )
    result = agent.run(user("go"), thread_id="t")
    assert result["exit_reason"] == "interrupted"
    assert result["notes"] == ["a"]  # write ran; send waits
    assert [c.tool_name for c in result["pending_tool_calls"]] == ["send"]
    assert agent.resume("t", {"call_2": "approve"})["last_message"].text == "sent"


def test_an_interrupted_thread_stays_interrupted_through_a_human_edit(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, interrupt_before=["write"])
    agent.run(user("alpha:1"), thread_id="t", scratch=["kept"])
    meta = agent.update_state("t", {"notes": ["human"]})
    assert meta.source == "update"
    snapshot = agent.get_state("t")
    assert snapshot.interrupted
    assert [c.id for c in snapshot.pending_tool_calls] == ["c1-0"]
    with pytest.raises(ValueError, match="is interrupted"):
        agent.run([], thread_id="t")
    final = agent.resume("t", {"c1-0": "approve"})
    assert final["notes"] == ["human", "alpha-1"]
    assert final["scratch"] == ["kept", "alpha-1"]  # still the same run: the run-scoped key was not reset


def test_an_after_run_hook_at_the_interrupt_keeps_the_thread_interrupted(store: Harness) -> None:
    cp = store.make()

    def after_run(state: State) -> None:
        state.set("count", 1)

    agent = build_agent(cp, interrupt_before=["write"], hooks={"after_run": after_run})
    agent.run(user("alpha:1"), thread_id="t")
    assert sources(cp, "t") == ["input", "model", "update"]
    assert agent.get_state("t").interrupted
    final = agent.resume("t", {"c1-0": "approve"})
    assert final["exit_reason"] == "text"
    assert final["count"] == 3  # 1 (hook) + 1 (write) + 1 (the hook again at the end)


def test_a_human_who_answers_the_pending_calls_ends_the_interrupt(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, interrupt_before=["write"])
    result = agent.run(user("alpha:1"), thread_id="t", scratch=["kept"])
    call = result["pending_tool_calls"][0]
    agent.update_state("t", {"messages": [ChatMessage.from_tool("done by hand", origin=call)]})
    snapshot = agent.get_state("t")
    assert not snapshot.interrupted and snapshot.pending_tool_calls == []
    with pytest.raises(ValueError, match="not interrupted"):
        agent.resume("t", {call.id: "approve"})
    final = agent.run([], thread_id="t")  # continues the run: the model reads the human's result
    assert final["last_message"].text == "done alpha"
    assert "notes" not in final
    assert final["scratch"] == ["kept"]  # the same run: its run-scoped key is kept


def test_an_agent_with_interrupts_refuses_to_run_without_a_thread() -> None:
    ran: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send a message."""
        ran.append(to)
        return "sent"

    with InMemoryCheckpointer() as cp:
        generator = ScriptedChatGenerator(script=[[("send", {"to": "bob"})], "sent"])
        agent = Agent(generator, tools=[send], checkpointer=cp, interrupt_before=["send"])
        with pytest.raises(ValueError, match=r"stops before send for a human's approval.*thread_id"):
            agent.run(user("send it"))
        with pytest.raises(ValueError, match="thread_id"):
            asyncio.run(agent.run_async(user("send it")))
        assert ran == [] and generator.calls == []
        assert cp.list_threads() == []


# --- refused resumes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decisions", "message"),
    [
        ({}, r"no decision or answer for pending request\(s\) \['c1-0', 'c1-1'\]"),
        ({"c1-0": "approve"}, r"no decision or answer for pending request\(s\) \['c1-1'\]"),
        ({"c1-0": "approve", "c1-1": "approve", "c9": "approve"}, r"unknown call id\(s\) \['c9'\]"),
        ({"c1-0": "approve", "c1-1": "yes"}, "must be 'approve', 'reject' or"),
        ({"c1-0": "approve", "c1-1": {"arguments": "text"}}, "must be 'approve', 'reject' or"),
        ({"c1-0": "approve", "c1-1": {"args": {}}}, "must be 'approve', 'reject' or"),
        ({"c1-0": "approve", "c1-1": {"arguments": {}, "extra": 1}}, "must be 'approve', 'reject' or"),
        (["c1-0", "c1-1"], "decisions must be a dict"),
        (
            {"c1-0": "approve", "c1-1": {"arguments": {"text": 5}}},
            r"edited arguments of call 'c1-1' do not fit tool 'write'.*'text'",
        ),
        ({"c1-0": "approve", "c1-1": {"arguments": {"txt": "x"}}}, r"call 'c1-1' do not fit tool 'write'.*'txt'"),
    ],
)
def test_bad_decisions_are_refused_and_write_nothing(decisions: Any, message: str) -> None:
    with InMemoryCheckpointer() as cp:
        agent = build_agent(cp, interrupt_before=["write"])
        agent.run(user("alpha:1:2"), thread_id="t", scratch=["s"])
        before = cp.history("t")
        with pytest.raises(ValueError, match=message):
            agent.resume("t", decisions)
        assert cp.history("t") == before
        assert agent.get_state("t").interrupted
        final = agent.resume("t", {"c1-0": "approve", "c1-1": "approve"})  # the thread is still resumable
        assert final["scratch"] == ["s", "alpha-1.0", "alpha-1.1"]


def test_resume_and_run_are_refused_where_they_do_not_fit() -> None:
    with InMemoryCheckpointer() as cp:
        agent = build_agent(cp, interrupt_before=["write"])
        agent.run(user("alpha:0"), thread_id="done")  # no tool call: the run finished
        with pytest.raises(ValueError, match="'done' is not interrupted: there is nothing to resume"):
            agent.resume("done", {})
        with pytest.raises(ThreadNotFoundError):
            agent.resume("missing", {"c1-0": "approve"})

        agent.run(user("alpha:1"), thread_id="t")
        before = cp.history("t")
        with pytest.raises(ValueError, match="interrupted before tool call"):
            agent.run(user("something else"), thread_id="t")
        with pytest.raises(ValueError, match="interrupted before tool call"):
            agent.run([], thread_id="t")
        with pytest.raises(ValueError, match="interrupted before tool call"):
            asyncio.run(agent.run_async([], thread_id="t"))
        assert cp.history("t") == before


# --- across processes ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_interrupt_in_one_process_and_resume_in_another(persistent_store: Harness, tmp_path: Path) -> None:
    spec = store_spec(persistent_store)
    with Worker("--store", spec, "--thread", "t", "--message", "alpha:2", "--interrupt") as worker:
        summary = json.loads(worker.finish())
    assert summary["exit_reason"] == "interrupted"
    assert summary["pending"] == ["c1-0"]
    cp = persistent_store.make()
    assert cp.head("t") == summary["checkpoint_id"]
    agent = build_agent(cp, interrupt_before=["write"])
    assert agent.get_state("t").interrupted
    assert agent.resume("t", {"c1-0": "approve"})["exit_reason"] == "interrupted"
    assert agent.resume("t", {"c2-0": {"arguments": {"text": "edited"}}})["exit_reason"] == "text"
    expected = uninterrupted("alpha:2")
    values = agent.get_state("t").values
    assert values["notes"] == ["alpha-1", "edited"]
    assert values["count"] == expected["count"]
    assert len(values["messages"]) == len(expected["messages"])
    assert sources(cp, "t") == ["input", "model", "tools", "model", "tools", "model"]
