"""
Tests of ``RunContext`` injection on the tool side: a parameter annotated ``RunContext[T]`` is hidden from the model
(the tool's schema, the body haystack's real ``OpenAIChatGenerator`` sends to the local fake server) and receives the
run's context, whose ``deps`` is the very object given to ``ToolInvoker.run(context=...)``: in sync and async tools,
in worker threads, in parallel calls, in component tools. A mismatch between ``T`` and the object is a ``TypeError``
naming the tool and parameter before anything runs. The context never reaches the state, the outputs, a checkpoint,
a pickle or a tool result.
"""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
import sqlite3
import threading
from dataclasses import dataclass
from typing import Annotated, Any, Optional, Protocol

import pytest
from fake_openai import FakeOpenAIServer
from haystack import Pipeline, component
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.utils import Secret

from haystack_state import (
    CodecError,
    ComponentTool,
    State,
    ToolDefinitionError,
    ToolInvoker,
    UnstorableValueError,
    tool,
    tool_spec,
    tool_specs,
)
from haystack_state.invocation._run import run_tool_calls
from haystack_state.persistence.codec import dumps
from haystack_state.runtime import RunContext, check_tool_deps
from haystack_state.values import to_jsonable

SECRET = "sk-live-0123456789"


@dataclass
class Deps:
    user_id: str
    token: str = SECRET


class Other:
    pass


class Greeter(Protocol):
    def greet(self) -> str: ...


def calls(*pairs: tuple[str, dict[str, Any]]) -> list[ChatMessage]:
    """One assistant message with one tool call per ``(tool_name, arguments)`` pair, with ids c0, c1, ..."""
    return [
        ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(pairs)]
        )
    ]


def texts(output: dict[str, Any]) -> list[str]:
    return [message.tool_call_results[0].result for message in output["tool_messages"]]


seen: list[Any] = []


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    seen.clear()


@tool
def whoami(greeting: str, ctx: RunContext[Deps]) -> str:
    """Say who is asking."""
    seen.append(ctx)
    return f"{greeting}, {ctx.deps.user_id}"


@tool
async def whoami_async(greeting: str, ctx: RunContext[Deps]) -> str:
    """Say who is asking, asynchronously."""
    await asyncio.sleep(0)
    seen.append(ctx)
    return f"{greeting}, {ctx.deps.user_id}"


@tool
def optional_ctx(x: int, ctx: Optional[RunContext[Deps]] = None) -> str:  # noqa: UP045  # the Optional form
    """A context that may be missing."""
    seen.append(ctx)
    return "none" if ctx is None or ctx.deps is None else ctx.deps.user_id


@tool
def annotated_ctx(x: int, ctx: Annotated[RunContext, "the run"]) -> int:
    """A bare RunContext inside Annotated."""
    seen.append(ctx)
    return x


# --- hidden from the model -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "expects"),
    [(whoami, Deps), (whoami_async, Deps), (optional_ctx, Optional[Deps]), (annotated_ctx, Any)],  # noqa: UP045
)
def test_a_run_context_parameter_is_hidden_from_the_schema(fn: Any, expects: Any) -> None:
    visible = {"whoami": {"greeting"}, "whoami_async": {"greeting"}}.get(fn.name, {"x"})
    assert set(fn.parameters["properties"]) == visible
    assert "ctx" not in fn.parameters.get("required", [])
    assert "ctx" not in json.dumps(fn.tool_spec["parameters"])  # what haystack's chat generators send
    spec = tool_spec(fn)
    assert spec.context_params == {"ctx": expects}
    assert "ctx" in spec.hidden_params
    assert "ctx" not in spec.parameters["properties"]


def test_a_run_context_filled_from_state_is_a_definition_error() -> None:
    def bad(x: int, ctx: RunContext[Deps]) -> int:
        """Bad."""
        return x

    with pytest.raises(ToolDefinitionError, match="parameter 'ctx' receives the run's RunContext"):
        tool(bad, inputs_from_state={"user": "ctx"})


