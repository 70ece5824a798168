"""
Retries of failed model and tool calls (``Agent(retry_policy=RetryPolicy(...))``): a flaky tool or model succeeds
within its budget, an exhausted budget fails as a call without retries does (the message naming the attempts), a
non-retryable error is not retried, the backoff is waited out, only the last attempt's State writes are merged, and
every retried call is recorded in the ``retries`` metadata of the checkpoint that follows it (SQLite, PostgreSQL).
The flaky tools and models are real functions and components that fail a given number of times, then succeed.
"""

from __future__ import annotations

import asyncio
import email.message
import itertools
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack import component
from haystack.dataclasses import ChatMessage, ToolCall
from persistence.harness import postgres_dsn, postgres_schema

from haystack_state import (
    Agent,
    AgentRunError,
    RetryPolicy,
    SQLiteCheckpointer,
    State,
    ToolInvocationError,
    ToolInvoker,
    ToolTimeoutError,
    tool,
    transient_error,
)
from haystack_state.agent.events import Retrying, RunFinished
from haystack_state.persistence import Checkpointer
from haystack_state.testing import ScriptedChatGenerator

__all__ = ["postgres_dsn", "postgres_schema"]  # fixtures

#: Tiny intervals, no jitter: the runs stay fast and the waits are known.
FAST = RetryPolicy(3, initial_interval=0.01, backoff_factor=2.0, jitter=False)


def user(text: str = "go") -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


class Flaky:
    """Fails its first ``failures`` calls with ``error``, then returns ``result``; records when each call came."""

    def __init__(self, failures: int, error: type[Exception] = ConnectionError, result: Any = "ok") -> None:
        self.failures = failures
        self.error = error
        self.result = result
        self.times: list[float] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.times)

    def __call__(self) -> Any:
        with self._lock:
            self.times.append(time.monotonic())
            attempt = len(self.times)
        if attempt <= self.failures:
            raise self.error(f"attempt {attempt} failed")
        return self.result


@component
class FlakyChatGenerator:
    """A chat generator whose first ``failures`` calls raise ``error``; then it answers from its script."""

    def __init__(self, script: list[Any], failures: int, error: type[Exception] = ConnectionError) -> None:
        self.inner = ScriptedChatGenerator(script=script)
        self.flaky = Flaky(failures, error)

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None, **kwargs: Any) -> dict[str, list[ChatMessage]]:
        self.flaky()
        return self.inner.run(messages, tools=tools, **kwargs)  # type: ignore[no-any-return]

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], tools: Any = None, **kwargs: Any
    ) -> dict[str, list[ChatMessage]]:
        self.flaky()
        return await self.inner.run_async(messages, tools=tools, **kwargs)  # type: ignore[no-any-return]


def flaky_tool(flaky: Flaky, name: str = "fetch") -> Any:
    @tool(name=name, outputs_to_state={"pages": {"source": "page"}}, outputs_to_string={"source": "page"})
    def fetch(url: str) -> dict[str, str]:
        """Fetch a page."""
        return {"page": f"{flaky()} {url}"}

    return fetch


SCHEMA: dict[str, Any] = {"pages": {"type": list[str]}}


def run(agent: Agent, is_async: bool, messages: list[ChatMessage] | None = None, **kwargs: Any) -> dict[str, Any]:
    if is_async:
        return asyncio.run(agent.run_async(messages or user(), **kwargs))
    return agent.run(messages or user(), **kwargs)


def tool_results(result: dict[str, Any]) -> list[tuple[str, bool]]:
    return [
        (m.tool_call_result.result, m.tool_call_result.error)
        for m in result["messages"]
        if m.tool_call_result is not None
    ]


def stored_retries(cp: Checkpointer, thread_id: str) -> list[tuple[str, dict[str, Any]]]:
    """``(source, entry)`` for every retried call recorded in the thread's checkpoints, oldest first."""
    metas = sorted(cp.history(thread_id), key=lambda meta: meta.checkpoint_id)
    return [(meta.source, entry) for meta in metas for entry in meta.metadata.get("retries", [])]


# --- the policy --------------------------------------------------------------------------------------------------


def test_delays_grow_by_the_factor_up_to_the_max_interval() -> None:
    policy = RetryPolicy(6, initial_interval=0.5, backoff_factor=3.0, max_interval=5.0, jitter=False)
    assert [policy.delay(attempt) for attempt in range(1, 6)] == [0.5, 1.5, 4.5, 5.0, 5.0]
    jittered = RetryPolicy(initial_interval=1.0, backoff_factor=2.0)
    for _ in range(50):
        assert 1.0 <= jittered.delay(2) <= 2.0
    assert policy.next_delay(5, ConnectionError()) == 5.0
    assert policy.next_delay(6, ConnectionError()) is None  # the budget is spent
    assert policy.next_delay(1, ValueError()) is None  # not retryable


