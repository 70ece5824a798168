"""Tests of haystack_state.Agent with the offline ScriptedChatGenerator: the loop, exits, hooks, errors, streaming."""

import asyncio
import inspect
from collections.abc import Sequence
from typing import Any

import pytest
from haystack import Pipeline, component
from haystack.dataclasses import ChatMessage, ChatRole, StreamingChunk, ToolCall
from haystack.tools import Tool, Toolset
from without_ids import without_ids

from haystack_state import (
    Agent,
    AgentRunError,
    State,
    StateSchemaError,
    ToolDefinitionError,
    ToolExecutionError,
    merge_lists,
    replace_values,
    tool,
)
from haystack_state.testing import ScriptedChatGenerator, ScriptError

# --- tools --------------------------------------------------------------------------------------------


@tool(outputs_to_state={"documents": {"source": "documents"}})
def search(query: str) -> dict[str, Any]:
    """Search the knowledge base."""
    return {"documents": [f"doc about {query}"]}


@tool(inputs_from_state={"user_name": "user"}, outputs_to_state={"greetings": {}})
def greet(name: str, user: str, state: State) -> str:
    """Greet someone on behalf of the user."""
    state.set("seen", [name])
    return f"{user} greets {name}"


@tool
def finish(answer: str) -> str:
    """Give the final answer."""
    return f"final: {answer}"


@tool
def broken_finish(answer: str) -> str:
    """Give the final answer (always fails)."""
    raise RuntimeError("cannot finish yet")


@tool
def explode(x: int) -> int:
    """Always fails."""
    raise KeyError(f"no entry {x}")


@tool(outputs_to_state={"total": {"source": "total"}})
async def async_add(a: int, b: int) -> dict[str, int]:
    """Add two numbers, asynchronously."""
    await asyncio.sleep(0)
    return {"total": a + b}


SCHEMA: dict[str, Any] = {
    "documents": {"type": list[str]},
    "user_name": {"type": str},
    "greetings": {"type": list[str]},
    "seen": {"type": list[str]},
    "total": {"type": int},
}


def user(text: str = "go") -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def make(script: list[Any], **kwargs: Any) -> tuple[Agent, ScriptedChatGenerator]:
    generator = ScriptedChatGenerator(script=script)
    kwargs.setdefault("tools", [search, greet, finish, broken_finish, explode, async_add])
    kwargs.setdefault("state_schema", SCHEMA)
    return Agent(chat_generator=generator, **kwargs), generator


def reply(text: str | None = None, calls: Sequence[tuple[str, dict[str, Any]]] = (), **usage: Any) -> ChatMessage:
    """A ready reply with ids and a usage meta, for scripts that need exact values."""
    tool_calls = [ToolCall(tool_name=name, arguments=args, id=f"id_{name}_{i}") for i, (name, args) in enumerate(calls)]
    return ChatMessage.from_assistant(text=text, tool_calls=tool_calls, meta={"usage": usage} if usage else {})


# --- construction ---------------------------------------------------------------------------------------


@component
class NoToolsGenerator:
    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, list[ChatMessage]]:
        return {"replies": [ChatMessage.from_assistant(f"echo: {messages[-1].text}")]}


def test_a_generator_without_tool_support_given_tools_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"NoToolsGenerator does not accept tools parameter in its run method.*search"):
        Agent(chat_generator=NoToolsGenerator(), tools=[search])


def test_a_generator_without_tool_support_runs_without_tools() -> None:
    agent = Agent(chat_generator=NoToolsGenerator(), tools=[])
    result = agent.run(user("hello"))
    assert result["last_message"].text == "echo: hello"
    assert result["exit_reason"] == "text"
    assert result["step_count"] == 1


@pytest.mark.parametrize("key", ["last_message", "step_count", "exit_reason", "token_usage", "streaming_callback"])
def test_a_schema_key_clashing_with_an_output_or_run_parameter_is_rejected(key: str) -> None:
    with pytest.raises(
        ValueError, match=rf"state_schema keys \['{key}'\] are reserved for Agent internal state.*clash"
    ):
        make(["hi"], state_schema={key: {"type": str}})


def test_a_declared_messages_key_is_not_a_clash() -> None:
    agent, _ = make(["hi"], tools=[], state_schema={"messages": {"type": list[ChatMessage]}})
    assert agent.run(user())["last_message"].text == "hi"


def test_an_invalid_schema_is_a_state_schema_error() -> None:
    with pytest.raises(StateSchemaError, match="documents"):
        make(["hi"], state_schema={"documents": {"handler": merge_lists}})


def test_an_exit_condition_naming_no_tool_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """As in haystack-ai, a run's tools=... may provide the tool: the agent warns and is built."""
    agent, _ = make(["hi"], exit_conditions=["text", "nope"])
    assert "exit_conditions ['nope'] name no tool of this agent (its tools: search" in caplog.text
    assert agent.exit_conditions == ["text", "nope"]


