"""haystack_state.Agent as a Haystack component: in a Pipeline, fed through its state sockets, and serialised."""

import asyncio
from typing import Any

import pytest
import yaml
from haystack import Pipeline, component
from haystack.core.errors import PipelineConnectError
from haystack.dataclasses import ChatMessage, Document

from haystack_state import Agent, State, tool, unique
from haystack_state.testing import ScriptedChatGenerator


@tool(inputs_from_state={"user_name": "user"}, outputs_to_state={"documents": {"source": "documents"}})
def search(query: str, user: str) -> dict[str, Any]:
    """Search the knowledge base for the user."""
    return {"documents": [Document(content=f"{query} for {user}")]}


@tool(outputs_to_state={"tags": {"source": "tags"}})
def tag(labels: list[str]) -> dict[str, list[str]]:
    """Tag the conversation."""
    return {"tags": labels}


@tool
def finish(answer: str) -> str:
    """Give the final answer."""
    return answer


def count_llm_calls(state: State) -> None:
    """A module-level hook (so it serialises): counts the model calls in the state."""
    state.set("llm_calls", (state.get("llm_calls") or 0) + 1)


SCHEMA: dict[str, Any] = {
    "user_name": {"type": str},
    "documents": {"type": list[Document]},
    "tags": {"type": list[str], "handler": unique},
    "llm_calls": {"type": int},
}
SCRIPT: list[Any] = [
    [("search", {"query": "python"}), ("tag", {"labels": ["code", "python"]})],
    [("tag", {"labels": ["python", "docs"]})],
    [("finish", {"answer": "Found it."})],
]


def make_agent(**kwargs: Any) -> Agent:
    kwargs.setdefault("tools", [search, tag, finish])
    kwargs.setdefault("state_schema", SCHEMA)
    return Agent(chat_generator=ScriptedChatGenerator(script=SCRIPT), **kwargs)


@component
class UserLookup:
    """Finds the user's name from an id."""

    @component.output_types(user_name=str, user_id_length=int)
    def run(self, user_id: str) -> dict[str, Any]:
        return {"user_name": {"u1": "Alice", "u2": "Bob"}[user_id], "user_id_length": len(user_id)}


@component
class Librarian:
    """Reads what the agent found."""

    @component.output_types(titles=list[str], reason=str)
    def run(self, documents: list[Document], exit_reason: str) -> dict[str, Any]:
        return {"titles": [d.content for d in documents], "reason": exit_reason}


def build_pipeline(agent: Agent) -> Pipeline:
    pipeline = Pipeline()
    pipeline.add_component("lookup", UserLookup())
    pipeline.add_component("agent", agent)
    pipeline.add_component("librarian", Librarian())
    pipeline.connect("lookup.user_name", "agent.user_name")
    pipeline.connect("agent.documents", "librarian.documents")
    pipeline.connect("agent.exit_reason", "librarian.exit_reason")
    return pipeline


def pipeline_inputs(user_id: str = "u1") -> dict[str, Any]:
    return {"lookup": {"user_id": user_id}, "agent": {"messages": [ChatMessage.from_user("Find Python docs")]}}


def test_a_pipeline_feeds_a_state_input_socket_and_reads_the_state_outputs() -> None:
    pipeline = build_pipeline(make_agent(exit_conditions=["finish"]))
    result = pipeline.run(pipeline_inputs("u2"), include_outputs_from={"agent"})

    assert result["librarian"] == {"titles": ["python for Bob"], "reason": "finish"}
    agent_out = result["agent"]
    assert agent_out["user_name"] == "Bob"
    assert agent_out["tags"] == ["code", "python", "docs"]
    assert agent_out["step_count"] == 3
    assert agent_out["last_message"].tool_call_result.result == "Found it."


def test_the_state_sockets_are_optional_pipeline_inputs() -> None:
    pipeline = Pipeline()
    pipeline.add_component("agent", make_agent(exit_conditions=["finish"]))
    inputs = pipeline.inputs()["agent"]
    assert inputs["messages"]["is_mandatory"] is True
    assert {key: inputs[key]["is_mandatory"] for key in SCHEMA} == dict.fromkeys(SCHEMA, False)
    assert inputs["documents"]["type"] == list[Document]

    result = pipeline.run({"agent": {"messages": [ChatMessage.from_user("hi")], "user_name": "Carol"}})
    assert [d.content for d in result["agent"]["documents"]] == ["python for Carol"]


def test_a_state_socket_is_typed() -> None:
    pipeline = Pipeline()
    pipeline.add_component("lookup", UserLookup())
    pipeline.add_component("agent", make_agent())
    with pytest.raises(PipelineConnectError, match="user_id_length"):
        pipeline.connect("lookup.user_id_length", "agent.user_name")


