"""
Human input from inside a run (issue 13): ``interrupt(value)`` in tools and ``before_tool`` hooks, answered by
``Agent.resume(thread_id, answers=...)`` in any process; ``interrupt_before`` holding only the named calls;
``interrupt_after`` reviews; and the tool-call events of a streamed run.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from workers.harness import TESTS_DIR, Harness, PostgresHarness, SQLiteHarness

from haystack_state import Agent, InMemoryCheckpointer, RunContext, State, interrupt, tool
from haystack_state.agent.events import Interrupted, ToolCallFinished, ToolCallStarted
from haystack_state.cli import main
from haystack_state.testing import ScriptedChatGenerator

SCHEMA: dict[str, Any] = {"log": {"type": list[str]}, "notes": {"type": list[str]}}


def user(text: str = "go") -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


@tool(outputs_to_state={"log": {}})
def transfer(amount: int, state: State) -> str:
    """Transfer money, once a human agrees."""
    state.set("notes", [f"asked about {amount}"])  # discarded while the call waits; kept once it finishes
    agreed = interrupt({"question": f"Transfer {amount}?"})
    if not agreed:
        return f"not transferred: {amount}"
    reference = interrupt("Which reference?")
    return f"transferred {amount} ({reference})"


@tool(outputs_to_state={"log": {}})
def bump() -> str:
    """Count something."""
    return "bumped"


@tool(outputs_to_state={"log": {}})
async def confirm_async(item: str) -> str:
    """Confirm an item, asynchronously."""
    await asyncio.sleep(0)
    answer = interrupt(f"Confirm {item}?")
    return f"{item}: {answer}"


@tool(outputs_to_state={"log": {}})
def report(ctx: RunContext) -> str:
    """Report progress."""
    ctx.emit("progress", {"done": 1})
    return "reported"


def make(script: list[Any], cp: Any, **kwargs: Any) -> Agent:
    return Agent(
        ScriptedChatGenerator(script=script),
        tools=[transfer, bump, confirm_async],
        state_schema=SCHEMA,
        checkpointer=cp,
        **kwargs,
    )


# --- interrupt() inside a tool -------------------------------------------------------------------------------


def test_a_tool_asks_and_the_answers_resume_it_in_order(store: Harness) -> None:
    cp = store.make()
    agent = make([[("transfer", {"amount": 5}), ("bump", {})], "done"], cp)
    first = agent.run(user(), thread_id="t")
    assert first["exit_reason"] == "interrupted"
    (request,) = first["pending_interrupts"]
    assert request["kind"] == "interrupt" and request["tool_name"] == "transfer" and request["call_id"] == "call_1"
    assert request["value"] == {"question": "Transfer 5?"}
    # The other call of the reply ran and is committed; the waiting call merged nothing (not even its first write).
    assert first["log"] == ["bumped"] and "notes" not in first
    snapshot = agent.get_state("t")
    assert snapshot.interrupted and snapshot.interrupts == first["pending_interrupts"]
    assert [c.id for c in snapshot.pending_tool_calls] == ["call_1"]

    second = agent.resume("t", answers={request["id"]: True})
    assert second["exit_reason"] == "interrupted"
    (again,) = second["pending_interrupts"]
    assert again["value"] == "Which reference?" and again["id"] != request["id"]

    final = agent.resume("t", answers={again["id"]: "REF-1"})
    assert final["exit_reason"] == "text"
    assert final["log"] == ["bumped", "transferred 5 (REF-1)"]
    assert final["notes"] == ["asked about 5"]  # the finished call's writes, once
    assert not agent.get_state("t").interrupted
    results = [m.tool_call_result for m in final["messages"] if m.tool_call_result is not None]
    assert sorted(r.origin.id for r in results) == ["call_1", "call_2"]  # every call has exactly one result


def test_a_resume_without_an_answer_for_every_request_writes_nothing(store: Harness) -> None:
    cp = store.make()
    agent = make([[("transfer", {"amount": 5})], "done"], cp)
    request = agent.run(user(), thread_id="t")["pending_interrupts"][0]
    before = cp.history("t")
    for bad, message in (
        ({}, r"no decision or answer for pending request\(s\) \['int-"),
        ({request["id"]: True, "int-nope": 1}, r"answers name unknown interrupt id\(s\) \['int-nope'\]"),
    ):
        with pytest.raises(ValueError, match=message):
            agent.resume("t", answers=bad)
        assert cp.history("t") == before
    with pytest.raises(ValueError, match=r"interrupted before tool call\(s\) to transfer.*agent.resume"):
        agent.run([], thread_id="t")
    with pytest.raises(ValueError, match="answers must be a dict"):
        agent.resume("t", answers=["yes"])  # type: ignore[arg-type]
    assert cp.history("t") == before
    assert agent.resume("t", answers={request["id"]: False})["log"] == ["not transferred: 5"]


def test_an_async_tool_asks_in_run_async_and_is_answered_in_resume_async() -> None:
    cp = InMemoryCheckpointer()
    agent = make([[("confirm_async", {"item": "order"})], "done"], cp)

    async def scenario() -> dict[str, Any]:
        first = await agent.run_async(user(), thread_id="t")
        assert first["exit_reason"] == "interrupted"
        (request,) = first["pending_interrupts"]
        assert request["value"] == "Confirm order?"
        return await agent.resume_async("t", answers={request["id"]: "yes"})

    assert asyncio.run(scenario())["log"] == ["order: yes"]


def test_a_call_that_reads_what_a_waiting_call_writes_waits_with_it() -> None:
    @tool(inputs_from_state={"notes": "notes"}, outputs_to_state={"log": {}})
    def summarize(notes: list[str] | None = None) -> str:
        """Summarize the notes."""
        return f"{len(notes or [])} notes"

    cp = InMemoryCheckpointer()
    agent = Agent(
        ScriptedChatGenerator(script=[[("transfer", {"amount": 1}), ("summarize", {}), ("bump", {})], "done"]),
        tools=[transfer, summarize, bump],
        state_schema=SCHEMA,
        checkpointer=cp,
    )
    first = agent.run(user(), thread_id="t")
    assert first["log"] == ["bumped"]  # summarize reads "notes", which transfer writes: it waits too
    assert [c.id for c in agent.get_state("t").pending_tool_calls] == ["call_1", "call_2"]
    request = first["pending_interrupts"][0]
    second = agent.resume("t", answers={request["id"]: True})
    final = agent.resume("t", answers={second["pending_interrupts"][0]["id"]: "R"})
    assert final["log"] == ["bumped", "transferred 1 (R)", "1 notes"]


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from haystack.dataclasses import ChatMessage
    from haystack_state import Agent, State, interrupt, tool
    from haystack_state.persistence import PostgresCheckpointer, SQLiteCheckpointer
    from haystack_state.testing import ScriptedChatGenerator

    @tool(outputs_to_state={"log": {}})
    def transfer(amount: int) -> str:
        '''Transfer money, once a human agrees.'''
        return f"transferred {amount}: {interrupt({'question': f'Transfer {amount}?'})}"

    kind, where, step = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "sqlite":
        cp = SQLiteCheckpointer(where)
    else:
        dsn, schema = where.split("#")
        cp = PostgresCheckpointer(dsn, schema=schema)
    script = [[("transfer", {"amount": 7})]] if step == "start" else ["done"]
    agent = Agent(ScriptedChatGenerator(script=script), tools=[transfer],
                  state_schema={"log": {"type": list[str]}}, checkpointer=cp)
    if step == "start":
        result = agent.run([ChatMessage.from_user("pay")], thread_id="t")
    else:
        result = agent.resume("t", answers={sys.argv[4]: json.loads(sys.argv[5])})
    print(json.dumps({"exit_reason": result["exit_reason"], "log": result.get("log"),
                      "pending": result["pending_interrupts"]}))
    cp.close()
    """
)


