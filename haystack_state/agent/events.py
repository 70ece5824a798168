"""
Live events of an Agent run: a closed set of small frozen records that ``Agent.stream`` and ``Agent.stream_async``
yield while the run goes on.

Every event carries the run's id, its sequence number in the run (from 0, no gaps), the time it was made (seconds
since the epoch) and the thread's id (None without a thread). ``to_dict()`` gives a JSON-ready form with a ``type``
tag, which an HTTP layer can send as a server-sent event unchanged. Messages are rendered with
``ChatMessage.to_dict()``; state values with the checkpoint codec (``haystack_state.persistence.codec``), so a
client reads them exactly as a checkpoint stores them.

``StateChanged`` events come from the State's change journal, the one checkpoints are made from: they are emitted
where a checkpoint is committed (or would be, on a run without a thread), so what is streamed is what is stored.
Replaying a run's ``StateChanged`` events onto the state it started from gives its final state.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from haystack.dataclasses import ChatMessage, StreamingChunk

from haystack_state.persistence.codec import encode
from haystack_state.values import to_jsonable

__all__ = [
    "AgentEvent",
    "CheckpointCommitted",
    "CustomEvent",
    "EventSink",
    "Interrupted",
    "ModelChunk",
    "ModelReply",
    "Retrying",
    "RunFailed",
    "RunFinished",
    "RunStarted",
    "StateChanged",
    "ToolCallFinished",
    "ToolCallStarted",
    "apply_state_changes",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentEvent:
    """
    What all events carry.

    :param run_id: The run's id (a fresh UUID per ``run``/``stream`` call).
    :param seq: The event's position in the run, from 0.
    :param time: When it was made, in seconds since the epoch.
    :param thread_id: The durable thread the run is on, or None.
    """

    type: ClassVar[str] = "event"

    run_id: str
    seq: int
    time: float
    thread_id: str | None = None

    def payload(self) -> dict[str, Any]:
        """
        The event's own fields, JSON-ready (everything but the common ones). By default, their values as they are:
        an event with a field that needs rendering (a message, a chunk, state values) overrides this.
        """
        return {name: getattr(self, name) for name in _own_fields(type(self))}

    def to_dict(self) -> dict[str, Any]:
        """
        The event as JSON-compatible data: ``{"type", "run_id", "seq", "time", "thread_id", ...its fields}``.

        :returns: The dict.
        """
        return {
            "type": self.type,
            "run_id": self.run_id,
            "seq": self.seq,
            "time": self.time,
            "thread_id": self.thread_id,
            **self.payload(),
        }


_OWN_FIELDS: dict[type[AgentEvent], tuple[str, ...]] = {}


def _own_fields(cls: type[AgentEvent]) -> tuple[str, ...]:
    """An event class's fields beyond the common ones (``run_id``, ``seq``, ``time``, ``thread_id``), in order."""
    names = _OWN_FIELDS.get(cls)
    if names is None:
        common = {field.name for field in dataclasses.fields(AgentEvent)}
        names = _OWN_FIELDS[cls] = tuple(field.name for field in dataclasses.fields(cls) if field.name not in common)
    return names


