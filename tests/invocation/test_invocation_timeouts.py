"""
Tool timeouts and Ctrl-C: a call over its timeout (``@tool(timeout=...)``, ``ToolInvoker(tool_timeout=...)``,
``Agent(tool_timeout=...)``) becomes a ``ToolTimeoutError`` result naming the tool and the seconds, and merges nothing
even if it finishes later; async tools are cancelled; a sync tool that never returns does not hang the run. Ctrl-C
stops a sync run at once, with parallel calls too (checked in a subprocess sent SIGINT).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools.errors import ToolInvocationError as HaystackToolInvocationError

from haystack_state import (
    Agent,
    State,
    ToolDefinitionError,
    ToolInvoker,
    ToolTimeoutError,
    tool,
    tool_spec,
)
from haystack_state.invocation._run import run_tool_calls, run_tool_calls_async
from haystack_state.invocation._settings import ToolRunSettings
from haystack_state.invocation._workers import WORKERS
from haystack_state.persistence import SQLiteCheckpointer
from haystack_state.testing import ScriptedChatGenerator
from haystack_state.tools.function_tool import FunctionTool

RELEASE = threading.Event()
FINISHED = threading.Event()
CANCELLED: list[str] = []


@pytest.fixture(autouse=True)
def fresh_events() -> Any:
    RELEASE.clear()
    FINISHED.clear()
    CANCELLED.clear()
    yield
    RELEASE.set()  # let abandoned tools end


@tool(timeout=0.2, outputs_to_state={"log": {"source": "entry"}})
def stuck(state: State) -> dict[str, Any]:
    """Write through the State, then wait until released (think: a hung network call)."""
    state.set("log", ["staged by stuck"])
    RELEASE.wait(30)
    FINISHED.set()
    return {"entry": ["returned by stuck"]}


@tool(outputs_to_state={"log": {"source": "entry"}})
def quick(text: str) -> dict[str, Any]:
    """Return at once."""
    return {"entry": [text]}


@tool
def waits(seconds: float) -> str:
    """Sleep a little."""
    RELEASE.wait(seconds)
    return "waited"


@tool(timeout=0.2)
async def async_stuck() -> str:
    """Await forever, unless cancelled."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        CANCELLED.append("async_stuck")
        raise
    return "never"


def schema() -> dict[str, Any]:
    return {"log": {"type": list[str]}}


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ChatMessage]:
    tool_calls = [ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(specs)]
    return [ChatMessage.from_assistant(tool_calls=tool_calls)]


def outcome(output: dict[str, Any]) -> list[tuple[bool, str]]:
    return [(m.tool_call_result.error, m.tool_call_result.result) for m in output["tool_messages"]]


TIMED_OUT = "Tool 'stuck' timed out after 0.2 s; its result and state writes were discarded."


def test_a_call_over_its_tools_timeout_becomes_an_error_and_merges_nothing_even_later() -> None:
    state = State(schema(), {"log": ["before"]})
    output = ToolInvoker([stuck], raise_on_failure=False).run(calls(("stuck", {})), state=state)
    assert outcome(output) == [(True, TIMED_OUT)]
    assert state.get("log") == ["before"]
    RELEASE.set()
    assert FINISHED.wait(10)  # the abandoned call returns after all...
    assert state.get("log") == ["before"]  # ...and still merges nothing


def test_a_timed_out_call_among_parallel_calls_leaves_the_others_merged_in_order() -> None:
    state = State(schema())
    output = ToolInvoker([stuck, quick], raise_on_failure=False).run(
        calls(("quick", {"text": "a"}), ("stuck", {}), ("quick", {"text": "b"})), state=state
    )
    assert outcome(output) == [(False, '{"entry": ["a"]}'), (True, TIMED_OUT), (False, '{"entry": ["b"]}')]
    assert state.get("log") == ["a", "b"]


def test_the_invokers_tool_timeout_applies_to_tools_without_their_own() -> None:
    output = ToolInvoker([waits], raise_on_failure=False, tool_timeout=0.1).run(calls(("waits", {"seconds": 30})))
    assert outcome(output) == [
        (True, "Tool 'waits' timed out after 0.1 s; its result and state writes were discarded.")
    ]
    assert tool_spec(waits).timeout is None


