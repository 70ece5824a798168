"""
Drop-in loose ends that haystack-ai's own tests show (issue 25), each run against haystack-ai 3.4's class and ours
where haystack-ai has one: the words of its errors and warnings (its tests match on them), the builtin each error
derives from, ``Agent.resolved_state_schema``, the warning for a run of system messages only, the run span's
``haystack.agent.state_schema`` tag, ``State.to_dict`` leaving out what it cannot serialize (while a durable thread
still refuses it), ``run(enable_streaming_callback_passthrough=...)``, and ``ToolInvoker(convert_result_to_json_string=
...)`` (haystack-ai's ``ToolInvoker`` parameter, before 3.0 folded the invoker into the Agent).
"""

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

import pytest
from haystack import component, tracing
from haystack.components.agents import Agent as HaystackAgent
from haystack.components.agents.state import State as HaystackState
from haystack.components.agents.state.state_utils import merge_lists, replace_values
from haystack.components.agents.tool_calling import ToolNotFoundException
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, Document, StreamingChunk, ToolCall
from haystack.tools import Tool, Toolset, tool
from haystack.tracing import Span, Tracer

from compat.agent_helpers import agent_class as agent_class  # fixtures
from compat.agent_helpers import call, save, scripted, texts, user
from haystack_state import Agent, CodecError, InMemoryCheckpointer, State, ThreadNotFoundError, ToolInvoker
from haystack_state import tool as our_tool
from haystack_state.errors import ToolMergeError, ToolNotFoundError

STATE_CLASSES = [HaystackState, State]
STR = {"type": str}
STATE_IDS = ["haystack", "ours"]

#: The keys haystack-ai's Agent reserves for its run metadata and internal state.
RESERVED = (
    "step_count",
    "token_usage",
    "tool_call_counts",
    "exit_reason",
    "continue_run",
    "stop_run",
    "tools",
    "hook_context",
    "context_tokens",
)


@pytest.fixture(params=STATE_CLASSES, ids=STATE_IDS)
def state_class(request: pytest.FixtureRequest) -> Any:
    """haystack-ai's State, then ours."""
    return request.param


@component
class NoToolsGenerator:
    """A chat generator whose run takes no tools."""

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        return {"replies": [ChatMessage.from_assistant("plain")]}


class BeforeToolOnly:
    """A hook object that may run only at ``before_tool`` (as haystack's ``ConfirmationHook``)."""

    allowed_hook_points = ("before_tool",)

    def run(self, state: Any) -> None:
        return None


def refuse(current: Any, new: Any) -> Any:
    """A state handler that always fails."""
    raise ValueError("State set operation failed")


@tool(outputs_to_state={"total": {"source": "sum", "handler": refuse}})
def add(a: Annotated[int, "a number"], b: Annotated[int, "another"]) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@tool
def narrate(topic: Annotated[str, "what to narrate"], streaming_callback: Any = None) -> str:
    """Narrate a topic, streaming as it goes."""
    if streaming_callback is not None:
        streaming_callback(StreamingChunk(content=f"narrating {topic}"))
    return f"told {topic}"


def tool_calls(*calls: ToolCall) -> list[ChatMessage]:
    return [ChatMessage.from_assistant(tool_calls=list(calls))]


# --- 1. haystack-ai's words, and the builtin each error derives from -----------------------------------------------


def test_reserved_state_schema_keys_are_refused_in_haystacks_words(agent_class: Any) -> None:
    for key in RESERVED:
        with pytest.raises(ValueError, match="reserved for Agent internal state") as info:
            agent_class(chat_generator=scripted("hi"), tools=[save], state_schema={key: {"type": int}})
        assert f"'{key}'" in str(info.value)


def test_a_messages_key_of_the_wrong_type_is_refused_in_haystacks_words(agent_class: Any) -> None:
    for wrong in (str, list[int]):
        with pytest.raises(ValueError, match=re.escape("'messages' must be of type list[ChatMessage]")):
            agent_class(chat_generator=scripted("hi"), state_schema={"messages": {"type": wrong}})