def test_the_default_retries_transient_errors_only() -> None:
    import httpx
    import openai

    class Status(Exception):
        def __init__(self, status_code: int) -> None:
            super().__init__(f"HTTP {status_code}")
            self.status_code = status_code

    request = httpx.Request("POST", "https://example.invalid/v1/chat")

    def http_error(status: int) -> urllib.error.HTTPError:
        return urllib.error.HTTPError("https://example.invalid", status, "status", email.message.Message(), None)

    def status_error(status: int) -> httpx.HTTPStatusError:
        return httpx.HTTPStatusError("status", request=request, response=httpx.Response(status, request=request))

    transient = [
        ConnectionError("reset"),
        ConnectionResetError(),
        TimeoutError(),
        Status(429),
        Status(503),
        httpx.ConnectError("refused", request=request),
        httpx.ReadTimeout("slow", request=request),
        openai.APIConnectionError(request=request),
        openai.APITimeoutError(request=request),
        openai.RateLimitError("slow down", response=httpx.Response(429, request=request), body=None),
        openai.InternalServerError("oops", response=httpx.Response(500, request=request), body=None),
        status_error(502),
        http_error(503),
        urllib.error.URLError(ConnectionRefusedError()),
    ]
    permanent = [
        ValueError("bad"),
        TypeError("wrong"),
        KeyError("k"),
        RuntimeError("bug"),
        Status(400),
        Status(401),
        ToolTimeoutError("slow_tool", 1.0),
        openai.BadRequestError("bad", response=httpx.Response(400, request=request), body=None),
        status_error(404),
        http_error(404),
    ]
    assert [transient_error(error) for error in transient] == [True] * len(transient)
    assert [transient_error(error) for error in permanent] == [False] * len(permanent)
    assert RetryPolicy().retries(ConnectionError()) and not RetryPolicy().retries(ValueError())


def test_retry_on_takes_types_or_a_predicate() -> None:
    assert RetryPolicy(retry_on=ValueError).retries(ValueError()) is True
    assert RetryPolicy(retry_on=[KeyError, ToolTimeoutError]).retry_on == (KeyError, ToolTimeoutError)
    assert RetryPolicy(retry_on=(KeyError,)).retries(ConnectionError()) is False
    assert RetryPolicy(retry_on=lambda error: "again" in str(error)).retries(RuntimeError("try again")) is True

    def broken(error: BaseException) -> bool:
        raise RuntimeError("the predicate is broken")

    assert RetryPolicy(retry_on=broken).retries(ConnectionError()) is False  # logged, not raised


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"initial_interval": -1}, "initial_interval"),
        ({"max_interval": float("inf")}, "max_interval"),
        ({"backoff_factor": 0.5}, "backoff_factor"),
        ({"retry_on": "ConnectionError"}, "retry_on"),
        ({"retry_on": [ValueError, "x"]}, "retry_on"),
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)


