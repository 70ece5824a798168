"""
The rules of :mod:`haystack_state.hayhooks._conversation`, without a server: which thread a chat completion runs on,
what in its messages is new, and the ids of Responses. Skipped without Hayhooks (the subpackage needs it).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("hayhooks.events", reason='Hayhooks is not installed: pip install -e ".[hayhooks]"')

from haystack_state.hayhooks._conversation import (
    ClientMessage,
    chat_thread_id,
    client_messages,
    parse_response_id,
    plan_chat_turn,
    response_id,
)


def chat(*pairs: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in pairs]


def test_the_thread_is_named_by_metadata_then_headers_then_a_hash() -> None:
    messages = client_messages(chat(("system", "Be brief."), ("user", "hi")))
    both = {"metadata": {"conversation_id": "c1"}}
    headers = {"X-Thread-Id": "h1", "X-OpenWebUI-Chat-Id": "w1"}
    assert chat_thread_id(both, headers, messages) == ("c1", "metadata.conversation_id")
    assert chat_thread_id({}, headers, messages) == ("h1", "header x-thread-id")
    assert chat_thread_id({}, {"x-openwebui-chat-id": "w1"}, messages) == ("w1", "header x-openwebui-chat-id")
    anyone, how = chat_thread_id({}, None, messages)
    assert how == "hash" and anyone.startswith("chat-")
    assert chat_thread_id({}, None, [*messages, ClientMessage("user", "more")])[0] == anyone  # the start decides
    ann = chat_thread_id({"user": "ann"}, None, messages)[0]
    assert ann not in {anyone, chat_thread_id({"user": "bob"}, None, messages)[0]}
    assert chat_thread_id({}, {"X-OpenWebUI-User-Id": "ann"}, messages)[0] == ann
    other_system = client_messages(chat(("system", "Be long."), ("user", "hi")))
    assert chat_thread_id({}, None, other_system)[0] != anyone


def test_what_is_new_in_a_request() -> None:
    history = client_messages(chat(("user", "a"), ("assistant", "A"), ("user", "b"), ("assistant", "B"), ("user", "c")))
    assert plan_chat_turn(None, history).kind == "new"
    append = plan_chat_turn(["a", "b"], history)
    assert (append.kind, [m.text for m in append.messages]) == ("append", ["c"])
    again = plan_chat_turn(["a", "b", "c"], history)
    assert (again.kind, again.index) == ("regenerate", 2)
    assert (plan_chat_turn(["a", "b", "c", "d"], history[:3]).kind, plan_chat_turn(["a", "b"], history[:1]).index) == (
        "regenerate",
        0,
    )
    edit = plan_chat_turn(["a", "x", "y"], history)
    assert (edit.kind, edit.index, [m.text for m in edit.messages]) == ("edit", 1, ["b", "c"])
    only_new = plan_chat_turn(["a", "b"], client_messages(chat(("user", "z"))))
    assert (only_new.kind, [m.text for m in only_new.messages]) == ("append", ["z"])
    with pytest.raises(ValueError, match="no user message"):
        plan_chat_turn(["a"], client_messages(chat(("system", "s"))))


def test_client_messages_keep_text_and_drop_tool_traffic() -> None:
    kept = client_messages(
        [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": "42", "tool_call_id": "1"},
            {"type": "function_call_output", "call_id": "1", "output": "42"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]},
        ]
    )
    assert kept == [ClientMessage("system", "rules"), ClientMessage("user", "look"), ClientMessage("user", "and?")]


def test_a_response_id_names_its_checkpoint_and_thread() -> None:
    made = response_id("01a2-b3", "resp-x_y")
    assert made == "resp_01a2-b3_resp-x_y" and parse_response_id(made) == ("01a2-b3", "resp-x_y")
    assert parse_response_id("resp_abc") is None and parse_response_id("chatcmpl-1") is None
