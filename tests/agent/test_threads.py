"""
Durable threads end to end: an Agent with a checkpointer, on every backend (in memory, SQLite, PostgreSQL).

Field lifecycle, a checkpoint per model reply and per step's tool results, inspection (get_state, get_history,
time travel, forks), human edits, list/delete, async runs, hooks, storage growth, the codec's allowlist, and
concurrent runs. Crash recovery is in ``test_threads_crash.py``, human-in-the-loop interrupts in
``test_threads_hitl.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
import uuid
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.tools import Tool
from persistence.harness import branch
from without_ids import without_ids
from workers.harness import Harness
from workers.thread_worker import SCHEMA, build_agent, policy

from haystack_state import (
    Agent,
    CheckpointNotFoundError,
    CodecError,
    State,
    StateHandlerError,
    StateTypeError,
    ThreadBusyError,
    ThreadConflictError,
    ThreadNotFoundError,
    UnknownStateKeyError,
    tool,
)
from haystack_state.agent._history import CheckpointHistory
from haystack_state.persistence import Checkpointer, InMemoryCheckpointer, dumps, register_type
from haystack_state.testing import ScriptedChatGenerator

TOOL_KEYS = {"messages", "notes", "scratch", "count"}


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def texts(values: dict[str, Any]) -> list[str]:
    """The conversation as ``role: text`` lines (tool calls and results shown by their text)."""
    lines = []
    for message in values["messages"]:
        if message.tool_calls:
            lines.append(f"{message.role.value}: " + ",".join(c.arguments["text"] for c in message.tool_calls))
        elif message.tool_call_result is not None:
            result = message.tool_call_result.result
            lines.append(f"tool: {json.loads(result)['note'] if result.startswith('{') else result}")
        else:
            lines.append(f"{message.role.value}: {message.text}")
    return lines


# --- behaviour without a thread ---------------------------------------------------------------------------


@pytest.mark.slow
def test_without_a_thread_id_nothing_is_stored(store: Harness) -> None:
    cp = store.make()
    result = build_agent(cp).run(user("alpha:1"))
    assert result["exit_reason"] == "text"
    assert result["notes"] == ["alpha-1"]
    assert result["checkpoint_id"] is None
    assert cp.list_threads() == []


# --- field lifecycle --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_thread_scoped_keys_accumulate_and_run_scoped_keys_reset(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    first = agent.run(user("alpha:2"), thread_id="t", topic="A")
    assert (first["notes"], first["scratch"], first["count"], first["topic"]) == (
        ["alpha-1", "alpha-2"],
        ["alpha-1", "alpha-2"],
        2,
        "A",
    )
    second = agent.run(user("beta:1"), thread_id="t")
    assert second["notes"] == ["alpha-1", "alpha-2", "beta-1"]  # thread scope: the reducer keeps appending
    assert second["count"] == 3  # the add reducer too
    assert second["scratch"] == ["beta-1"]  # run scope: reset at the start of the run
    assert second["topic"] == "none"  # reset to its default
    assert texts(agent.get_state("t").values) == [
        "system: You write notes.",  # the system prompt is put once, in the thread's first run
        "user: alpha:2",
        "assistant: alpha-1",
        "tool: alpha-1",
        "assistant: alpha-2",
        "tool: alpha-2",
        "assistant: done alpha",
        "user: beta:1",
        "assistant: beta-1",
        "tool: beta-1",
        "assistant: done beta",
    ]
    assert second["messages"] == agent.get_state("t").values["messages"]
    assert second["checkpoint_id"] == cp.head("t")


@pytest.mark.slow
def test_inputs_are_written_through_the_handlers(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    agent.run(user("alpha:1"), thread_id="t")
    result = agent.run(user("beta:0"), thread_id="t", notes=["from input"], count=10, scratch=["s"])
    assert result["notes"] == ["alpha-1", "from input"]  # merge_lists appends to what the thread holds
    assert result["count"] == 11  # add
    assert result["scratch"] == ["s"]  # run scope: reset first, then the input
    input_checkpoint = branch(cp, "t")[-2]
    assert input_checkpoint.source == "input"
    assert set(input_checkpoint.changed_keys) == {"messages", "notes", "count", "scratch"}


def test_a_run_that_changes_nothing_new_commits_no_input_checkpoint(store: Harness) -> None:
    cp = store.make()
    agent = Agent(ScriptedChatGenerator(script=["one", "two"]), state_schema=SCHEMA, checkpointer=cp)
    agent.run(user("hi"), thread_id="t")
    agent.run([], thread_id="t")  # nothing new: scratch and topic already hold their defaults
    assert [m.source for m in branch(cp, "t")] == ["input", "model", "model"]


# --- checkpoints per step -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_checkpoint_after_every_model_reply_and_every_steps_tool_results(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    agent.run(user("alpha:2"), thread_id="t")
    agent.run(user("beta:1"), thread_id="t")
    history = agent.get_history("t")
    assert isinstance(history, CheckpointHistory)
    assert history == cp.history("t")
    records = list(reversed(history))
    assert [(m.source, m.step, m.tool_names) for m in records] == [
        ("input", 0, ()),
        ("model", 1, ()),
        ("tools", 1, ("write",)),
        ("model", 2, ()),
        ("tools", 2, ("write",)),
        ("model", 3, ()),
        ("input", 3, ()),
        ("model", 4, ()),
        ("tools", 4, ("write",)),
        ("model", 5, ()),
    ]
    assert records[0].parent_id is None
    for parent, child in itertools.pairwise(records):
        assert child.parent_id == parent.checkpoint_id
        assert child.created_at >= parent.created_at
    assert [m.changed_keys for m in records if m.source == "model"] == [("messages",)] * 5
    assert all(set(m.changed_keys) == TOOL_KEYS for m in records if m.source == "tools")
    assert set(records[0].changed_keys) == {"messages", "count", "topic"}  # the new thread's messages and defaults
    assert set(records[6].changed_keys) == {"messages", "scratch"}  # new message; the run-scoped list is reset
    assert len({m.checkpoint_id for m in records}) == len(records)


@pytest.mark.slow
def test_get_state_at_an_old_checkpoint_is_the_state_as_it_was_then(store: Harness) -> None:
    cp = store.make()
    seen: dict[str, dict[str, Any]] = {}

    def remember(state: State) -> None:  # after each step's tools, before the tools checkpoint
        seen[f"step {len(seen) + 1}"] = state.snapshot()  # type: ignore[attr-defined]  # hooks get a RunState

    agent = build_agent(cp, hooks={"after_tool": remember})
    agent.run(user("alpha:3"), thread_id="t")
    agent.run(user("beta:1"), thread_id="t")
    tools_checkpoints = [m for m in branch(cp, "t") if m.source == "tools"]
    assert len(tools_checkpoints) == len(seen) == 4
    for meta, values in zip(tools_checkpoints, seen.values(), strict=True):
        snapshot = agent.get_state("t", checkpoint_id=meta.checkpoint_id)
        assert snapshot.values == values
        assert snapshot.checkpoint == meta
        assert snapshot.pending_tool_calls == []
        assert not snapshot.interrupted
    first_model = branch(cp, "t")[1]
    assert "notes" not in agent.get_state("t", first_model.checkpoint_id).values  # no default, not written yet
    assert [c.id for c in agent.get_state("t", first_model.checkpoint_id).pending_tool_calls] == ["c1-0"]


@pytest.mark.slow
def test_a_run_from_a_past_checkpoint_forks_and_leaves_the_old_branch_untouched(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    fork_point = agent.run(user("alpha:1"), thread_id="t")["checkpoint_id"]
    old_head = agent.run(user("beta:1"), thread_id="t")["checkpoint_id"]
    old_values = agent.get_state("t").values
    old_branch = [m.checkpoint_id for m in branch(cp, "t")]

    forked = agent.run(user("gamma:1"), thread_id="t", checkpoint_id=fork_point)
    assert forked["notes"] == ["alpha-1", "gamma-1"]
    assert cp.head("t") == forked["checkpoint_id"] != old_head
    new_branch = branch(cp, "t")
    assert [m.checkpoint_id for m in new_branch[:4]] == old_branch[:4]  # up to the fork point
    assert new_branch[4].parent_id == fork_point
    assert new_branch[4].step == 2  # steps continue from the fork point
    assert agent.get_state("t", old_head).values == old_values
    assert len(cp.history("t")) == len(old_branch) + 4  # every branch is listed
    assert "user: beta:1" not in texts(agent.get_state("t").values)
    # The next run continues the new branch.
    assert agent.run(user("delta:0"), thread_id="t")["notes"] == ["alpha-1", "gamma-1"]


# --- human edits ------------------------------------------------------------------------------------------


def test_update_state_goes_through_the_handlers_and_is_a_checkpoint_of_its_own(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    agent.run(user("alpha:1"), thread_id="t")
    meta = agent.update_state("t", {"notes": ["human"], "count": 5})
    assert meta.source == "update"
    assert set(meta.changed_keys) == {"notes", "count"}
    assert meta.step == 2
    assert cp.head("t") == meta.checkpoint_id
    values = agent.get_state("t").values
    assert values["notes"] == ["alpha-1", "human"]
    assert values["count"] == 6
    assert agent.run(user("beta:1"), thread_id="t")["notes"] == ["alpha-1", "human", "beta-1"]


def test_update_state_with_a_wrong_value_writes_nothing(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    agent.run(user("alpha:1"), thread_id="t")
    before = cp.history("t")
    with pytest.raises(StateTypeError, match="'topic'"):
        agent.update_state("t", {"notes": ["fine"], "topic": 5})
    with pytest.raises(StateTypeError, match="'notes'"):
        agent.update_state("t", {"notes": [3]})
    with pytest.raises(StateHandlerError, match="'count'"):  # the add handler refuses it before the type check
        agent.update_state("t", {"notes": ["fine"], "count": "five"})
    with pytest.raises(UnknownStateKeyError, match="'nope'"):
        agent.update_state("t", {"nope": 1})
    assert cp.history("t") == before
    assert agent.get_state("t").values["notes"] == ["alpha-1"]


# --- threads ------------------------------------------------------------------------------------------------


def test_list_threads_and_delete_thread(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    agent.run(user("alpha:1"), thread_id="t-1")
    agent.run(user("beta:2"), thread_id="t-2")
    threads = {info.thread_id: info for info in cp.list_threads()}
    assert set(threads) == {"t-1", "t-2"}
    assert threads["t-1"].checkpoint_count == 4
    assert threads["t-2"].checkpoint_count == 6
    assert threads["t-2"].head_id == cp.head("t-2")
    assert cp.list_threads()[0].thread_id == "t-2"  # most recently updated first

    cp.delete_thread("t-1")
    assert [info.thread_id for info in cp.list_threads()] == ["t-2"]
    with pytest.raises(ThreadNotFoundError):
        agent.get_state("t-1")
    with pytest.raises(ThreadNotFoundError):
        cp.delete_thread("t-1")
    # A deleted thread's id starts a new thread.
    assert agent.run(user("gamma:1"), thread_id="t-1")["notes"] == ["gamma-1"]


def test_threads_do_not_see_each_other(store: Harness) -> None:
    agent = build_agent(store.make())
    agent.run(user("alpha:1"), thread_id="a")
    agent.run(user("beta:1"), thread_id="b")
    assert agent.get_state("a").values["notes"] == ["alpha-1"]
    assert agent.get_state("b").values["notes"] == ["beta-1"]


def test_a_thread_is_read_back_by_another_checkpointer_instance(store: Harness) -> None:
    if not store.persistent:
        pytest.skip("the in-memory checkpointer keeps nothing across instances")
    build_agent(store.make()).run(user("alpha:2"), thread_id="t")
    agent = build_agent(store.make())
    assert agent.run(user("beta:1"), thread_id="t")["notes"] == ["alpha-1", "alpha-2", "beta-1"]


# --- async and hooks ----------------------------------------------------------------------------------------


def test_run_async_on_a_thread_matches_run(store: Harness) -> None:
    cp = store.make()
    sync_agent, async_agent = build_agent(cp), build_agent(cp)
    for task in ("alpha:2", "beta:1"):
        sync_agent.run(user(task), thread_id="sync")
        result = asyncio.run(async_agent.run_async(user(task), thread_id="async"))
        assert result["checkpoint_id"] == cp.head("async")
    assert without_ids(sync_agent.get_state("sync").values) == without_ids(async_agent.get_state("async").values)
    shape = [(m.source, m.step, m.changed_keys) for m in cp.history("sync")]
    assert [(m.source, m.step, m.changed_keys) for m in cp.history("async")] == shape


def test_hooks_that_change_the_state_after_the_last_reply_commit_an_update(store: Harness) -> None:
    cp = store.make()

    def after_run(state: State) -> None:
        state.set("notes", ["summary"])

    def on_exit(state: State) -> bool:
        state.set("count", 100)
        return False

    agent = build_agent(cp, hooks={"after_run": after_run, "on_exit": on_exit})
    result = agent.run(user("alpha:1"), thread_id="t")
    head = branch(cp, "t")[-1]
    assert head.source == "update"
    assert set(head.changed_keys) == {"notes", "count"}
    assert head.checkpoint_id == result["checkpoint_id"]
    values = agent.get_state("t").values
    assert (values["notes"], values["count"]) == (["alpha-1", "summary"], 101)
    assert (values["notes"], values["count"]) == (result["notes"], result["count"])


def test_hooks_that_change_nothing_commit_nothing(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, hooks={"after_run": lambda state: None})
    agent.run(user("alpha:1"), thread_id="t")
    assert branch(cp, "t")[-1].source == "model"


# --- storage --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_steps_checkpoint_stores_the_change_not_the_state(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp, max_agent_steps=250)
    result = agent.run(user("long:200"), thread_id="t")
    assert result["step_count"] == 201
    assert len(result["notes"]) == 200
    records = list(reversed(cp.history("t")))
    assert len(records) == 1 + 2 * 200 + 1
    steps = [m for m in records if m.source in ("model", "tools")]
    assert all(m.changed_keys == ("messages",) for m in steps if m.source == "model")
    assert all(set(m.changed_keys) == TOOL_KEYS for m in steps if m.source == "tools")

    def size(meta: Any) -> int:
        return store.row_bytes(cp, "t", meta.checkpoint_id)

    early = [size(m) for m in records if 10 <= m.step <= 20 and m.source == "tools"]
    late = [size(m) for m in records if 190 <= m.step <= 200 and m.source == "tools"]
    assert max(late) <= max(early) + 64  # a few more digits in the texts and ids; nothing that grows with the thread
    early_model = [size(m) for m in records if 10 <= m.step <= 20 and m.source == "model"]
    late_model = [size(m) for m in records if 190 <= m.step <= 200 and m.source == "model"]
    assert max(late_model) <= max(early_model) + 64
    # The state at the head is materialized from the deltas; one step's row is a sliver of it.
    values = agent.get_state("t").values
    assert values["notes"] == [f"long-{i}" for i in range(1, 201)]
    assert max(late) * 50 < len(dumps(values["messages"]))


# --- the codec's allowlist -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unregistered_class_in_the_state_fails_the_commit_naming_the_key(store: Harness) -> None:
    @dataclasses.dataclass(frozen=True)
    class Invoice:
        number: int

    @tool(outputs_to_state={"invoice": {"source": "invoice"}})
    def make_invoice(number: int) -> dict[str, Any]:
        """Make an invoice."""
        return {"invoice": Invoice(number)}

    cp = store.make()
    agent = Agent(
        ScriptedChatGenerator(script=[[("make_invoice", {"number": 7})], "made"]),
        tools=[make_invoice],
        state_schema={"invoice": {"type": Invoice}},
        checkpointer=cp,
    )
    with pytest.raises(CodecError, match="'invoice'") as raised:
        agent.run(user("invoice please"), thread_id="t")
    assert "register_type" in str(raised.value)
    # Nothing of the failed commit was written: the head is the model reply, whose call is still pending.
    assert [m.source for m in branch(cp, "t")] == ["input", "model"]
    snapshot = agent.get_state("t")
    assert "invoice" not in snapshot.values
    assert [c.tool_name for c in snapshot.pending_tool_calls] == ["make_invoice"]

    register_type(Invoice, name=f"test_threads.Invoice.{uuid.uuid4().hex}")
    result = agent.run([], thread_id="t")  # finishes the pending call, then the model answers
    assert result["exit_reason"] == "text"
    assert agent.get_state("t").values["invoice"] == Invoice(7)
    assert [m.source for m in branch(cp, "t")] == ["input", "model", "tools", "model"]


# --- concurrency ------------------------------------------------------------------------------------------


def _second(store: Harness, cp: Checkpointer) -> Checkpointer:
    """Another handle on the same storage (as another process would have), or the same in-memory store."""
    return store.make() if store.persistent else cp


def _race(runs: dict[str, Any]) -> dict[str, Any]:
    """Run the callables in threads at once; return each one's result or exception."""
    outcomes: dict[str, Any] = {}

    def target(name: str) -> None:
        try:
            outcomes[name] = runs[name]()
        except Exception as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=target, args=(name,)) for name in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


