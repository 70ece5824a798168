"""
From the Agent's events to what a chat completion streams (:class:`haystack_state.hayhooks._streams.ChatStreamer`),
without a server. Skipped without Hayhooks (the subpackage needs it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
from haystack.dataclasses import ChatMessage, StreamingChunk

pytest.importorskip("hayhooks.events", reason='Hayhooks is not installed: pip install -e ".[hayhooks]"')

from haystack_state.agent.events import AgentEvent, ModelChunk, ModelReply, ToolCallFinished, ToolCallStarted
from haystack_state.hayhooks._streams import ChatStreamer

COMMON: dict[str, Any] = {"run_id": "r", "seq": 0, "time": 0.0}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRetry(AgentEvent):
    """A model call that failed and is made again, as the Agent's retry policy reports it."""

    type: ClassVar[str] = "retrying"
    step: int
    kind: str = "model"


def chunk(step: int, text: str) -> ModelChunk:
    return ModelChunk(**COMMON, step=step, chunk=StreamingChunk(content=text))


def run_events() -> list[AgentEvent]:
    return [
        chunk(1, "Let me "),
        chunk(1, "look."),
        ToolCallStarted(**COMMON, step=1, tool_name="search", call_id="c1", arguments={"query": "bees"}),
        ToolCallFinished(**COMMON, step=1, tool_name="search", call_id="c1", result="{}", error=False, duration=0.1),
        ModelReply(**COMMON, step=2, message=ChatMessage.from_assistant("Bees dance.")),  # not streamed: whole
    ]


def test_text_for_an_openai_client_and_status_events_for_open_webui() -> None:
    plain = ChatStreamer(status=False)
    assert [item for event in run_events() for item in plain.feed(event)] == ["Let me ", "look.", "\n\n", "Bees dance."]
    assert plain.text == "Let me look.\n\nBees dance."

    webui = ChatStreamer(status=True)
    items = [item for event in run_events() for item in webui.feed(event)]
    statuses = [item.to_event_dict() for item in items if not isinstance(item, str)]
    assert [(s["type"], s["data"]["description"], s["data"]["done"]) for s in statuses] == [
        ("status", "Calling 'search' tool...", False),
        ("status", "Called 'search' tool", True),
    ]
    assert webui.text == plain.text


def test_a_retried_model_call_leaves_the_answer() -> None:
    streamer = ChatStreamer(status=True)
    streamer.feed(chunk(1, "Bees da"))
    (replace,) = streamer.feed(ModelRetry(**COMMON, step=1))
    assert replace.to_event_dict() == {"type": "replace", "data": {"content": ""}}
    streamer.feed(chunk(1, "Bees dance."))
    assert streamer.text == "Bees dance."
