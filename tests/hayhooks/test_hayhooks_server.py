"""
Our Agent deployed on a real Hayhooks (``hayhooks run``, ``hayhooks mcp run``) with docs/hayhooks.md's wrapper, driven
by the ``openai`` client, raw HTTP (as Open WebUI sends it) and the ``mcp`` client. The threads are read back from
the server's SQLite file.

The demo's research agent answers a question by searching its library and writing a note (two tool calls, whose
results only the thread holds: clients never send them), and answers "Summarize ..." with every note in the
conversation: a summary that lists an earlier turn's note shows that the turn's tool results were on the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hayhooks_processes import Server, hayhooks_executable, mcp_server_problem, start, stop, write_pipelines
from openai import OpenAI

from haystack_state import Agent, SQLiteCheckpointer
from haystack_state.demo import QUESTIONS, research_agent

pytestmark = pytest.mark.slow

BEES, FOOD, WINTER, SUMMARY = QUESTIONS


@contextlib.contextmanager
def reading(db: Path) -> Iterator[Agent]:
    """The demo's agent on the server's SQLite file, to read its threads."""
    with SQLiteCheckpointer(db) as checkpointer:
        yield research_agent(checkpointer)


def users(agent: Agent, thread_id: str, checkpoint_id: str | None = None) -> list[str]:
    messages = agent.get_state(thread_id, checkpoint_id).values["messages"]
    return [message.text or "" for message in messages if message.is_from("user")]


def either(record: Any, name: str, old_name: str) -> Any:
    """A field of an ``mcp`` record: ``mcp`` 2 names them in snake case, ``mcp`` 1 (which Hayhooks 2.1 wants) not."""
    return getattr(record, name, None) if hasattr(record, name) else getattr(record, old_name)


def client(server: Server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def turn(conversation: list[dict[str, Any]], answer: str, question: str) -> list[dict[str, Any]]:
    return [*conversation, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]


def test_chat_completions_keep_one_thread_across_requests(hayhooks: Server) -> None:
    openai = client(hayhooks)
    metadata = {"thread_id": "bees-chat"}
    conversation = [{"role": "user", "content": BEES}]
    first = openai.chat.completions.create(model="research", messages=conversation, metadata=metadata)
    answer = first.choices[0].message.content or ""
    assert answer.startswith("Here is what I found:") and answer.endswith("[bees-1]")
    assert first.choices[0].finish_reason == "stop"

    conversation = turn(conversation, answer, FOOD)
    second = openai.chat.completions.create(model="research", messages=conversation, metadata=metadata)
    food = second.choices[0].message.content or ""
    assert food.endswith("[bees-3]")

    conversation = turn(conversation, food, SUMMARY)
    summary = openai.chat.completions.create(model="research", messages=conversation, metadata=metadata)
    lines = (summary.choices[0].message.content or "").splitlines()
    # the notes come from the take_note results of the first two requests: only the thread had them
    assert lines[0] == "So far I found:" and [line[-8:] for line in lines[1:]] == ["[bees-1]", "[bees-3]"]

    again = openai.chat.completions.create(model="research", messages=conversation, metadata=metadata)  # regenerate
    assert again.choices[0].message.content == summary.choices[0].message.content

    with reading(hayhooks.db()) as agent:
        state = agent.get_state("bees-chat")
        assert users(agent, "bees-chat") == [BEES, FOOD, SUMMARY]  # each once, though every request sent them all
        assert [note[-8:] for note in state.values["notes"]] == ["[bees-1]", "[bees-3]"]
        roles = [message.role.value for message in state.values["messages"]]
        assert roles.count("tool") == 4 and roles.count("system") == 1
        history = agent.get_history("bees-chat")
        parents = [meta.parent_id for meta in history]
        assert len(parents) > len(set(parents))  # the regenerate forked: two checkpoints share a parent


def test_a_streamed_chat_completion_is_text_deltas_and_one_stop(hayhooks: Server) -> None:
    openai = client(hayhooks)
    conversation = [{"role": "user", "content": WINTER}]
    chunks = list(openai.chat.completions.create(model="research", messages=conversation, stream=True))
    assert chunks and all(len(chunk.choices) == 1 for chunk in chunks)
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert not any(chunk.choices[0].delta.tool_calls for chunk in chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text.startswith("Here is what I found: In winter") and text.endswith("[bees-4]")
    assert sum(1 for chunk in chunks if chunk.choices[0].delta.content) > 3  # streamed in pieces

    # no thread id: the conversation's beginning names its thread (a hash), so the next request finds it
    conversation = turn(conversation, text, SUMMARY)
    chunks = list(openai.chat.completions.create(model="research", messages=conversation, stream=True))
    summary = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert summary.splitlines()[0] == "So far I found:" and summary.endswith("[bees-4]")

    with reading(hayhooks.db()) as agent:
        (thread_id,) = [
            info.thread_id
            for info in agent.checkpointer.list_threads()  # type: ignore[union-attr]
            if users(agent, info.thread_id)[:1] == [WINTER]
        ]
        assert thread_id.startswith("chat-")
        assert users(agent, thread_id) == [WINTER, SUMMARY]


def test_the_sync_wrapper_serves_chat_completions_streamed_and_not(hayhooks: Server) -> None:
    openai = client(hayhooks)
    headers = {"X-Thread-Id": "bees-sync"}
    conversation = [{"role": "user", "content": FOOD}]
    first = openai.chat.completions.create(model="research_sync", messages=conversation, extra_headers=headers)
    answer = first.choices[0].message.content or ""
    assert answer.endswith("[bees-3]")
    conversation = turn(conversation, answer, SUMMARY)
    chunks = list(
        openai.chat.completions.create(model="research_sync", messages=conversation, stream=True, extra_headers=headers)
    )
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices[0].finish_reason] == ["stop"]
    summary = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert summary.startswith("So far I found:") and summary.endswith("[bees-3]")
    with reading(hayhooks.db("research_sync")) as agent:
        assert users(agent, "bees-sync") == [FOOD, SUMMARY]

    # an edit of the second question: the thread forks from before it
    edited = [*conversation[:-1], {"role": "user", "content": WINTER}]
    winter = openai.chat.completions.create(model="research_sync", messages=edited, extra_headers=headers)
    assert (winter.choices[0].message.content or "").endswith("[bees-4]")
    # the sync Responses and /run paths
    response = openai.responses.create(model="research_sync", input=BEES)
    later = openai.responses.create(model="research_sync", input=SUMMARY, previous_response_id=response.id)
    assert later.output_text.endswith("[bees-1]")
    ran = httpx.post(hayhooks.url + "/research_sync/run", json={"message": BEES, "thread_id": "bees-sync"}, timeout=60)
    assert ran.json()["result"].endswith("[bees-1]")
    with reading(hayhooks.db("research_sync")) as agent:
        assert users(agent, "bees-sync") == [FOOD, WINTER, BEES]


def test_open_webui_gets_status_events_for_the_tool_calls(hayhooks: Server) -> None:
    headers = {"X-OpenWebUI-Chat-Id": "owui-chat", "X-OpenWebUI-User-Id": "ann"}
    body = {"model": "research", "stream": True, "messages": [{"role": "user", "content": BEES}]}
    statuses, texts, finishes = [], [], []
    with httpx.stream("POST", hayhooks.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: ") :])
            if "event" in data:
                statuses.append((data["event"]["type"], data["event"]["data"]["description"], len(texts)))
                continue
            choice = data["choices"][0]
            assert not choice["delta"].get("tool_calls")
            texts.append(choice["delta"].get("content") or "")
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    assert [(kind, description) for kind, description, _ in statuses] == [
        ("status", "Calling 'search' tool..."),
        ("status", "Called 'search' tool"),
        ("status", "Calling 'take_note' tool..."),
        ("status", "Called 'take_note' tool"),
    ]
    assert all(at == 0 for _, _, at in statuses)  # before the answer's text
    assert "".join(texts).endswith("[bees-1]") and finishes == ["stop"]
    with reading(hayhooks.db()) as agent:
        assert users(agent, "owui-chat") == [BEES]  # Open WebUI's chat id is the thread

    # Open WebUI's background tasks (here a title) name the chat too: they run on a scratch thread, not on the chat's
    task = "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history."
    body = {"model": "research", "messages": [{"role": "user", "content": task}]}
    answer = httpx.post(hayhooks.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    with reading(hayhooks.db()) as agent:
        assert users(agent, "owui-chat") == [BEES]
        names = [info.thread_id for info in agent.checkpointer.list_threads()]  # type: ignore[union-attr]
        assert not any(name.startswith("scratch-") for name in names)


def test_responses_continue_at_the_head_and_fork_at_an_older_response(hayhooks: Server) -> None:
    openai = client(hayhooks)
    first = openai.responses.create(model="research", input=BEES)
    assert first.id.startswith("resp_") and first.output_text.endswith("[bees-1]")
    second = openai.responses.create(model="research", input=FOOD, previous_response_id=first.id)
    summary = openai.responses.create(model="research", input=SUMMARY, previous_response_id=second.id)
    assert [line[-8:] for line in summary.output_text.splitlines()[1:]] == ["[bees-1]", "[bees-3]"]

    fork = openai.responses.create(model="research", input=SUMMARY, previous_response_id=first.id)
    assert [line[-8:] for line in fork.output_text.splitlines()[1:]] == ["[bees-1]"]  # the FOOD turn is not there

    metadata = [response.metadata or {} for response in (first, second, summary, fork)]
    (thread_id,) = {entry["thread_id"] for entry in metadata}
    with reading(hayhooks.db()) as agent:
        ids = {meta.checkpoint_id for meta in agent.get_history(thread_id)}
        assert {entry["checkpoint_id"] for entry in metadata} <= ids  # each response is a checkpoint
        assert users(agent, thread_id) == [BEES, SUMMARY]  # the head: the fork
        assert users(agent, thread_id, metadata[2]["checkpoint_id"]) == [BEES, FOOD, SUMMARY]  # the other branch

    # the older branch goes on: its response is no longer the head, so this forks again
    later = openai.responses.create(model="research", input=WINTER, previous_response_id=summary.id)
    assert later.output_text.endswith("[bees-4]")
    with reading(hayhooks.db()) as agent:
        assert users(agent, thread_id) == [BEES, FOOD, SUMMARY, WINTER]


def test_a_streamed_response_ends_with_its_checkpoint_and_store_false_leaves_no_thread(hayhooks: Server) -> None:
    openai = client(hayhooks)
    events = list(openai.responses.create(model="research", input=WINTER, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") > 3 and "response.output_item.done" in kinds
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == text and text.endswith("[bees-4]")
    thread_id = (completed.metadata or {})["thread_id"]

    scratch = openai.responses.create(model="research", input=SUMMARY, previous_response_id=completed.id, store=False)
    assert scratch.output_text.splitlines() == ["So far I found:", "- " + text.removeprefix("Here is what I found: ")]
    with pytest.raises(Exception, match="404"):  # not stored: it cannot be continued
        openai.responses.create(model="research", input=SUMMARY, previous_response_id=scratch.id)
    with reading(hayhooks.db()) as agent:
        threads = [info.thread_id for info in agent.checkpointer.list_threads()]  # type: ignore[union-attr]
        assert not any(name.startswith("scratch-") for name in threads)
        assert agent.get_state(thread_id).checkpoint.checkpoint_id == (completed.metadata or {})["checkpoint_id"]
        assert users(agent, thread_id) == [WINTER]  # untouched by the store=false run


def test_the_agent_is_an_mcp_tool_with_a_thread_id(hayhooks: Server, pipelines_folder: Path) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    problem = mcp_server_problem(hayhooks_executable() or "hayhooks")
    if problem is not None:
        pytest.skip(problem)
    mcp_server = start(pipelines_folder, "mcp", "run", wanted="ok")
    try:

        async def talk() -> tuple[dict[str, Any], list[str]]:
            async with (
                streamable_http_client(mcp_server.url + "/mcp") as streams,
                ClientSession(streams[0], streams[1]) as session,
            ):
                await session.initialize()
                (tool,) = [tool for tool in (await session.list_tools()).tools if tool.name == "research"]
                answers = []
                for question in (BEES, SUMMARY):
                    result = await session.call_tool("research", {"message": question, "thread_id": "bees-mcp"})
                    assert not either(result, "is_error", "isError")
                    answers.append(result.content[0].text)  # type: ignore[union-attr]
                return either(tool, "input_schema", "inputSchema"), answers

        schema, answers = asyncio.run(talk())
    finally:
        stop(mcp_server)
    assert set(schema["properties"]) == {"message", "thread_id"} and set(schema["required"]) == {"message", "thread_id"}
    assert answers[0].endswith("[bees-1]")
    assert answers[1].splitlines()[0] == "So far I found:" and answers[1].endswith("[bees-1]")

    # the same thread through the HTTP server's /research/run (another process, the same SQLite file)
    answer = httpx.post(
        hayhooks.url + "/research/run", json={"message": FOOD, "thread_id": "bees-mcp"}, timeout=60
    ).json()["result"]
    assert answer.endswith("[bees-3]")
    with reading(hayhooks.db()) as agent:
        assert users(agent, "bees-mcp") == [BEES, SUMMARY, FOOD]


def test_under_hayhooks_durable_mode_the_thread_is_ours(tmp_path: Path, pipelines_folder: Path) -> None:
    write_pipelines(tmp_path)
    server = start(
        tmp_path,
        "run",
        wanted="research_sync",
        env={"HAYHOOKS_DURABLE_MODE": "true", "HAYHOOKS_DURABLE_STORE": "memory"},
    )
    try:
        status = httpx.get(server.url + "/status", timeout=10).json()
        assert status["durable_mode"] is True  # Hayhooks' durable mode is on: the pipeline set is fixed at startup
        modes = {deployment["name"]: deployment["execution_mode"] for deployment in status["deployments"]}
        assert modes == {"research": "request-bound", "research_sync": "request-bound"}  # not durable executions
        assert httpx.post(server.url + "/deploy_files", json={}, timeout=10).status_code == 404
        openai = client(server)
        conversation = [{"role": "user", "content": BEES}]
        first = openai.chat.completions.create(model="research", messages=conversation, metadata={"thread_id": "d"})
        answer = first.choices[0].message.content or ""
        conversation = turn(conversation, answer, SUMMARY)
        summary = openai.chat.completions.create(model="research", messages=conversation, metadata={"thread_id": "d"})
        assert (summary.choices[0].message.content or "").endswith("[bees-1]")
    finally:
        stop(server)
    with reading(server.db()) as agent:
        assert users(agent, "d") == [BEES, SUMMARY]
        assert agent.get_history("d")[0].source == "model"