@pytest.mark.slow
def test_two_runs_on_one_thread_one_holds_it_the_other_is_busy_and_writes_nothing(store: Harness) -> None:
    cp = store.make()
    schema = {"notes": {"type": list[str]}}
    Agent(ScriptedChatGenerator(script=["hello"]), state_schema=schema, checkpointer=cp).run(user("hi"), thread_id="t")
    before = cp.history("t")
    ended = threading.Event()

    def agent_for(name: str, checkpointer: Checkpointer) -> Agent:
        def reply(messages: list[ChatMessage], tools: list[Tool]) -> str:
            ended.wait(30)  # the run holding the thread waits until the other one has given up
            return f"answer from {name}"

        return Agent(ScriptedChatGenerator(policy=reply), state_schema=schema, checkpointer=checkpointer)

    def run(agent: Agent) -> Any:
        try:
            return agent.run([], thread_id="t")
        finally:
            ended.set()

    agents = {"a": agent_for("a", cp), "b": agent_for("b", _second(store, cp))}
    outcomes = _race({name: lambda agent=agent: run(agent) for name, agent in agents.items()})
    busy = [name for name, outcome in outcomes.items() if isinstance(outcome, ThreadBusyError)]
    winners = [name for name, outcome in outcomes.items() if isinstance(outcome, dict)]
    assert len(busy) == 1 and len(winners) == 1, outcomes
    assert isinstance(outcomes[busy[0]], ThreadConflictError)  # a caller retrying on conflicts retries
    assert outcomes[busy[0]].holder is not None and outcomes[busy[0]].expires_at is not None
    winner, loser = winners[0], busy[0]
    history = cp.history("t")
    assert history[1:] == before  # exactly one checkpoint more: the winner's
    assert history[0].parent_id == before[0].checkpoint_id
    assert history[0].checkpoint_id == outcomes[winner]["checkpoint_id"]
    final = [m.text for m in agents[winner].get_state("t").values["messages"]]
    assert final[-1] == f"answer from {winner}"
    assert f"answer from {loser}" not in final
    assert cp.read_lease("t") is None  # released when the run ended