def test_unknown_hook_points_and_uncallable_hooks_are_rejected() -> None:
    with pytest.raises(ValueError, match="Invalid hook point 'before_tools'"):
        make(["hi"], hooks={"before_tools": print})
    with pytest.raises(
        TypeError, match=r"Hook registered for hook point 'before_llm' must have a callable 'run\(state\)'"
    ):
        make(["hi"], hooks={"before_llm": [print, "nope"]})


@pytest.mark.parametrize("setting", [{"max_agent_steps": 0}, {"tool_concurrency_limit": 0}])
def test_limits_below_one_are_rejected(setting: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be greater than or equal to 1"):
        make(["hi"], **setting)


def test_state_keys_are_optional_inputs_and_outputs() -> None:
    agent, _ = make(["hi"])
    pipeline = Pipeline()
    pipeline.add_component("agent", agent)
    inputs = pipeline.inputs(include_components_with_connected_inputs=True)["agent"]
    outputs = pipeline.outputs()["agent"]
    run_options = {"streaming_callback", "thread_id", "checkpoint_id", "generation_kwargs", "tools", "hook_context"}
    run_options |= {"context", "on_unfinished_calls", "run_id", "enable_streaming_callback_passthrough"}
    assert set(inputs) == {"messages", *run_options, *SCHEMA}
    for key in SCHEMA:
        assert inputs[key]["is_mandatory"] is False
        assert inputs[key]["type"] == SCHEMA[key]["type"]
    assert inputs["messages"]["is_mandatory"] is True
    run_facts = {"step_count", "exit_reason", "token_usage", "tool_call_counts", "context_tokens"}
    run_facts |= {"pending_tool_calls", "pending_interrupts", "checkpoint_id"}
    assert set(outputs) == {"messages", "last_message", *run_facts, *SCHEMA}
    assert outputs["total"]["type"] is int


def test_run_and_run_async_have_the_same_signature() -> None:
    assert inspect.signature(Agent.run) == inspect.signature(Agent.run_async)


# --- the loop -----------------------------------------------------------------------------------------


def test_a_text_reply_ends_the_run() -> None:
    agent, generator = make(["Hello."])
    result = agent.run(user("hi"))

    assert result["last_message"].text == "Hello."
    assert [m.role for m in result["messages"]] == [ChatRole.USER, ChatRole.ASSISTANT]
    assert (result["step_count"], result["exit_reason"]) == (1, "text")
    assert not set(SCHEMA) & set(result)  # nothing was written: as in haystack-ai, unset keys are left out
    assert len(generator.calls) == 1


def test_tool_calls_then_text() -> None:
    agent, generator = make([[("search", {"query": "python"})], [("search", {"query": "haystack"})], "Found two."])
    result = agent.run(user("find docs"))

    assert result["documents"] == ["doc about python", "doc about haystack"]
    assert (result["step_count"], result["exit_reason"]) == (3, "text")
    roles = [m.role for m in result["messages"]]
    assert roles == [ChatRole.USER, *[ChatRole.ASSISTANT, ChatRole.TOOL] * 2, ChatRole.ASSISTANT]
    # Each model call got the whole conversation so far, the tool results carrying the ids of their calls.
    second = generator.calls[1].messages
    assert [m.role for m in second] == [ChatRole.USER, ChatRole.ASSISTANT, ChatRole.TOOL]
    assert second[2].tool_call_result.origin.id == second[1].tool_calls[0].id == "call_1"
    assert second[2].tool_call_result.result == '{"documents": ["doc about python"]}'
    assert generator.calls[2].messages == result["messages"][:-1]


def test_the_model_gets_every_tool_without_hidden_parameters() -> None:
    agent, generator = make(["ok"])
    agent.run(user())
    [call] = generator.calls
    assert call.tool_names == ["search", "greet", "finish", "broken_finish", "explode", "async_add"]
    greet_schema = call.tools[1].parameters
    assert greet_schema["properties"] == {"name": {"type": "string"}}
    assert greet_schema["required"] == ["name"]


def test_a_hand_built_tool_listing_hidden_parameters_is_shown_to_the_model_without_them() -> None:
    def greet_by_hand(name: str, user: str, state: State) -> str:
        state.set("seen", [name])
        return f"{user} greets {name}"

    listed = {"name": {"type": "string"}, "user": {"type": "string"}, "state": {"type": "object"}}
    by_hand = Tool(
        name="greet_by_hand",
        description="Greet.",
        parameters={"type": "object", "properties": listed, "required": ["name", "user", "state"]},
        function=greet_by_hand,
        inputs_from_state={"user_name": "user"},
    )
    agent, generator = make([[("greet_by_hand", {"name": "Bob"})], "done"], tools=[by_hand])
    result = agent.run(user(), user_name="Alice")

    for call in generator.calls:
        assert call.tools[0].parameters == {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        }
    assert result["seen"] == ["Bob"]
    assert result["messages"][2].tool_call_result.result == "Alice greets Bob"


def test_state_inputs_prefill_the_state_through_their_handlers() -> None:
    agent, _ = make([[("greet", {"name": "Bob"}), ("search", {"query": "x"})], "done"])
    result = agent.run(user(), user_name="Alice", documents=["given"])

    assert result["user_name"] == "Alice"
    assert result["documents"] == ["given", "doc about x"]  # merge_lists appended to the given value
    assert result["greetings"] == ["Alice greets Bob"]
    assert result["seen"] == ["Bob"]


def test_an_input_of_none_leaves_the_key_unset() -> None:
    agent, _ = make(["hi"], state_schema={**SCHEMA, "user_name": {"type": str, "default": "anonymous"}})
    assert agent.run(user(), user_name=None)["user_name"] == "anonymous"


def test_unknown_run_inputs_are_a_clear_error() -> None:
    agent, generator = make(["hi"])
    with pytest.raises(ValueError, match=r"unknown inputs \['usr_name'\]; the state keys are: .*user_name"):
        agent.run(user(), usr_name="Alice")
    assert generator.calls == []


def test_a_wrongly_typed_run_input_is_a_type_error() -> None:
    agent, _ = make(["hi"])
    with pytest.raises(TypeError, match="user_name"):
        agent.run(user(), user_name=42)


def test_the_system_prompt_is_put_first_once() -> None:
    agent, generator = make(["one", "two"], system_prompt="Be brief.")
    first = agent.run(user("a"))
    second = agent.run([ChatMessage.from_system("Custom."), *user("b")])

    assert [(m.role, m.text) for m in first["messages"]] == [
        (ChatRole.SYSTEM, "Be brief."),
        (ChatRole.USER, "a"),
        (ChatRole.ASSISTANT, "one"),
    ]
    assert [m.text for m in generator.calls[0].messages] == ["Be brief.", "a"]
    assert [m.text for m in generator.calls[1].messages] == ["Custom.", "b"]  # the caller's system message stays
    assert second["messages"][0].text == "Custom."


def test_runs_do_not_share_state() -> None:
    agent, _ = make([[("search", {"query": "a"})], "one", [("search", {"query": "b"})], "two"])
    assert agent.run(user())["documents"] == ["doc about a"]
    assert agent.run(user())["documents"] == ["doc about b"]


def test_the_callers_messages_are_not_changed() -> None:
    messages = user("keep me")
    agent, _ = make([[("search", {"query": "a"})], "done"], system_prompt="sys")
    agent.run(messages)
    assert messages == user("keep me")


def test_parallel_tool_calls_merge_in_call_order() -> None:
    calls = [("search", {"query": str(i)}) for i in range(6)]
    agent, _ = make([calls, "done"], tool_concurrency_limit=3)
    result = agent.run(user())

    assert result["documents"] == [f"doc about {i}" for i in range(6)]
    tool_messages = result["messages"][2:8]
    assert [m.tool_call_result.origin.id for m in tool_messages] == [f"call_{i}" for i in range(1, 7)]


def test_a_failing_tool_is_reported_to_the_model_and_merges_nothing() -> None:
    agent, generator = make([[("explode", {"x": 1}), ("search", {"query": "a"})], "sorry"])
    result = agent.run(user())

    failed = result["messages"][2].tool_call_result
    assert failed.error is True
    assert "Failed to invoke tool 'explode': KeyError" in failed.result
    assert result["documents"] == ["doc about a"]
    assert generator.calls[1].messages[2].tool_call_result.error is True
    assert result["exit_reason"] == "text"


def test_a_tool_call_the_model_invents_is_reported_to_the_model() -> None:
    script = [reply(calls=[("nonexistent", {})]), "ok"]
    agent = Agent(ScriptedChatGenerator(script=script, validate_tools=False), tools=[search], state_schema=SCHEMA)
    result = agent.run(user())
    result_message = result["messages"][2].tool_call_result
    assert result_message.error is True
    assert "'nonexistent' not found" in result_message.result


def test_toolsets_are_accepted() -> None:
    generator = ScriptedChatGenerator(script=[[("search", {"query": "a"}), ("finish", {"answer": "x"})], "d"])
    agent = Agent(chat_generator=generator, tools=[Toolset([search]), finish], state_schema=SCHEMA)
    result = agent.run(user())
    assert generator.calls[0].tool_names == ["search", "finish"]
    assert result["documents"] == ["doc about a"]
    assert result["messages"][3].tool_call_result.result == "final: x"


# --- exits -------------------------------------------------------------------------------------------


def test_a_successful_exit_tool_ends_the_run() -> None:
    agent, generator = make([[("finish", {"answer": "42"})], "never sent"], exit_conditions=["finish"])
    result = agent.run(user())

    assert (result["exit_reason"], result["step_count"]) == ("finish", 1)
    assert result["last_message"].tool_call_result.result == "final: 42"
    assert len(generator.calls) == 1


def test_an_exit_tool_among_other_calls_ends_the_run_after_all_of_them() -> None:
    script = [[("search", {"query": "a"}), ("finish", {"answer": "42"}), ("search", {"query": "b"})]]
    agent, _ = make(script, exit_conditions=["text", "finish"])
    result = agent.run(user())

    assert result["exit_reason"] == "finish"
    assert result["documents"] == ["doc about a", "doc about b"]
    assert result["last_message"].tool_call_result.origin.tool_name == "search"


def test_an_exit_tool_that_errors_does_not_exit() -> None:
    script = [[("broken_finish", {"answer": "1"})], [("finish", {"answer": "2"})]]
    agent, generator = make(script, exit_conditions=["finish", "broken_finish"])
    result = agent.run(user())

    assert result["messages"][2].tool_call_result.error is True
    assert (result["exit_reason"], result["step_count"]) == ("finish", 2)
    assert len(generator.calls) == 2


def test_an_exit_tool_with_invalid_arguments_does_not_exit() -> None:
    agent, _ = make([[("finish", {"answer": 3})], "gave up"], exit_conditions=["finish"])
    result = agent.run(user())
    assert result["messages"][2].tool_call_result.error is True
    assert (result["exit_reason"], result["step_count"]) == ("text", 2)


def test_a_text_reply_ends_the_run_even_without_the_text_exit_condition() -> None:
    agent, _ = make([[("search", {"query": "a"})], "plain text"], exit_conditions=["finish"])
    result = agent.run(user())
    assert (result["exit_reason"], result["step_count"]) == ("text", 2)


def test_other_tools_do_not_exit() -> None:
    agent, _ = make([[("search", {"query": "a"})], "done"], exit_conditions=["finish"])
    assert agent.run(user())["step_count"] == 2


def test_max_agent_steps_stops_the_run_after_the_last_steps_tools() -> None:
    script = [[("search", {"query": str(i)})] for i in range(5)]
    agent, generator = make(script, max_agent_steps=3)
    result = agent.run(user())

    assert (result["exit_reason"], result["step_count"]) == ("max_agent_steps", 3)
    assert len(generator.calls) == 3
    assert result["documents"] == ["doc about 0", "doc about 1", "doc about 2"]
    assert result["last_message"].is_from(ChatRole.TOOL)


# --- hooks ---------------------------------------------------------------------------------------------


def test_each_hook_point_gets_the_live_state() -> None:
    events: list[tuple[str, int, list[str] | None]] = []

    def recorder(point: str) -> Any:
        def hook(state: State) -> None:
            assert isinstance(state, State)
            events.append((point, len(state.get("messages")), state.get("documents")))

        return hook

    hooks = {point: recorder(point) for point in ("before_run", "before_llm", "after_tool", "on_exit", "after_run")}
    agent, _ = make([[("search", {"query": "a"})], "done"], hooks=hooks)
    agent.run(user())

    assert events == [
        ("before_run", 1, None),
        ("before_llm", 1, None),
        ("after_tool", 3, ["doc about a"]),
        ("before_llm", 3, ["doc about a"]),
        ("on_exit", 4, ["doc about a"]),
        ("after_run", 4, ["doc about a"]),
    ]


def test_hooks_at_one_point_run_in_order() -> None:
    order: list[str] = []
    agent, _ = make(["hi"], hooks={"before_llm": [lambda s: order.append("a"), lambda s: order.append("b")]})
    agent.run(user())
    assert order == ["a", "b"]


def test_a_before_llm_hook_can_edit_the_state_the_model_sees() -> None:
    def inject_context(state: State) -> None:
        step = len(state.get("documents") or [])
        state.set("user_name", f"user-{step}")
        state.set("messages", ChatMessage.from_system(f"context {step}"))

    agent, generator = make([[("greet", {"name": "Bob"}), ("search", {"query": "a"})], "done"])
    agent = Agent(generator, tools=agent.tools, state_schema=SCHEMA, hooks={"before_llm": inject_context})
    result = agent.run(user())

    assert generator.calls[0].messages[-1].text == "context 0"
    assert generator.calls[1].messages[-1].text == "context 1"  # appended after the tool results
    assert result["greetings"] == ["user-0 greets Bob"]  # the greet tool read the value the hook wrote
    assert result["user_name"] == "user-1"


def test_a_before_run_hook_can_seed_the_state() -> None:
    agent, _ = make(
        [[("greet", {"name": "Bob"})], "done"],
        hooks={"before_run": lambda state: state.set("user_name", "Seeded")},
    )
    assert agent.run(user())["greetings"] == ["Seeded greets Bob"]


def test_an_after_tool_hook_sees_the_tool_results() -> None:
    seen: list[str] = []

    def after_tool(state: State) -> None:
        last = state.get("messages")[-1]
        seen.append(last.tool_call_result.result)
        state.set("total", len(seen))

    agent, _ = make(
        [[("search", {"query": "a"})], [("search", {"query": "b"})], "done"], hooks={"after_tool": after_tool}
    )
    result = agent.run(user())
    assert seen == ['{"documents": ["doc about a"]}', '{"documents": ["doc about b"]}']
    assert result["total"] == 2


def test_an_on_exit_hook_returning_true_keeps_the_agent_running_once() -> None:
    calls = []

    def insist_once(state: State) -> bool:
        calls.append(state.get("messages")[-1].text)
        if len(calls) == 1:
            state.set("messages", ChatMessage.from_user("Please double-check."))
            return True
        return False

    agent, generator = make(["first answer", "checked answer"], hooks={"on_exit": insist_once})
    result = agent.run(user())

    assert calls == ["first answer", "checked answer"]
    assert (result["exit_reason"], result["step_count"]) == ("text", 2)
    assert generator.calls[1].messages[-1].text == "Please double-check."
    assert result["last_message"].text == "checked answer"


def test_an_on_exit_hook_keeps_an_exit_tool_run_going_too() -> None:
    returns = iter([True, False])
    agent, _ = make(
        [[("finish", {"answer": "1"})], [("finish", {"answer": "2"})]],
        exit_conditions=["finish"],
        hooks={"on_exit": lambda state: next(returns)},
    )
    result = agent.run(user())
    assert (result["exit_reason"], result["step_count"]) == ("finish", 2)


def test_only_true_keeps_the_agent_running() -> None:
    """A hook that happens to return a truthy value (here: the state's data) does not loop the agent."""
    agent, generator = make(["one", "two"], hooks={"on_exit": lambda state: state.data})
    result = agent.run(user())
    assert (result["exit_reason"], result["step_count"]) == ("text", 1)
    assert len(generator.calls) == 1


def test_an_on_exit_hook_that_always_continues_is_bounded_by_max_steps() -> None:
    exits: list[int] = []
    agent, _ = make(["a", "b", "c", "d"], max_agent_steps=3, hooks={"on_exit": lambda s: exits.append(1) or True})
    result = agent.run(user())
    assert (result["exit_reason"], result["step_count"]) == ("max_agent_steps", 3)
    assert len(exits) == 3


def test_on_exit_hooks_do_not_run_when_max_steps_stops_the_run() -> None:
    exits: list[int] = []
    agent, _ = make([[("search", {"query": "a"})]] * 2, max_agent_steps=2, hooks={"on_exit": lambda s: exits.append(1)})
    assert agent.run(user())["exit_reason"] == "max_agent_steps"
    assert exits == []


def test_after_run_changes_are_in_the_outputs() -> None:
    def summarize(state: State) -> None:
        state.set("messages", ChatMessage.from_assistant(f"{len(state.get('documents'))} document(s)."))
        state.set("total", 99)

    agent, _ = make([[("search", {"query": "a"})], "done"], hooks={"after_run": summarize})
    result = agent.run(user())
    assert result["last_message"].text == "1 document(s)."
    assert result["messages"][-1] == result["last_message"]
    assert result["total"] == 99


def test_a_failing_hook_raises_an_agent_run_error_with_the_state() -> None:
    def strict(state: State) -> None:
        if state.get("documents"):
            raise RuntimeError("too many documents")

    agent, _ = make([[("search", {"query": "a"})], "done"], hooks={"after_tool": strict})
    with pytest.raises(AgentRunError, match=r"the 'after_tool' hook failed at step 1: RuntimeError") as info:
        agent.run(user())
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.state.get("documents") == ["doc about a"]


# --- errors ----------------------------------------------------------------------------------------------


def failing_generator(script: list[Any], fail_on: int) -> ScriptedChatGenerator:
    """A generator that replays ``script`` but raises a ConnectionError on call ``fail_on`` (a network failure)."""
    replies = iter(script)
    count = 0

    def policy(messages: list[ChatMessage], tools: list[Tool]) -> Any:
        nonlocal count
        count += 1
        if count == fail_on:
            raise ConnectionError("model endpoint went away")
        return next(replies)

    return ScriptedChatGenerator(policy=policy)


@pytest.mark.parametrize("mode", ["run", "run_async"])
def test_a_generator_error_carries_the_partial_state(mode: str) -> None:
    generator = failing_generator([[("search", {"query": "a"}), ("greet", {"name": "Bob"})], "never"], fail_on=2)
    agent = Agent(chat_generator=generator, tools=[search, greet], state_schema=SCHEMA)
    with pytest.raises(AgentRunError, match=r"the chat generator failed at step 2: ConnectionError") as info:
        if mode == "run":
            agent.run(user(), user_name="Alice")
        else:
            asyncio.run(agent.run_async(user(), user_name="Alice"))

    error = info.value
    assert isinstance(error.__cause__, ConnectionError)
    state = error.state
    assert state.get("documents") == ["doc about a"]
    assert state.get("greetings") == ["Alice greets Bob"]
    assert state.get("seen") == ["Bob"]
    assert [m.role for m in state.get("messages")] == [ChatRole.USER, ChatRole.ASSISTANT, ChatRole.TOOL, ChatRole.TOOL]


def test_a_script_error_on_the_first_call_carries_the_initial_state() -> None:
    agent, _ = make([])
    with pytest.raises(AgentRunError, match=r"step 1: ScriptError") as info:
        agent.run(user("hi"), user_name="Alice")
    assert isinstance(info.value.__cause__, ScriptError)
    assert info.value.state.get("user_name") == "Alice"
    assert without_ids(info.value.state.get("messages")) == user("hi")  # the message got an id


def test_a_reply_that_is_not_a_chat_message_is_an_agent_run_error() -> None:
    @component
    class BadGenerator:
        @component.output_types(replies=list[ChatMessage])
        def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
            return {"replies": ["not a ChatMessage"]}

    with pytest.raises(AgentRunError, match="the chat generator failed at step 1") as info:
        Agent(BadGenerator(), tools=[search], state_schema=SCHEMA).run(user())
    assert "messages" in str(info.value.__cause__)


@pytest.mark.parametrize("mode", ["run", "run_async"])
def test_raise_on_tool_invocation_failure_raises_the_tool_error_with_its_cause_and_the_state(mode: str) -> None:
    agent, _ = make(
        [[("search", {"query": "a"}), ("explode", {"x": 7})], "never"], raise_on_tool_invocation_failure=True
    )
    with pytest.raises(ToolExecutionError, match=r"Failed to invoke tool 'explode': KeyError") as info:
        if mode == "run":
            agent.run(user())
        else:
            asyncio.run(agent.run_async(user()))

    error = info.value
    assert isinstance(error.__cause__, KeyError)  # the tool's own exception, not the error itself
    assert error.__cause__.args == ("no entry 7",)
    assert error.state.get("documents") == ["doc about a"]  # the call before the failure was merged


# --- streaming -----------------------------------------------------------------------------------------


def test_streaming_delivers_text_tool_calls_and_tool_results() -> None:
    chunks: list[StreamingChunk] = []
    agent, generator = make([[("search", {"query": "python"})], "Found a document about it."])
    result = agent.run(user(), streaming_callback=chunks.append)

    assert all(call.streamed for call in generator.calls)
    text = "".join(c.content for c in chunks)
    assert text == "Found a document about it."
    [call_delta] = [d for c in chunks for d in c.tool_calls or [] if d.tool_name]
    assert (call_delta.tool_name, call_delta.id) == ("search", "call_1")
    [result_chunk] = [c for c in chunks if c.tool_call_result is not None]
    assert result_chunk.tool_call_result == result["messages"][2].tool_call_result
    finishes = [c.finish_reason for c in chunks if c.finish_reason]
    assert finishes == ["tool_calls", "tool_call_results", "stop"]
    # In order: the call streamed before its result, and the result before the final answer.
    positions = {id(c): i for i, c in enumerate(chunks)}
    first_text = next(c for c in chunks if c.content)
    assert positions[id(result_chunk)] < positions[id(first_text)]


def test_the_constructor_callback_is_used_unless_run_overrides_it() -> None:
    default: list[StreamingChunk] = []
    override: list[StreamingChunk] = []
    agent, _ = make(["one", "two"], streaming_callback=default.append)
    agent.run(user())
    agent.run(user(), streaming_callback=override.append)

    assert "".join(c.content for c in default) == "one"
    assert "".join(c.content for c in override) == "two"


def test_tool_results_stream_even_when_the_generator_does_not() -> None:
    @component
    class NonStreaming:
        def __init__(self) -> None:
            self.replies = [
                ChatMessage.from_assistant(tool_calls=[ToolCall("search", {"query": "q"}, id="c1")]),
                ChatMessage.from_assistant("done"),
            ]

        @component.output_types(replies=list[ChatMessage])
        def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
            return {"replies": [self.replies.pop(0)]}

    chunks: list[StreamingChunk] = []
    result = Agent(NonStreaming(), tools=[search], state_schema=SCHEMA).run(user(), streaming_callback=chunks.append)
    assert result["documents"] == ["doc about q"]
    assert [c.tool_call_result.result for c in chunks if c.tool_call_result] == ['{"documents": ["doc about q"]}']


def test_an_async_callback_is_rejected_by_run() -> None:
    async def on_chunk(chunk: StreamingChunk) -> None:
        pass

    agent, _ = make(["hi"])
    with pytest.raises(ValueError, match="cannot be a coroutine"):
        agent.run(user(), streaming_callback=on_chunk)


# --- token usage --------------------------------------------------------------------------------------


def test_token_usage_is_summed_over_the_steps() -> None:
    agent, generator = make([[("search", {"query": "a"})], [("search", {"query": "b"})], "done"])
    result = agent.run(user())
    usages = [call.reply.meta["usage"] for call in generator.calls]
    assert len(usages) == 3
    assert result["token_usage"] == {key: sum(u[key] for u in usages) for key in usages[0]}
    assert result["token_usage"]["total_tokens"] > 0


def test_nested_usage_is_summed_key_by_key_other_values_kept_and_missing_usage_skipped() -> None:
    script = [
        reply(
            calls=[("search", {"query": "a"})],
            prompt_tokens=10,
            completion_tokens=4,
            completion_tokens_details={"reasoning_tokens": 3, "audio_tokens": None},
            cached=True,
        ),
        reply(calls=[("search", {"query": "b"})]),  # no usage reported
        reply("done", prompt_tokens=20, completion_tokens=1.5, completion_tokens_details={"reasoning_tokens": 2}),
    ]
    agent, _ = make(script)
    assert agent.run(user())["token_usage"] == {
        "prompt_tokens": 30,
        "completion_tokens": 5.5,
        "completion_tokens_details": {"reasoning_tokens": 5, "audio_tokens": None},
        "cached": True,  # as in haystack-ai: what is not a number is kept as the latest reply reported it
    }


def test_token_usage_is_empty_without_usage_meta() -> None:
    agent = Agent(chat_generator=NoToolsGenerator())
    assert agent.run(user())["token_usage"] == {}


# --- the messages the model sees, when something other than the loop writes them -----------------------


@tool
def note_taker(note: str, state: State) -> str:
    """Add a note to the conversation."""
    state.set("messages", ChatMessage.from_user(f"note: {note}"))
    return "noted"


@tool(outputs_to_state={"messages": {"source": "message"}})
def messenger(text: str) -> dict[str, ChatMessage]:
    """Post a message into the conversation."""
    return {"message": ChatMessage.from_user(f"posted: {text}")}


@pytest.mark.parametrize(("writer", "expected"), [("note_taker", "note: hi"), ("messenger", "posted: hi")])
def test_messages_written_by_tools_reach_the_model(writer: str, expected: str) -> None:
    arg = "note" if writer == "note_taker" else "text"
    generator = ScriptedChatGenerator(script=[[(writer, {arg: "hi"})], "done"])
    result = Agent(generator, tools=[note_taker, messenger]).run(user())

    seen = [m.text or (m.tool_call_result and m.tool_call_result.result) for m in generator.calls[1].messages]
    assert expected in seen
    assert result["messages"][:-1] == generator.calls[1].messages
    assert len(result["messages"]) == 5


def keep_last_three(current: list[ChatMessage] | None, new: list[ChatMessage] | ChatMessage) -> list[ChatMessage]:
    items = new if isinstance(new, list) else [new]
    return ([*(current or []), *items])[-3:]


def test_a_custom_messages_handler_decides_what_the_model_sees() -> None:
    schema = {"messages": {"type": list[ChatMessage], "handler": keep_last_three}, "documents": {"type": list[str]}}
    script = [[("search", {"query": "a"})], [("search", {"query": "b"})], "done"]
    agent, generator = make(script, state_schema=schema, tools=[search])
    result = agent.run(user())

    assert [len(call.messages) for call in generator.calls] == [1, 3, 3]
    assert generator.calls[2].messages[-1].tool_call_result.result == '{"documents": ["doc about b"]}'
    assert len(result["messages"]) == 3
    assert result["last_message"].text == "done"


def test_the_outputs_do_not_change_the_next_run() -> None:
    agent, _ = make([[("search", {"query": "a"})], "one", "two"])
    first = agent.run(user())
    first["messages"].append(ChatMessage.from_user("tampered"))
    first["documents"].append("tampered")
    second = agent.run(user())
    assert len(second["messages"]) == 2
    assert "documents" not in second


# --- async ---------------------------------------------------------------------------------------------


def script_for_parity() -> list[Any]:
    return [
        [("search", {"query": "a"}), ("greet", {"name": "Bob"})],
        [("async_add", {"a": 2, "b": 3}), ("explode", {"x": 1})],
        [("finish", {"answer": "5"})],
    ]


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A run's outputs, without the message ids (each run's messages get their own)."""
    return {**result, "messages": [m.to_dict() for m in without_ids(result["messages"])], "last_message": None}


def test_run_and_run_async_give_the_same_outputs() -> None:
    hooks = {"before_run": lambda state: state.set("total", 0), "after_tool": lambda state: state.set("seen", "hook")}
    sync_agent, sync_generator = make(script_for_parity(), exit_conditions=["finish"], hooks=hooks)
    async_agent, async_generator = make(script_for_parity(), exit_conditions=["finish"], hooks=hooks)
    sync_result = sync_agent.run(user(), user_name="Alice")
    async_result = asyncio.run(async_agent.run_async(user(), user_name="Alice"))

    assert comparable(sync_result) == comparable(async_result)
    assert without_ids(sync_result["last_message"]) == without_ids(async_result["last_message"])
    assert sync_result["exit_reason"] == "finish"
    assert sync_result["total"] == 5
    assert sync_result["seen"] == ["Bob", "hook", "hook", "hook"]
    assert without_ids([c.messages for c in sync_generator.calls]) == without_ids(
        [c.messages for c in async_generator.calls]
    )


def test_async_hooks_are_awaited_under_run_async() -> None:
    events: list[str] = []

    async def before_llm(state: State) -> None:
        await asyncio.sleep(0)
        events.append("before_llm")
        state.set("user_name", "async")

    async def on_exit(state: State) -> bool:
        events.append("on_exit")
        return False

    agent, _ = make([[("greet", {"name": "Bob"})], "done"], hooks={"before_llm": before_llm, "on_exit": on_exit})
    result = asyncio.run(agent.run_async(user()))
    assert events == ["before_llm", "before_llm", "on_exit"]
    assert result["greetings"] == ["async greets Bob"]


async def async_seed(state: State) -> None:
    await asyncio.sleep(0)
    state.set("user_name", "from an async hook")


async def async_continue_once(state: State) -> bool:
    await asyncio.sleep(0)
    return len(state.get("messages")) < 5  # True after the first text reply (4 messages), then False


def test_async_hooks_run_to_completion_under_run() -> None:
    agent, generator = make(
        [[("greet", {"name": "Bob"})], "one", "two"],
        hooks={"before_llm": async_seed, "on_exit": async_continue_once},
    )
    result = agent.run(user())
    assert result["greetings"] == ["from an async hook greets Bob"]
    assert result["user_name"] == "from an async hook"
    assert len(generator.calls) == 3  # on_exit's awaited True kept the run going once, its False ended it
    assert (result["last_message"].text, result["step_count"]) == ("two", 3)


def test_async_hooks_under_run_called_from_inside_an_event_loop() -> None:
    """As in a notebook cell: ``run`` is called while an event loop is running in this thread."""

    async def main() -> dict[str, Any]:
        agent, _ = make([[("greet", {"name": "Bob"})], "done"], hooks={"before_llm": async_seed})
        return agent.run(user())

    assert asyncio.run(main())["greetings"] == ["from an async hook greets Bob"]


def test_async_tools_run_under_both_run_and_run_async() -> None:
    script = [[("async_add", {"a": 20, "b": 22})], "42"]
    sync_agent, _ = make(script)
    async_agent, _ = make(script)
    assert sync_agent.run(user())["total"] == 42
    assert asyncio.run(async_agent.run_async(user()))["total"] == 42


def test_run_async_uses_a_sync_only_generator_in_a_thread() -> None:
    result = asyncio.run(Agent(chat_generator=NoToolsGenerator()).run_async(user("ping")))
    assert result["last_message"].text == "echo: ping"


def test_run_async_streams_to_an_async_callback() -> None:
    chunks: list[StreamingChunk] = []

    async def on_chunk(chunk: StreamingChunk) -> None:
        chunks.append(chunk)

    agent, _ = make([[("search", {"query": "a"})], "done"])
    asyncio.run(agent.run_async(user(), streaming_callback=on_chunk))
    assert "".join(c.content for c in chunks) == "done"
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["tool_calls", "tool_call_results", "stop"]


# --- warm up and close --------------------------------------------------------------------------------------


@component
class NeedsWarmUp:
    """A generator that must be warmed up before it runs (as local-model generators must)."""

    def __init__(self) -> None:
        self.warm_ups = 0
        self.closed = False

    def warm_up(self) -> None:
        self.warm_ups += 1

    def close(self) -> None:
        self.closed = True

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
        if not self.warm_ups:
            raise RuntimeError("call warm_up() first")
        return {"replies": [ChatMessage.from_assistant("warm")]}


def test_run_warms_the_generator_up_once() -> None:
    generator = NeedsWarmUp()
    agent = Agent(chat_generator=generator, tools=[search], state_schema=SCHEMA)
    assert agent.run(user())["last_message"].text == "warm"
    assert asyncio.run(agent.run_async(user()))["last_message"].text == "warm"
    agent.run(user())
    assert generator.warm_ups == 1
    agent.close()
    assert generator.closed
    agent.run(user())  # a closed agent warms up again
    assert generator.warm_ups == 2


def test_close_async_closes_the_generator() -> None:
    generator = NeedsWarmUp()
    asyncio.run(Agent(chat_generator=generator).close_async())
    assert generator.closed


def test_unchanged_tools_are_passed_to_the_model_as_they_are() -> None:
    agent, generator = make(["hi"], tools=[search, finish])
    agent.run(user())
    assert generator.calls[0].tools == [search, finish]
    assert replace_values is not merge_lists  # both handlers importable from the package root


def test_a_tool_mapping_to_an_undeclared_key_is_refused_at_construction() -> None:
    with pytest.raises(ToolDefinitionError) as raised:
        make(["hi"], state_schema={"user_name": {"type": str}})
    message = str(raised.value)
    assert "Tool 'search': outputs_to_state names state key 'documents'" in message
    assert "Tool 'greet': outputs_to_state names state key 'greetings'" in message


def test_only_the_chat_generator_may_be_given_by_position() -> None:
    """As haystack-ai's Agent takes every parameter by keyword, ours takes all but the chat generator so."""
    generator = ScriptedChatGenerator(script=["hi"])
    assert Agent(generator).chat_generator is generator
    with pytest.raises(TypeError, match="positional argument"):
        Agent(generator, [])  # type: ignore[misc]
