"""
The stream modes of ``runs/stream`` and joined streams, made from the Agent's live events
(:mod:`haystack_state.agent.events`) by a :class:`StreamTranslator`, in the shapes LangGraph's SDK reads:

- ``values``: the thread's state (the wire format of :mod:`haystack_state.server._wire`) after each committed
  checkpoint; when the run stops at an interrupt, once more with ``__interrupt__``.
- ``updates``: each checkpoint's changes, as ``{node: {key: value}}``. An Agent has no graph nodes: the node is the
  checkpoint's source: ``input`` (the run's new messages and values), ``model`` (the model's reply), ``tools`` (the
  tool results and the tools' state writes) or ``update`` (what hooks and the run's end wrote). A key that was
  appended to carries the appended items (as a LangGraph reducer key does), a replaced key its new value, a reset
  key None. A run that stops at an interrupt ends with ``{"__interrupt__": [...]}``.
- ``messages-tuple``: the model's tokens as ``[message chunk, metadata]`` pairs (SSE event ``messages``): an
  ``AIMessageChunk`` dict per streamed chunk (text in ``content``, tool-call deltas in ``tool_call_chunks``), with
  ``{"langgraph_node": "model", "langgraph_step", "thread_id", "run_id"}`` metadata. A reply that did not stream (a
  model without a streaming callback) is sent whole, and so are tool results (node ``tools``).
- ``messages``: LangGraph's own form of the same (see :mod:`haystack_state.server._stream_messages`):
  ``messages/metadata`` once per message, ``messages/partial`` with the reply so far after each chunk, and
  ``messages/complete`` with each finished message (the reply, each tool result).
- ``checkpoints``, ``tasks`` and ``debug``: each checkpoint, and each model call and tool batch as a task, in
  LangGraph's shapes (see :mod:`haystack_state.server._stream_steps`).
- ``custom``: what tools and hooks emit (``RunContext.emit(name, data)``), as ``{"name", "data"}``.
- ``events``: the Agent's own events, unchanged (``AgentEvent.to_dict()``: haystack's message format, not LangChain's
  ``astream_events``).

Within one checkpoint, events come in LangGraph's order: messages, the task's result, ``updates``, ``values``, the
checkpoint.
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
    RunFailed,
    RunStarted,
    StateChanged,
    ToolCallFinished,
    ToolCallStarted,
)
from haystack_state.persistence.codec import encode
from haystack_state.server._interrupts import interrupt_from_requests
from haystack_state.server._stream_messages import MESSAGE_EVENTS, MessageStream
from haystack_state.server._stream_steps import STEP_MODES, StepStream
from haystack_state.server._wire import MESSAGES, conversation_to_wire, message_to_wire, messages_to_wire

__all__ = ["EVENTS_OF_MODE", "STREAM_MODES", "SUPPORTED_STREAM_MODES", "StreamTranslator", "event_names"]

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
#: The SSE event names each mode this server streams sends.
EVENTS_OF_MODE: dict[str, tuple[str, ...]] = {
    "values": ("values",),
    "updates": ("updates",),
    "messages": MESSAGE_EVENTS,
    "messages-tuple": ("messages",),
    "custom": ("custom",),
    "events": ("events",),
    **{mode: (mode,) for mode in STEP_MODES},
}
#: The modes this server streams.
SUPPORTED_STREAM_MODES = tuple(EVENTS_OF_MODE)
INTERRUPT_KEY = "__interrupt__"


def event_names(modes: Iterable[str]) -> set[str]:
    """The SSE event names that carry these modes."""
    return {name for mode in modes for name in EVENTS_OF_MODE.get(mode, ())}


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

    For ``values`` (and ``checkpoints``, ``tasks`` and ``debug``, which carry the state too), the state the run started
    from is given with :meth:`start` (the executor reads it when the run reports its starting checkpoint); the
    translator then applies each ``StateChanged`` to it, so a step costs what it changed, not the size of the state.

    :param modes: The stream modes asked for (unsupported ones are ignored; the request model refuses them).
    :param run_id: The server's run id, in the ``messages`` metadata.
    :param thread_id: The run's thread (None for a stateless run), in the ``messages`` metadata.
    :param system_prompt: Whether ``messages`` in ``values`` and ``updates`` keep the Agent's own system prompt.
    """

    def __init__(
        self, modes: Iterable[str], *, run_id: str, thread_id: str | None, system_prompt: bool = False
    ) -> None:
        wanted = set(modes)
        self.names = event_names(wanted)
        self.run_id = run_id
        self.thread_id = thread_id
        self.system_prompt = system_prompt
        self.values: dict[str, Any] | None = None
        #: The checkpoint the run started from (None for a thread's first run), once it started.
        self.started_from: str | None = None
        self.started = False
        self.last_checkpoint: str | None = None
        self._values_mode = "values" in wanted
        self._updates = "updates" in wanted
        self._tuples = "messages-tuple" in wanted
        self._messages = MessageStream() if "messages" in wanted else None
        self._steps = StepStream(wanted, run_id=run_id, thread_id=thread_id) if wanted & set(STEP_MODES) else None
        self._native = "events" in wanted
        self._custom = "custom" in wanted
        self._start_step = 0
        self._changes: dict[str, Any] = {}
        self._appended: list[Any] = []
        self._streamed_steps: set[int] = set()

    @property
    def needs_start_values(self) -> bool:
        """Whether :meth:`start` must be given the starting state (``values`` or a step mode is asked for)."""
        return self._values_mode or self._steps is not None

    def start(self, values: dict[str, Any], step: int = 0) -> None:
        """
        Give the state the run started from.

        :param values: The thread's values at the run's starting checkpoint, in the wire format (``{}`` for none).
        :param step: That checkpoint's step (0 for none).
        """
        self.values = dict(values)
        self._start_step = step

    def translate(self, event: AgentEvent) -> list[tuple[str, Any]]:
        """
        The stream events one Agent event makes.

        :param event: The event.
        :returns: ``(SSE event name, data)`` pairs, in order.
        """
        out: list[tuple[str, Any]] = []
        if self._native:
            out.append(("events", event.to_dict()))
        steps = self._steps
        if isinstance(event, RunStarted):
            self.started = True
            self.started_from = event.checkpoint_id
            if steps is not None:
                steps.started(event.checkpoint_id, self._start_step)
        elif isinstance(event, StateChanged):
            self._state_changed(event)
        elif isinstance(event, CheckpointCommitted):
            out.extend(self._committed(event))
        elif isinstance(event, ModelChunk):
            if steps is not None:
                out.extend(steps.begin("model", self._values_or_none, event.time))
            if self._tuples or self._messages is not None:
                self._streamed_steps.add(event.step)
                chunk, metadata = self._chunk(event), self._metadata("model", event.step)
                if self._tuples:
                    out.append(("messages", [chunk, metadata]))
                if self._messages is not None:
                    out.extend(self._messages.chunk(chunk, metadata))
        elif isinstance(event, ModelReply):
            out.extend(self._replied(event))
        elif isinstance(event, ToolCallStarted):
            if steps is not None:
                out.extend(steps.begin("tools", self._values_or_none, event.time))
                steps.call_started()
        elif isinstance(event, ToolCallFinished):
            if steps is not None:
                steps.call_finished()
        elif isinstance(event, Interrupted):
            out.extend(self._interrupted(event))
        elif isinstance(event, CustomEvent):
            if self._custom:
                out.append(("custom", event.payload()))
        elif isinstance(event, RunFailed) and steps is not None and not event.cancelled:
            out.extend(steps.failed(event.error, event.time, self._values_or_none))
        return out

    def _replied(self, event: ModelReply) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        steps = self._steps
        if steps is not None:
            out.extend(steps.begin("model", self._values_or_none, event.time))
            steps.replied(bool(event.message.tool_calls))
        whole = self._tuples and event.step not in self._streamed_steps  # (a reply that streamed is not sent again)
        if whole or self._messages is not None:
            message = message_to_wire(event.message)
            message["id"] = message["id"] or self._message_id(event.step)
            metadata = self._metadata("model", event.step)
            if whole:
                out.append(("messages", [message, metadata]))
            if self._messages is not None:
                out.extend(self._messages.complete(message, metadata))
        return out

    def _state_changed(self, event: StateChanged) -> None:
        key = event.key
        changes = self._updates or self._steps is not None
        if event.op == "append":
            items = _wire_items(key, list(event.items or []), self.system_prompt)
            if changes:
                self._changes[key] = items
            if self.values is not None:
                self.values[key] = [*(self.values.get(key) or []), *items]
            if key == MESSAGES:
                self._appended.extend(items)
        elif event.op == "replace":
            value = _wire_value(key, event.value, self.thread_id, self.system_prompt)
            if changes:
                self._changes[key] = value
            if self.values is not None:
                self.values[key] = value
        else:
            if changes:
                self._changes[key] = None
            if self.values is not None:
                self.values.pop(key, None)

    def _committed(self, event: CheckpointCommitted) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        self.last_checkpoint = event.checkpoint_id
        if (self._tuples or self._messages is not None) and event.source == "tools":
            metadata = self._metadata("tools", event.step)
            for item in self._appended:
                if item.get("type") != "tool":
                    continue
                if self._tuples:
                    out.append(("messages", [item, metadata]))
                if self._messages is not None:
                    named = item if item.get("id") else {**item, "id": f"run-{self.run_id}-{item.get('tool_call_id')}"}
                    out.extend(self._messages.complete(named, metadata))
        steps = self._steps
        if steps is not None:
            out.extend(steps.finished(event.source, self._changes, event.time))
        if self._updates and self._changes:
            out.append(("updates", {event.source: self._changes}))
        now = self._values_now() if self.values is not None else None
        if self._values_mode and now is not None:
            out.append(("values", now))
        if steps is not None:
            out.extend(steps.checkpoint(event.checkpoint_id, event.step, event.source, now, event.time))
        self._changes, self._appended = {}, []
        return out

    def _interrupted(self, event: Interrupted) -> list[tuple[str, Any]]:
        interrupts = interrupt_from_requests(event.requests, self.last_checkpoint or "")
        out: list[tuple[str, Any]] = []
        if self._steps is not None:
            out.extend(self._steps.interrupted(interrupts, event.time))
        if self._updates:
            out.append(("updates", {INTERRUPT_KEY: interrupts}))
        if self._values_mode and self.values is not None:
            out.append(("values", {**self._values_now(), INTERRUPT_KEY: interrupts}))
        return out

    def _values_now(self) -> dict[str, Any]:
        assert self.values is not None
        return {key: list(value) if isinstance(value, list) else value for key, value in self.values.items()}

    def _values_or_none(self) -> dict[str, Any] | None:
        return self._values_now() if self.values is not None else None

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
