"""
haystack-ai 3.4's documented Agent behaviours (``test/components/agents/test_agent.py``,
``test_agent_user_prompt.py``), re-expressed so that each test body runs against haystack-ai's ``Agent`` and ours
(the import line a user changes): construction checks, Jinja prompts, per-run ``generation_kwargs``/``tools``, tool
streaming passthrough, ``tool_call_counts``, ``clone()``, exit conditions, ``max_agent_steps``, streaming,
``run_async``, serialization, the Agent as a ``ComponentTool`` and in a ``Pipeline``. The model is
``ScriptedChatGenerator``, or ``OpenAIChatGenerator`` against the local fake OpenAI server; nothing of ours is
mocked. Deliberate differences are tested on both sides and named in the test's docstring.
"""

import asyncio
import copy
from typing import Annotated, Any

import pytest
from fake_openai import FakeOpenAIServer
from haystack import Pipeline, component
from haystack.components.agents import Agent as HaystackAgent
from haystack.components.agents.state import State as HaystackState
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Toolset, tool
from haystack.tools.errors import ToolInvocationError
from haystack.utils import Secret

from compat.agent_helpers import (
    AGENT_CLASSES,
    OUR_EXTRA_INPUTS,
    OUR_EXTRA_OUTPUTS,
    broken,
    call,
    common,
    final_answer,
    run_both,
    save,
    scripted,
    texts,
    user,
)
from compat.agent_helpers import agent_class as agent_class  # fixtures
from compat.agent_helpers import trusted_here as trusted_here
from haystack_state import Agent, AgentRunError, State
from haystack_state import tool as our_tool
from haystack_state.testing import ScriptedChatGenerator
from haystack_state.tools import ComponentTool

NOTES = {"notes": {"type": list[str]}}


@component
class NoToolsGenerator:
    """A chat generator whose run takes no tools."""

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        return {"replies": [ChatMessage.from_assistant("plain")]}