def test_invalid_retry_policy_arguments_are_refused() -> None:
    generator = ScriptedChatGenerator(script=["hi"])
    with pytest.raises(ValueError, match="its keys are 'model' and 'tools'"):
        Agent(generator, retry_policy={"llm": FAST})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="must be a RetryPolicy"):
        Agent(generator, retry_policy={"model": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="must be a RetryPolicy"):
        Agent(generator, retry_policy=3)  # type: ignore[arg-type]


# --- tool calls --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_flaky_tool_succeeds_on_its_third_attempt(is_async: bool) -> None:
    flaky = Flaky(failures=2, result="page of")
    generator = ScriptedChatGenerator(script=[[("fetch", {"url": "a"})], "Done."])
    agent = Agent(generator, tools=[flaky_tool(flaky)], state_schema=SCHEMA, retry_policy=FAST)
    result = run(agent, is_async)
    assert flaky.calls == 3
    assert tool_results(result) == [("page of a", False)]
    assert result["pages"] == ["page of a"]  # merged once
    assert result["tool_call_counts"] == {"fetch": 1}  # a retried call is one call
    assert result["last_message"].text == "Done."


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_only_the_last_attempts_state_writes_are_merged(is_async: bool) -> None:
    attempts: list[int] = []

    @tool
    def remember(note: str, state: State) -> str:
        """Remember a note."""
        attempts.append(len(attempts) + 1)
        state.set("notes", f"{note} (attempt {len(attempts)})")  # written before it fails
        if len(attempts) < 3:
            raise ConnectionError("the notebook is offline")
        return "noted"

    generator = ScriptedChatGenerator(script=[[("remember", {"note": "milk"})], "Noted."])
    agent = Agent(generator, tools=[remember], state_schema={"notes": {"type": list[str]}}, retry_policy=FAST)
    result = run(agent, is_async)
    assert attempts == [1, 2, 3]
    assert result["notes"] == ["milk (attempt 3)"]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_parallel_flaky_tools_are_retried_and_merged_in_call_order(is_async: bool) -> None:
    first, second = Flaky(failures=1, result="one"), Flaky(failures=2, result="two")
    generator = ScriptedChatGenerator(script=[[("first", {"url": "a"}), ("second", {"url": "b"})], "Both."])
    tools = [flaky_tool(first, "first"), flaky_tool(second, "second")]
    agent = Agent(generator, tools=tools, state_schema=SCHEMA, retry_policy=FAST)
    result = run(agent, is_async)
    assert (first.calls, second.calls) == (2, 3)
    assert tool_results(result) == [("one a", False), ("two b", False)]
    assert result["pages"] == ["one a", "two b"]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_an_exhausted_tool_budget_goes_to_the_model_as_an_error(is_async: bool) -> None:
    flaky = Flaky(failures=99)
    generator = ScriptedChatGenerator(script=[[("fetch", {"url": "a"})], "It is down."])
    agent = Agent(generator, tools=[flaky_tool(flaky)], state_schema=SCHEMA, retry_policy=FAST)
    result = run(agent, is_async)
    assert flaky.calls == 3
    [(text, error)] = tool_results(result)
    assert error is True
    assert text == "Failed to invoke tool 'fetch' after 3 attempts: ConnectionError: attempt 3 failed"
    assert "pages" not in result or result["pages"] == []
    assert result["last_message"].text == "It is down."


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_an_exhausted_tool_budget_raises_with_raise_on_tool_invocation_failure(is_async: bool) -> None:
    flaky = Flaky(failures=99)
    generator = ScriptedChatGenerator(script=[[("fetch", {"url": "a"})], "unused"])
    agent = Agent(
        generator,
        tools=[flaky_tool(flaky)],
        state_schema=SCHEMA,
        retry_policy=RetryPolicy(2, initial_interval=0.0),
        raise_on_tool_invocation_failure=True,
    )
    with pytest.raises(ToolInvocationError, match="after 2 attempts: ConnectionError") as caught:
        run(agent, is_async)
    assert flaky.calls == 2
    assert isinstance(caught.value.__cause__, ConnectionError)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_non_retryable_tool_error_is_not_retried(is_async: bool) -> None:
    flaky = Flaky(failures=1, error=ValueError)
    generator = ScriptedChatGenerator(script=[[("fetch", {"url": "a"})], "Bad input."])
    agent = Agent(generator, tools=[flaky_tool(flaky)], state_schema=SCHEMA, retry_policy=FAST)
    result = run(agent, is_async)
    assert flaky.calls == 1
    assert tool_results(result) == [("Failed to invoke tool 'fetch': ValueError: attempt 1 failed", True)]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_tool_timeout_is_retried_only_when_retry_on_names_it(is_async: bool) -> None:
    times: list[float] = []

    @tool(timeout=0.2)
    def slow(url: str) -> str:
        """Slow the first time."""
        times.append(time.monotonic())
        if len(times) == 1:
            time.sleep(0.6)
        return f"fetched {url}"

    def agent(policy: RetryPolicy) -> Agent:
        generator = ScriptedChatGenerator(script=[[("slow", {"url": "a"})], "ok"])
        return Agent(generator, tools=[slow], retry_policy={"tools": policy})

    result = run(agent(FAST), is_async)
    assert len(times) == 1
    assert tool_results(result)[0][1] is True  # timed out, not retried by default
    time.sleep(0.5)  # the abandoned first call ends
    times.clear()
    result = run(agent(RetryPolicy(3, initial_interval=0.0, retry_on=(ToolTimeoutError,))), is_async)
    assert len(times) == 2
    assert tool_results(result) == [("fetched a", False)]


def test_separate_budgets_for_model_and_tool_calls() -> None:
    tool_flaky = Flaky(failures=1)
    generator = FlakyChatGenerator([[("fetch", {"url": "a"})], "Done."], failures=2)
    agent = Agent(
        generator,
        tools=[flaky_tool(tool_flaky)],
        state_schema=SCHEMA,
        retry_policy={"model": RetryPolicy(3, initial_interval=0.0)},  # tools: not retried
    )
    result = agent.run(user())
    assert generator.flaky.calls == 4  # 3 for the first step, 1 for the second
    assert tool_flaky.calls == 1
    assert tool_results(result)[0][1] is True


def test_the_tool_invoker_retries_too() -> None:
    flaky = Flaky(failures=2, result="page of")
    invoker = ToolInvoker([flaky_tool(flaky)], retry_policy=FAST)
    state = State(SCHEMA)
    message = ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="fetch", arguments={"url": "a"}, id="c1")])
    result = invoker.run([message], state=state)
    assert flaky.calls == 3
    assert result["tool_messages"][0].tool_call_result.result == "page of a"
    assert state.get("pages") == ["page of a"]
    policy = RetryPolicy(2, retry_on=[ConnectionError])
    assert ToolInvoker.from_dict(ToolInvoker([], retry_policy=policy).to_dict()).retry_policy == policy


