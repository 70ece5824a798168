"""
From our Agent's live events (``Agent.stream``/``stream_async``: see :mod:`haystack_state.agent.events`) to what
Hayhooks streams: for a chat completion, the text of the model's replies (Hayhooks' OpenAI router makes them
``delta.content`` chunks and ends with one ``finish_reason="stop"``) and, for Open WebUI, a status event per tool
call; for a Response, the Responses API's named events of one output message, ended by the ``Response``.

Hayhooks' own ``streaming_generator`` helpers run haystack-ai's Agent (they check ``isinstance(..., Agent)``), and
pass the model's tool-call deltas on as ``tool_calls`` chunks, which an OpenAI client takes for calls it must run
itself. Here the tools run on the server: the client sees their activity as status events, or nothing.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from hayhooks.events import create_notification_event, create_status_event
from hayhooks.open_webui import create_replace_event

from haystack_state.agent.events import AgentEvent, ModelChunk, ModelReply, ToolCallFinished, ToolCallStarted

__all__ = ["ChatStreamer", "ResponseStreamer", "SSEEvent", "usage_of"]


class SSEEvent:
    """
    A named server-sent event of the Responses API, as Hayhooks' OpenAI router (``fastapi-openai-compat``) sends it:
    any object with ``to_event_dict()`` is sent as it is, its ``type`` as the event's name.

    :param data: The event's data, with its ``type``.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_event_dict(self) -> dict[str, Any]:
        """The event's data."""
        return self.data


class ChatStreamer:
    """
    Turns one run's events into chat completion stream items: text (``str``) and, with ``status``, Open WebUI status
    events. The texts of the run's model replies are streamed as they come, separated by ``separator``; a reply that
    was not streamed in chunks (a chat generator that does not stream) comes whole when it is complete.

    :param status: Whether tool calls are announced as Open WebUI status events (and failures as notifications).
    :param separator: What goes between the texts of two replies.
    """

    def __init__(self, *, status: bool, separator: str = "\n\n") -> None:
        self.status = status
        self.separator = separator
        self._pieces: list[tuple[int, str]] = []  # (step, text), separators counted with the step they precede
        self._steps_with_text: set[int] = set()

    @property
    def text(self) -> str:
        """The answer so far: the text streamed, less what a failed (and retried) model call had streamed."""
        return "".join(piece for _, piece in self._pieces)

    def _text(self, step: int, text: str) -> list[Any]:
        items: list[Any] = []
        if step not in self._steps_with_text:
            if self._steps_with_text:
                items.append(self.separator)
            self._steps_with_text.add(step)
        items.append(text)
        self._pieces.extend((step, item) for item in items)
        return items

    def _retried(self, step: int) -> list[Any]:
        """A model call of ``step`` failed and is made again: what it streamed is not part of the answer."""
        if step not in self._steps_with_text:
            return []
        self._steps_with_text.discard(step)
        self._pieces = [(at, piece) for at, piece in self._pieces if at != step]
        # what was sent stays with an OpenAI client; Open WebUI replaces the message it shows
        return [create_replace_event(self.text)] if self.status else []

    def note(self, text: str) -> list[Any]:
        """
        Text of the wrapper's own after the run's replies (see ``AgentWrapper.closing_note``).

        :param text: The text.
        :returns: The stream items.
        """
        return self._text(-1, text)

    def feed(self, event: AgentEvent) -> list[Any]:
        """
        The stream items an event makes.

        :param event: The event.
        :returns: Texts and status events (often none).
        """
        if isinstance(event, ModelChunk):
            return self._text(event.step, event.chunk.content) if event.chunk.content else []
        if isinstance(event, ModelReply):
            text = event.message.text
            return self._text(event.step, text) if text and event.step not in self._steps_with_text else []
        if event.type == "retrying" and getattr(event, "kind", None) == "model":
            return self._retried(int(getattr(event, "step", 0)))
        if not self.status:
            return []
        if isinstance(event, ToolCallStarted):
            return [create_status_event(description=f"Calling '{event.tool_name}' tool...", done=False)]
        if isinstance(event, ToolCallFinished):
            if event.error:
                return [
                    create_status_event(description=f"Called '{event.tool_name}' tool", done=True, hidden=True),
                    create_notification_event(f"The '{event.tool_name}' tool failed", notification_type="error"),
                ]
            return [create_status_event(description=f"Called '{event.tool_name}' tool", done=True)]
        return []


def usage_of(outputs: dict[str, Any]) -> dict[str, int] | None:
    """
    A run's token usage in the Responses API's terms (``input_tokens``, ``output_tokens``, ``total_tokens``).

    :param outputs: The run's outputs (``token_usage`` is read).
    :returns: The usage, or None if the replies reported none.
    """
    usage = outputs.get("token_usage") or {}
    if not isinstance(usage, dict):
        return None
    given = int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
    made = int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
    if not given and not made:
        return None
    return {"input_tokens": given, "output_tokens": made, "total_tokens": given + made}


class ResponseStreamer:
    """
    The Responses API's events of one output message (``response.output_item.added``,
    ``response.content_part.added``, ``response.output_text.delta``..., then the ``.done`` events), made from a run's
    text as :class:`ChatStreamer` gives it. Hayhooks' router sends ``response.created`` before them and, for the
    ``Response`` yielded last, ``response.completed``.

    :param separator: What goes between the texts of two replies.
    """

    def __init__(self, separator: str = "\n\n") -> None:
        self.chat = ChatStreamer(status=False, separator=separator)
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self._opened = False

    def _open(self) -> list[SSEEvent]:
        if self._opened:
            return []
        self._opened = True
        item = {"id": self.item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            SSEEvent({"type": "response.output_item.added", "output_index": 0, "item": item}),
            SSEEvent(
                {
                    "type": "response.content_part.added",
                    "item_id": self.item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "part": part,
                }
            ),
        ]

    def feed(self, event: AgentEvent) -> list[SSEEvent]:
        """
        The events an agent event makes.

        :param event: The agent's event.
        :returns: The Responses API events.
        """
        events: list[SSEEvent] = []
        for text in self.chat.feed(event):
            events.extend(self._open())
            events.append(
                SSEEvent(
                    {
                        "type": "response.output_text.delta",
                        "item_id": self.item_id,
                        "output_index": 0,
                        "content_index": 0,
                        "delta": text,
                    }
                )
            )
        return events

    def output_item(self) -> dict[str, Any]:
        """The output message, complete."""
        part = {"type": "output_text", "text": self.chat.text, "annotations": []}
        return {"id": self.item_id, "type": "message", "status": "completed", "role": "assistant", "content": [part]}

    def finish(self) -> list[SSEEvent]:
        """The events that close the output message."""
        events = self._open()
        item = self.output_item()
        part = item["content"][0]
        common = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        return [
            *events,
            SSEEvent({"type": "response.output_text.done", **common, "text": part["text"]}),
            SSEEvent({"type": "response.content_part.done", **common, "part": part}),
            SSEEvent({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ]
