"""
The stream modes of ``runs/stream`` and joined streams, made from the Agent's live events
(:mod:`haystack_state.agent.events`) by a :class:`StreamTranslator`, in the shapes LangGraph's SDK reads:

- ``values``: the thread's state (the wire format of :mod:`haystack_state.server.wire`) after each committed
  checkpoint; when the run stops at an interrupt, once more with ``__interrupt__``.
- ``updates``: each checkpoint's changes, as ``{node: {key: value}}``. An Agent has no graph nodes: the node is the
  checkpoint's source: ``input`` (the run's new messages and values), ``model`` (the model's reply), ``tools`` (the
  tool results and the tools' state writes) or ``update`` (what hooks and the run's end wrote). A key that was
  appended to carries the appended items (as a LangGraph reducer key does), a replaced key its new value, a reset
  key None. A run that stops at an interrupt ends with ``{"__interrupt__": [...]}``.
- ``messages`` (and its alias ``messages-tuple``): the model's tokens as ``[message chunk, metadata]`` pairs (SSE
  event ``messages``), as LangGraph's messages-tuple mode sends them: an ``AIMessageChunk`` dict per streamed chunk
  (text in ``content``, tool-call deltas in ``tool_call_chunks``), with ``{"langgraph_node": "model",
  "langgraph_step", "thread_id", "run_id"}`` metadata. A reply that did not stream (a model without a streaming
  callback) is sent whole, and so are tool results (node ``tools``).
- ``custom``: what tools and hooks emit (``RunContext.emit(name, data)``), as ``{"name", "data"}``.
- ``events``: the Agent's own events, unchanged (``AgentEvent.to_dict()``: haystack's message format, not LangChain's
  ``astream_events``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from haystack_state.agent.events import (
    AgentEvent,
    CheckpointCommitted,
    CustomEvent,
    Interrupted,
    ModelChunk,
    ModelReply,
    RunStarted,
    StateChanged,
)
from haystack_state.persistence.codec import encode
from haystack_state.server.interrupts import interrupt_from_requests
from haystack_state.server.wire import MESSAGES, conversation_to_wire, message_to_wire, messages_to_wire

__all__ = ["EVENT_OF_MODE", "STREAM_MODES", "SUPPORTED_STREAM_MODES", "StreamTranslator", "event_names"]

#: Every mode LangGraph's SDK may ask for.
STREAM_MODES = (
    "values",
    "messages",
    "updates",
    "events",
    "tasks",
    "checkpoints",
    "debug",
    "custom",
    "messages-tuple",
    "tools",
    "lifecycle",
)
#: The modes this server streams.
SUPPORTED_STREAM_MODES = ("values", "updates", "messages", "messages-tuple", "custom", "events")
#: The SSE event name of each supported mode.
EVENT_OF_MODE = {mode: "messages" if mode.startswith("messages") else mode for mode in SUPPORTED_STREAM_MODES}
INTERRUPT_KEY = "__interrupt__"


def event_names(modes: Iterable[str]) -> set[str]:
    """The SSE event names that carry these modes."""
    return {EVENT_OF_MODE[mode] for mode in modes if mode in EVENT_OF_MODE}


def _wire_items(key: str, items: list[Any], system_prompt: bool) -> list[Any]:
    if key == MESSAGES:
        return messages_to_wire(items, system_prompt=system_prompt)
    encoded = encode(list(items), key=key)
    return list(encoded) if isinstance(encoded, list) else [encoded]


def _wire_value(key: str, value: Any, thread_id: str | None, system_prompt: bool) -> Any:
    if key == MESSAGES and isinstance(value, list):
        return conversation_to_wire(value, thread_id, system_prompt=system_prompt)
    return encode(value, key=key)


class StreamTranslator:
    """
    Turns one run's events into the stream events of the modes a client asked for (pure: no I/O).

    For ``values``, the state the run started from is given with :meth:`start` (the executor reads it when the run
    reports its starting checkpoint); the translator then applies each ``StateChanged`` to it, so a step costs what it
    changed, not the size of the state.

    :param modes: The stream modes asked for (unsupported ones are ignored; the request model refuses them).
    :param run_id: The server's run id, in the ``messages`` metadata.
    :param thread_id: The run's thread (None for a stateless run), in the ``messages`` metadata.
    :param system_prompt: Whether ``messages`` in ``values`` and ``updates`` keep the Agent's own system prompt.
    """

    def __init__(
        self, modes: Iterable[str], *, run_id: str, thread_id: str | None, system_prompt: bool = False
    ) -> None:
        self.names = event_names(modes)
        self.run_id = run_id
        self.thread_id = thread_id
        self.system_prompt = system_prompt
        self.values: dict[str, Any] | None = None
        #: The checkpoint the run started from (None for a thread's first run), once it started.
        self.started_from: str | None = None
        self.started = False
        self.last_checkpoint: str | None = None
        self._changes: dict[str, Any] = {}
        self._appended: list[Any] = []
        self._streamed_steps: set[int] = set()

    @property
    def needs_start_values(self) -> bool:
        """Whether :meth:`start` must be given the starting state (the ``values`` mode is asked for)."""
        return "values" in self.names

    def start(self, values: dict[str, Any]) -> None:
        """
        Give the state the run started from.

        :param values: The thread's values at the run's starting checkpoint, in the wire format (``{}`` for none).
        """
        self.values = dict(values)

    def translate(self, event: AgentEvent) -> list[tuple[str, Any]]:
        """
        The stream events one Agent event makes.

        :param event: The event.
        :returns: ``(SSE event name, data)`` pairs, in order.
        """
        out: list[tuple[str, Any]] = []
        if "events" in self.names:
            out.append(("events", event.to_dict()))
        if isinstance(event, RunStarted):
            self.started = True
            self.started_from = event.checkpoint_id
        elif isinstance(event, StateChanged):
            self._state_changed(event)
        elif isinstance(event, CheckpointCommitted):
            out.extend(self._committed(event))
        elif isinstance(event, ModelChunk):
            if "messages" in self.names:
                self._streamed_steps.add(event.step)
                out.append(("messages", [self._chunk(event), self._metadata("model", event.step)]))
        elif isinstance(event, ModelReply):
            if "messages" in self.names and event.step not in self._streamed_steps:
                message = message_to_wire(event.message)
                message["id"] = message["id"] or self._message_id(event.step)
                out.append(("messages", [message, self._metadata("model", event.step)]))
        elif isinstance(event, Interrupted):
            out.extend(self._interrupted(event))
        elif isinstance(event, CustomEvent) and "custom" in self.names:
            out.append(("custom", event.payload()))
        return out

    def _state_changed(self, event: StateChanged) -> None:
        key = event.key
        if event.op == "append":
            items = _wire_items(key, list(event.items or []), self.system_prompt)
            if "updates" in self.names:
                self._changes[key] = items
            if self.values is not None:
                self.values[key] = [*(self.values.get(key) or []), *items]
            if key == MESSAGES:
                self._appended.extend(items)
        elif event.op == "replace":
            value = _wire_value(key, event.value, self.thread_id, self.system_prompt)
            if "updates" in self.names:
                self._changes[key] = value
            if self.values is not None:
                self.values[key] = value
        else:
            if "updates" in self.names:
                self._changes[key] = None
            if self.values is not None:
                self.values.pop(key, None)

    def _committed(self, event: CheckpointCommitted) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        self.last_checkpoint = event.checkpoint_id
        if "messages" in self.names and event.source == "tools":
            metadata = self._metadata("tools", event.step)
            out.extend(("messages", [item, metadata]) for item in self._appended if item.get("type") == "tool")
        if "updates" in self.names and self._changes:
            out.append(("updates", {event.source: self._changes}))
        if "values" in self.names and self.values is not None:
            out.append(("values", self._values_now()))
        self._changes, self._appended = {}, []
        return out

    def _interrupted(self, event: Interrupted) -> list[tuple[str, Any]]:
        interrupts = interrupt_from_requests(event.requests, self.last_checkpoint or "")
        out: list[tuple[str, Any]] = []
        if "updates" in self.names:
            out.append(("updates", {INTERRUPT_KEY: interrupts}))
        if "values" in self.names and self.values is not None:
            out.append(("values", {**self._values_now(), INTERRUPT_KEY: interrupts}))
        return out

    def _values_now(self) -> dict[str, Any]:
        assert self.values is not None
        return {key: list(value) if isinstance(value, list) else value for key, value in self.values.items()}

    def _message_id(self, step: int) -> str:
        return f"run-{self.run_id}-{step}"

    def _metadata(self, node: str, step: int) -> dict[str, Any]:
        return {"run_id": self.run_id, "thread_id": self.thread_id, "langgraph_node": node, "langgraph_step": step}

    def _chunk(self, event: ModelChunk) -> dict[str, Any]:
        chunk = event.chunk
        extra: dict[str, Any] = {}
        if chunk.reasoning is not None:
            extra["reasoning"] = chunk.reasoning.reasoning_text
        return {
            "type": "AIMessageChunk",
            "content": chunk.content,
            "id": event.message_id or self._message_id(event.step),
            "name": None,
            "tool_calls": [],
            "invalid_tool_calls": [],
            "tool_call_chunks": [
                {
                    "name": delta.tool_name,
                    "args": delta.arguments,
                    "id": delta.id,
                    "index": delta.index,
                    "type": "tool_call_chunk",
                }
                for delta in chunk.tool_calls or []
            ],
            "additional_kwargs": extra,
            "response_metadata": {"finish_reason": chunk.finish_reason} if chunk.finish_reason else {},
        }