def test_pipeline_yaml_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    original = build_pipeline(
        make_agent(
            exit_conditions=["finish"],
            system_prompt="Use the tools.",
            max_agent_steps=7,
            tool_concurrency_limit=2,
            raise_on_tool_invocation_failure=True,
            hooks={"before_llm": count_llm_calls},
        )
    )
    text = original.dumps()

    params = yaml.safe_load(text)["components"]["agent"]["init_parameters"]
    assert params["state_schema"]["tags"] == {"type": "list[str]", "handler": "haystack_state.handlers.unique"}
    assert params["hooks"] == {"before_llm": [f"{__name__}.count_llm_calls"]}
    assert [t["data"]["name"] for t in params["tools"]] == ["search", "tag", "finish"]
    assert params["chat_generator"]["type"] == "haystack_state.testing.ScriptedChatGenerator"

    restored = Pipeline.loads(text)
    assert yaml.safe_load(restored.dumps())["components"] == yaml.safe_load(text)["components"]
    agent = restored.get_component("agent")
    assert isinstance(agent, Agent)
    assert (agent.max_agent_steps, agent.tool_concurrency_limit, agent.system_prompt) == (7, 2, "Use the tools.")
    assert agent.raise_on_tool_invocation_failure is True
    assert agent.hooks == {"before_llm": [count_llm_calls]}

    expected = original.run(pipeline_inputs(), include_outputs_from={"agent"})
    got = restored.run(pipeline_inputs(), include_outputs_from={"agent"})
    assert got["librarian"] == expected["librarian"] == {"titles": ["python for Alice"], "reason": "finish"}
    for key in ("user_name", "documents", "tags", "llm_calls", "step_count", "exit_reason", "token_usage"):
        assert got["agent"][key] == expected["agent"][key], key
    assert got["agent"]["llm_calls"] == 3
    assert got["agent"]["messages"][0].text == "Use the tools."


def test_to_dict_and_from_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    agent = make_agent(hooks={"after_tool": [count_llm_calls, count_llm_calls]}, exit_conditions=["text", "finish"])
    data = agent.to_dict()
    assert data["type"] == "haystack_state.agent.Agent"
    restored = Agent.from_dict(data)
    assert restored.to_dict() == data == agent.to_dict()  # from_dict left its input as it was
    assert Agent.from_dict(data).to_dict() == data
    assert restored.exit_conditions == ["text", "finish"]
    assert restored.hooks == {"after_tool": [count_llm_calls, count_llm_calls]}
    assert restored.run([ChatMessage.from_user("go")], user_name="Dan")["llm_calls"] == 6


def test_defaults_serialise_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    params = Agent(chat_generator=ScriptedChatGenerator(script=["hi"])).to_dict()["init_parameters"]
    assert (params["state_schema"], params["hooks"], params["streaming_callback"]) == (None, None, None)
    assert params["tools"] == []
    restored = Agent.from_dict(Agent(chat_generator=ScriptedChatGenerator(script=["hi"])).to_dict())
    assert restored.run([ChatMessage.from_user("hello")])["last_message"].text == "hi"


def test_from_dict_rejects_an_unknown_hook_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    data = make_agent(hooks={"before_llm": count_llm_calls}).to_dict()
    data["init_parameters"]["hooks"] = {"before_lm": [f"{__name__}.count_llm_calls"]}
    with pytest.raises(ValueError, match="Invalid hook point 'before_lm'"):
        Agent.from_dict(data)


def test_pipeline_run_async_runs_the_agent_asynchronously() -> None:
    pipeline = Pipeline()
    pipeline.add_component("lookup", UserLookup())
    pipeline.add_component("agent", make_agent(exit_conditions=["finish"]))
    pipeline.connect("lookup.user_name", "agent.user_name")
    result = asyncio.run(pipeline.run_async(pipeline_inputs("u1")))
    assert [d.content for d in result["agent"]["documents"]] == ["python for Alice"]
    assert result["agent"]["exit_reason"] == "finish"


@component
class ColdGenerator:
    """A generator that only answers once warmed up."""

    def __init__(self) -> None:
        self.warm = False

    def warm_up(self) -> None:
        self.warm = True

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
        return {"replies": [ChatMessage.from_assistant("warm" if self.warm else "cold")]}


def test_the_pipeline_warms_up_the_agents_generator() -> None:
    generator = ColdGenerator()
    pipeline = Pipeline()
    pipeline.add_component(
        "agent", Agent(chat_generator=generator, tools=[tag], state_schema={"tags": {"type": list[str]}})
    )
    pipeline.warm_up()
    assert generator.warm
    result = pipeline.run({"agent": {"messages": [ChatMessage.from_user("hi")]}})
    assert result["agent"]["last_message"].text == "warm"
