"""
Message ids over HTTP, through LangGraph's own SDK, on SQLite and PostgreSQL: every message has one stable id, the same
in the stream (``messages-tuple`` chunks, ``updates``, ``values``), in ``values``, ``get_state``, history and after an
``update_state`` edit; a client's id is kept; messages stored before ids existed get the same id on every read; and the
Agent's system prompt is not drawn as a message unless ``create_app(wire_system_prompt=True)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, StreamingChunk

from haystack_state import State
from haystack_state.agent._message_ids import SYSTEM_PROMPT_ID_PREFIX
from haystack_state.agent.events import CheckpointCommitted, ModelChunk, StateChanged
from haystack_state.persistence.delta import extend
from haystack_state.server._streams import StreamTranslator
from server.conftest import Served

PROMPT = "You are a test assistant."


def human(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text, **extra}]}


def ids(values: dict[str, Any]) -> list[str]:
    return [m["id"] for m in values["messages"]]


@pytest.mark.slow
def test_one_id_per_message_in_the_stream_the_state_and_the_history(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    modes = ["messages-tuple", "updates", "values"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("note tea"), stream_mode=modes))

    state = client.threads.get_state(thread_id)
    messages = state["values"]["messages"]
    assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai"]
    assert all(isinstance(m["id"], str) and m["id"] for m in messages)
    assert len(set(ids(state["values"]))) == 4
    _, call, result, answer = messages

    # messages-tuple: each AI chunk carries the id its stored reply has; the tool message is sent with its id
    pairs = [p.data for p in parts if p.event == "messages"]
    chunk_ids = {meta["langgraph_step"]: set() for _, meta in pairs if meta["langgraph_node"] == "model"}
    for chunk, meta in pairs:
        if meta["langgraph_node"] == "model":
            chunk_ids[meta["langgraph_step"]].add(chunk["id"])
    assert list(chunk_ids.values()) == [{call["id"]}, {answer["id"]}]
    assert [chunk["id"] for chunk, meta in pairs if meta["langgraph_node"] == "tools"] == [result["id"]]

    # updates and values carry the same ids
    updates = [p.data for p in parts if p.event == "updates"]
    streamed = [m["id"] for update in updates for node in update.values() for m in node.get("messages", [])]
    assert streamed == ids(state["values"])
    values = [p.data for p in parts if p.event == "values"]
    assert ids(values[-1]) == ids(state["values"])
    assert all(ids(v) == ids(state["values"])[: len(v["messages"])] for v in values)

    # the thread, its history (every checkpoint) and a run's final values agree
    assert ids(client.threads.get(thread_id)["values"]) == ids(state["values"])
    history = client.threads.get_history(thread_id, limit=20)
    assert len(history) >= 4
    for checkpoint in history:
        assert ids(checkpoint["values"]) == ids(state["values"])[: len(checkpoint["values"]["messages"])]
    final = client.runs.wait(thread_id, "agent", input=human("hi"))
    assert ids(final)[:4] == ids(state["values"])
    assert ids(final) == ids(client.threads.get_state(thread_id)["values"])


@pytest.mark.slow
def test_a_client_id_is_kept_and_an_edit_by_id_keeps_it(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("hello", id="client-msg-1"), stream_mode="updates"))
    assert parts[1].data["input"]["messages"][0]["id"] == "client-msg-1"
    values = client.threads.get_state(thread_id)["values"]
    assert (values["messages"][0]["type"], values["messages"][0]["id"]) == ("human", "client-msg-1")
    reply = values["messages"][1]

    # an edit that names a message by id replaces it, in place, under the same id
    edited = {**reply, "content": "edited reply"}
    client.threads.update_state(thread_id, {"messages": [edited, {"type": "human", "content": "added"}]})
    after = client.threads.get_state(thread_id)["values"]["messages"]
    assert [(m["id"], m["content"]) for m in after[:2]] == [("client-msg-1", "hello"), (reply["id"], "edited reply")]
    assert after[2]["content"] == "added" and after[2]["id"] not in (None, "client-msg-1", reply["id"])
    assert ids(client.threads.get_state(thread_id)["values"]) == [m["id"] for m in after]  # and on every read
    # the checkpoint before the edit still has the reply as the model wrote it
    history = client.threads.get_history(thread_id, limit=10)
    before = history[1]["values"]["messages"]
    assert [(m["id"], m["content"]) for m in before] == [("client-msg-1", "hello"), (reply["id"], "echo: hello")]


def check_system_prompt(served: Served, expected: list[str]) -> None:
    """The types a conversation starts with on every way out: the stream, the state, the thread, a run, the history."""
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("hi"), stream_mode=["updates", "values"]))
    first = next(p.data for p in parts if p.event == "updates")["input"]["messages"]
    assert [m["type"] for m in first] == expected[:-1]
    assert [m["type"] for m in [p.data for p in parts if p.event == "values"][-1]["messages"]] == expected
    final = client.runs.wait(thread_id, "agent", input=human("again"))
    history = client.threads.get_history(thread_id, limit=20)
    for values in (
        client.threads.get_state(thread_id)["values"],
        client.threads.get(thread_id)["values"],
        client.threads.search(limit=1)[0]["values"],
        final,
        history[0]["values"],
    ):
        assert [m["type"] for m in values["messages"]] == [*expected, "human", "ai"]
    assert [m["type"] for m in history[-1]["values"]["messages"]] == expected[:-1]  # the run's input checkpoint
    assert served.agent.get_state(thread_id).values["messages"][0].text == PROMPT  # stored either way


@pytest.mark.slow
def test_the_system_prompt_is_not_drawn_as_a_message(served: Served) -> None:
    check_system_prompt(served, ["human", "ai"])


@pytest.mark.slow
def test_wire_system_prompt_draws_it(serve: Callable[..., Served]) -> None:
    served = serve(wire_system_prompt=True)
    check_system_prompt(served, ["system", "human", "ai"])
    prompt = served.client().threads.search(limit=1)[0]["values"]["messages"][0]
    assert prompt["content"] == PROMPT and prompt["id"].startswith("system-prompt-")


@pytest.mark.slow
def test_a_system_message_the_client_sent_stays(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    sent = {"messages": [{"type": "system", "content": "Answer in French."}, {"type": "human", "content": "hi"}]}
    values = client.runs.wait(thread_id, "agent", input=sent)
    assert [(m["type"], m["content"]) for m in values["messages"]] == [
        ("system", "Answer in French."),
        ("human", "hi"),
        ("ai", "echo: hi"),
    ]


@pytest.mark.slow
def test_messages_stored_without_ids_get_the_same_ids_on_every_read(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    checkpointer = served.agent.checkpointer
    assert checkpointer is not None
    # two checkpoints written as an Agent from before message ids wrote them
    state = State(served.agent.state_schema)
    state.set("messages", [ChatMessage.from_system(PROMPT), ChatMessage.from_user("old question")])
    first = checkpointer.commit(
        thread_id, parent_id=None, expected_head=None, delta=state.peek_changes(), step=0, source="input"
    )
    checkpointer.commit(
        thread_id,
        parent_id=first.checkpoint_id,
        expected_head=first.checkpoint_id,
        delta={"messages": extend([ChatMessage.from_assistant("old answer")])},
        step=1,
        source="model",
    )
    assert all("id" not in m.meta for m in served.agent.get_state(thread_id).values["messages"])

    old = client.threads.get_state(thread_id)["values"]
    assert [(m["type"], m["content"]) for m in old["messages"]] == [("human", "old question"), ("ai", "old answer")]
    old_ids = ids(old)
    assert all(old_ids) and len(set(old_ids)) == 2
    assert ids(client.threads.get_state(thread_id)["values"]) == old_ids
    assert ids(client.threads.get(thread_id)["values"]) == old_ids
    history = client.threads.get_history(thread_id)
    assert [ids(h["values"]) for h in history] == [old_ids, old_ids[:1]]
    assert ids(client.threads.search(limit=1)[0]["values"]) == old_ids

    # a new run keeps the old ids, in its stream and in the state; its own messages get ids when they are written
    parts = list(client.runs.stream(thread_id, "agent", input=human("new"), stream_mode=["values", "updates"]))
    values = [p.data for p in parts if p.event == "values"]
    assert all(ids(v)[:2] == old_ids for v in values)
    now = client.threads.get_state(thread_id)["values"]
    assert ids(now)[:2] == old_ids and ids(values[-1]) == ids(now) and len(set(ids(now))) == 4
    stored = served.agent.get_state(thread_id).values["messages"]
    assert [m.meta.get("id") for m in stored[:3]] == [None, None, None] and all(m.meta["id"] for m in stored[3:])

    # an edit of an old message by its id keeps that id
    client.threads.update_state(thread_id, {"messages": [{"type": "ai", "content": "better answer", "id": old_ids[1]}]})
    edited = client.threads.get_state(thread_id)["values"]
    assert ids(edited) == ids(now)
    assert [m["content"] for m in edited["messages"]] == ["old question", "better answer", "new", "echo: new"]


@pytest.mark.parametrize("shown", [False, True])
def test_the_translator_names_chunks_by_their_reply_and_leaves_out_the_prompt(shown: bool) -> None:
    common = {"run_id": "r", "time": 0.0, "thread_id": "t"}
    prompt = ChatMessage.from_system(PROMPT, meta={"id": SYSTEM_PROMPT_ID_PREFIX + "1"})
    sent = ChatMessage.from_system("Answer in French.", meta={"id": "client-system"})
    user = ChatMessage.from_user("hi", meta={"id": "u1"})
    translator = StreamTranslator(
        ["messages-tuple", "updates", "values"], run_id="r", thread_id="t", system_prompt=shown
    )
    translator.start({})
    out = translator.translate(StateChanged(**common, seq=0, key="messages", op="append", items=[prompt, sent, user]))
    out += translator.translate(CheckpointCommitted(**common, seq=1, checkpoint_id="c1", step=0, source="input"))
    expected = [*([prompt.meta["id"]] if shown else []), "client-system", "u1"]
    [(_, update), (_, values)] = out
    assert [m["id"] for m in update["input"]["messages"]] == expected
    assert [m["id"] for m in values["messages"]] == expected
    chunk = ModelChunk(**common, seq=2, step=1, chunk=StreamingChunk(content="hel"), message_id="reply-1")
    [(name, (wire, _))] = translator.translate(chunk)
    assert name == "messages" and wire["id"] == "reply-1"