@pytest.mark.slow
def test_two_runs_finishing_the_same_pending_calls_run_the_tool_once(store: Harness) -> None:
    cp = store.make()
    schema = {"notes": {"type": list[str]}}
    armed = threading.Event()
    ended = threading.Event()
    calls: list[str] = []

    @tool(outputs_to_state={"notes": {"source": "note"}})
    def note(text: str) -> dict[str, Any]:
        """Take a note."""
        if armed.is_set():
            calls.append(threading.current_thread().name)
            ended.wait(30)  # the run holding the thread waits until the other one has given up
            return {"note": f"{text} by {threading.current_thread().name}"}
        raise RuntimeError("the first attempt fails")

    def agent_on(checkpointer: Checkpointer, script: list[Any]) -> Agent:
        return Agent(
            ScriptedChatGenerator(script=script),
            tools=[note],
            state_schema=schema,
            checkpointer=checkpointer,
            raise_on_tool_invocation_failure=True,
        )

    def run(agent: Agent) -> Any:
        try:
            return agent.run([], thread_id="t")
        finally:
            ended.set()

    with pytest.raises(Exception, match="first attempt"):
        agent_on(cp, [[("note", {"text": "n"})]]).run(user("note it"), thread_id="t")
    before = cp.history("t")
    assert before[0].source == "model"  # the call is pending
    armed.set()
    agents = [agent_on(cp, ["ok"]), agent_on(_second(store, cp), ["ok"])]
    outcomes = _race({f"run{i}": (lambda agent=agent: run(agent)) for i, agent in enumerate(agents)})
    assert sorted(type(o).__name__ for o in outcomes.values()) == ["ThreadBusyError", "dict"], outcomes
    assert len(calls) == 1  # the tool ran once: the live run was not taken over
    history = cp.history("t")
    assert [m.source for m in history[: len(history) - len(before)]] == ["model", "tools"]
    assert history[len(history) - len(before) :] == before
    notes = agents[0].get_state("t").values["notes"]
    assert len(notes) == 1  # one run's tool results, not both


