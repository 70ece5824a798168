"""
haystack_state.Agent driving haystack-ai's real ``OpenAIChatGenerator`` over HTTP, against the local
``FakeOpenAIServer`` (127.0.0.1, no network). The assertions read the request bodies the model would have received.
"""

import asyncio
import json
from collections.abc import Iterator
from typing import Annotated, Any

import openai
import pytest
from fake_openai import FakeOpenAIServer, HTTPErrorReply
from haystack import component
from haystack.components.agents import State as HaystackState
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage, Document, StreamingChunk
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Tool
from haystack.tools import tool as haystack_tool
from haystack.utils import Secret

from haystack_state import Agent, AgentRunError, ComponentTool, State, tool


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    """Agents made by a test; closing them closes their generators' HTTP clients."""
    made: list[Agent] = []
    yield made
    for agent in made:
        agent.close()


def openai_agent(server: FakeOpenAIServer, made: list[Agent], generation_kwargs: Any = None, **kwargs: Any) -> Agent:
    generator = OpenAIChatGenerator(
        api_key=Secret.from_token("test"),
        api_base_url=server.base_url,
        model="gpt-4o-mini",
        timeout=10,
        generation_kwargs=generation_kwargs,
    )
    agent = Agent(chat_generator=generator, **kwargs)
    made.append(agent)
    return agent


# --- tools with hidden parameters, of every kind --------------------------------------------------------


@tool(inputs_from_state={"user_name": "user"}, outputs_to_state={"greetings": {}})
def greet(name: Annotated[str, "Who to greet"], user: str, state: State) -> str:
    """Greet someone on behalf of the user."""
    state.set("log", [f"greet {name}"])
    return f"{user} greets {name}"


@haystack_tool(inputs_from_state={"user_name": "user_context"}, outputs_to_state={"documents": {"source": "docs"}})
def search(query: Annotated[str, "The search query"], user_context: str) -> dict:
    """Search documents using query and user context."""
    return {"docs": [f"{query} for {user_context}"]}


@component
class Notes:
    """Write a note into the state."""

    @component.output_types(reply=str)
    def run(self, text: str, state: State, author: str = "?") -> dict[str, str]:
        """
        Write a note.

        :param text: The note.
        :param author: Who writes it.
        """
        state.set("log", [f"{author}: {text}"])
        return {"reply": "noted"}


@component
class Shelf:
    """Put a document on the shelf."""

    @component.output_types(reply=str)
    def run(self, title: str, state: HaystackState) -> dict[str, str]:
        """
        Shelve a document.

        :param title: The document's title.
        """
        state.set("shelved", [Document(content=title)])
        return {"reply": f"shelved {title}"}


def tag(label: str, user: str, state: State) -> str:
    state.set("log", [f"tag {label} by {user}"])
    return label


HAND_BUILT = Tool(
    name="tag",
    description="Tag the conversation.",
    parameters={
        "type": "object",
        "properties": {"label": {"type": "string"}, "user": {"type": "string"}, "state": {"type": "object"}},
        "required": ["label", "user", "state"],
    },
    function=tag,
    inputs_from_state={"user_name": "user"},
)

SCHEMA: dict[str, Any] = {
    "user_name": {"type": str},
    "greetings": {"type": list[str]},
    "documents": {"type": list[str]},
    "log": {"type": list[str]},
    "shelved": {"type": list[Document]},
}
HIDDEN = ("user", "user_context", "state")


def all_tools() -> list[Tool]:
    return [
        greet,
        search,
        ComponentTool(Notes(), name="note", inputs_from_state={"user_name": "author"}),
        HaystackComponentTool(Shelf(), name="shelve"),
        HAND_BUILT,
    ]


def test_the_tool_schemas_sent_to_openai_lack_every_hidden_parameter(agents: list[Agent]) -> None:
    script = [
        [
            ("greet", {"name": "Bob"}),
            ("search", {"query": "python"}),
            ("note", {"text": "hello"}),
            ("shelve", {"title": "Dune"}),
            ("tag", {"label": "urgent"}),
        ],
        "All done.",
    ]
    with FakeOpenAIServer(script=script) as server:
        agent = openai_agent(server, agents, tools=all_tools(), state_schema=SCHEMA)
        result = agent.run([ChatMessage.from_user("Do everything")], user_name="Alice")

    for body in server.bodies:
        functions = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
        assert {name: set(p["properties"]) for name, p in functions.items()} == {
            "greet": {"name"},
            "search": {"query"},
            "note": {"text"},
            "shelve": {"title"},
            "tag": {"label"},
        }
        for parameters in functions.values():
            assert not set(parameters.get("required", [])) & set(HIDDEN)
        assert functions["greet"]["properties"]["name"]["description"] == "Who to greet"
        assert functions["note"]["properties"]["text"]["description"] == "The note."

    assert result["greetings"] == ["Alice greets Bob"]
    assert result["documents"] == ["python for Alice"]
    assert result["log"] == ["greet Bob", "Alice: hello", "tag urgent by Alice"]
    assert [d.content for d in result["shelved"]] == ["Dune"]
    assert result["last_message"].text == "All done."