def test_the_openai_request_body_never_holds_the_context_or_its_deps() -> None:
    """The real OpenAIChatGenerator over HTTP: tools offered, tool call answered, results sent back."""
    deps = Deps("u1")
    with FakeOpenAIServer(script=[[("whoami", {"greeting": "Hi"})], "Done."]) as server:
        generator = OpenAIChatGenerator(
            api_key=Secret.from_token("test"), api_base_url=server.base_url, model="gpt-4o-mini", timeout=10
        )
        invoker = ToolInvoker(tools=[whoami])
        try:
            messages = [ChatMessage.from_user("Who am I?")]
            reply = generator.run(messages=messages, tools=[whoami])["replies"]
            output = invoker.run(messages=reply, context=deps)
            generator.run(messages=[*messages, *reply, *output["tool_messages"]], tools=[whoami])
        finally:
            generator.client.close()
        bodies = server.bodies
    assert len(bodies) == 2
    for body in bodies:
        offered = body["tools"][0]["function"]
        assert offered["name"] == "whoami"
        assert set(offered["parameters"]["properties"]) == {"greeting"}
        text = json.dumps(body)
        assert "ctx" not in text and SECRET not in text and "RunContext" not in text
    assert bodies[1]["messages"][-1]["content"] == "Hi, u1"


# --- injection -------------------------------------------------------------------------------------------------------


def test_a_sync_tool_receives_the_live_deps_object() -> None:
    deps = Deps("u1")
    output = ToolInvoker(tools=[whoami]).run(messages=calls(("whoami", {"greeting": "Hi"})), context=deps)
    assert texts(output) == ["Hi, u1"]
    assert isinstance(seen[0], RunContext)
    assert seen[0].deps is deps


def test_an_async_tool_receives_the_live_deps_object_in_run_and_run_async() -> None:
    deps = Deps("u2")
    invoker = ToolInvoker(tools=[whoami_async, whoami])
    messages = calls(("whoami_async", {"greeting": "Yo"}), ("whoami", {"greeting": "Hey"}))
    assert texts(invoker.run(messages=messages, context=deps)) == ["Yo, u2", "Hey, u2"]
    assert texts(asyncio.run(invoker.run_async(messages=messages, context=deps))) == ["Yo, u2", "Hey, u2"]
    assert len(seen) == 4
    assert all(ctx.deps is deps for ctx in seen)


