"""
New messages on a thread whose last run stopped between the model's tool calls and their results follow the Agent's
``on_unfinished_calls`` policy (``finish``, ``close``, ``refuse``; per Agent and per run): after a real crash (a
worker process killed with SIGKILL) and after a failure inside the process. Refusing writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from workers import thread_worker
from workers.harness import Harness, Worker, store_spec, wait_for_leases
from workers.thread_worker import build_agent

from haystack_state import Agent, ThreadBusyError, ToolExecutionError
from haystack_state.persistence import Checkpointer


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def crashed(persistent_store: Harness, tmp_path: Path) -> Checkpointer:
    """A thread ``t`` whose run was killed while its second tool call ran: call ``c2-0`` (``alpha-2``) is pending."""
    signal_file = tmp_path / "reached"
    args = ["--store", store_spec(persistent_store), "--thread", "t", "--message", "alpha:3"]
    with Worker(*args, "--block", "tool:alpha-2", "--signal", str(signal_file)) as worker:
        worker.wait_for(signal_file)
        worker.kill()
    cp = persistent_store.make()
    wait_for_leases(cp, ["t"])
    assert [call.id for call in build_agent(cp).get_state("t").pending_tool_calls] == ["c2-0"]
    return cp


def roles(result: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for message in result["messages"][1:]:
        if message.tool_call_result is not None:
            result = message.tool_call_result.result
            out.append(("tool", json.loads(result)["note"] if result.startswith("{") else result))
        elif message.tool_calls:
            out.append(("call", message.tool_calls[0].arguments["text"]))
        else:
            out.append((message.role.value, message.text or ""))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("where", ["agent", "run"])
def test_after_a_crash_finish_runs_the_pending_call_then_takes_the_message(
    persistent_store: Harness, tmp_path: Path, where: str
) -> None:
    cp = crashed(persistent_store, tmp_path)
    if where == "agent":
        result = build_agent(cp, on_unfinished_calls="finish").run(user("beta:1"), thread_id="t")
    else:  # the default after a crash is "finish", and a run may say so itself
        result = build_agent(cp, on_unfinished_calls="refuse").run(
            user("beta:1"), thread_id="t", on_unfinished_calls="finish"
        )
    assert result["notes"] == ["alpha-1", "alpha-2", "beta-1"]
    assert roles(result)[3:] == [
        ("call", "alpha-2"),
        ("tool", "alpha-2"),
        ("user", "beta:1"),
        ("call", "beta-1"),
        ("tool", "beta-1"),
        ("assistant", "done beta"),
    ]
    assert result["exit_reason"] == "text"
    assert build_agent(cp).get_state("t").pending_tool_calls == []


@pytest.mark.slow
def test_after_a_crash_the_default_finishes(persistent_store: Harness, tmp_path: Path) -> None:
    cp = crashed(persistent_store, tmp_path)
    assert build_agent(cp).run(user("beta:1"), thread_id="t")["notes"] == ["alpha-1", "alpha-2", "beta-1"]


@pytest.mark.slow
def test_after_a_crash_close_answers_the_pending_call_with_an_error(persistent_store: Harness, tmp_path: Path) -> None:
    cp = crashed(persistent_store, tmp_path)
    result = build_agent(cp, on_unfinished_calls="close").run(user("beta:1"), thread_id="t")
    assert result["notes"] == ["alpha-1", "beta-1"]  # alpha-2 never ran
    closed = [m for m in result["messages"] if m.tool_call_result is not None and m.tool_call_result.error]
    assert len(closed) == 1 and closed[0].tool_call_result.origin.id == "c2-0"
    assert "was not run" in closed[0].tool_call_result.result and "stopped" in closed[0].tool_call_result.result
    assert roles(result)[-4:] == [
        ("user", "beta:1"),
        ("call", "beta-1"),
        ("tool", "beta-1"),
        ("assistant", "done beta"),
    ]


@pytest.mark.slow
def test_after_a_crash_refuse_names_both_ways_out_and_writes_nothing(persistent_store: Harness, tmp_path: Path) -> None:
    cp = crashed(persistent_store, tmp_path)
    agent = build_agent(cp, on_unfinished_calls="refuse")
    history = cp.history("t")
    with pytest.raises(ThreadBusyError) as refused:
        agent.run(user("beta:1"), thread_id="t")
    message = str(refused.value)
    assert "write" in message and "agent.run(messages=[]" in message and "input null" in message
    assert "on_unfinished_calls" in message
    assert cp.history("t") == history
    # The Python way out: finish the run, then the thread takes messages again.
    assert agent.run([], thread_id="t")["notes"] == ["alpha-1", "alpha-2", "alpha-3"]
    assert agent.run(user("beta:1"), thread_id="t")["notes"][-1] == "beta-1"


def test_close_without_messages_answers_the_calls_and_the_model_goes_on(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, raise_on_tool_invocation_failure=True)
    thread_worker.FAIL_ONCE.add("tool:alpha-2")
    try:
        with pytest.raises(ToolExecutionError):
            agent.run(user("alpha:2"), thread_id="t")
    finally:
        thread_worker.FAIL_ONCE.clear()
    result = agent.run([], thread_id="t", on_unfinished_calls="close")
    assert result["notes"] == ["alpha-1"]
    assert roles(result)[-2:] == [
        ("tool", roles(result)[-2][1]),
        ("assistant", "done alpha"),
    ]
    assert "was not run" in roles(result)[-2][1]


def test_a_bad_policy_is_refused_at_construction_and_per_run(store: Harness) -> None:
    with pytest.raises(ValueError, match="on_unfinished_calls must be one of finish, close, refuse"):
        build_agent(store.make(), on_unfinished_calls="later")
    with pytest.raises(ValueError, match=r"run\(\) on_unfinished_calls"):
        build_agent(store.make()).run(user("alpha:1"), thread_id="t", on_unfinished_calls="later")


def test_the_policy_round_trips_through_to_dict() -> None:
    from haystack_state.testing import ScriptedChatGenerator

    agent = Agent(ScriptedChatGenerator(script=["hi"]), on_unfinished_calls="close")
    data = agent.to_dict()
    assert data["init_parameters"]["on_unfinished_calls"] == "close"
    assert Agent.from_dict(data).on_unfinished_calls == "close"
    del data["init_parameters"]["on_unfinished_calls"]  # as written before the parameter existed
    assert Agent.from_dict(data).on_unfinished_calls is None