# --- construction ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "step_count",
        "token_usage",
        "tool_call_counts",
        "exit_reason",
        "continue_run",
        "stop_run",
        "tools",
        "hook_context",
        "context_tokens",
    ],
)
def test_reserved_state_keys_are_refused(agent_class: Any, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        agent_class(chat_generator=scripted("x"), state_schema={key: {"type": int}})


def test_a_schema_entry_without_a_type_is_refused(agent_class: Any) -> None:
    with pytest.raises(ValueError, match="notes"):
        agent_class(chat_generator=scripted("x"), state_schema={"notes": {"handler": lambda a, b: b}})


def test_tools_for_a_generator_without_tool_support_are_a_type_error(agent_class: Any) -> None:
    with pytest.raises(TypeError, match="NoToolsGenerator"):
        agent_class(chat_generator=NoToolsGenerator(), tools=[save])
    assert agent_class(chat_generator=NoToolsGenerator(), tools=[]).run(messages=user())["last_message"].text == "plain"


def test_a_tool_concurrency_limit_below_one_is_refused(agent_class: Any) -> None:
    with pytest.raises(ValueError, match="tool_concurrency_limit"):
        agent_class(chat_generator=scripted("x"), tool_concurrency_limit=0)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"user_prompt": "Hi {{ notes }}", "state_schema": NOTES}, "notes"),
        ({"system_prompt": "Use {{ tools }}"}, "tools"),
        ({"user_prompt": "{{ generation_kwargs }}"}, "generation_kwargs"),
        (
            {"user_prompt": '{% message role="user" %}a{% endmessage %}{% message role="user" %}b{% endmessage %}'},
            "one",
        ),
        ({"user_prompt": '{% message role="system" %}a{% endmessage %}'}, "role 'user'"),
        ({"system_prompt": '{% message role="user" %}a{% endmessage %}'}, "role 'system'"),
    ],
)
def test_prompts_clashing_or_malformed_are_refused(agent_class: Any, settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        agent_class(chat_generator=scripted("x"), **settings)


def test_required_variables_without_template_variables_is_a_warning(
    agent_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    agent_class(chat_generator=scripted("x"), user_prompt="no variables", required_variables=["x"])
    assert "required_variables" in caplog.text


def test_an_exit_condition_naming_no_tool_is_accepted_and_a_runtime_tool_can_meet_it(
    agent_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    agent = agent_class(chat_generator=scripted(call("final_answer", answer="42")), exit_conditions=["final_answer"])
    result = agent.run(messages=user(), tools=[final_answer])
    assert result["exit_reason"] == "final_answer"
    if agent_class is Agent:  # ours says so when it is built
        assert "exit_conditions ['final_answer'] name no tool of this agent" in caplog.text


class LazyToolset(Toolset):
    """A toolset that loads its tools in warm_up(), as haystack's MCPToolset does."""

    def __init__(self) -> None:
        super().__init__(tools=[])
        self.warmed = False

    def warm_up(self) -> None:
        if not self.warmed:
            self.tools = [final_answer, save]
            self.warmed = True


def test_an_exit_condition_of_a_lazy_toolset_is_checked_after_warm_up(
    agent_class: Any, caplog: pytest.LogCaptureFixture
) -> None:
    agent = agent_class(
        chat_generator=scripted(call("save", content="x"), call("final_answer", answer="42")),
        tools=LazyToolset(),
        exit_conditions=["final_answer"],
    )
    result = agent.run(messages=user())
    assert (result["exit_reason"], result["tool_call_counts"]) == ("final_answer", {"final_answer": 1, "save": 1})
    assert "name no tool" not in caplog.text


def test_an_exit_condition_no_lazy_tool_provides_is_a_warning_after_warm_up(caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(chat_generator=scripted("x"), tools=LazyToolset(), exit_conditions=["missing"])
    assert "name no tool" not in caplog.text  # not known yet
    agent.warm_up()
    assert "exit_conditions ['missing'] name no tool of this agent (its tools: final_answer, save)" in caplog.text


def test_max_agent_steps_zero_runs_no_step_in_haystack_and_is_refused_here() -> None:
    """Deliberate difference: an agent that may not call its model is a mistake, reported when it is built."""
    model = scripted("x")
    result = HaystackAgent(chat_generator=model, max_agent_steps=0).run(messages=user())
    assert (result["exit_reason"], model.call_count) == ("max_agent_steps", 0)
    with pytest.raises(ValueError, match="max_agent_steps"):
        Agent(chat_generator=model, max_agent_steps=0)


# --- outputs ---------------------------------------------------------------------------------------------------------


def test_outputs_match_and_leave_out_keys_nothing_set() -> None:
    def build(cls: Any) -> Any:
        return cls(
            chat_generator=scripted(call("save", content="x"), "done"),
            tools=[save, final_answer],
            state_schema={"notes": {"type": list[str]}, "topic": {"type": str}},
        )

    haystack, ours = run_both(build, user(), topic="tea")
    assert set(ours) == set(haystack) | OUR_EXTRA_OUTPUTS
    assert "notes" not in ours and ours["topic"] == haystack["topic"] == "tea"
    assert common(ours)["tool_call_counts"] == haystack["tool_call_counts"] == {"save": 1, "final_answer": 0}
    assert ours["token_usage"] == haystack["token_usage"]
    assert (ours["step_count"], ours["exit_reason"]) == (haystack["step_count"], haystack["exit_reason"]) == (2, "text")
    assert texts(ours["messages"]) == texts(haystack["messages"])
    assert ours["last_message"].text == haystack["last_message"].text == "done"


def test_the_component_declares_the_same_inputs_and_outputs_and_ours_adds_its_own() -> None:
    sockets = []
    for cls in AGENT_CLASSES:
        agent = cls(chat_generator=scripted("x"), state_schema=NOTES, user_prompt="Tell {{ who }}")
        pipeline = Pipeline()
        pipeline.add_component("agent", agent)
        inputs = pipeline.inputs(include_components_with_connected_inputs=True)["agent"]
        sockets.append(({k: v["is_mandatory"] for k, v in inputs.items()}, set(pipeline.outputs()["agent"])))
    (haystack_inputs, haystack_outputs), (our_inputs, our_outputs) = sockets
    assert {k: our_inputs[k] for k in haystack_inputs} == haystack_inputs
    assert {"thread_id", "checkpoint_id"} <= set(our_inputs) - set(haystack_inputs) <= OUR_EXTRA_INPUTS
    assert haystack_inputs["who"] is True and haystack_inputs["notes"] is False
    assert our_outputs == haystack_outputs | OUR_EXTRA_OUTPUTS


# --- prompts ---------------------------------------------------------------------------------------------------------


def test_user_and_system_prompts_are_jinja_templates_rendered_from_run_arguments(agent_class: Any) -> None:
    model = scripted("ok")
    agent = agent_class(
        chat_generator=model,
        system_prompt="You answer in {{ language }}.",
        user_prompt='{% message role="user" %}Translate: {{ document }}{% endmessage %}',
    )
    result = agent.run(messages=[], language="French", document="good morning")
    assert [(m.role.value, m.text) for m in model.calls[0].messages] == [
        ("system", "You answer in French."),
        ("user", "Translate: good morning"),
    ]
    assert [m.text for m in result["messages"]] == ["You answer in French.", "Translate: good morning", "ok"]


def test_the_user_prompt_is_appended_to_the_given_messages(agent_class: Any) -> None:
    model = scripted("ok")
    agent = agent_class(chat_generator=model, user_prompt="and {{ more }}")
    agent.run(messages=user("first"), more="second")
    assert [m.text for m in model.calls[0].messages] == ["first", "and second"]


def test_a_missing_required_variable_is_an_error_before_the_model_is_called(agent_class: Any) -> None:
    model = scripted("ok")
    agent = agent_class(chat_generator=model, user_prompt="{{ a }} and {{ b }}", required_variables=["a"])
    with pytest.raises(ValueError, match="a"):
        agent.run(messages=[], b="x")
    assert model.call_count == 0
    agent.run(messages=[], a="x")
    assert model.calls[0].messages[0].text == "x and"  # ChatPromptBuilder strips the rendered text


def test_required_variables_none_renders_missing_ones_empty(agent_class: Any) -> None:
    model = scripted("ok")
    agent_class(chat_generator=model, system_prompt="Hi {{ name }}!", required_variables=None).run(messages=user())
    assert model.calls[0].messages[0].text == "Hi !"


# --- per-run options -------------------------------------------------------------------------------------------------


def test_per_run_generation_kwargs_reach_the_generator(agent_class: Any) -> None:
    model = scripted(call("save", content="x"), "done")
    agent_class(chat_generator=model, tools=[save]).run(messages=user(), generation_kwargs={"temperature": 0.1})
    assert [c.generation_kwargs for c in model.calls] == [{"temperature": 0.1}] * 2


@pytest.mark.slow
def test_per_run_generation_kwargs_merge_with_the_generators_own_over_http(agent_class: Any) -> None:
    with FakeOpenAIServer(script=["one"]) as server:
        generator = OpenAIChatGenerator(
            api_key=Secret.from_token("test"),
            api_base_url=server.base_url,
            model="gpt-4o-mini",
            generation_kwargs={"temperature": 0.5, "max_completion_tokens": 20},
        )
        result = agent_class(chat_generator=generator).run(messages=user(), generation_kwargs={"temperature": 0.1})
        body = server.bodies[-1]
    assert result["last_message"].text == "one"
    assert (body["temperature"], body["max_completion_tokens"]) == (0.1, 20)


def test_per_run_tools_by_name_or_object(agent_class: Any) -> None:
    model = scripted("a", "b")
    agent = agent_class(chat_generator=model, tools=[save, final_answer])
    agent.run(messages=user(), tools=["final_answer"])
    agent.run(messages=user(), tools=[broken])
    assert [c.tool_names for c in model.calls] == [["final_answer"], ["broken"]]
    with pytest.raises(ValueError, match="nope"):
        agent.run(messages=user(), tools=["nope"])


def test_tool_call_counts_list_every_tool_of_the_run(agent_class: Any) -> None:
    model = scripted(call("save", content="x"), call("save", content="y"), "done")
    result = agent_class(chat_generator=model, tools=[save, final_answer]).run(messages=user())
    assert result["tool_call_counts"] == {"save": 2, "final_answer": 0}


@tool
def narrate(topic: Annotated[str, "what to narrate"], streaming_callback: Any = None) -> str:
    """Narrate a topic, streaming as it goes."""
    if streaming_callback is not None:
        streaming_callback(StreamingChunk(content=f"narrating {topic}"))
    return f"told {topic}"


def test_tool_streaming_callback_passthrough(agent_class: Any) -> None:
    for passthrough in (False, True):
        chunks: list[StreamingChunk] = []
        agent = agent_class(
            chat_generator=scripted(call("narrate", topic="tea"), "done"),
            tools=[narrate],
            streaming_callback=chunks.append,
            tool_streaming_callback_passthrough=passthrough,
        )
        result = agent.run(messages=user())
        assert ("narrating tea" in [c.content for c in chunks]) is passthrough
        assert "told tea" in texts(result["messages"])


def test_clone_keeps_the_configuration_and_applies_overrides(agent_class: Any) -> None:
    agent = agent_class(
        chat_generator=scripted("a"), tools=[save], system_prompt="Be brief.", state_schema=NOTES, max_agent_steps=7
    )
    clone = agent.clone(system_prompt="Be thorough.")
    assert type(clone) is agent_class
    assert (clone.system_prompt, clone.max_agent_steps, clone.tools) == ("Be thorough.", 7, [save])
    assert clone.state_schema == agent.state_schema and agent.system_prompt == "Be brief."


# --- exits -----------------------------------------------------------------------------------------------------------


def test_a_successful_exit_tool_ends_the_run_and_an_errored_one_does_not(agent_class: Any) -> None:
    model = scripted(call("final_answer", answer="42"))
    result = agent_class(chat_generator=model, tools=[final_answer], exit_conditions=["final_answer"]).run(
        messages=user()
    )
    assert (result["exit_reason"], result["step_count"]) == ("final_answer", 1)
    model = scripted(call("broken", reason="x"), "done")
    result = agent_class(chat_generator=model, tools=[broken], exit_conditions=["broken"]).run(messages=user())
    assert (result["exit_reason"], result["step_count"]) == ("text", 2)


def test_a_text_reply_ends_the_run_even_without_the_text_condition(agent_class: Any) -> None:
    result = agent_class(chat_generator=scripted("done"), tools=[save], exit_conditions=["save"]).run(messages=user())
    assert result["exit_reason"] == "text"


def test_an_incomplete_reply_ends_the_run_with_its_finish_reason(agent_class: Any) -> None:
    cut = ChatMessage.from_assistant("partial", meta={"finish_reason": "length"})
    result = agent_class(chat_generator=scripted(cut), tools=[save]).run(messages=user())
    assert result["exit_reason"] == "length"


def test_an_empty_reply_does_not_end_a_run_with_tools(agent_class: Any) -> None:
    model = scripted(ChatMessage.from_assistant(""), "done")
    result = agent_class(chat_generator=model, tools=[save]).run(messages=user())
    assert (model.call_count, result["exit_reason"], result["step_count"]) == (2, "text", 2)


def test_max_agent_steps_stops_after_the_last_steps_tools(agent_class: Any, caplog: pytest.LogCaptureFixture) -> None:
    model = scripted(*[call("save", content=str(i)) for i in range(3)])
    result = agent_class(chat_generator=model, tools=[save], max_agent_steps=3).run(messages=user())
    assert (result["exit_reason"], result["step_count"], result["tool_call_counts"]) == (
        "max_agent_steps",
        3,
        {"save": 3},
    )
    assert result["last_message"].tool_call_result is not None
    assert "maximum" in caplog.text


@pytest.mark.parametrize(
    "cls",
    [HaystackAgent, Agent],
    ids=["haystack", "ours"],
)
def test_a_failing_tool_with_raise_on_failure_raises_haystacks_error(cls: Any) -> None:
    agent = cls(
        chat_generator=scripted(call("broken", reason="x")), tools=[broken], raise_on_tool_invocation_failure=True
    )
    with pytest.raises(ToolInvocationError):
        agent.run(messages=user())


def test_a_failing_generator_raises_the_cause_in_haystack_and_an_agent_run_error_here() -> None:
    """Deliberate difference: our AgentRunError names the step and carries the partial State; the cause is chained."""
    empty = ScriptedChatGenerator(script=[])
    with pytest.raises(RuntimeError, match="exhausted"):
        HaystackAgent(chat_generator=empty).run(messages=user())
    with pytest.raises(AgentRunError, match="step 1") as caught:
        Agent(chat_generator=empty).run(user())
    assert "exhausted" in str(caught.value.__cause__)
    assert [m.text for m in caught.value.state.get("messages")] == ["hi"]


def test_unknown_run_inputs_are_ignored_in_haystack_and_an_error_here() -> None:
    """Deliberate difference: a misspelt input is a mistake said at once, not a value silently dropped."""
    assert HaystackAgent(chat_generator=scripted("a")).run(messages=user(), topik="tea")["exit_reason"] == "text"
    with pytest.raises(ValueError, match="topik"):
        Agent(chat_generator=scripted("a")).run(user(), topik="tea")


# --- streaming and async ---------------------------------------------------------------------------------------------


def test_streaming_delivers_the_same_chunks(agent_class: Any) -> None:
    streams = []
    for cls in AGENT_CLASSES:
        chunks: list[StreamingChunk] = []
        cls(chat_generator=scripted(call("save", content="x"), "all done"), tools=[save]).run(
            messages=user(), streaming_callback=chunks.append
        )
        streams.append([(c.content, bool(c.tool_calls), c.tool_call_result is not None) for c in chunks])
    assert streams[0] == streams[1]
    assert any(result for _, _, result in streams[1]) and "".join(c for c, _, _ in streams[1]).endswith("all done")


def test_run_async_gives_the_same_outputs_as_run(agent_class: Any) -> None:
    def build() -> Any:
        return agent_class(chat_generator=scripted(call("save", content="x"), "done"), tools=[save], state_schema=NOTES)

    sync = build().run(messages=user())
    chunks: list[StreamingChunk] = []

    async def collect(chunk: StreamingChunk) -> None:
        chunks.append(chunk)

    concurrent = asyncio.run(build().run_async(messages=user(), streaming_callback=collect))
    assert texts(concurrent["messages"]) == texts(sync["messages"])
    assert common(concurrent).keys() == common(sync).keys()
    assert concurrent["tool_call_counts"] == sync["tool_call_counts"] and chunks


# --- serialization ---------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("trusted_here")
def test_to_dict_round_trips_and_haystacks_dict_loads_into_ours_by_changing_the_type(agent_class: Any) -> None:
    agent = agent_class(
        chat_generator=scripted("a"),
        tools=[save],
        system_prompt="Be {{ tone }}.",
        exit_conditions=["text", "save"],
        state_schema=NOTES,
        max_agent_steps=9,
        tool_streaming_callback_passthrough=True,
    )
    data = agent.to_dict()
    rebuilt = agent_class.from_dict(copy.deepcopy(data))  # haystack-ai's from_dict changes what it is given
    assert rebuilt.to_dict() == data
    if agent_class is HaystackAgent:
        haystack_data = data
        ours = Agent.from_dict({**haystack_data, "type": "haystack_state.agent.Agent"})
        ours_data = ours.to_dict()["init_parameters"]
        expected = haystack_data["init_parameters"]
        assert {k: ours_data[k] for k in expected if k != "state_schema"} == {
            k: v for k, v in expected.items() if k != "state_schema"
        }
        # Ours writes each key's handler, and the messages key, explicitly.
        assert {k: ours_data["state_schema"][k]["type"] for k in expected["state_schema"]} == {"notes": "list[str]"}
        assert ours.run(user(), tone="kind")["exit_reason"] == "text"


# --- the Agent as a tool, in a Pipeline -----------------------------------------------------------------------------


def shape(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter schema without its descriptions (ours document their run parameters in their own words)."""
    if isinstance(schema, dict):
        return {k: shape(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [shape(v) for v in schema]
    return schema


@pytest.mark.slow
def test_an_agent_as_a_component_tool_shows_the_same_parameters_without_thread_inputs() -> None:
    schemas = [
        ComponentTool(cls(chat_generator=scripted("x"), state_schema=NOTES), name="sub", description="d").parameters
        for cls in AGENT_CLASSES
    ]
    haystack_schema = HaystackComponentTool(
        HaystackAgent(chat_generator=scripted("x"), state_schema=NOTES), name="sub", description="d"
    ).parameters
    assert schemas[0] == haystack_schema
    assert shape(schemas[1]) == shape(haystack_schema)
    assert "thread_id" not in schemas[1]["properties"] and "checkpoint_id" not in schemas[1]["properties"]


@pytest.mark.slow
def test_haystacks_component_tool_shows_our_agents_thread_inputs() -> None:
    """A known limit: haystack-ai's ComponentTool cannot be told to hide inputs; use ours for an Agent (README)."""
    made = HaystackComponentTool(Agent(chat_generator=scripted("x")), name="sub", description="d")
    assert {"thread_id", "checkpoint_id"} <= set(made.parameters["properties"])


def test_an_agent_runs_as_a_sub_agent_tool(agent_class: Any) -> None:
    inner_model = scripted("inner answer")
    inner = agent_class(chat_generator=inner_model)
    sub = ComponentTool(
        inner, name="researcher", description="Research a question.", outputs_to_string={"source": "last_message"}
    )
    question = {"messages": [{"role": "user", "content": [{"text": "what?"}]}]}
    outer_model = scripted(call("researcher", **question), "outer answer")
    result = agent_class(chat_generator=outer_model, tools=[sub]).run(messages=user())
    assert result["last_message"].text == "outer answer"
    assert inner_model.calls[0].messages[0].text == "what?"
    assert "inner answer" in str(texts(result["messages"])[2])


def test_an_agent_in_a_pipeline(agent_class: Any) -> None:
    pipeline = Pipeline()
    pipeline.add_component(
        "agent",
        agent_class(
            chat_generator=scripted(call("save", content="x"), "done"),
            tools=[save],
            state_schema=NOTES,
            user_prompt="About {{ topic }}",
        ),
    )
    outputs = pipeline.run({"agent": {"messages": [], "topic": "tea", "notes": ["seed"]}})["agent"]
    assert outputs["last_message"].text == "done"
    assert outputs["notes"] == ["seed"] and outputs["step_count"] == 2
    assert outputs["messages"][0].text == "About tea"


# --- State classes across the two agents -----------------------------------------------------------------------------


def note_with_haystack_state(text: Annotated[str, "the note"], state: HaystackState) -> str:
    """Write a note into the state."""
    state.set("notes", [text])
    return "noted"


def note_with_our_state(text: Annotated[str, "the note"], state: State) -> str:
    """Write a note into the state."""
    state.set("notes", [text])
    return "noted"


def test_a_tool_taking_haystacks_state_works_in_both_agents(agent_class: Any) -> None:
    for made in (tool(note_with_haystack_state), our_tool(note_with_haystack_state)):
        model = scripted(call(made.name, text="tea"), "done")
        result = agent_class(chat_generator=model, tools=[made], state_schema=NOTES).run(messages=user())
        assert result["notes"] == ["tea"]


def test_a_tool_taking_our_state_gets_the_state_in_haystacks_agent() -> None:
    """haystack-ai's State check (an identity test) recognises our State once haystack_state is imported."""
    for made in (tool(note_with_our_state), our_tool(note_with_our_state)):
        assert "state" not in made.parameters["properties"]
        model = scripted(call(made.name, text="tea"), "done")
        result = HaystackAgent(chat_generator=model, tools=[made], state_schema=NOTES).run(messages=user())
        assert result["notes"] == ["tea"]
        model = scripted(call(made.name, text="tea"), "done")
        assert Agent(chat_generator=model, tools=[made], state_schema=NOTES).run(user())["notes"] == ["tea"]


@pytest.mark.usefixtures("trusted_here")
def test_a_pipeline_yaml_for_haystacks_agent_loads_into_ours_by_changing_its_type_line() -> None:
    pipeline = Pipeline()
    pipeline.add_component(
        "agent",
        HaystackAgent(
            chat_generator=scripted(call("save", content="x"), "done"),
            tools=[save],
            state_schema=NOTES,
            user_prompt="About {{ topic }}",
            exit_conditions=["text"],
        ),
    )
    text = pipeline.dumps()
    assert text.count("type: haystack.components.agents.agent.Agent") == 1
    loaded = Pipeline.loads(text.replace("haystack.components.agents.agent.Agent", "haystack_state.agent.Agent"))
    agent = loaded.get_component("agent")
    assert isinstance(agent, Agent)
    outputs = loaded.run({"agent": {"messages": [], "topic": "tea"}})["agent"]
    assert (outputs["last_message"].text, outputs["tool_call_counts"]) == ("done", {"save": 1})