def test_tool_results_go_back_to_the_model_with_their_call_ids(agents: list[Agent]) -> None:
    script = [[("greet", {"name": "Bob"}), ("greet", {"name": "Carol"})], [("search", {"query": "x"})], "Done."]
    with FakeOpenAIServer(script=script) as server:
        agent = openai_agent(server, agents, tools=[greet, search], state_schema=SCHEMA, system_prompt="Be kind.")
        result = agent.run([ChatMessage.from_user("Greet them")], user_name="Alice")

    first, second, third = server.bodies
    assert first["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Greet them"},
    ]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    calls = second["messages"][2]["tool_calls"]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("call_1", "greet", {"name": "Bob"}),
        ("call_2", "greet", {"name": "Carol"}),
    ]
    assert second["messages"][3:] == [
        {"role": "tool", "content": "Alice greets Bob", "tool_call_id": "call_1"},
        {"role": "tool", "content": "Alice greets Carol", "tool_call_id": "call_2"},
    ]
    assert third["messages"][-1] == {"role": "tool", "content": '{"docs": ["x for Alice"]}', "tool_call_id": "call_3"}
    assert third["messages"][:5] == second["messages"]

    assert result["greetings"] == ["Alice greets Bob", "Alice greets Carol"]
    assert result["documents"] == ["x for Alice"]
    assert (result["step_count"], result["exit_reason"]) == (3, "text")
    assert len(result["messages"]) == 8


def test_token_usage_is_the_sum_of_the_servers_usage(agents: list[Agent]) -> None:
    with FakeOpenAIServer(script=[[("greet", {"name": "Bob"})], [("greet", {"name": "Eve"})], "Hi."]) as server:
        agent = openai_agent(server, agents, tools=[greet], state_schema=SCHEMA)
        result = agent.run([ChatMessage.from_user("Greet")], user_name="Alice")

    sent = [r.response["usage"] for r in server.requests]
    assert len(sent) == 3
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert result["token_usage"][key] == sum(u[key] for u in sent) > 0


def test_streaming_through_the_openai_generator(agents: list[Agent]) -> None:
    chunks: list[StreamingChunk] = []
    script = [{"text": "Let me greet.", "tool_calls": [("greet", {"name": "Bob"})]}, "Bob has been greeted by Alice."]
    with FakeOpenAIServer(script=script, chunk_size=4) as server:
        agent = openai_agent(
            server,
            agents,
            generation_kwargs={"stream_options": {"include_usage": True}},
            tools=[greet],
            state_schema=SCHEMA,
            streaming_callback=chunks.append,
        )
        result = agent.run([ChatMessage.from_user("Greet Bob")], user_name="Alice")

    assert all(body["stream"] is True for body in server.bodies)
    assert "".join(c.content for c in chunks) == "Let me greet.Bob has been greeted by Alice."
    assert sum(1 for c in chunks if c.content) > 5  # the text really arrived in pieces
    deltas = [d for c in chunks for d in c.tool_calls or []]
    assert [d.id for d in deltas if d.id] == ["call_1"]
    assert json.loads("".join(d.arguments or "" for d in deltas)) == {"name": "Bob"}
    [result_chunk] = [c for c in chunks if c.tool_call_result is not None]
    assert result_chunk.tool_call_result.result == "Alice greets Bob"
    assert result_chunk.tool_call_result.origin.id == "call_1"
    assert [c.finish_reason for c in chunks if c.finish_reason] == ["tool_calls", "tool_call_results", "stop"]

    assert result["greetings"] == ["Alice greets Bob"]
    assert result["last_message"].text == "Bob has been greeted by Alice."
    sent = [r.response["usage"]["total_tokens"] for r in server.requests]
    assert result["token_usage"]["total_tokens"] == sum(sent)
    assert server.bodies[1]["messages"][-1] == {"role": "tool", "content": "Alice greets Bob", "tool_call_id": "call_1"}