@pytest.mark.slow
def test_runs_on_different_threads_never_block_each_other(store: Harness) -> None:
    cp = store.make()
    barrier = threading.Barrier(2, timeout=30)

    def lockstep(messages: list[ChatMessage], tools: list[Tool]) -> ChatMessage:
        barrier.wait()  # every model call of one run waits for the other run's: both must be under way at once
        return policy(messages, tools)

    def agent_on(checkpointer: Checkpointer) -> Agent:
        return Agent(
            ScriptedChatGenerator(policy=lockstep),
            tools=build_agent(None).tools,
            state_schema=SCHEMA,
            checkpointer=checkpointer,
        )

    first, second = agent_on(cp), agent_on(_second(store, cp))
    outcomes = _race(
        {
            "a": lambda: first.run(user("alpha:3"), thread_id="a"),
            "b": lambda: second.run(user("beta:3"), thread_id="b"),
        }
    )
    assert outcomes["a"]["notes"] == ["alpha-1", "alpha-2", "alpha-3"], outcomes
    assert outcomes["b"]["notes"] == ["beta-1", "beta-2", "beta-3"], outcomes
    assert first.get_state("b").values["notes"] == ["beta-1", "beta-2", "beta-3"]


# --- errors -------------------------------------------------------------------------------------------------