def test_an_object_that_cannot_be_copied_reaches_parallel_calls_in_worker_threads() -> None:
    """A sqlite3 connection (which cannot be copied) is shared by three calls that run at the same time."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    connection.execute("CREATE TABLE users (id TEXT, name TEXT)")
    connection.executemany("INSERT INTO users VALUES (?, ?)", [("u1", "Ann"), ("u2", "Bob"), ("u3", "Cy")])
    together = threading.Barrier(3, timeout=10)  # each call waits for the other two: they overlap
    threads: set[int] = set()
    lock = threading.Lock()

    @tool
    def lookup(user_id: str, ctx: RunContext[sqlite3.Connection]) -> str:
        """Look a user up."""
        together.wait()
        with lock:
            threads.add(threading.get_ident())
            seen.append(ctx.deps)
            row = ctx.deps.execute("SELECT name FROM users WHERE id = ?", (user_id,)).fetchone()
        return str(row[0])

    invoker = ToolInvoker(tools=[lookup], max_workers=3)
    messages = calls(("lookup", {"user_id": "u1"}), ("lookup", {"user_id": "u2"}), ("lookup", {"user_id": "u3"}))
    try:
        output = invoker.run(messages=messages, context=connection)
        assert texts(output) == ["Ann", "Bob", "Cy"]
        assert len(threads) == 3
        assert all(each is connection for each in seen)
        seen.clear()
        together.reset()
        output = asyncio.run(invoker.run_async(messages=messages, context=connection))
        assert texts(output) == ["Ann", "Bob", "Cy"]
        assert all(each is connection for each in seen)
    finally:
        connection.close()


def test_the_context_is_never_in_the_state_or_the_outputs() -> None:
    deps = Deps("u1")

    @tool(outputs_to_state={"greeting": {}})
    def remember(greeting: str, ctx: RunContext[Deps], state: State) -> str:
        """Remember a greeting."""
        state.set("seen_by", ctx.deps.user_id)
        return greeting

    state = State({"greeting": {"type": str}, "seen_by": {"type": str}})
    output = ToolInvoker(tools=[remember]).run(
        messages=calls(("remember", {"greeting": "Hi"})), state=state, context=deps
    )
    assert set(output) == {"tool_messages", "state"}
    assert output["state"].data == {"greeting": "Hi", "seen_by": "u1"}
    text = json.dumps(output["state"].to_dict()) + json.dumps([m.to_dict() for m in output["tool_messages"]])
    assert SECRET not in text and "RunContext" not in text
    for key in ("greeting", "seen_by"):
        assert SECRET not in dumps(output["state"].get(key), key=key)


def test_a_run_context_given_to_the_invoker_is_passed_as_it_is() -> None:
    deps = Deps("u1")
    context = RunContext(deps=deps, thread_id="t-1", run_id="r-1", step=3)
    ToolInvoker(tools=[whoami]).run(messages=calls(("whoami", {"greeting": "Hi"})), context=context)
    assert seen == [context]
    assert seen[0] is context


def test_without_a_context_an_optional_parameter_gets_an_empty_run_context() -> None:
    invoker = ToolInvoker(tools=[optional_ctx, annotated_ctx])
    output = invoker.run(messages=calls(("optional_ctx", {"x": 1}), ("annotated_ctx", {"x": 2})))
    assert texts(output) == ["none", "2"]
    assert [(type(ctx), ctx.deps) for ctx in seen] == [(RunContext, None), (RunContext, None)]


def test_a_value_the_model_sends_for_the_context_is_dropped() -> None:
    deps = Deps("u1")
    messages = calls(("whoami", {"greeting": "Hi", "ctx": {"deps": {"user_id": "admin"}}}))
    output = ToolInvoker(tools=[whoami]).run(messages=messages, context=deps)
    assert texts(output) == ["Hi, u1"]
    assert seen[0].deps is deps


def test_a_tool_can_emit_events_from_worker_threads() -> None:
    received: list[tuple[str, Any, int]] = []

    @tool
    def step(n: int, ctx: RunContext) -> int:
        """Report progress."""
        ctx.emit("progress", {"n": n})
        return n

    context = RunContext(deps=None, emitter=lambda name, data: received.append((name, data, threading.get_ident())))
    messages = calls(*[("step", {"n": n}) for n in range(4)])
    output = ToolInvoker(tools=[step], max_workers=4).run(messages=messages, context=context)
    assert texts(output) == ["0", "1", "2", "3"]
    assert sorted(data["n"] for _, data, _ in received) == [0, 1, 2, 3]
    assert {name for name, _, _ in received} == {"progress"}


def test_in_a_pipeline_a_run_context_keeps_the_very_deps_object() -> None:
    # Pipelines deep-copy component inputs; a RunContext is never copied, so its deps stay the live object.
    deps = Deps("u1")
    pipeline = Pipeline()
    pipeline.add_component("invoker", ToolInvoker(tools=[whoami]))
    result = pipeline.run(
        {"invoker": {"messages": calls(("whoami", {"greeting": "Hi"})), "context": RunContext(deps=deps)}}
    )
    assert texts(result["invoker"]) == ["Hi, u1"]
    assert seen[0].deps is deps


# --- component tools ---------------------------------------------------------------------------------------------


@component
class Profile:
    """Read the current user's profile."""

    @component.output_types(profile=str)
    def run(self, field: str, ctx: RunContext[Deps] | None = None) -> dict[str, str]:
        """
        Read a profile field.

        :param field: Which field.
        """
        seen.append(ctx)
        user = ctx.deps.user_id if ctx is not None else "?"
        return {"profile": f"{user}.{field}"}