def test_construction_errors_use_haystacks_words(agent_class: Any) -> None:
    with pytest.raises(TypeError, match="NoToolsGenerator does not accept tools parameter in its run method"):
        agent_class(chat_generator=NoToolsGenerator(), tools=[save])
    with pytest.raises(ValueError, match="tool_concurrency_limit must be greater than or equal to 1"):
        agent_class(chat_generator=scripted("hi"), tool_concurrency_limit=0)
    with pytest.raises(ValueError, match="Invalid hook point 'before_tools'"):
        agent_class(chat_generator=scripted("hi"), hooks={"before_tools": []})
    with pytest.raises(TypeError, match=re.escape("Hook registered for hook point 'before_llm' must have a callable")):
        agent_class(chat_generator=scripted("hi"), hooks={"before_llm": [3]})
    only = "Hook of type 'BeforeToolOnly' is registered under hook point 'before_llm' but only supports: before_tool"
    with pytest.raises(ValueError, match=only):
        agent_class(chat_generator=scripted("hi"), hooks={"before_llm": [BeforeToolOnly()]})


def test_prompt_errors_use_haystacks_words(agent_class: Any) -> None:
    defined = "Variable 'question' from user_prompt is already defined in the state schema."
    with pytest.raises(ValueError, match=re.escape(defined)):
        agent_class(chat_generator=scripted("hi"), user_prompt="Q: {{question}}", state_schema={"question": STR})
    conflicts = "Variable 'streaming_callback' from user_prompt conflicts with input names in the run method."
    with pytest.raises(ValueError, match=re.escape(conflicts)):
        agent_class(chat_generator=scripted("hi"), user_prompt="{{streaming_callback}} is a run parameter.")
    with pytest.raises(ValueError, match="system_prompt message block must have role 'system'"):
        agent_class(chat_generator=scripted("hi"), system_prompt='{% message role="user" %}Hi{% endmessage %}')
    with pytest.raises(ValueError, match="user_prompt message block must have role 'user'"):
        agent_class(chat_generator=scripted("hi"), user_prompt='{% message role="system" %}Hi{% endmessage %}')
    agent = agent_class(chat_generator=scripted("hi"), user_prompt="{% message role=role_name %}Q{% endmessage %}")
    with pytest.raises(ValueError, match="user_prompt must render to a user message"):
        agent.run(messages=[], role_name="assistant")


def test_run_errors_use_haystacks_words(agent_class: Any) -> None:
    agent = agent_class(chat_generator=scripted("hi"), tools=[save])
    with pytest.raises(
        TypeError,
        match=re.escape(
            "tools must be a list of Tool and/or Toolset objects, a Toolset, or a list of tool names (strings)."
        ),
    ):
        agent.run(messages=user(), tools="save")
    with pytest.raises(ValueError, match="The following tool names are not valid"):
        agent.run(messages=user(), tools=["nope"])
    with pytest.raises(ValueError, match=re.escape("No tools were configured for the Agent at initialization.")):
        agent_class(chat_generator=scripted("hi")).run(messages=user(), tools=["nope"])
    with pytest.raises(ValueError, match="Duplicate tool names"):

        def same(description: str) -> Tool:
            return Tool(
                name="same", description=description, parameters={"type": "object", "properties": {}}, function=str
            )

        agent = agent_class(chat_generator=scripted("hi"), tools=[Toolset([same("a")]), Toolset([same("b")])])
        agent.warm_up()
        agent.run(messages=user())