def test_thread_methods_need_a_checkpointer() -> None:
    agent = build_agent(None)
    with pytest.raises(ValueError, match="needs an Agent created with a checkpointer"):
        agent.run(user("alpha:1"), thread_id="t")
    with pytest.raises(ValueError, match="checkpointer"):
        asyncio.run(agent.run_async(user("alpha:1"), thread_id="t"))
    for call in (
        lambda: agent.get_state("t"),
        lambda: agent.get_history("t"),
        lambda: agent.update_state("t", {"count": 1}),
        lambda: agent.resume("t", {}),
    ):
        with pytest.raises(ValueError, match="checkpointer"):
            call()
    with pytest.raises(ValueError, match="checkpoint_id needs a thread_id"):
        agent.run(user("alpha:1"), checkpoint_id="x")
    with pytest.raises(ValueError, match="interrupt_before needs a checkpointer"):
        build_agent(None, interrupt_before=["write"])


@pytest.mark.slow
def test_unknown_threads_and_checkpoints(store: Harness) -> None:
    cp = store.make()
    agent = build_agent(cp)
    for call in (
        lambda: agent.get_state("nope"),
        lambda: agent.get_state("nope", checkpoint_id="x"),
        lambda: agent.get_history("nope"),
        lambda: agent.update_state("nope", {"count": 1}),
        lambda: agent.resume("nope", {}),
        lambda: agent.run(user("alpha:1"), thread_id="nope", checkpoint_id="x"),
    ):
        with pytest.raises(ThreadNotFoundError, match="'nope'"):
            call()
    assert cp.list_threads() == []  # nothing was created on the way
    agent.run(user("alpha:1"), thread_id="t")
    with pytest.raises(CheckpointNotFoundError, match="'missing'"):
        agent.get_state("t", checkpoint_id="missing")
    with pytest.raises(CheckpointNotFoundError, match="'missing'"):
        agent.run(user("beta:1"), thread_id="t", checkpoint_id="missing")
    with pytest.raises(ValueError, match="unknown inputs"):
        agent.run(user("beta:1"), thread_id="t", nope=1)
    assert len(cp.history("t")) == 4


def test_a_thread_that_does_not_fit_the_schema_is_reported() -> None:
    cp = InMemoryCheckpointer()
    build_agent(cp).run(user("alpha:1"), thread_id="t")
    other = Agent(ScriptedChatGenerator(script=["x"]), state_schema={"count": {"type": str}}, checkpointer=cp)
    with pytest.raises(Exception, match="does not fit the agent's schema"):
        other.run(user("hi"), thread_id="t")
    cp.close()


def test_checkpoint_history_renders_as_a_table() -> None:
    with InMemoryCheckpointer() as cp:
        agent = build_agent(cp)
        agent.run(user("alpha:1"), thread_id="t")
        history = agent.get_history("t")
        html = history._repr_html_()
    assert html.startswith("<table") and html.endswith("</table>")
    assert html.count("<tr>") == len(history) + 1  # header and one row per checkpoint
    for header in ("checkpoint", "parent", "step", "source", "tools", "created", "changed keys"):
        assert f"<th>{header}</th>" in html
    for meta in history:  # short ids, as the CLI shows them; the full id in the cell's title
        assert f'<td title="{meta.checkpoint_id}">{meta.checkpoint_id[-8:]}</td>' in html
    assert "<td>write</td>" in html and "<td>tools</td>" in html