def test_a_component_input_annotated_run_context_is_hidden_and_injected() -> None:
    profile = ComponentTool(Profile(), name="profile")
    assert set(profile.parameters["properties"]) == {"field"}
    assert tool_spec(profile).context_params == {"ctx": Optional[Deps]}  # noqa: UP045
    deps = Deps("u9")
    output = ToolInvoker(tools=[profile]).run(messages=calls(("profile", {"field": "email"})), context=deps)
    assert json.loads(texts(output)[0]) == {"profile": "u9.email"}
    assert seen[0].deps is deps


# --- mismatches --------------------------------------------------------------------------------------------------


def test_a_mismatched_context_fails_before_any_call_runs() -> None:
    ran: list[str] = []

    @tool(outputs_to_state={"log": {}})
    def side_effect(x: int) -> int:
        """Runs first."""
        ran.append("side_effect")
        return x

    state = State({"log": {"type": list[int]}})
    invoker = ToolInvoker(tools=[side_effect, whoami])
    messages = calls(("side_effect", {"x": 1}), ("whoami", {"greeting": "Hi"}))
    with pytest.raises(
        TypeError,
        match=r"Tool 'whoami', parameter 'ctx' expects RunContext\[Deps\], but the run was given builtins.str",
    ):
        invoker.run(messages=messages, state=state, context="not deps")
    with pytest.raises(TypeError, match=r"Tool 'whoami', parameter 'ctx'.*given no context"):
        asyncio.run(invoker.run_async(messages=messages, state=state))
    assert ran == [] and seen == []
    assert state.data == {}


def test_check_tool_deps_checks_every_tool_it_can() -> None:
    @tool
    def maybe(x: int, ctx: RunContext[Deps | None]) -> int:
        """Deps or nothing."""
        return x

    @tool
    def duck(x: int, ctx: RunContext[Greeter]) -> int:
        """A protocol that isinstance cannot check: trusted."""
        return x

    specs = tool_specs([maybe, duck, whoami])
    check_tool_deps(specs, Deps("u1"))
    check_tool_deps([specs["maybe"], specs["duck"]], None)
    check_tool_deps(specs.values(), Deps("u1"))
    with pytest.raises(TypeError, match="Tool 'maybe', parameter 'ctx' expects RunContext\\[Deps \\| NoneType\\]"):
        check_tool_deps(specs, Other())
    with pytest.raises(TypeError, match=r"Tool 'whoami'.*test_run_context.Other"):
        check_tool_deps([specs["duck"], specs["whoami"]], Other())


# --- never stored, copied or shown ---------------------------------------------------------------------------------


def test_a_run_context_is_refused_by_the_state_the_codec_and_pickle() -> None:
    context = RunContext(deps=Deps("u1"))
    state = State({"anything": {"type": object}, "items": {"type": list}})
    with pytest.raises(UnstorableValueError, match=r"State key 'anything' cannot hold a .*RunContext"):
        state.set("anything", context)
    with pytest.raises(UnstorableValueError, match="State key 'items'"):
        state.set("items", [{"ctx": context}])
    assert not state.has("anything") and not state.has("items")
    with pytest.raises(CodecError, match="cannot encode the RunContext at k\\['ctx'\\]"):
        dumps({"ctx": context}, key="k")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(context)
    assert copy.deepcopy(context) is context and copy.copy(context) is context
    assert copy.deepcopy({"ctx": context})["ctx"] is context
    assert SECRET not in repr(context) and "Deps" in repr(context)
    with pytest.raises(TypeError):
        to_jsonable(context)


def test_a_tool_returning_its_context_does_not_show_the_deps_to_the_model() -> None:
    @tool
    def leak(ctx: RunContext[Deps]) -> Any:
        """Returns what it should not."""
        return {"ctx": ctx}

    deps = Deps("u1")
    output = run_tool_calls(calls(("leak", {})), State({}), tool_specs([leak]), context=RunContext(deps=deps))
    text = output[0].tool_call_results[0].result
    assert SECRET not in text and "RunContext(deps=<Deps>" in text
