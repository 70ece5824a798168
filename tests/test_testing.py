"""Tests of haystack_state.testing.ScriptedChatGenerator."""

import asyncio
import inspect
import json
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.agents import Agent
from haystack.core.errors import PipelineRuntimeError
from haystack.dataclasses import ChatMessage, StreamingChunk, ToolCall
from haystack.token_counters import ApproximateTokenCounter
from haystack.tools import Toolset
from haystack.tools.tool import Tool

from haystack_state.agent.context import ContextSummary, SummaryRequest
from haystack_state.errors import HaystackStateError
from haystack_state.testing import SUMMARY_MAX_LINES, ScriptedCall, ScriptedChatGenerator, ScriptError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}


def add(a: int, b: int) -> int:
    return a + b


def multiply(a: int, b: int) -> int:
    return a * b


@pytest.fixture
def add_tool() -> Tool:
    return Tool(name="add", description="Add two integers.", parameters=SCHEMA, function=add)


@pytest.fixture
def mul_tool() -> Tool:
    return Tool(name="multiply", description="Multiply two integers.", parameters=SCHEMA, function=multiply)


def echo_policy(messages: list[ChatMessage], tools: list[Tool]) -> str:
    """A module-level policy, so it can be serialized."""
    return f"{messages[-1].text} | tools: {','.join(t.name for t in tools) or '-'}"


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def reassemble(chunks: list[StreamingChunk]) -> tuple[str, list[ToolCall]]:
    """Rebuild the text and tool calls from streamed chunks, the way a consumer would."""
    text = "".join(c.content for c in chunks)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in chunk.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "args": ""})
            entry["id"] = delta.id or entry["id"]
            entry["name"] += delta.tool_name or ""
            entry["args"] += delta.arguments or ""
    tool_calls = [ToolCall(e["name"], json.loads(e["args"]), e["id"]) for _, e in sorted(calls.items())]
    return text, tool_calls


# --- replies -----------------------------------------------------------------------------------------


