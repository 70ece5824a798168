"""
Crash recovery on durable threads: a worker process is SIGKILLed in the middle of a run, and another process
continues the thread with ``agent.run(messages=[], thread_id=...)``; the final state equals an uninterrupted run's
and no committed checkpoint is lost. Also: failures inside the process (a tool, the model), what a continued run
keeps (run-scoped keys, the step count, hooks), and the codec's allowlist across processes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from persistence.harness import branch, shape
from without_ids import without_ids
from workers import thread_worker
from workers.harness import Harness, Worker, store_spec, wait_for_leases
from workers.thread_worker import build_agent

from haystack_state import AgentRunError, CodecError, State, ToolExecutionError
from haystack_state.errors import ThreadBusyError
from haystack_state.persistence import InMemoryCheckpointer


@pytest.fixture(autouse=True)
def no_leftover_failures() -> Iterator[None]:
    yield
    thread_worker.FAIL_ONCE.clear()


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def reference(task: str, **inputs: Any) -> tuple[dict[str, Any], list[Any]]:
    """The final state and checkpoint shape of an uninterrupted run of ``task``."""
    with InMemoryCheckpointer() as cp:
        build_agent(cp).run(user(task), thread_id="reference", **inputs)
        return cp.get("reference").values, shape(cp, "reference")


# --- a worker killed with SIGKILL -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("block", "head_source", "pending"),
    [
        ("tool:alpha-2", "model", ["c2-0"]),  # killed while the tool runs: its call was committed, its result not
        ("model:alpha@3", "tools", []),  # killed while the model thinks: the step's results were committed
    ],
)
def test_a_killed_run_continues_in_another_process_to_the_uninterrupted_state(
    persistent_store: Harness, tmp_path: Path, block: str, head_source: str, pending: list[str]
) -> None:
    signal_file = tmp_path / "reached"
    args = ["--store", store_spec(persistent_store), "--thread", "t", "--message", "alpha:3", "--topic", "T"]
    with Worker(*args, "--block", block, "--signal", str(signal_file)) as worker:
        worker.wait_for(signal_file)
        worker.kill()

    cp = persistent_store.make()
    assert cp.read_lease("t") is not None  # the dead run's lease holds the thread until it expires
    with pytest.raises(ThreadBusyError, match="busy"):
        build_agent(cp).run([], thread_id="t")
    wait_for_leases(cp, ["t"])
    committed = branch(cp, "t")
    assert committed[-1].source == head_source
    agent = build_agent(cp)
    snapshot = agent.get_state("t")
    assert [call.id for call in snapshot.pending_tool_calls] == pending
    assert not snapshot.interrupted
    if pending:
        with pytest.raises(ValueError, match="not committed"):
            agent.run(user("something else"), thread_id="t", on_unfinished_calls="refuse")
        with pytest.raises(ValueError, match=r"not interrupted.*stopped early"):
            agent.resume("t", {"c2-0": "approve"})
        assert branch(cp, "t") == committed

    result = agent.run([], thread_id="t")
    assert result["exit_reason"] == "text"
    assert result["step_count"] == 4  # the run's model calls, those before the crash included

    expected_values, expected_shape = reference("alpha:3", topic="T")
    assert without_ids(cp.get("t").values) == without_ids(expected_values)  # each run's messages get their own ids
    assert result["topic"] == "T"  # the run-scoped input was kept: it is the same run
    final = branch(cp, "t")
    assert final[: len(committed)] == committed  # every checkpoint committed before the crash is still there
    assert shape(cp, "t") == expected_shape
    assert len(cp.history("t")) == len(final)  # and no stray branch


@pytest.mark.slow
def test_a_killed_run_resumed_by_a_second_worker_then_continued(persistent_store: Harness, tmp_path: Path) -> None:
    signal_file = tmp_path / "reached"
    spec = store_spec(persistent_store)
    with Worker(
        "--store",
        spec,
        "--thread",
        "t",
        "--message",
        "alpha:2",
        "--block",
        "tool:alpha-1",
        "--signal",
        str(signal_file),
    ) as worker:
        worker.wait_for(signal_file)
        worker.kill()
    cp = persistent_store.make()
    wait_for_leases(cp, ["t"])
    agent = build_agent(cp)
    assert agent.run([], thread_id="t")["notes"] == ["alpha-1", "alpha-2"]
    # The thread goes on as usual afterwards, from another process too.
    with Worker("--store", spec, "--thread", "t", "--message", "beta:1") as worker:
        worker.finish()
    assert agent.get_state("t").values["notes"] == ["alpha-1", "alpha-2", "beta-1"]


# --- failures inside the process --------------------------------------------------------------------------------


def test_a_failed_tool_leaves_its_call_pending_and_a_run_without_messages_finishes_it(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, raise_on_tool_invocation_failure=True)
    thread_worker.FAIL_ONCE.add("tool:alpha-2")
    with pytest.raises(ToolExecutionError, match="simulated failure"):
        agent.run(user("alpha:3"), thread_id="t", scratch=["s"])
    committed = branch(cp, "t")
    assert [m.source for m in committed] == ["input", "model", "tools", "model"]
    with pytest.raises(ValueError, match="not committed"):
        agent.run(user("other"), thread_id="t", on_unfinished_calls="refuse")
    result = agent.run([], thread_id="t")
    assert result["scratch"] == ["s", "alpha-1", "alpha-2", "alpha-3"]
    expected_values, expected_shape = reference("alpha:3", scratch=["s"])
    assert without_ids(cp.get("t").values) == without_ids(expected_values)  # each run's messages get their own ids
    assert shape(cp, "t") == expected_shape
    assert branch(cp, "t")[:4] == committed


def test_a_failed_model_call_ends_the_run_on_the_thread_and_a_run_without_messages_starts_again(
    store: Harness,
) -> None:
    # The failure happened in this process, so the run is known to be over: the thread records that it stopped (an
    # "update" checkpoint that changes nothing), and later runs are not refused as if it were still in flight.
    cp = store.make()
    agent = build_agent(cp)
    thread_worker.FAIL_ONCE.add("model:alpha@1")
    with pytest.raises(AgentRunError, match="simulated failure"):
        agent.run(user("alpha:2"), thread_id="t", topic="T", scratch=["s"])
    history = branch(cp, "t")
    assert [m.source for m in history] == ["input", "update"]
    assert history[-1].changed_keys == ()
    assert "simulated failure" in history[-1].metadata["stopped"]
    assert "continues" not in history[-1].metadata
    result = agent.run([], thread_id="t")  # no new messages: the model gets the conversation as it stands
    assert result["exit_reason"] == "text"
    assert result["notes"] == ["alpha-1", "alpha-2"]


def test_new_messages_after_a_failed_model_call_start_a_new_run(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    thread_worker.FAIL_ONCE.add("model:alpha@2")
    with pytest.raises(AgentRunError):
        agent.run(user("alpha:2"), thread_id="t", topic="T")
    result = agent.run(user("beta:1"), thread_id="t")
    assert result["topic"] == "none"  # a new run: run-scoped keys are reset
    assert result["scratch"] == ["beta-1"]
    assert result["notes"] == ["alpha-1", "beta-1"]


@pytest.mark.slow
def test_the_step_limit_counts_the_steps_before_the_crash(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, max_agent_steps=3, raise_on_tool_invocation_failure=True)
    thread_worker.FAIL_ONCE.add("tool:alpha-2")
    with pytest.raises(ToolExecutionError):
        agent.run(user("alpha:9"), thread_id="t")
    result = agent.run([], thread_id="t")
    assert result["exit_reason"] == "max_agent_steps"
    assert result["step_count"] == 3
    assert result["notes"] == ["alpha-1", "alpha-2", "alpha-3"]
    assert branch(cp, "t")[-1].metadata.get("continues") is None  # the run is over: nothing to continue
    assert agent.run([], thread_id="t")["step_count"] == 3  # a new run, with a step limit of its own


def test_a_continued_run_does_not_run_before_run_hooks_again(store: Harness) -> None:
    cp = store.make()
    calls: list[str] = []

    def before_run(state: State) -> None:
        calls.append("before_run")
        state.set("count", 100)

    def after_run(state: State) -> None:
        calls.append("after_run")

    agent = build_agent(
        cp, raise_on_tool_invocation_failure=True, hooks={"before_run": before_run, "after_run": after_run}
    )
    thread_worker.FAIL_ONCE.add("tool:alpha-1")
    with pytest.raises(ToolExecutionError):
        agent.run(user("alpha:2"), thread_id="t")
    assert agent.run([], thread_id="t")["count"] == 102
    assert calls == ["before_run", "after_run"]
    agent.run(user("beta:0"), thread_id="t")
    assert calls == ["before_run", "after_run", "before_run", "after_run"]


# --- the codec's allowlist across processes ------------------------------------------------------------------


@pytest.mark.slow
def test_loading_a_class_registered_only_in_another_process_fails_without_importing_it(
    persistent_store: Harness,
) -> None:
    with Worker("--store", store_spec(persistent_store), "--thread", "t", "--message", "x", "--custom-type") as worker:
        worker.finish()
    assert "workers.custom_types" not in sys.modules
    cp = persistent_store.make()
    assert [m.source for m in branch(cp, "t")] == ["input", "model", "tools", "model"]
    with pytest.raises(CodecError, match=r"workers\.Receipt") as raised:
        cp.get("t")
    assert "register" in str(raised.value)
    assert "workers.custom_types" not in sys.modules  # loading looked the name up; it imported nothing