def test_a_tools_own_timeout_wins_over_the_invokers() -> None:
    patient = tool(waits.function, name="patient", timeout=30)
    output = ToolInvoker([patient], raise_on_failure=False, tool_timeout=0.05).run(calls(("patient", {"seconds": 0.3})))
    assert outcome(output) == [(False, "waited")]


def test_with_raise_on_failure_a_timeout_raises_haystacks_error_class() -> None:
    with pytest.raises(ToolTimeoutError) as info:
        ToolInvoker([stuck]).run(calls(("stuck", {})), state=State(schema()))
    assert info.value.tool_name == "stuck" and info.value.timeout == 0.2
    assert isinstance(info.value, HaystackToolInvocationError)


def test_an_async_tool_over_time_is_cancelled_in_run_async() -> None:
    output = asyncio.run(ToolInvoker([async_stuck], raise_on_failure=False).run_async(calls(("async_stuck", {}))))
    assert outcome(output) == [
        (True, "Tool 'async_stuck' timed out after 0.2 s; its result and state writes were discarded.")
    ]
    assert CANCELLED == ["async_stuck"]


def test_an_async_tool_over_time_is_cancelled_in_a_sync_run() -> None:
    output = ToolInvoker([async_stuck, quick], raise_on_failure=False).run(
        calls(("async_stuck", {}), ("quick", {"text": "x"})), state=State(schema())
    )
    assert outcome(output)[0] == (
        True,
        "Tool 'async_stuck' timed out after 0.2 s; its result and state writes were discarded.",
    )
    assert outcome(output)[1] == (False, '{"entry": ["x"]}')
    assert CANCELLED == ["async_stuck"]


def test_a_sync_tool_over_time_in_run_async_is_abandoned_and_merges_nothing() -> None:
    state = State(schema(), {"log": ["before"]})
    output = asyncio.run(
        ToolInvoker([stuck, quick], raise_on_failure=False).run_async(
            calls(("stuck", {}), ("quick", {"text": "q"})), state=state
        )
    )
    assert outcome(output) == [(True, TIMED_OUT), (False, '{"entry": ["q"]}')]
    RELEASE.set()
    assert FINISHED.wait(10)
    assert state.get("log") == ["before", "q"]


LENIENT_TIMED = ToolRunSettings(raise_on_failure=False, tool_timeout=0.1)


def test_run_tool_calls_takes_a_tool_timeout() -> None:
    specs = {"waits": tool_spec(waits)}
    messages = calls(("waits", {"seconds": 30}))
    (message,) = run_tool_calls(messages, State({}), specs, settings=LENIENT_TIMED)
    assert message.tool_call_result.error and "timed out after 0.1 s" in message.tool_call_result.result
    RELEASE.set()
    (message,) = asyncio.run(run_tool_calls_async(messages, State({}), specs, settings=LENIENT_TIMED))
    assert message.tool_call_result.result == "waited"


def test_abandoned_calls_do_not_count_as_running_once_they_return() -> None:
    ToolInvoker([stuck], raise_on_failure=False).run(calls(("stuck", {})), state=State(schema()))
    assert WORKERS.busy >= 1  # the abandoned call still holds its thread
    RELEASE.set()
    assert FINISHED.wait(10)
    for _ in range(1000):
        if WORKERS.busy == 0:
            break
        threading.Event().wait(0.01)
    assert WORKERS.busy == 0


# --- configuration ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "5"])
def test_an_invalid_timeout_is_refused_at_construction(value: Any) -> None:
    with pytest.raises(ToolDefinitionError, match="timeout must be a positive number of seconds or None"):
        tool(quick.function, name="bad", timeout=value)
    with pytest.raises(ValueError, match="ToolInvoker tool_timeout must be a positive number of seconds or None"):
        ToolInvoker([quick], tool_timeout=value)
    with pytest.raises(ValueError, match="Agent tool_timeout must be a positive number of seconds or None"):
        Agent(ScriptedChatGenerator(script=["x"]), tools=[quick], tool_timeout=value)


def plain(x: int) -> int:
    """A module-level function, so that it serializes."""
    return x