# --- model calls ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_flaky_model_succeeds(is_async: bool) -> None:
    generator = FlakyChatGenerator(["Hello!"], failures=2)
    agent = Agent(generator, retry_policy=FAST)
    result = run(agent, is_async)
    assert generator.flaky.calls == 3
    assert result["last_message"].text == "Hello!"
    assert result["step_count"] == 1  # retries are not steps
    assert result["exit_reason"] == "text"


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_an_exhausted_model_budget_fails_the_run_naming_the_attempts(is_async: bool) -> None:
    generator = FlakyChatGenerator(["never"], failures=99)
    agent = Agent(generator, retry_policy=FAST)
    with pytest.raises(AgentRunError, match=r"chat generator failed at step 1 after 3 attempts: ConnectionError") as e:
        run(agent, is_async)
    assert isinstance(e.value.__cause__, ConnectionError)
    assert str(e.value.__cause__) == "attempt 3 failed"
    assert generator.flaky.calls == 3


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_non_retryable_model_error_is_not_retried(is_async: bool) -> None:
    generator = FlakyChatGenerator(["never"], failures=1, error=TypeError)
    agent = Agent(generator, retry_policy=FAST)
    with pytest.raises(AgentRunError, match=r"failed at step 1: TypeError: attempt 1 failed"):
        run(agent, is_async)
    assert generator.flaky.calls == 1


def test_without_a_policy_nothing_is_retried() -> None:
    generator = FlakyChatGenerator(["never"], failures=1)
    with pytest.raises(AgentRunError, match=r"failed at step 1: ConnectionError"):
        Agent(generator).run(user())
    assert generator.flaky.calls == 1


# --- backoff and events ----------------------------------------------------------------------------------------------


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_the_backoff_is_waited_out_and_streamed_as_retrying_events(is_async: bool) -> None:
    policy = RetryPolicy(3, initial_interval=0.05, backoff_factor=2.0, jitter=False)
    model = FlakyChatGenerator([[("fetch", {"url": "a"})], "Done."], failures=2)
    flaky = Flaky(failures=2)
    agent = Agent(model, tools=[flaky_tool(flaky)], state_schema=SCHEMA, retry_policy=policy)

    async def collect() -> list[Any]:
        return [event async for event in agent.stream_async(user())]

    events = asyncio.run(collect()) if is_async else list(agent.stream(user()))
    assert isinstance(events[-1], RunFinished)
    retrying = [event for event in events if isinstance(event, Retrying)]
    assert [(e.kind, e.attempt, e.max_attempts, e.delay, e.step) for e in retrying] == [
        ("model", 1, 3, 0.05, 1),
        ("model", 2, 3, 0.1, 1),
        ("tool", 1, 3, 0.05, 1),
        ("tool", 2, 3, 0.1, 1),
    ]
    assert retrying[0].error == "ConnectionError: attempt 1 failed" and retrying[0].error_type == "ConnectionError"
    assert (retrying[2].tool_name, retrying[2].call_id) == ("fetch", "call_1")
    assert retrying[0].to_dict()["type"] == "retrying"
    for times in (model.flaky.times[:3], flaky.times):  # each wait at least its interval (a little clock slack)
        assert [round(gap, 3) >= minimum for gap, minimum in zip(gaps(times), [0.045, 0.095], strict=True)] == [
            True,
            True,
        ]


