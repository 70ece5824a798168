"""Haystack's real OpenAIChatGenerator, over real HTTP, against the local FakeOpenAIServer."""

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fake_openai import FakeOpenAIServer, HTTPErrorReply
from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.tools.tool import Tool
from haystack.utils import Secret

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def add(a: int, b: int) -> int:
    return a + b


@pytest.fixture
def add_tool() -> Tool:
    return Tool(name="add", description="Add two integers.", parameters=ADD_SCHEMA, function=add)


@pytest.fixture
def generators() -> Iterator[list[OpenAIChatGenerator]]:
    """Generators created by a test; their HTTP clients are closed at the end."""
    made: list[OpenAIChatGenerator] = []
    yield made
    for generator in made:
        generator.close()


def make_generator(server: FakeOpenAIServer, made: list[OpenAIChatGenerator], **kwargs: Any) -> OpenAIChatGenerator:
    generator = OpenAIChatGenerator(
        api_key=Secret.from_token("test"), api_base_url=server.base_url, model="gpt-4o-mini", timeout=10, **kwargs
    )
    made.append(generator)
    return generator


def test_text_reply_and_usage(generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=["Hello from the fake server."]) as server:
        reply = make_generator(server, generators).run([ChatMessage.from_user("hi")])["replies"][0]

    assert reply.text == "Hello from the fake server."
    assert reply.tool_calls == []
    assert reply.meta["model"] == "gpt-4o-mini"
    assert reply.meta["finish_reason"] == "stop"
    sent_usage = server.requests[0].response["usage"]
    assert sent_usage["total_tokens"] == sent_usage["prompt_tokens"] + sent_usage["completion_tokens"] > 0
    assert {k: reply.meta["usage"][k] for k in sent_usage} == sent_usage

    [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer test"
    assert request.body["model"] == "gpt-4o-mini"
    assert request.body["messages"] == [{"role": "user", "content": "hi"}]
    assert request.body["stream"] is False
    assert "tools" not in request.body


def test_tool_call_reply_and_tool_schema(add_tool: Tool, generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=[[("add", {"a": 2, "b": 3})]]) as server:
        generator = make_generator(server, generators, tools=[add_tool])
        reply = generator.run([ChatMessage.from_user("What is 2 + 3?")])["replies"][0]

    assert reply.text is None
    [call] = reply.tool_calls
    assert (call.tool_name, call.arguments, call.id) == ("add", {"a": 2, "b": 3}, "call_1")
    assert reply.meta["finish_reason"] == "tool_calls"
    wire_call = server.requests[0].response["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(wire_call["function"]["arguments"]) == {"a": 2, "b": 3}
    assert isinstance(wire_call["function"]["arguments"], str)
    assert server.bodies[0]["tools"] == [
        {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_SCHEMA}}
    ]


def test_text_and_tool_calls_together(add_tool: Tool, generators: list[OpenAIChatGenerator]) -> None:
    script = [{"text": "Adding twice.", "tool_calls": [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]}]
    with FakeOpenAIServer(script=script) as server:
        reply = make_generator(server, generators, tools=[add_tool]).run("go")["replies"][0]

    assert reply.text == "Adding twice."
    assert [(c.id, c.arguments) for c in reply.tool_calls] == [
        ("call_1", {"a": 1, "b": 2}),
        ("call_2", {"a": 3, "b": 4}),
    ]


def test_tool_messages_are_sent_back_with_their_call_ids(add_tool: Tool, generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=[[("add", {"a": 2, "b": 3})], "The sum is 5."]) as server:
        generator = make_generator(server, generators, tools=[add_tool])
        messages = [ChatMessage.from_user("What is 2 + 3?")]
        first = generator.run(messages)["replies"][0]
        tool_message = ChatMessage.from_tool("5", origin=first.tool_calls[0])
        final = generator.run([*messages, first, tool_message])["replies"][0]

    assert final.text == "The sum is 5."
    sent = server.bodies[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == "call_1"
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert sent[2] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}


def test_streaming_text(generators: list[OpenAIChatGenerator]) -> None:
    text = "Streaming works, one small chunk at a time."
    chunks: list[StreamingChunk] = []
    with FakeOpenAIServer(script=[text], chunk_size=5) as server:
        reply = make_generator(server, generators).run("hi", streaming_callback=chunks.append)["replies"][0]

    assert reply.text == text
    assert "".join(c.content for c in chunks) == text
    content_chunks = [c for c in chunks if c.content]
    assert len(content_chunks) == 9  # ceil(43 / 5)
    assert content_chunks[0].start is True
    assert chunks[-1].finish_reason == "stop"
    assert server.bodies[0]["stream"] is True
    assert reply.meta["usage"] is None  # OpenAI only streams usage when stream_options.include_usage is set


def test_streaming_tool_calls_and_usage(add_tool: Tool, generators: list[OpenAIChatGenerator]) -> None:
    script = [{"text": "Let me add.", "tool_calls": [("add", {"a": 10, "b": 20}), ("add", {"a": 1, "b": 2})]}]
    chunks: list[StreamingChunk] = []
    with FakeOpenAIServer(script=script, chunk_size=4) as server:
        generator = make_generator(
            server, generators, tools=[add_tool], generation_kwargs={"stream_options": {"include_usage": True}}
        )
        reply = generator.run("add", streaming_callback=chunks.append)["replies"][0]

    assert reply.text == "Let me add."
    assert [(c.tool_name, c.arguments, c.id) for c in reply.tool_calls] == [
        ("add", {"a": 10, "b": 20}, "call_1"),
        ("add", {"a": 1, "b": 2}, "call_2"),
    ]
    assert reply.meta["finish_reason"] == "tool_calls"
    sent_usage = server.requests[0].response["usage"]
    assert {k: reply.meta["usage"][k] for k in sent_usage} == sent_usage
    deltas = [d for c in chunks for d in c.tool_calls or []]
    assert [d.id for d in deltas if d.id] == ["call_1", "call_2"]
    assert len(deltas) > 4  # the arguments really arrived in pieces
    assert server.bodies[0]["stream_options"] == {"include_usage": True}


def test_policy_sees_the_request_body(add_tool: Tool, generators: list[OpenAIChatGenerator]) -> None:
    def policy(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return f"Result: {last['content']}"
        return [("add", {"a": len(last["content"]), "b": 1})]

    with FakeOpenAIServer(policy=policy) as server:
        generator = make_generator(server, generators, tools=[add_tool])
        first = generator.run("four")["replies"][0]
        second = generator.run(
            [ChatMessage.from_user("four"), first, ChatMessage.from_tool("5", origin=first.tool_calls[0])]
        )["replies"][0]

    assert first.tool_calls[0].arguments == {"a": 4, "b": 1}
    assert second.text == "Result: 5"


def test_agent_loop_over_http(add_tool: Tool, generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=[[("add", {"a": 20, "b": 22})], "The answer is 42."]) as server:
        agent = Agent(chat_generator=make_generator(server, generators), tools=[add_tool])
        result = agent.run(messages=[ChatMessage.from_user("What is 20 + 22?")])

    assert result["last_message"].text == "The answer is 42."
    tool_message = server.bodies[1]["messages"][-1]
    assert tool_message == {"role": "tool", "content": "42", "tool_call_id": "call_1"}
    assert server.bodies[1]["tools"][0]["function"]["name"] == "add"
    expected = sum(r.response["usage"]["total_tokens"] for r in server.requests)
    assert result["token_usage"]["total_tokens"] == expected


def test_fail_next_returns_http_error_without_retries(generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=["recovered"]) as server:
        generator = make_generator(server, generators)  # default max_retries: the server says not to retry
        server.fail_next(500, "database on fire")
        with pytest.raises(openai.InternalServerError, match="database on fire"):
            generator.run("hi")
        assert generator.run("hi")["replies"][0].text == "recovered"

    assert [r.status for r in server.requests] == [500, 200]


def test_scripted_http_error(generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=[HTTPErrorReply(429, "slow down", "rate_limit_error"), "ok"]) as server:
        generator = make_generator(server, generators)
        with pytest.raises(openai.RateLimitError, match="slow down"):
            generator.run("hi")
        assert generator.run("hi")["replies"][0].text == "ok"


def test_script_exhausted_is_reported(generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=["only one"]) as server:
        generator = make_generator(server, generators)
        generator.run("hi")
        with pytest.raises(openai.InternalServerError, match=r"script exhausted: it has 1 replies, and request 2"):
            generator.run("hi again")

    assert len(server.errors) == 1


def test_undeclared_tool_is_reported(generators: list[OpenAIChatGenerator]) -> None:
    with (
        FakeOpenAIServer(script=[[("search", {"q": "x"})]]) as server,
        pytest.raises(openai.InternalServerError, match="'search'"),
    ):
        make_generator(server, generators).run("hi")


def test_path_without_v1_prefix(generators: list[OpenAIChatGenerator]) -> None:
    with FakeOpenAIServer(script=["no prefix"]) as server:
        generator = OpenAIChatGenerator(
            api_key=Secret.from_token("test"), api_base_url=f"http://127.0.0.1:{server.port}", model="gpt-4o-mini"
        )
        generators.append(generator)
        assert generator.run("hi")["replies"][0].text == "no prefix"

    assert server.requests[0].path == "/chat/completions"


@pytest.mark.slow
def test_run_async_and_async_streaming(add_tool: Tool) -> None:
    chunks: list[StreamingChunk] = []

    async def on_chunk(chunk: StreamingChunk) -> None:
        chunks.append(chunk)

    async def scenario(server: FakeOpenAIServer) -> tuple[ChatMessage, ChatMessage]:
        generator = OpenAIChatGenerator(
            api_key=Secret.from_token("test"), api_base_url=server.base_url, model="gpt-4o-mini", tools=[add_tool]
        )
        try:
            plain = (await generator.run_async("hi"))["replies"][0]
            streamed = (await generator.run_async("hi", streaming_callback=on_chunk))["replies"][0]
        finally:
            await generator.close_async()
        return plain, streamed

    with FakeOpenAIServer(script=["async text", [("add", {"a": 1, "b": 1})]]) as server:
        plain, streamed = asyncio.run(scenario(server))

    assert plain.text == "async text"
    assert streamed.tool_calls[0].arguments == {"a": 1, "b": 1}
    assert streamed.tool_calls[0].id == "call_1"
    assert any(c.tool_calls for c in chunks)


def test_server_lifecycle() -> None:
    server = FakeOpenAIServer(script=[])
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.base_url
    with server:
        port = server.port
        assert server.base_url == f"http://127.0.0.1:{port}/v1"
    server.stop()  # idempotent
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_needs_exactly_one_of_script_and_policy() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        FakeOpenAIServer()
    with pytest.raises(ValueError, match="exactly one"):
        FakeOpenAIServer(script=["a"], policy=lambda body: "b")