def _message(message: ChatMessage | None) -> dict[str, Any] | None:
    return None if message is None else message.to_dict()


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunStarted(AgentEvent):
    """
    The run has started (its inputs are in the state).

    :param checkpoint_id: The thread's head the run started from, or None.
    :param continuing: Whether it continues an unfinished run of the thread.
    """

    type: ClassVar[str] = "run_started"
    checkpoint_id: str | None = None
    continuing: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelChunk(AgentEvent):
    """
    A piece of the model's reply as it streams: text, and tool-call deltas.

    :param step: The step (model call) it belongs to, from 1.
    :param chunk: haystack's ``StreamingChunk``.
    :param message_id: The id the reply gets (``meta["id"]`` of the step's ``ModelReply`` message).
    """

    type: ClassVar[str] = "model_chunk"
    step: int
    chunk: StreamingChunk
    message_id: str | None = None

    def payload(self) -> dict[str, Any]:
        chunk = self.chunk
        return {
            "step": self.step,
            "message_id": self.message_id,
            "content": chunk.content,
            "index": chunk.index,
            "start": chunk.start,
            "finish_reason": chunk.finish_reason,
            "tool_calls": [
                {"index": delta.index, "id": delta.id, "tool_name": delta.tool_name, "arguments": delta.arguments}
                for delta in chunk.tool_calls or []
            ],
            "reasoning": chunk.reasoning.reasoning_text if chunk.reasoning is not None else None,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelReply(AgentEvent):
    """
    The model's whole reply at a step.

    :param step: The step, from 1.
    :param message: The reply.
    """

    type: ClassVar[str] = "model_reply"
    step: int
    message: ChatMessage

    def payload(self) -> dict[str, Any]:
        return {"step": self.step, "message": self.message.to_dict()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolCallStarted(AgentEvent):
    """
    A tool call has started.

    :param step: The step whose reply made the call.
    :param tool_name: The tool.
    :param call_id: The call's id.
    :param arguments: The model's arguments.
    """

    type: ClassVar[str] = "tool_call_started"
    step: int
    tool_name: str
    call_id: str | None
    arguments: Mapping[str, Any]

    def payload(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tool_name": self.tool_name,
            "call_id": self.call_id,
            "arguments": to_jsonable(dict(self.arguments)),
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolCallFinished(AgentEvent):
    """
    A tool call has finished (and, unless it failed, its writes are merged into the state).

    :param step: The step whose reply made the call.
    :param tool_name: The tool.
    :param call_id: The call's id.
    :param result: The tool result as the model sees it.
    :param error: Whether the call failed.
    :param duration: How long it ran, in seconds.
    """

    type: ClassVar[str] = "tool_call_finished"
    step: int
    tool_name: str
    call_id: str | None
    result: str
    error: bool
    duration: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Retrying(AgentEvent):
    """
    A model or tool call failed with an error its retry policy retries (``Agent(retry_policy=...)``): it is made
    again after ``delay`` seconds. What a failed model attempt streamed (``ModelChunk`` events of the step) is
    superseded by the next attempt's.

    :param step: The step the call belongs to.
    :param kind: ``"model"`` or ``"tool"``.
    :param attempt: The attempt that failed, from 1.
    :param max_attempts: The call's budget of attempts.
    :param delay: Seconds until the next attempt.
    :param error: The attempt's error, ``"Type: message"``.
    :param error_type: The error's class name.
    :param tool_name: The tool (``"tool"`` only).
    :param call_id: The tool call's id (``"tool"`` only).
    """

    type: ClassVar[str] = "retrying"
    step: int
    kind: Literal["model", "tool"]
    attempt: int
    max_attempts: int
    delay: float
    error: str
    error_type: str
    tool_name: str | None = None
    call_id: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StateChanged(AgentEvent):
    """
    A state key changed.

    :param key: The key.
    :param op: ``"append"`` (``items`` were appended), ``"replace"`` (the key now holds ``value``) or ``"reset"``
        (the key holds no value any more).
    :param items: The appended items (``append``).
    :param value: The new value (``replace``).
    """

    type: ClassVar[str] = "state_changed"
    key: str
    op: Literal["append", "replace", "reset"]
    items: list[Any] | None = None
    value: Any = None

    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = {"key": self.key, "op": self.op}
        if self.op == "append":
            data["items"] = encode(list(self.items or []), key=self.key)
        elif self.op == "replace":
            data["value"] = encode(self.value, key=self.key)
        return data


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointCommitted(AgentEvent):
    """
    A checkpoint of the thread was committed.

    :param checkpoint_id: Its id.
    :param step: The thread's step it records.
    :param source: ``"input"``, ``"model"``, ``"tools"`` or ``"update"``.
    """

    type: ClassVar[str] = "checkpoint_committed"
    checkpoint_id: str
    step: int
    source: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interrupted(AgentEvent):
    """
    The run stopped for a human: the requests waiting for ``Agent.resume``.

    :param requests: The pending interrupt requests (JSON-ready dicts: ``id``, ``kind``, ``tool_name``, ``call_id``,
        ``value``).
    """

    type: ClassVar[str] = "interrupted"
    requests: list[dict[str, Any]]

    def payload(self) -> dict[str, Any]:
        return {"requests": [dict(request) for request in self.requests]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CustomEvent(AgentEvent):
    """
    Anything a tool or hook emits (``RunContext.emit`` or ``state.emit``).

    :param name: The event's name.
    :param data: Its data (rendered to JSON with the codec).
    """

    type: ClassVar[str] = "custom"
    name: str
    data: Any = None

    def payload(self) -> dict[str, Any]:
        return {"name": self.name, "data": encode(self.data, where=f"custom event '{self.name}'")}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFinished(AgentEvent):
    """
    The run finished: ``outputs`` is the same dict ``Agent.run`` returns.

    :param outputs: The run's outputs.
    """

    type: ClassVar[str] = "run_finished"
    outputs: dict[str, Any]

    def payload(self) -> dict[str, Any]:
        outputs = dict(self.outputs)
        rendered: dict[str, Any] = {}
        for key, value in outputs.items():
            if key == "last_message":
                rendered[key] = _message(value)
            elif key == "messages":
                rendered[key] = [message.to_dict() for message in value]
            else:
                rendered[key] = encode(value, key=key)
        return {"outputs": rendered}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFailed(AgentEvent):
    """
    The run failed: the error the caller of ``run`` would get.

    :param error: The error's message.
    :param error_type: Its class name.
    :param cancelled: Whether the run was cancelled (the consumer stopped listening) rather than failing.
    """

    type: ClassVar[str] = "run_failed"
    error: str
    error_type: str
    cancelled: bool = False


class EventSink:
    """
    Numbers, stamps and delivers one run's events to a listener. Thread-safe (tool calls run in worker threads).

    :param listener: Receives each event.
    :param thread_id: The run's thread, if any.
    """

    def __init__(self, listener: Callable[[AgentEvent], None], thread_id: str | None = None) -> None:
        self.listener = listener
        #: The step (model call) under way, from 1: the loop sets it before each model call.
        self.step = 0
        #: The id of the reply under way (its chunks carry it): the loop sets it before each model call.
        self.message_id: str | None = None
        self.run_id = str(uuid.uuid4())
        self.thread_id = thread_id
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def emit(self, event_type: type[AgentEvent], **fields: object) -> None:
        """
        Make an event of ``event_type`` with ``fields`` and deliver it.

        :param event_type: The event class.
        :param fields: Its own fields.
        """
        shape = _SHAPES.get(event_type) or _shape(event_type)
        with self._lock:
            if shape is _PLAIN:
                event = event_type(
                    run_id=self.run_id, seq=next(self._counter), time=time.time(), thread_id=self.thread_id, **fields
                )
            else:  # what the dataclass's __init__ does, without its frozen setattr per field (a stream makes many)
                defaults, names = shape
                event = _new(event_type)
                values = event.__dict__
                values.update(defaults)
                values.update(fields)
                values["run_id"] = self.run_id
                values["seq"] = next(self._counter)
                values["time"] = time.time()
                values["thread_id"] = self.thread_id
                if values.keys() != names:
                    raise TypeError(f"{event_type.__name__} takes {sorted(names)}, got {sorted(values)}")
            self.listener(event)


_new = object.__new__
#: An event class made by its ``__init__`` (one with a ``__post_init__``, a default factory or slots).
_PLAIN: tuple[dict[str, Any], frozenset[str]] = ({}, frozenset())
#: By event class: its fields' defaults and all its fields' names, or ``_PLAIN``.
_SHAPES: dict[type[AgentEvent], tuple[dict[str, Any], frozenset[str]]] = {}


def _shape(event_type: type[AgentEvent]) -> tuple[dict[str, Any], frozenset[str]]:
    """How :meth:`EventSink.emit` makes events of a class (worked out once per class)."""
    fields = dataclasses.fields(event_type)
    plain = (
        hasattr(event_type, "__post_init__")
        or hasattr(event_type, "__slots__")
        or any(field.default_factory is not dataclasses.MISSING for field in fields)
    )
    if plain:
        shape = _PLAIN
    else:
        defaults = {field.name: field.default for field in fields if field.default is not dataclasses.MISSING}
        shape = (defaults, frozenset(field.name for field in fields))
    _SHAPES[event_type] = shape
    return shape


def apply_state_changes(values: Mapping[str, Any], events: list[AgentEvent]) -> dict[str, Any]:
    """
    Replay ``StateChanged`` events onto a state's values (other events are skipped).

    :param values: The values the run started from (``State.data``).
    :param events: The run's events, in order.
    :returns: The values after the changes.
    """
    result = {key: list(value) if isinstance(value, list) else value for key, value in values.items()}
    for event in events:
        if not isinstance(event, StateChanged):
            continue
        if event.op == "append":
            current = result.get(event.key)
            result[event.key] = [*(current or []), *(event.items or [])]
        elif event.op == "replace":
            result[event.key] = list(event.value) if isinstance(event.value, list) else event.value
        else:
            result.pop(event.key, None)
    return result