def test_warnings_use_haystacks_words(agent_class: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        agent_class(chat_generator=scripted("hi"), required_variables=["name"])
    assert "The parameter required_variables is provided but neither" in caplog.text
    caplog.clear()
    model = scripted(call("save", content="x"), call("save", content="y"))
    agent = agent_class(chat_generator=model, tools=[save], max_agent_steps=2)
    with caplog.at_level(logging.WARNING):
        result = agent.run(messages=user())
    assert "Agent reached maximum agent steps of 2" in caplog.text
    assert result["exit_reason"] == "max_agent_steps"


def test_an_unknown_tool_is_not_found(agent_class: Any) -> None:
    invented = tool_calls(ToolCall(tool_name="nope", arguments={}))[0]
    model = MockChatGenerator([invented, "done"])
    result = agent_class(chat_generator=model, tools=[save]).run(messages=user())
    assert "Tool 'nope' not found. Available tools: save" in texts(result["messages"])[2]
    agent = agent_class(chat_generator=MockChatGenerator(invented), tools=[save], raise_on_tool_invocation_failure=True)
    with pytest.raises(ToolNotFoundException, match="Tool 'nope' not found"):
        agent.run(messages=user())


def test_a_failing_tool_is_reported_in_haystacks_words(agent_class: Any) -> None:
    @tool
    def explode(reason: Annotated[str, "why"]) -> str:
        """Always fails."""
        raise KeyError(reason)

    result = agent_class(chat_generator=scripted(call("explode", reason="x"), "done"), tools=[explode]).run(
        messages=user()
    )
    assert "Failed to invoke" in texts(result["messages"])[2]


def test_a_failed_merge_into_state_is_a_runtime_error(agent_class: Any) -> None:
    agent = agent_class(
        chat_generator=scripted(call("add", a=1, b=2)),
        tools=[add],
        state_schema={"total": {"type": int}},
        raise_on_tool_invocation_failure=True,
    )
    with pytest.raises(RuntimeError, match=r"Tool 'add': [Ff]ailed to merge"):
        agent.run(messages=user())


def test_the_tool_invoker_uses_haystacks_words_for_a_missing_tool_and_a_failed_merge() -> None:
    calls = tool_calls(ToolCall(tool_name="nope", arguments={}))
    with pytest.raises(ToolNotFoundError, match="Tool 'nope' not found") as missing:
        ToolInvoker(tools=[add]).run(messages=calls)
    assert isinstance(missing.value, ToolNotFoundException)
    message = ToolInvoker(tools=[add], raise_on_failure=False).run(messages=calls)["tool_messages"][0]
    assert message.tool_call_result.error and "not found" in message.tool_call_result.result

    calls = tool_calls(ToolCall(tool_name="add", arguments={"a": 1, "b": 2}))
    with pytest.raises(RuntimeError, match="Failed to merge") as failed:
        ToolInvoker(tools=[add]).run(messages=calls, state=State({"total": {"type": int}}))
    assert isinstance(failed.value, ToolMergeError)
    result = ToolInvoker(tools=[add], raise_on_failure=False).run(messages=calls, state=State({"total": {"type": int}}))
    message = result["tool_messages"][0]
    assert message.tool_call_result.error
    assert "Failed to merge tool outputs from tool add into State" in message.tool_call_result.result
    assert not result["state"].has("total")


def test_the_tool_invoker_uses_haystacks_words_for_a_result_it_cannot_convert() -> None:
    @our_tool(outputs_to_string={"handler": lambda result: 1 / 0})
    def weather(city: str) -> str:
        """The weather."""
        return "sunny"

    calls = tool_calls(ToolCall(tool_name="weather", arguments={"city": "Rome"}))
    result = ToolInvoker(tools=[weather], raise_on_failure=False).run(messages=calls)["tool_messages"][0]
    assert result.tool_call_result.error and "Failed to convert" in result.tool_call_result.result


def test_state_errors_use_haystacks_words(state_class: Any) -> None:
    with pytest.raises(ValueError, match="Key 'any_key' not found in schema"):
        state_class({}).set("any_key", "value")
    with pytest.raises(ValueError, match="must be a Python type"):
        state_class({"test": {"type": "not_a_type"}})
    with pytest.raises(ValueError, match="missing a 'type' entry"):
        state_class({"test": {"handler": lambda current, new: new}})
    with pytest.raises(ValueError, match="must be callable or None"):
        state_class({"test": {"type": list, "handler": "not_callable"}})


# --- 2. Agent.resolved_state_schema ----------------------------------------------------------------------------------


def test_the_resolved_state_schema_is_haystacks() -> None:
    expected = {
        "foo": {"type": str},
        "messages": {"type": list[ChatMessage], "handler": merge_lists},
        "step_count": {"type": int, "handler": replace_values},
        "token_usage": {"type": dict[str, Any], "handler": replace_values},
        "tool_call_counts": {"type": dict[str, int], "handler": replace_values},
        "exit_reason": {"type": str, "handler": replace_values},
        "continue_run": {"type": bool, "handler": replace_values},
        "stop_run": {"type": str, "handler": replace_values},
        "tools": {"type": list, "handler": replace_values},
        "hook_context": {"type": dict[str, Any], "handler": replace_values},
        "context_tokens": {"type": int, "handler": replace_values},
    }
    for schema in ({"foo": {"type": str}}, {"foo": {"type": str}, "messages": {"type": list[ChatMessage]}}):
        theirs = HaystackAgent(chat_generator=scripted("hi"), tools=[save], state_schema=schema)
        ours = Agent(chat_generator=scripted("hi"), tools=[save], state_schema=schema)
        assert ours.resolved_state_schema == theirs.resolved_state_schema
        assert list(ours.resolved_state_schema) == list(theirs.resolved_state_schema)
        assert ours.state_schema == schema
    assert Agent(chat_generator=scripted("hi"), state_schema={"foo": {"type": str}}).resolved_state_schema == expected


# --- 3. the warning for system messages only -------------------------------------------------------------------------


def test_a_run_of_system_messages_only_warns_as_haystack_does(
    agent_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    warning = "All messages provided to the Agent component are system messages. This is not recommended."
    for messages, prompt in (([], "Be brief."), ([ChatMessage.from_system("Be brief.")], None), ([], None)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            agent_class(chat_generator=scripted("hi"), system_prompt=prompt).run(messages=messages)
        assert warning in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        agent_class(chat_generator=scripted("hi"), system_prompt="Be brief.").run(messages=user())
    assert warning not in caplog.text


def test_a_thread_with_history_does_not_warn_when_continued_without_new_messages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent(chat_generator=scripted("one", "two"), system_prompt="Be brief.", checkpointer=InMemoryCheckpointer())
    agent.run(messages=user(), thread_id="t")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        agent.run(messages=[], thread_id="t")
    assert "are system messages" not in caplog.text


# --- 4. the state_schema tag of the run span -------------------------------------------------------------------------


class SpySpan(Span):
    def __init__(self, name: str, tags: dict[str, Any]) -> None:
        self.name = name
        self.tags = tags

    def set_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value

    def raw_span(self) -> Any:
        return self


class SpyTracer(Tracer):
    def __init__(self) -> None:
        self.spans: list[SpySpan] = []

    @contextlib.contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
    ) -> Iterator[Span]:
        span = SpySpan(operation_name, dict(tags or {}))
        self.spans.append(span)
        yield span

    def current_span(self) -> Span | None:
        return None


@pytest.fixture
def spy() -> Iterator[SpyTracer]:
    tracer = SpyTracer()
    tracing.enable_tracing(tracer)
    try:
        yield tracer
    finally:
        tracing.disable_tracing()


def run_span_schema(spy: SpyTracer, agent: Any) -> dict[str, Any]:
    spy.spans.clear()
    agent.run(messages=user())
    (run_span,) = [span for span in spy.spans if span.name == "haystack.agent.run"]
    return dict(run_span.tags["haystack.agent.state_schema"])


def test_the_run_span_lists_the_state_keys_as_haystacks_does(spy: SpyTracer) -> None:
    for schema in (None, {"notes": {"type": list[str]}, "who": {"type": str, "handler": replace_values}}):
        theirs = run_span_schema(spy, HaystackAgent(chat_generator=scripted("hi"), tools=[save], state_schema=schema))
        ours = run_span_schema(spy, Agent(chat_generator=scripted("hi"), tools=[save], state_schema=schema))
        assert ours == theirs
    assert ours["notes"] == {"type": "list[str]"}
    assert ours["step_count"] == {
        "type": "int",
        "handler": "haystack.components.agents.state.state_utils.replace_values",
    }


# --- 5. State.to_dict leaves out what it cannot serialize; a checkpoint still refuses it ---------------------------


def test_to_dict_leaves_out_a_field_it_cannot_serialize_with_a_warning(
    state_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    state = state_class({"good": {"type": int}, "bad": {"type": object}}, {"good": 1, "bad": datetime(2024, 1, 1)})
    with caplog.at_level(logging.WARNING):
        data = state.to_dict()
    assert data["data"]["serialized_data"] == {"good": 1}
    assert "bad" not in data["data"]["serialization_schema"]["properties"]
    assert "bad" in data["schema"]
    assert "Failed to serialize the 'bad' field of the agent's State data" in caplog.text
    assert State.from_dict(data).data == {"good": 1}


class Opaque:
    """A value no checkpoint can encode."""


def test_a_durable_thread_still_refuses_a_value_it_cannot_store(caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(
        chat_generator=scripted("hi"), state_schema={"thing": {"type": Opaque}}, checkpointer=InMemoryCheckpointer()
    )
    with pytest.raises(CodecError, match="'thing'"):
        agent.run(messages=user(), thread_id="t", thing=Opaque())
    with pytest.raises(ThreadNotFoundError):
        agent.get_state("t")  # nothing was written
    with caplog.at_level(logging.WARNING):  # while to_dict leaves the value out
        assert State({"thing": {"type": Opaque}}, {"thing": Opaque()}).to_dict()["data"]["serialized_data"] == {}


# --- 6. run(enable_streaming_callback_passthrough=...) ---------------------------------------------------------------


def test_run_accepts_enable_streaming_callback_passthrough(agent_class: Any) -> None:
    """haystack-ai's Agent takes it into ``**kwargs`` (and ignores it); ours applies it to the run."""
    agent = agent_class(chat_generator=scripted("hi"), tools=[save])
    assert agent.run(messages=user(), enable_streaming_callback_passthrough=True)["last_message"].text == "hi"


@pytest.mark.parametrize("is_async", [False, True], ids=["run", "run_async"])
def test_the_run_setting_overrides_the_agents(is_async: bool) -> None:
    for configured, per_run in ((False, True), (True, False), (True, None)):
        chunks: list[StreamingChunk] = []
        agent = Agent(
            chat_generator=scripted(call("narrate", topic="tea"), "done"),
            tools=[narrate],
            tool_streaming_callback_passthrough=configured,
        )
        kwargs = {"enable_streaming_callback_passthrough": per_run}
        if is_async:  # a sync callback (haystack warns): the sync tool calls it as it is
            asyncio.run(agent.run_async(messages=user(), streaming_callback=chunks.append, **kwargs))
        else:
            agent.run(messages=user(), streaming_callback=chunks.append, **kwargs)
        expected = configured if per_run is None else per_run
        assert ("narrating tea" in [chunk.content for chunk in chunks]) is expected


def test_the_tool_invoker_takes_it_per_run_too() -> None:
    calls = tool_calls(ToolCall(tool_name="narrate", arguments={"topic": "tea"}))
    for configured, per_run in ((False, True), (True, False), (True, None)):
        chunks: list[StreamingChunk] = []
        invoker = ToolInvoker(
            tools=[narrate], streaming_callback=chunks.append, enable_streaming_callback_passthrough=configured
        )
        invoker.run(messages=calls, enable_streaming_callback_passthrough=per_run)
        expected = configured if per_run is None else per_run
        assert ("narrating tea" in [chunk.content for chunk in chunks]) is expected


# --- 7. ToolInvoker(convert_result_to_json_string=...) ---------------------------------------------------------------

VALUES: list[Any] = [
    "hello",
    42,
    True,
    None,
    [1, 2, 3],
    {"key": "value"},
    "Hello 🌍",
    Document(id="d", content="text"),
]


@our_tool
def give(index: int) -> Any:
    """Return one of the test values."""
    return VALUES[index]


def rendered(invoker: ToolInvoker) -> list[str]:
    calls = tool_calls(*(ToolCall(tool_name="give", arguments={"index": i}) for i in range(len(VALUES))))
    return [message.tool_call_result.result for message in invoker.run(messages=calls)["tool_messages"]]


def test_results_are_converted_with_json_dumps_or_str_as_haystacks_tool_invoker_does() -> None:
    as_json = rendered(ToolInvoker(tools=[give], convert_result_to_json_string=True))
    assert as_json[:7] == ['"hello"', "42", "true", "null", "[1, 2, 3]", '{"key": "value"}', '"Hello 🌍"']
    assert '"content": "text"' in as_json[7]
    as_str = rendered(ToolInvoker(tools=[give], convert_result_to_json_string=False))
    assert as_str[:7] == ["hello", "42", "True", "None", "[1, 2, 3]", "{'key': 'value'}", "Hello 🌍"]
    assert "'content': 'text'" in as_str[7]  # converted with to_dict first, as haystack-ai does
    default = rendered(ToolInvoker(tools=[give]))  # haystack-ai's Agent's rule: strings as they are, others as JSON
    assert default[:7] == ["hello", "42", "true", "null", "[1, 2, 3]", '{"key": "value"}', "Hello 🌍"]


def test_convert_result_to_json_string_is_serialized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", "haystack_state,compat")
    for value in (None, True, False):
        data = ToolInvoker(tools=[give], convert_result_to_json_string=value).to_dict()
        assert data["init_parameters"]["convert_result_to_json_string"] is value
        restored = ToolInvoker.from_dict(data)
        assert restored.convert_result_to_json_string is value
        assert rendered(restored)[0] == ('"hello"' if value else "hello")
    data = ToolInvoker(tools=[give]).to_dict()
    del data["init_parameters"]["convert_result_to_json_string"]  # written before the parameter existed
    assert ToolInvoker.from_dict(data).convert_result_to_json_string is None