def test_an_openai_error_mid_run_carries_the_partial_state(agents: list[Agent]) -> None:
    script = [[("greet", {"name": "Bob"})], HTTPErrorReply(503, "model overloaded")]
    with FakeOpenAIServer(script=script) as server:
        agent = openai_agent(server, agents, tools=[greet], state_schema=SCHEMA)
        with pytest.raises(AgentRunError, match="the chat generator failed at step 2") as info:
            agent.run([ChatMessage.from_user("Greet Bob")], user_name="Alice")

    assert isinstance(info.value.__cause__, openai.APIStatusError)
    assert "model overloaded" in str(info.value.__cause__)
    state = info.value.state
    assert state.get("greetings") == ["Alice greets Bob"]
    assert state.get("log") == ["greet Bob"]
    assert state.get("messages")[-1].tool_call_result.result == "Alice greets Bob"
    assert [r.status for r in server.requests] == [200, 503]


def test_run_async_over_openai_matches_run(agents: list[Agent]) -> None:
    script = [[("greet", {"name": "Bob"}), ("search", {"query": "q"})], "Done."]
    chunks: list[StreamingChunk] = []

    async def on_chunk(chunk: StreamingChunk) -> None:
        chunks.append(chunk)

    with FakeOpenAIServer(script=script) as sync_server, FakeOpenAIServer(script=script) as async_server:
        sync_agent = openai_agent(sync_server, agents, tools=[greet, search], state_schema=SCHEMA)
        async_agent = openai_agent(async_server, agents, tools=[greet, search], state_schema=SCHEMA)
        sync_result = sync_agent.run([ChatMessage.from_user("go")], user_name="Alice")

        async def scenario() -> dict[str, Any]:
            try:
                return await async_agent.run_async(
                    [ChatMessage.from_user("go")], streaming_callback=on_chunk, user_name="Alice"
                )
            finally:
                await async_agent.close_async()

        async_result = asyncio.run(scenario())

    keys = ["greetings", "documents", "log", "user_name", "step_count", "exit_reason"]
    assert {k: async_result[k] for k in keys} == {k: sync_result[k] for k in keys}
    assert async_result["last_message"].text == sync_result["last_message"].text == "Done."
    strip = [{k: v for k, v in m.items() if k != "tool_calls"} for m in sync_server.bodies[1]["messages"]]
    assert strip == [{k: v for k, v in m.items() if k != "tool_calls"} for m in async_server.bodies[1]["messages"]]
    assert "".join(c.content for c in chunks) == "Done."
    assert [c.tool_call_result.result for c in chunks if c.tool_call_result] == [
        "Alice greets Bob",
        '{"docs": ["q for Alice"]}',
    ]


def test_the_chained_documentation_example_over_http(agents: list[Agent]) -> None:
    @haystack_tool(outputs_to_state={"documents": {"source": "documents"}, "last_query": {"source": "query"}})
    def retrieve_documents(query: Annotated[str, "The search query"]) -> dict:
        """Retrieve relevant documents."""
        return {"documents": [{"title": f"About {query}"}], "query": query}

    @haystack_tool(
        inputs_from_state={"documents": "documents"},
        outputs_to_state={"final_docs": {"source": "processed_docs"}, "final_count": {"source": "processed_count"}},
    )
    def process_documents(
        max_results: Annotated[int, "Maximum number of documents to return"],
        documents: list = None,  # type: ignore[assignment]  # noqa: RUF013 - as the docs write it
    ) -> dict:
        """Process retrieved documents and return a filtered subset."""
        processed = (documents or [])[:max_results]
        return {"processed_docs": processed, "processed_count": len(processed)}

    script = [
        [("retrieve_documents", {"query": "Python"})],
        [("process_documents", {"max_results": 3})],
        "Processed 1 document.",
    ]
    with FakeOpenAIServer(script=script) as server:
        agent = openai_agent(
            server,
            agents,
            tools=[retrieve_documents, process_documents],
            system_prompt="Use the available tools to retrieve and process documents.",
            state_schema={
                "documents": {"type": list},
                "last_query": {"type": str},
                "final_docs": {"type": list},
                "final_count": {"type": int},
            },
        )
        result = agent.run([ChatMessage.from_user("Find and process 3 documents about Python")])

    process_schema = next(
        t["function"]["parameters"] for t in server.bodies[0]["tools"] if t["function"]["name"] == "process_documents"
    )
    assert set(process_schema["properties"]) == {"max_results"}
    assert result["final_docs"] == [{"title": "About Python"}]
    assert (result["final_count"], result["last_query"]) == (1, "Python")
    assert server.bodies[2]["messages"][-1]["content"] == (
        '{"processed_docs": [{"title": "About Python"}], "processed_count": 1}'
    )