def run_script(*args: str) -> dict[str, Any]:
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False", "PYTHONPATH": str(TESTS_DIR.parent)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_an_interrupt_is_answered_in_another_process(persistent_store: Harness) -> None:
    if isinstance(persistent_store, SQLiteHarness):
        kind, where = "sqlite", str(persistent_store.path)
    else:
        assert isinstance(persistent_store, PostgresHarness)
        kind, where = "postgres", f"{persistent_store.dsn}#{persistent_store.schema}"
    first = run_script(kind, where, "start")
    assert first["exit_reason"] == "interrupted" and first["log"] is None
    (request,) = first["pending"]
    assert request["value"] == {"question": "Transfer 7?"}
    # The CLI lists the pending interrupt with its value.
    if kind == "sqlite":
        printed = subprocess.run(
            [sys.executable, "-m", "haystack_state.cli", "show", where, "t"],
            env={**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False", "PYTHONPATH": str(TESTS_DIR.parent)},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert "pending interrupts:" in printed and request["id"] in printed and "Transfer 7?" in printed
    final = run_script(kind, where, "resume", request["id"], json.dumps("approved"))
    assert final == {"exit_reason": "text", "log": ["transferred 7: approved"], "pending": []}


# --- interrupt() in a before_tool hook -----------------------------------------------------------------------


def test_a_before_tool_hook_asks_before_the_tool_runs() -> None:
    ran: list[str] = []

    @tool
    def launch(target: str) -> str:
        """Launch something."""
        ran.append(target)
        return f"launched {target}"

    def approve(state: Any) -> None:
        calls = state.last("messages").tool_calls
        if not interrupt({"approve": [call.tool_name for call in calls]}):
            state.set("messages", [ChatMessage.from_tool("refused", origin=call, error=True) for call in calls])

    cp = InMemoryCheckpointer()
    agent = Agent(
        ScriptedChatGenerator(script=[[("launch", {"target": "moon"})], "ok", [("launch", {"target": "mars"})], "ok"]),
        tools=[launch],
        checkpointer=cp,
        hooks={"before_tool": approve},
    )
    first = agent.run(user(), thread_id="t")
    (request,) = first["pending_interrupts"]
    assert first["exit_reason"] == "interrupted" and request["kind"] == "hook"
    assert request["value"] == {"approve": ["launch"]} and ran == []
    assert agent.resume("t", answers={request["id"]: True})["exit_reason"] == "text"
    assert ran == ["moon"]
    second = agent.run(user("again"), thread_id="t")
    result = agent.resume("t", answers={second["pending_interrupts"][0]["id"]: False})
    assert ran == ["moon"] and result["messages"][-2].tool_call_result.result == "refused"


# --- interrupt_before and interrupt_after ----------------------------------------------------------------------


def test_interrupt_before_holds_only_the_named_calls(store: Harness) -> None:
    cp = store.make()
    agent = make([[("bump", {}), ("transfer", {"amount": 3}), ("bump", {})], "done"], cp, interrupt_before=["transfer"])
    first = agent.run(user(), thread_id="t")
    assert first["exit_reason"] == "interrupted"
    assert [r["kind"] for r in first["pending_interrupts"]] == ["before"]
    assert first["pending_interrupts"][0]["arguments"] == {"amount": 3}
    # the other calls of the same reply ran, and their results are committed in call order
    assert first["log"] == ["bumped", "bumped"]
    results = [m.tool_call_result.origin.id for m in first["messages"] if m.tool_call_result is not None]
    assert results == ["call_1", "call_3"]
    second = agent.resume("t", {"call_2": {"arguments": {"amount": 4}}})
    assert second["pending_interrupts"][0]["value"] == {"question": "Transfer 4?"}  # the edit ran, and asked
    second = agent.resume("t", answers={second["pending_interrupts"][0]["id"]: False})
    assert second["log"] == ["bumped", "bumped", "not transferred: 4"]
    results = [m.tool_call_result.origin.id for m in second["messages"] if m.tool_call_result is not None]
    assert results == ["call_1", "call_3", "call_2"]


def test_interrupt_after_stops_for_review_once_the_result_is_committed(store: Harness) -> None:
    cp = store.make()
    agent = make([[("bump", {})], "done"], cp, interrupt_after=["bump"])
    first = agent.run(user(), thread_id="t")
    assert first["exit_reason"] == "interrupted" and first["log"] == ["bumped"]
    (review,) = first["pending_interrupts"]
    assert review["kind"] == "after" and review["value"] == "bumped" and review["call_id"] == "call_1"
    assert agent.get_state("t").interrupted and agent.get_state("t").pending_tool_calls == []
    assert cp.history("t")[0].source == "tools"
    with pytest.raises(ValueError, match="no decision or answer"):
        agent.resume("t", answers={})
    final = agent.resume("t", answers={review["id"]: "looks right"})
    assert final["exit_reason"] == "text" and final["last_message"].text == "done"
    # A decision on the call goes on as well.
    again = make([[("bump", {})], "done"], InMemoryCheckpointer(), interrupt_after=["bump"])
    again.run(user(), thread_id="u")
    assert again.resume("u", {"call_1": "approve"})["exit_reason"] == "text"


def test_interrupt_after_needs_a_checkpointer_and_a_known_tool() -> None:
    with pytest.raises(ValueError, match="interrupt_after needs a checkpointer"):
        Agent(ScriptedChatGenerator(script=["x"]), tools=[bump], state_schema=SCHEMA, interrupt_after=["bump"])
    with pytest.raises(ValueError, match=r"interrupt_after \['nope'\]"):
        Agent(
            ScriptedChatGenerator(script=["x"]),
            tools=[bump],
            state_schema=SCHEMA,
            checkpointer=InMemoryCheckpointer(),
            interrupt_after=["nope"],
        )


# --- events ----------------------------------------------------------------------------------------------------


def test_a_stream_reports_each_tool_call_and_the_interrupt() -> None:
    agent = make([[("bump", {}), ("transfer", {"amount": 2})], "done"], InMemoryCheckpointer())
    events = list(agent.stream(user(), thread_id="t"))
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert {(e.tool_name, e.call_id) for e in started} == {("bump", "call_1"), ("transfer", "call_2")}
    assert [(e.tool_name, e.result, e.error) for e in finished] == [("bump", "bumped", False)]
    assert finished[0].duration >= 0 and finished[0].to_dict()["type"] == "tool_call_finished"
    assert started[0].to_dict()["arguments"] in ({}, {"amount": 2})
    (interrupted,) = [e for e in events if isinstance(e, Interrupted)]
    assert interrupted.requests[0]["kind"] == "interrupt" and interrupted.requests[0]["value"] == {
        "question": "Transfer 2?"
    }
    assert json.loads(json.dumps(interrupted.to_dict()))["requests"][0]["call_id"] == "call_2"


def test_the_cli_shows_pending_interrupts_as_json(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from haystack_state import SQLiteCheckpointer

    path = tmp_path / "threads.db"
    with SQLiteCheckpointer(path) as cp:
        make([[("transfer", {"amount": 9})], "done"], cp).run(user(), thread_id="t")
    assert main(["show", str(path), "t", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (request,) = document["pending_interrupts"]
    assert request["value"] == {"question": "Transfer 9?"} and request["kind"] == "interrupt"


# --- cancel from another process ---------------------------------------------------------------------------------

CANCEL_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from haystack.dataclasses import ChatMessage
    from haystack_state import Agent, tool
    from haystack_state.persistence import PostgresCheckpointer, SQLiteCheckpointer
    from haystack_state.testing import ScriptedChatGenerator

    kind, where, started = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    @tool(outputs_to_state={"log": {}})
    def work(step: int) -> str:
        '''Do one step of a long job.'''
        started.write_text(str(step))
        time.sleep(0.1)
        return f"step {step}"

    def policy(messages, tools):
        return [("work", {"step": sum(1 for m in messages if m.tool_call_result is not None)})]

    if kind == "sqlite":
        cp = SQLiteCheckpointer(where, lease_ttl=0.6)
    else:
        dsn, schema = where.split("#")
        cp = PostgresCheckpointer(dsn, schema=schema, lease_ttl=0.6)
    agent = Agent(ScriptedChatGenerator(policy=policy), tools=[work], state_schema={"log": {"type": list[str]}},
                  checkpointer=cp, max_agent_steps=500)
    result = agent.run([ChatMessage.from_user("work until stopped")], thread_id="t")
    print(json.dumps({"exit_reason": result["exit_reason"], "steps": result["step_count"]}))
    cp.close()
    """
)


@pytest.mark.slow
def test_cancel_from_another_process_stops_the_run_at_a_step_boundary(persistent_store: Harness, tmp_path: Any) -> None:
    if isinstance(persistent_store, SQLiteHarness):
        kind, where = "sqlite", str(persistent_store.path)
    else:
        assert isinstance(persistent_store, PostgresHarness)
        kind, where = "postgres", f"{persistent_store.dsn}#{persistent_store.schema}"
    started = tmp_path / "started"
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False", "PYTHONPATH": str(TESTS_DIR.parent)}
    worker = subprocess.Popen(
        [sys.executable, "-c", CANCEL_WORKER, kind, where, str(started)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker never started working"
            time.sleep(0.02)
        cp = persistent_store.make()
        agent = Agent(ScriptedChatGenerator(script=["Stopped where you asked."]), state_schema=SCHEMA, checkpointer=cp)
        assert agent.cancel("t") is True
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["exit_reason"] == "cancelled" and 1 <= summary["steps"] < 500
    # The run left a checkpoint that can be continued; no run holds the thread now, and a cancel finds none.
    snapshot = agent.get_state("t")
    assert not snapshot.interrupted and snapshot.pending_tool_calls == []
    assert cp.read_lease("t") is None and agent.cancel("t") is False
    assert len(snapshot.values["log"]) == summary["steps"]
    assert agent.run([], thread_id="t")["last_message"].text == "Stopped where you asked."


def test_every_event_type_streams_sync_and_async() -> None:
    from haystack_state.agent import events as ev

    def make_agent(cp: Any) -> Agent:
        return Agent(
            ScriptedChatGenerator(script=[[("report", {}), ("transfer", {"amount": 1})], "done"]),
            tools=[report, transfer],
            state_schema=SCHEMA,
            checkpointer=cp,
        )

    async def collect_async(agent: Agent) -> list[Any]:
        return [event async for event in agent.stream_async(user(), thread_id="t")]

    expected = {
        ev.RunStarted, ev.ModelChunk, ev.ModelReply, ev.ToolCallStarted, ev.ToolCallFinished, ev.StateChanged,
        ev.CheckpointCommitted, ev.Interrupted, ev.CustomEvent, ev.RunFinished,
    }  # fmt: skip
    for events in (list(make_agent(InMemoryCheckpointer()).stream(user(), thread_id="t")),
                   asyncio.run(collect_async(make_agent(InMemoryCheckpointer())))):  # fmt: skip
        assert {type(event) for event in events} == expected
        assert all(json.loads(json.dumps(event.to_dict()))["type"] == event.type for event in events)
    # RunFailed: a run whose model fails
    broken = Agent(ScriptedChatGenerator(script=[]), checkpointer=InMemoryCheckpointer())
    seen: list[Any] = []
    with pytest.raises(Exception, match="script is exhausted"):
        seen.extend(broken.stream(user(), thread_id="u"))

    async def failing() -> None:
        async for event in broken.stream_async(user(), thread_id="v"):
            seen.append(event)

    with pytest.raises(Exception, match="script is exhausted"):
        asyncio.run(failing())
    assert sum(isinstance(event, ev.RunFailed) for event in seen) == 2


# --- a streamed resume ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_resume_streams_its_events_sync_and_async(store: Harness) -> None:
    cp = store.make()
    agent = make([[("transfer", {"amount": 7})], [("transfer", {"amount": 8})], "done"], cp)
    request = agent.run(user(), thread_id="t")["pending_interrupts"][0]

    events = list(agent.stream([], thread_id="t", answers={request["id"]: True}))
    kinds = [type(event).__name__ for event in events]
    assert kinds[0] == "RunStarted" and kinds[-1] == "RunFinished"
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [(e.tool_name, e.call_id) for e in started] == [("transfer", "call_1")]  # the call runs again
    (stop,) = [e for e in events if isinstance(e, Interrupted)]
    (again,) = stop.requests
    assert again["value"] == "Which reference?"
    assert events[-1].outputs["exit_reason"] == "interrupted"  # type: ignore[attr-defined]

    async def resume_async() -> list[Any]:
        return [event async for event in agent.stream_async([], thread_id="t", answers={again["id"]: "R-7"})]

    events = asyncio.run(resume_async())
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert next((e.call_id, e.result) for e in finished) == ("call_1", "transferred 7 (R-7)")
    # It went on past the resumed step: the model's next call is streamed too.
    assert any(isinstance(e, ToolCallStarted) and e.call_id != "call_1" for e in events)
    assert type(events[-1]).__name__ == "RunFinished"
    assert agent.get_state("t").values["log"][0] == "transferred 7 (R-7)"


def test_a_streamed_resume_is_refused_before_anything_runs(store: Harness) -> None:
    cp = store.make()
    agent = make([[("transfer", {"amount": 5})], "done"], cp)
    request = agent.run(user(), thread_id="t")["pending_interrupts"][0]
    before = cp.history("t")
    head = agent.get_state("t").checkpoint.checkpoint_id
    for kwargs, message in (
        ({"messages": user("more")}, "Thread 't': a resume .* takes no new messages"),
        ({"messages": [], "checkpoint_id": head}, "Thread 't': a resume continues the thread's head"),
        ({"messages": [], "thread_id": None}, "decisions and answers resume an interrupted thread: give its thread_id"),
    ):
        call = {"thread_id": "t", "answers": {request["id"]: True}, **kwargs}
        with pytest.raises(ValueError, match=message):
            agent.stream(**call)
        with pytest.raises(ValueError, match=message):
            asyncio.run(anext(agent.stream_async(**call)))
    with pytest.raises(ValueError, match=r"no decision or answer for pending request"):
        list(agent.stream([], thread_id="t", answers={}))
    assert cp.history("t") == before
    final = list(agent.stream([], thread_id="t", answers={request["id"]: False}))[-1]
    assert final.outputs["log"] == ["not transferred: 5"]  # type: ignore[attr-defined]