def test_text_reply_has_meta_like_a_real_generator() -> None:
    generator = ScriptedChatGenerator(script=["Hello there."])
    [reply] = generator.run(user("hi"))["replies"]

    assert reply.is_from("assistant")
    assert reply.text == "Hello there."
    assert reply.tool_calls == []
    assert reply.meta["model"] == "scripted"
    assert reply.meta["finish_reason"] == "stop"
    usage = reply.meta["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_usage_is_deterministic_and_grows_with_the_prompt(add_tool: Tool) -> None:
    def usage(messages: list[ChatMessage], tools: list[Tool] | None = None) -> dict[str, int]:
        return dict(
            ScriptedChatGenerator(script=["same answer"]).run(messages, tools=tools)["replies"][0].meta["usage"]
        )

    assert usage(user("hi")) == usage(user("hi"))
    assert usage(user("hi " * 100))["prompt_tokens"] > usage(user("hi"))["prompt_tokens"]
    assert usage(user("hi"), [add_tool])["prompt_tokens"] > usage(user("hi"))["prompt_tokens"]
    assert usage(user("hi " * 100))["completion_tokens"] == usage(user("hi"))["completion_tokens"]


def test_string_messages_are_a_user_message() -> None:
    generator = ScriptedChatGenerator(script=["ok"])
    generator.run("just a string")

    assert generator.calls[0].messages == [ChatMessage.from_user("just a string")]


def test_tool_call_ids_count_across_calls(add_tool: Tool) -> None:
    generator = ScriptedChatGenerator(
        script=[[("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})], [("add", {"a": 5, "b": 6})], "done"]
    )
    first = generator.run(user("go"), tools=[add_tool])["replies"][0]
    second = generator.run(user("go"), tools=[add_tool])["replies"][0]
    third = generator.run(user("go"), tools=[add_tool])["replies"][0]

    assert [(c.tool_name, c.arguments, c.id) for c in first.tool_calls] == [
        ("add", {"a": 1, "b": 2}, "call_1"),
        ("add", {"a": 3, "b": 4}, "call_2"),
    ]
    assert [c.id for c in second.tool_calls] == ["call_3"]
    assert first.text is None
    assert first.meta["finish_reason"] == "tool_calls"
    assert third.meta["finish_reason"] == "stop"


def test_mixed_text_and_tool_calls(add_tool: Tool) -> None:
    generator = ScriptedChatGenerator(script=[{"text": "Adding.", "tool_calls": [("add", {"a": 1, "b": 2})]}])
    [reply] = generator.run(user("go"), tools=[add_tool])["replies"]

    assert reply.text == "Adding."
    assert reply.tool_calls == [ToolCall("add", {"a": 1, "b": 2}, "call_1")]
    assert reply.meta["finish_reason"] == "tool_calls"


def test_single_pair_and_list_forms_are_accepted(add_tool: Tool) -> None:
    generator = ScriptedChatGenerator(
        script=[("add", {"a": 1, "b": 1}), [["add", {"a": 2, "b": 2}]], {"tool_calls": [["add", {"a": 3, "b": 3}]]}]
    )
    args = [generator.run(user("x"), tools=[add_tool])["replies"][0].tool_calls[0].arguments for _ in range(3)]

    assert args == [{"a": 1, "b": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 3}]


def test_scripted_arguments_are_copied(add_tool: Tool) -> None:
    arguments = {"a": 1, "b": 2}
    generator = ScriptedChatGenerator(script=[[("add", arguments)]])
    reply = generator.run(user("x"), tools=[add_tool])["replies"][0]
    reply.tool_calls[0].arguments["a"] = 99

    assert arguments == {"a": 1, "b": 2}
    assert generator.to_dict()["init_parameters"]["script"] == [[["add", {"a": 1, "b": 2}]]]


def test_chat_message_reply_is_returned_as_is() -> None:
    message = ChatMessage.from_assistant("verbatim", meta={"custom": True})
    [reply] = ScriptedChatGenerator(script=[message]).run(user("x"))["replies"]

    assert reply is message


def test_policy_receives_messages_and_flattened_tools(add_tool: Tool, mul_tool: Tool) -> None:
    seen: list[tuple[list[ChatMessage], list[str]]] = []

    def policy(messages: list[ChatMessage], tools: list[Tool]) -> Any:
        seen.append((messages, [t.name for t in tools]))
        if messages[-1].tool_call_result is not None:
            return f"The result is {messages[-1].tool_call_result.result}."
        return [("multiply", {"a": 6, "b": 7})]

    generator = ScriptedChatGenerator(policy=policy)
    tools: list[Tool | Toolset] = [add_tool, Toolset([mul_tool])]
    first = generator.run(user("6 x 7?"), tools=tools)["replies"][0]
    tool_msg = ChatMessage.from_tool("42", origin=first.tool_calls[0])
    second = generator.run([*user("6 x 7?"), first, tool_msg], tools=tools)["replies"][0]

    assert first.tool_calls[0].tool_name == "multiply"
    assert first.tool_calls[0].id == "call_1"
    assert second.text == "The result is 42."
    assert [names for _, names in seen] == [["add", "multiply"], ["add", "multiply"]]
    assert len(seen[1][0]) == 3
    assert generator.remaining is None


def test_policy_reply_is_validated_against_tools(add_tool: Tool) -> None:
    generator = ScriptedChatGenerator(policy=lambda messages, tools: [("delete_everything", {})])

    with pytest.raises(ScriptError, match="'delete_everything'"):
        generator.run(user("x"), tools=[add_tool])


# --- streaming ---------------------------------------------------------------------------------------


def test_streaming_text_chunks_concatenate_to_the_text() -> None:
    text = "A streamed reply, cut into chunks of five characters."
    chunks: list[StreamingChunk] = []
    generator = ScriptedChatGenerator(script=[text], chunk_size=5)
    [reply] = generator.run(user("hi"), streaming_callback=chunks.append)["replies"]

    assert reply.text == text
    assert "".join(c.content for c in chunks) == text
    content = [c for c in chunks if c.content]
    assert len(content) == -(-len(text) // 5)
    assert all(len(c.content) <= 5 for c in content)
    assert [c.start for c in content] == [True] + [False] * (len(content) - 1)
    assert all(c.index == 0 for c in content)
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].meta["usage"] == reply.meta["usage"]
    assert chunks[0].component_info is not None
    assert chunks[0].component_info.type == "haystack_state.testing.ScriptedChatGenerator"
    assert generator.calls[0].streamed is True


def test_streaming_tool_calls_reassemble_to_the_reply(add_tool: Tool, mul_tool: Tool) -> None:
    script = [{"text": "Working on it.", "tool_calls": [("add", {"a": 10, "b": 20}), ("multiply", {"a": 3, "b": 4})]}]
    chunks: list[StreamingChunk] = []
    generator = ScriptedChatGenerator(script=script, chunk_size=4)
    [reply] = generator.run(user("go"), tools=[add_tool, mul_tool], streaming_callback=chunks.append)["replies"]

    text, tool_calls = reassemble(chunks)
    assert text == reply.text == "Working on it."
    assert tool_calls == reply.tool_calls
    assert [c.id for c in tool_calls] == ["call_1", "call_2"]
    starts = [c for c in chunks if c.tool_calls and c.start]
    assert [c.tool_calls[0].tool_name for c in starts if c.tool_calls] == ["add", "multiply"]
    assert len([c for c in chunks if c.tool_calls]) > 2  # arguments arrive in several deltas
    assert chunks[-1].finish_reason == "tool_calls"


def test_no_chunks_without_a_callback() -> None:
    generator = ScriptedChatGenerator(script=["x"])
    generator.run(user("hi"))

    assert generator.calls[0].streamed is False


def test_init_streaming_callback_is_used() -> None:
    chunks: list[StreamingChunk] = []
    generator = ScriptedChatGenerator(script=["from init"], streaming_callback=chunks.append)
    generator.run(user("hi"))

    assert "".join(c.content for c in chunks) == "from init"


# --- recording ---------------------------------------------------------------------------------------


def test_calls_record_messages_tools_and_replies(add_tool: Tool, mul_tool: Tool) -> None:
    generator = ScriptedChatGenerator(script=["one", "two"])
    messages = [ChatMessage.from_system("Be brief."), *user("first")]
    generator.run(messages, tools=Toolset([add_tool, mul_tool]), generation_kwargs={"temperature": 0})
    generator.run(user("second"))

    first, second = generator.calls
    assert isinstance(first, ScriptedCall)
    assert first.number == 1
    assert first.messages == messages and first.messages is not messages  # a copy: the caller may extend its list
    assert [m.text for m in first.messages] == ["Be brief.", "first"]
    assert first.tool_names == ["add", "multiply"]
    assert first.tools == [add_tool, mul_tool]
    assert first.generation_kwargs == {"temperature": 0}
    assert first.reply is not None
    assert first.reply.text == "one"
    assert second.number == 2
    assert second.tool_names == []
    assert generator.remaining == 0


def test_reset_rewinds_script_ids_and_calls(add_tool: Tool) -> None:
    generator = ScriptedChatGenerator(script=[[("add", {"a": 1, "b": 1})]])
    generator.run(user("x"), tools=[add_tool])
    generator.reset()
    reply = generator.run(user("x"), tools=[add_tool])["replies"][0]

    assert reply.tool_calls[0].id == "call_1"
    assert len(generator.calls) == 1


# --- errors ------------------------------------------------------------------------------------------


def test_exhausted_script_says_how_many_replies_and_which_call() -> None:
    generator = ScriptedChatGenerator(script=["one", "two"])
    generator.run(user("1"))
    generator.run(user("2"))

    with pytest.raises(ScriptError, match=r"has 2 replies, and call 3 asked for one more") as info:
        generator.run(user("3"))
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, HaystackStateError)
    assert len(generator.calls) == 3  # the failing call is recorded too
    assert generator.calls[2].reply is None


def test_exhausted_single_reply_script_grammar() -> None:
    generator = ScriptedChatGenerator(script=[])
    with pytest.raises(ScriptError, match=r"has 0 replies, and call 1 asked"):
        generator.run(user("1"))
    generator = ScriptedChatGenerator(script=["only"])
    generator.run(user("1"))
    with pytest.raises(ScriptError, match=r"has 1 reply, and call 2 asked"):
        generator.run(user("2"))


def test_unknown_tool_names_the_tool_and_the_available_ones(add_tool: Tool, mul_tool: Tool) -> None:
    generator = ScriptedChatGenerator(script=[[("search", {"q": "x"})], "after"])

    with pytest.raises(ScriptError) as info:
        generator.run(user("x"), tools=[add_tool, mul_tool])
    message = str(info.value)
    assert "'search'" in message
    assert "'add', 'multiply'" in message
    assert "script reply 1 (for call 1)" in message
    assert generator.remaining == 2  # the failed reply was not consumed

    with pytest.raises(ScriptError, match="no tools were passed"):
        generator.run(user("x"))


def test_validate_tools_false_allows_any_tool_name() -> None:
    generator = ScriptedChatGenerator(script=[[("search", {"q": "x"})]], validate_tools=False)

    assert generator.run(user("x"))["replies"][0].tool_calls[0].tool_name == "search"


def test_tool_names_in_chat_message_replies_are_validated(add_tool: Tool) -> None:
    message = ChatMessage.from_assistant(tool_calls=[ToolCall("nope", {}, "id-1")])

    with pytest.raises(ScriptError, match="'nope'"):
        ScriptedChatGenerator(script=[message]).run(user("x"), tools=[add_tool])


def test_constructor_errors() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ScriptedChatGenerator()
    with pytest.raises(ValueError, match="exactly one"):
        ScriptedChatGenerator(script=["a"], policy=echo_policy)
    with pytest.raises(ValueError, match="chunk_size"):
        ScriptedChatGenerator(script=["a"], chunk_size=0)
    with pytest.raises(TypeError, match="Script reply 2"):
        ScriptedChatGenerator(script=["fine", 42])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Script reply 1: a tool call"):
        ScriptedChatGenerator(script=[[("add", "not a dict")]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="wrap a single reply"):
        ScriptedChatGenerator(script="not a list")


# --- serialization and pipelines ----------------------------------------------------------------------


def test_to_dict_from_dict_round_trip(add_tool: Tool) -> None:
    script: list[Any] = [
        "text",
        [("add", {"a": 1, "b": 2})],
        {"text": "both", "tool_calls": [("add", {"a": 3, "b": 4})]},
        ChatMessage.from_assistant("as is", meta={"k": "v"}),
    ]
    generator = ScriptedChatGenerator(script=script, chunk_size=3, model="m", validate_tools=False)
    data = generator.to_dict()

    assert data["type"] == "haystack_state.testing.ScriptedChatGenerator"
    params = data["init_parameters"]
    assert params["script"][:3] == [
        "text",
        [["add", {"a": 1, "b": 2}]],
        {"text": "both", "tool_calls": [["add", {"a": 3, "b": 4}]]},
    ]
    assert params["policy"] is None
    assert (params["chunk_size"], params["model"], params["validate_tools"]) == (3, "m", False)

    restored = ScriptedChatGenerator.from_dict(data)
    assert restored.to_dict() == data
    original_replies = [generator.run(user("x"), tools=[add_tool])["replies"][0] for _ in script]
    restored_replies = [restored.run(user("x"), tools=[add_tool])["replies"][0] for _ in script]
    assert restored_replies == original_replies


def test_policy_serializes_by_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    data = ScriptedChatGenerator(policy=echo_policy).to_dict()
    assert data["init_parameters"]["policy"] == f"{__name__}.echo_policy"
    assert data["init_parameters"]["script"] is None

    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", __name__)
    restored = ScriptedChatGenerator.from_dict(data)
    assert restored.policy is echo_policy
    assert restored.run(user("ping"))["replies"][0].text == "ping | tools: -"


def test_pipeline_yaml_round_trip_and_run(add_tool: Tool) -> None:
    pipeline = Pipeline()
    pipeline.add_component("llm", ScriptedChatGenerator(script=[[("add", {"a": 1, "b": 2})], "three"]))
    yaml_text = pipeline.dumps()
    assert "ScriptedChatGenerator" in yaml_text

    loaded = Pipeline.loads(yaml_text, allowed_modules=["haystack_state"])
    assert loaded.dumps() == yaml_text
    first = loaded.run({"llm": {"messages": user("1 + 2?"), "tools": [add_tool]}})["llm"]["replies"][0]
    second = loaded.run({"llm": {"messages": user("and?")}})["llm"]["replies"][0]

    assert first.tool_calls == [ToolCall("add", {"a": 1, "b": 2}, "call_1")]
    assert second.text == "three"
    with pytest.raises(PipelineRuntimeError, match="script is exhausted"):
        loaded.run({"llm": {"messages": user("more?")}})


def test_pipeline_with_policy_round_trip() -> None:
    pipeline = Pipeline()
    pipeline.add_component("llm", ScriptedChatGenerator(policy=echo_policy))
    loaded = Pipeline.loads(pipeline.dumps(), allowed_modules=["haystack_state", __name__])

    assert loaded.run({"llm": {"messages": user("yaml")}})["llm"]["replies"][0].text == "yaml | tools: -"


# --- async and agents ------------------------------------------------------------------------------


def test_run_and_run_async_take_the_same_parameters() -> None:
    run = inspect.signature(ScriptedChatGenerator.run)
    run_async = inspect.signature(ScriptedChatGenerator.run_async)

    assert run.parameters == run_async.parameters
    assert list(run.parameters) == ["self", "messages", "tools", "streaming_callback", "generation_kwargs"]


def test_run_async_with_async_and_sync_callbacks(add_tool: Tool) -> None:
    async_chunks: list[StreamingChunk] = []
    sync_chunks: list[StreamingChunk] = []

    async def on_chunk(chunk: StreamingChunk) -> None:
        await asyncio.sleep(0)
        async_chunks.append(chunk)

    generator = ScriptedChatGenerator(script=["async reply", [("add", {"a": 1, "b": 1})]])

    async def scenario() -> tuple[ChatMessage, ChatMessage]:
        first = (await generator.run_async(user("x"), streaming_callback=on_chunk))["replies"][0]
        second = (await generator.run_async(user("y"), tools=[add_tool], streaming_callback=sync_chunks.append))[
            "replies"
        ][0]
        return first, second

    first, second = asyncio.run(scenario())
    assert first.text == "async reply"
    assert "".join(c.content for c in async_chunks) == "async reply"
    assert reassemble(sync_chunks)[1] == second.tool_calls
    assert second.tool_calls[0].id == "call_1"


def test_sync_run_rejects_an_async_callback() -> None:
    async def on_chunk(chunk: StreamingChunk) -> None:
        pass

    with pytest.raises(ValueError, match="coroutine"):
        ScriptedChatGenerator(script=["x"]).run(user("x"), streaming_callback=on_chunk)


def test_drives_a_haystack_agent(add_tool: Tool) -> None:
    generator = ScriptedChatGenerator(script=[[("add", {"a": 20, "b": 22})], "The answer is 42."])
    agent = Agent(chat_generator=generator, tools=[add_tool])
    result = agent.run(messages=user("What is 20 + 22?"))

    assert result["last_message"].text == "The answer is 42."
    tool_message = generator.calls[1].messages[-1]
    assert tool_message.tool_call_result is not None
    assert tool_message.tool_call_result.result == "42"
    assert tool_message.tool_call_result.origin.id == "call_1"
    assert generator.calls[0].tool_names == ["add"]
    replies = [c.reply for c in generator.calls if c.reply is not None]
    assert result["token_usage"]["total_tokens"] == sum(r.meta["usage"]["total_tokens"] for r in replies)


# --- bounded recording, token counts, the summarizer ------------------------------------------------------


def test_recording_keeps_the_last_calls_and_counts_them_all() -> None:
    generator = ScriptedChatGenerator(policy=echo_policy, record=3)
    for i in range(10):
        generator.run(user(f"call {i}"))

    assert generator.call_count == 10
    assert [c.number for c in generator.calls] == [8, 9, 10]
    assert [c.messages[0].text for c in generator.calls] == ["call 7", "call 8", "call 9"]
    generator.reset()
    assert (generator.calls, generator.call_count) == ([], 0)


def test_recording_can_be_turned_off() -> None:
    generator = ScriptedChatGenerator(script=["a", "b"], record=False)
    generator.run(user("1"))
    reply = generator.run(user("2"))["replies"][0]

    assert generator.calls == []
    assert generator.call_count == 2
    assert reply.meta["usage"]["prompt_tokens"] > 0
    assert ScriptedChatGenerator(script=["a"], record=True).record == 100
    with pytest.raises(ValueError, match="record must be a number of calls"):
        ScriptedChatGenerator(script=["a"], record=-1)


@pytest.mark.slow
def test_a_long_run_records_a_bounded_window() -> None:
    generator = ScriptedChatGenerator(policy=echo_policy)
    conversation: list[ChatMessage] = []
    for i in range(2000):
        conversation.append(ChatMessage.from_user(f"step {i}"))
        generator.run(conversation)  # one list, extended between calls, as the Agent sends it
        assert len(generator.calls[-1].messages) == i + 1

    calls = generator.calls
    assert len(calls) == 100
    assert generator.call_count == 2000
    # what stays referenced: 100 copies of about 2,000 messages, not 2,000 (two million references)
    assert sum(len(c.messages) for c in calls) == sum(range(1901, 2001))


def test_each_call_records_its_size_in_tokens(add_tool: Tool) -> None:
    counter = ApproximateTokenCounter()
    generator = ScriptedChatGenerator(script=["one", "two"], token_counter=counter)
    messages = [ChatMessage.from_system("Be brief."), ChatMessage.from_user("x" * 400)]
    generator.run(messages, tools=[add_tool])
    generator.run(messages[:1])

    first, second = generator.calls
    assert first.tokens == counter.count(messages[:1]) + counter.count(messages[1:]) + counter.count([], [add_tool])
    assert first.tokens > 100 > second.tokens > 0
    assert first.reply is not None and first.reply.meta["usage"]["prompt_tokens"] == first.tokens
    dense = ScriptedChatGenerator(script=["x"], token_counter=ApproximateTokenCounter(chars_per_token=1.0))
    dense.run(messages)
    assert dense.calls[0].tokens > 3 * counter.count(messages)


def test_a_growing_conversation_is_counted_as_a_whole_recount_would(add_tool: Tool) -> None:
    """Only the new messages of a list sent again are counted, and any other list (or a rewrite) is counted whole."""

    from haystack_state.agent.context._tokens import token_meter

    counter = ApproximateTokenCounter()
    meter = token_meter(counter)
    visited: list[ChatMessage] = []
    measure = meter.message

    def message(m: ChatMessage) -> int:
        visited.append(m)
        return measure(m)

    meter.message = message  # type: ignore[method-assign]
    generator = ScriptedChatGenerator(script=["r"] * 8, token_counter=counter)
    conversation = [ChatMessage.from_user("start")]
    for turn in range(4):  # as an Agent does: the same list, extended
        generator.run(conversation, tools=[add_tool])
        conversation.extend([ChatMessage.from_assistant(f"a{turn}"), ChatMessage.from_user("u" * (turn + 1) * 50)])
    assert len(visited) == 7  # each message once over the 4 calls, not 1 + 3 + 5 + 7 times
    whole = ApproximateTokenCounter()

    def recount(messages: list[ChatMessage]) -> int:  # each message on its own, as the generator counts
        return sum(whole.count([m]) for m in messages) + whole.count([], [add_tool])

    for call in generator.calls:
        assert call.tokens == recount(call.messages)
    # Rewritten in place (its last counted message replaced), and a fresh list: counted whole.
    conversation[-1] = ChatMessage.from_user("rewritten " * 40)
    generator.run(conversation, tools=[add_tool])
    generator.run(list(conversation[:3]), tools=[add_tool])
    for call in generator.calls[-2:]:
        assert call.tokens == recount(call.messages)


def test_record_and_the_token_counter_round_trip() -> None:
    generator = ScriptedChatGenerator(
        script=["a"], record=7, token_counter=ApproximateTokenCounter(chars_per_token=2.5)
    )
    data = generator.to_dict()
    assert data["init_parameters"]["record"] == 7
    restored = ScriptedChatGenerator.from_dict(data)
    assert restored.record == 7
    assert isinstance(restored.token_counter, ApproximateTokenCounter)
    assert restored.token_counter.chars_per_token == 2.5
    assert restored.to_dict() == data


def summarizer_prompt(previous: str | None, turns: list[tuple[str, list[str], str]]) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for n, (question, tools, answer) in enumerate(turns):
        messages.append(ChatMessage.from_user(question))
        if tools:
            calls = [ToolCall(name, {"n": n}, f"c{n}_{i}") for i, name in enumerate(tools)]
            messages.append(ChatMessage.from_assistant(tool_calls=calls))
            messages += [ChatMessage.from_tool("done", origin=call) for call in calls]
        messages.append(ChatMessage.from_assistant(answer))
    summary = ContextSummary(previous, covers=(0, 3), tokens=5) if previous else None
    return SummaryRequest(previous=summary, to_fold=messages, start=3, end=3 + len(messages)).prompt()


def test_the_summarizer_folds_the_previous_summary_and_one_line_per_turn() -> None:
    generator = ScriptedChatGenerator.summarizer()
    prompt = summarizer_prompt("- earlier: the user likes tea", [("Book a table", ["search", "book"], "Booked.")])
    [reply] = generator.run(prompt)["replies"]

    assert reply.text == "- earlier: the user likes tea\n- Book a table (tools: search, book) -> Booked."
    assert reply.meta["model"] == "scripted-summarizer"
    assert reply.meta["usage"]["prompt_tokens"] == generator.calls[0].tokens
    assert generator.to_dict()["init_parameters"]["policy"] == "haystack_state.testing._summarizer.fold_summary"
    assert ScriptedChatGenerator.from_dict(generator.to_dict()).run(prompt)["replies"][0].text == reply.text


def test_the_summarizer_stays_bounded() -> None:
    generator = ScriptedChatGenerator.summarizer()
    summary: str | None = None
    for round_ in range(3):
        turns = [(f"question {round_}.{i}", [], f"answer {i}") for i in range(30)]
        summary = generator.run(summarizer_prompt(summary, turns))["replies"][0].text

    assert summary is not None
    lines = summary.splitlines()
    assert len(lines) == SUMMARY_MAX_LINES
    assert lines[0] == f"- ({90 - SUMMARY_MAX_LINES + 1} earlier lines dropped)"
    assert lines[-1] == "- question 2.29 -> answer 29"