def test_a_cancelled_run_stops_waiting() -> None:
    policy = RetryPolicy(2, initial_interval=30.0, jitter=False)
    generator = FlakyChatGenerator(["never"], failures=1)
    agent = Agent(generator, retry_policy=policy)
    stream = agent.stream(user())
    started = time.monotonic()
    for event in stream:
        if isinstance(event, Retrying):
            stream.close()  # the consumer stops listening: the run is cancelled
            break
    assert time.monotonic() - started < 10
    assert generator.flaky.calls == 1


# --- durable threads: the attempts are in the checkpoint metadata ----------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Checkpointer]:
    cp: Checkpointer
    if request.param == "sqlite":
        cp = SQLiteCheckpointer(tmp_path / "threads.sqlite")
    else:
        from haystack_state.persistence.postgres import PostgresCheckpointer

        cp = PostgresCheckpointer(
            request.getfixturevalue("postgres_dsn"), schema=request.getfixturevalue("postgres_schema")
        )
    yield cp
    cp.close()


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_the_attempts_are_recorded_in_the_checkpoint_metadata(checkpointer: Checkpointer, is_async: bool) -> None:
    model = FlakyChatGenerator([[("fetch", {"url": "a"}), ("other", {"url": "b"})], "Done."], failures=1)
    fetch, other = Flaky(failures=2, result="page of"), Flaky(failures=99)
    agent = Agent(
        model,
        tools=[flaky_tool(fetch), flaky_tool(other, "other")],
        state_schema=SCHEMA,
        checkpointer=checkpointer,
        retry_policy=FAST,
    )
    result = run(agent, is_async, thread_id="t1")
    assert tool_results(result)[0] == ("page of a", False)
    assert stored_retries(checkpointer, "t1") == [
        (
            "model",
            {
                "kind": "model",
                "step": 1,
                "attempts": 2,
                "succeeded": True,
                "errors": ["ConnectionError: attempt 1 failed"],
            },
        ),
        (
            "tools",
            {
                "kind": "tool",
                "tool_name": "fetch",
                "call_id": "call_1",
                "attempts": 3,
                "succeeded": True,
                "errors": ["ConnectionError: attempt 1 failed", "ConnectionError: attempt 2 failed"],
                "step": 1,
            },
        ),
        (
            "tools",
            {
                "kind": "tool",
                "tool_name": "other",
                "call_id": "call_2",
                "attempts": 3,
                "succeeded": False,
                "errors": [f"ConnectionError: attempt {n} failed" for n in (1, 2, 3)],
                "step": 1,
            },
        ),
    ]
    # get_state shows the head's metadata; the model's retries are on the checkpoint of its reply.
    assert "retries" not in agent.get_state("t1").checkpoint.metadata  # the last reply needed no retry


def test_a_run_that_exhausts_the_model_budget_records_it_where_it_stopped(checkpointer: Checkpointer) -> None:
    model = FlakyChatGenerator(["never"], failures=99)
    agent = Agent(model, checkpointer=checkpointer, retry_policy=RetryPolicy(2, initial_interval=0.0))
    with pytest.raises(AgentRunError, match="after 2 attempts"):
        agent.run(user(), thread_id="t2")
    head = agent.get_state("t2").checkpoint
    assert head.metadata["retries"] == [
        {
            "kind": "model",
            "step": 1,
            "attempts": 2,
            "succeeded": False,
            "errors": ["ConnectionError: attempt 1 failed", "ConnectionError: attempt 2 failed"],
        }
    ]
    assert "after 2 attempts" in head.metadata["stopped"]


# --- serialization ---------------------------------------------------------------------------------------------------


def test_the_policy_round_trips_through_to_dict() -> None:
    generator = ScriptedChatGenerator(script=["hi"])
    for given in (
        FAST,
        RetryPolicy(retry_on=(ConnectionError, ToolTimeoutError)),
        {"model": RetryPolicy(5, max_interval=2.0), "tools": None},
        {"tools": RetryPolicy(retry_on=transient_error)},
    ):
        agent = Agent(generator, retry_policy=given)
        data = agent.to_dict()
        restored = Agent.from_dict(data)
        assert restored.to_dict() == data
        assert (restored._model_retry, restored._tool_retry) == (agent._model_retry, agent._tool_retry)
    data = Agent(generator, retry_policy=RetryPolicy(retry_on=[ConnectionError, ToolTimeoutError])).to_dict()
    assert data["init_parameters"]["retry_policy"]["retry_on"] == [
        "builtins.ConnectionError",
        "haystack_state.errors.ToolTimeoutError",
    ]
    assert "retry_on" not in FAST.to_dict()  # the default
    assert Agent(generator).to_dict()["init_parameters"]["retry_policy"] is None
    assert Agent.from_dict(Agent(generator).to_dict()).retry_policy is None