def test_timeouts_round_trip_through_to_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    timed = tool(plain, timeout=2.5)
    assert timed.to_dict()["data"]["timeout"] == 2.5
    assert "timeout" not in tool(plain).to_dict()["data"]  # as haystack-ai's Tool.to_dict when none is set
    restored = FunctionTool.from_dict(timed.to_dict())
    assert restored.timeout == 2.5 and tool_spec(restored).timeout == 2.5

    invoker = ToolInvoker([timed], tool_timeout=3, max_tool_calls=10)
    again = ToolInvoker.from_dict(invoker.to_dict())
    assert (again.tool_timeout, again.max_tool_calls) == (3.0, 10)
    assert again.tools[0].timeout == 2.5

    agent = Agent(ScriptedChatGenerator(script=["x"]), tools=[timed], tool_timeout=4)
    rebuilt = Agent.from_dict(agent.to_dict())
    assert (rebuilt.tool_timeout, rebuilt.max_tool_calls) == (4.0, 64)


def test_an_agent_on_a_durable_thread_answers_a_timed_out_call_and_goes_on(tmp_path: Path) -> None:
    generator = ScriptedChatGenerator(script=[[("waits", {"seconds": 30}), ("quick", {"text": "fine"})], "done", "ok"])
    agent = Agent(
        generator,
        tools=[waits, quick],
        state_schema=schema(),
        tool_timeout=0.2,
        checkpointer=SQLiteCheckpointer(tmp_path / "t.db"),
    )
    result = agent.run([ChatMessage.from_user("go")], thread_id="t")
    results = [m.tool_call_result for m in result["messages"] if m.tool_call_result is not None]
    assert [(r.error, r.origin.tool_name) for r in results] == [(True, "waits"), (False, "quick")]
    assert "timed out after 0.2 s" in results[0].result
    assert result["log"] == ["fine"]
    assert result["last_message"].text == "done"
    RELEASE.set()
    assert agent.run([ChatMessage.from_user("again")], thread_id="t")["last_message"].text == "ok"


def test_an_async_agent_cancels_a_timed_out_async_tool() -> None:
    generator = ScriptedChatGenerator(script=[[("async_stuck", {})], "done"])
    agent = Agent(generator, tools=[async_stuck])
    result = asyncio.run(agent.run_async([ChatMessage.from_user("go")]))
    (error,) = [m.tool_call_result for m in result["messages"] if m.tool_call_result is not None]
    assert error.error and "timed out after 0.2 s" in error.result
    assert CANCELLED == ["async_stuck"]


# --- Ctrl-C ---------------------------------------------------------------------------------------------------------

CTRL_C_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"
    from haystack.dataclasses import ChatMessage, ToolCall
    from haystack_state import Agent, ToolInvoker, tool
    from haystack_state.testing import ScriptedChatGenerator

    started = []
    lock = threading.Lock()

    @tool
    def hang(n: int) -> str:
        '''Never return (a blocking call).'''
        with lock:
            started.append(n)
            if len(started) == int(sys.argv[2]):
                print("started", flush=True)
        threading.Event().wait()
        return "never"

    count = int(sys.argv[2])
    calls = [("hang", {"n": i}) for i in range(count)]
    try:
        if sys.argv[1] == "invoker":
            message = ChatMessage.from_assistant(
                tool_calls=[ToolCall(tool_name=name, arguments=args, id=str(i)) for i, (name, args) in enumerate(calls)]
            )
            ToolInvoker([hang], max_workers=4).run([message])
        else:
            Agent(ScriptedChatGenerator(script=[calls, "done"]), tools=[hang]).run([ChatMessage.from_user("go")])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
    print("finished", flush=True)
    """
)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize(("runner", "count"), [("invoker", 1), ("invoker", 3), ("agent", 1), ("agent", 3)])
def test_ctrl_c_stops_a_sync_run_at_once(tmp_path: Path, runner: str, count: int) -> None:
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, str(script), runner, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # As in a terminal: a test run started in the background by a shell without job control ignores SIGINT, and
        # a child would inherit that (Python then installs no KeyboardInterrupt handler).
        preexec_fn=_default_sigint,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "started"
        process.send_signal(signal.SIGINT)  # one Ctrl-C
        out, err = process.communicate(timeout=60)  # a run that swallowed it would hang here
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "interrupted" in out, err
    assert process.returncode == 3
