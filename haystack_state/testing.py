"""
Test utilities: ``ScriptedChatGenerator``, a deterministic chat generator that needs no API key.

It replays a script of replies (or asks a policy callable) and behaves like a real Haystack chat generator: it
accepts ``tools``, streams ``StreamingChunk``s, gives tool calls ids and reports ``usage`` in the reply meta.
"""

import copy
import inspect
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from haystack import component, default_from_dict, default_to_dict
from haystack.dataclasses import (
    ChatMessage,
    ComponentInfo,
    StreamingCallbackT,
    StreamingChunk,
    ToolCall,
    ToolCallDelta,
    select_streaming_callback,
)
from haystack.dataclasses.streaming_chunk import FinishReason
from haystack.tools import ToolsType, flatten_tools_or_toolsets
from haystack.tools.tool import Tool
from haystack.utils import deserialize_callable, serialize_callable

from haystack_state.errors import HaystackStateError

ToolCallSpec = tuple[str, dict[str, Any]]
"""One scripted tool call: ``(tool_name, arguments)``. A two-item list ``[tool_name, arguments]`` is accepted too."""

ScriptReply = str | ChatMessage | ToolCallSpec | Sequence[ToolCallSpec | list[Any]] | dict[str, Any]
"""One scripted reply: a text, a ready ``ChatMessage``, tool calls, or ``{"text": ..., "tool_calls": [...]}``."""

Policy = Callable[[list[ChatMessage], list[Tool]], ScriptReply]
"""A callable that decides the reply from the messages and the tools of a call."""


class ScriptError(HaystackStateError, RuntimeError):
    """A ``ScriptedChatGenerator`` cannot produce the reply it was asked for (script exhausted, unknown tool)."""


@dataclass(frozen=True)
class _Reply:
    text: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    message: ChatMessage | None = None

    def to_serializable(self) -> Any:
        if self.message is not None:
            return {"chat_message": self.message.to_dict()}
        calls = [[name, copy.deepcopy(args)] for name, args in self.tool_calls]
        if not calls:
            return self.text
        return calls if self.text is None else {"text": self.text, "tool_calls": calls}


@dataclass
class ScriptedCall:
    """
    What one call of a ``ScriptedChatGenerator`` received, and what it replied.

    :param number: The 1-based number of the call over the generator's life (since the last ``reset``).
    :param messages: The messages the call received.
    :param tools: The tools the call received, flattened (Toolsets expanded).
    :param generation_kwargs: The ``generation_kwargs`` the call received.
    :param streamed: Whether a streaming callback was given.
    :param reply: The reply returned, or ``None`` if the call raised.
    """

    number: int
    messages: list[ChatMessage]
    tools: list[Tool]
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    streamed: bool = False
    reply: ChatMessage | None = None

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools the call received, in order."""
        return [t.name for t in self.tools]


def _parse_tool_call(value: Any, where: str) -> ToolCallSpec:
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
        return value[0], dict(value[1])
    raise TypeError(f"{where}: a tool call must be a (tool_name, arguments_dict) pair, got {value!r}.")


def _parse_reply(value: Any, where: str) -> _Reply:
    """Normalize one scripted (or policy) reply into a ``_Reply``."""
    if isinstance(value, ChatMessage):
        return _Reply(message=value)
    if isinstance(value, str):
        return _Reply(text=value)
    if isinstance(value, dict):
        if "chat_message" in value and len(value) == 1:
            return _Reply(message=ChatMessage.from_dict(value["chat_message"]))
        unknown = set(value) - {"text", "tool_calls"}
        text = value.get("text")
        if unknown or not (text is None or isinstance(text, str)):
            raise TypeError(f"{where}: a dict reply takes 'text' (str) and 'tool_calls' only, got {value!r}.")
        calls = tuple(_parse_tool_call(c, where) for c in value.get("tool_calls") or [])
        return _Reply(text=text, tool_calls=calls)
    if isinstance(value, tuple | list):
        if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
            return _Reply(tool_calls=(_parse_tool_call(value, where),))  # a single (name, args) call
        return _Reply(tool_calls=tuple(_parse_tool_call(c, where) for c in value))
    raise TypeError(
        f"{where}: a reply must be a str, a ChatMessage, a list of (tool_name, arguments) pairs or a dict with "
        f"'text' and/or 'tool_calls', got {type(value).__name__}."
    )


def _estimate_tokens(text: str) -> int:
    """A cheap deterministic token estimate: one token per four characters, rounded up."""
    return (len(text) + 3) // 4


def _message_text(message: ChatMessage) -> str:
    parts = list(message.texts)
    parts += [f"{tc.tool_name}{json.dumps(tc.arguments, sort_keys=True)}" for tc in message.tool_calls]
    parts += [str(r.result) for r in message.tool_call_results]
    return " ".join(parts)


@component
class ScriptedChatGenerator:
    """
    A deterministic chat generator for tests, notebooks and offline demos: no model, no API key.

    Each call returns the next reply of ``script``, or asks ``policy``. A reply is a ``str`` (text), a
    ``ChatMessage`` (returned as is), a list of ``(tool_name, arguments)`` tool calls, or a dict
    ``{"text": ..., "tool_calls": [...]}`` for both. Tool calls get ids ``call_1``, ``call_2``, ... counted over the
    generator's life; replies carry ``model``, ``finish_reason`` and ``usage`` meta like a real generator.

    ```python
    generator = ScriptedChatGenerator(script=[[("search", {"query": "haystack"})], "Haystack is a framework."])
    ```
    """

    def __init__(
        self,
        script: Sequence[ScriptReply] | None = None,
        policy: Policy | None = None,
        *,
        chunk_size: int = 8,
        model: str = "scripted",
        validate_tools: bool = True,
        streaming_callback: StreamingCallbackT | None = None,
    ) -> None:
        """
        Create a ScriptedChatGenerator. Give exactly one of ``script`` and ``policy``.

        :param script: The replies to return, one per call, in order.
        :param policy: A callable ``(messages, tools) -> reply`` deciding each reply, with a reply in any form
            ``script`` accepts.
        :param chunk_size: The number of characters per streamed text (and tool-arguments) chunk.
        :param model: The model name reported in the reply meta.
        :param validate_tools: Whether a reply calling a tool that was not passed in ``tools`` raises ``ScriptError``.
        :param streaming_callback: A default streaming callback; the one given to ``run`` takes precedence.
        :raises ValueError: If both or neither of ``script`` and ``policy`` are given, or ``chunk_size`` < 1.
        :raises TypeError: If a scripted reply has an unsupported form.
        """
        if (script is None) == (policy is None):
            raise ValueError("ScriptedChatGenerator needs exactly one of `script` and `policy`.")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}.")
        if isinstance(script, str | ChatMessage | dict):
            raise TypeError("`script` must be a list of replies; wrap a single reply in a list.")
        self._replies = [_parse_reply(r, f"Script reply {i}") for i, r in enumerate(script or [], start=1)]
        self.policy = policy
        self.chunk_size = chunk_size
        self.model = model
        self.validate_tools = validate_tools
        self.streaming_callback = streaming_callback
        self.calls: list[ScriptedCall] = []
        self._position = 0
        self._next_call_id = 1
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int | None:
        """How many scripted replies are left, or ``None`` with a policy."""
        return None if self.policy is not None else len(self._replies) - self._position

    def reset(self) -> None:
        """Rewind the script, restart tool-call ids at ``call_1`` and forget the recorded calls."""
        with self._lock:
            self.calls = []
            self._position = 0
            self._next_call_id = 1

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize this component to a dictionary.

        :returns: The serialized component.
        """
        return default_to_dict(
            self,
            script=None if self.policy is not None else [r.to_serializable() for r in self._replies],
            policy=serialize_callable(self.policy) if self.policy is not None else None,
            chunk_size=self.chunk_size,
            model=self.model,
            validate_tools=self.validate_tools,
            streaming_callback=serialize_callable(self.streaming_callback) if self.streaming_callback else None,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ScriptedChatGenerator":
        """
        Deserialize this component from a dictionary.

        :param data: The dictionary ``to_dict`` produced.
        :returns: The deserialized component.
        """
        data = {**data, "init_parameters": dict(data.get("init_parameters", {}))}
        params = data["init_parameters"]
        for key in ("policy", "streaming_callback"):
            if params.get(key):
                params[key] = deserialize_callable(params[key])
        return default_from_dict(cls, data)

    @component.output_types(replies=list[ChatMessage])
    def run(
        self,
        messages: list[ChatMessage] | str,
        tools: ToolsType | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, list[ChatMessage]]:
        """
        Return the next scripted reply.

        :param messages: The conversation so far; a string is taken as one user message.
        :param tools: The tools the reply may call: Tools, Toolsets, or a list mixing both.
        :param streaming_callback: Called with each ``StreamingChunk`` of the reply.
        :param generation_kwargs: Recorded in ``calls``; otherwise ignored.
        :returns: A dictionary with ``replies``: a list with one assistant ``ChatMessage``.
        :raises ScriptError: If the script is exhausted or the reply calls a tool not in ``tools``.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        reply, chunks = self._respond(messages, tools, generation_kwargs, streaming=callback is not None)
        if callback is not None:
            for chunk in chunks:
                callback(chunk)
        return {"replies": [reply]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self,
        messages: list[ChatMessage] | str,
        tools: ToolsType | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, list[ChatMessage]]:
        """
        Return the next scripted reply; the asynchronous version of ``run``, with the same parameters.

        :param messages: The conversation so far; a string is taken as one user message.
        :param tools: The tools the reply may call: Tools, Toolsets, or a list mixing both.
        :param streaming_callback: Called (and awaited, if async) with each ``StreamingChunk`` of the reply.
        :param generation_kwargs: Recorded in ``calls``; otherwise ignored.
        :returns: A dictionary with ``replies``: a list with one assistant ``ChatMessage``.
        :raises ScriptError: If the script is exhausted or the reply calls a tool not in ``tools``.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        reply, chunks = self._respond(messages, tools, generation_kwargs, streaming=callback is not None)
        if callback is not None:
            for chunk in chunks:
                result = callback(chunk)
                if inspect.isawaitable(result):
                    await result
        return {"replies": [reply]}

    # --- internals ----------------------------------------------------------------------------------

    def _respond(
        self,
        messages: list[ChatMessage] | str,
        tools: ToolsType | None,
        generation_kwargs: dict[str, Any] | None,
        *,
        streaming: bool,
    ) -> tuple[ChatMessage, list[StreamingChunk]]:
        msgs = [ChatMessage.from_user(messages)] if isinstance(messages, str) else list(messages)
        flat = flatten_tools_or_toolsets(list(tools) if isinstance(tools, Sequence) else tools)
        with self._lock:
            record = ScriptedCall(len(self.calls) + 1, msgs, flat, dict(generation_kwargs or {}), streaming)
            self.calls.append(record)
            if self.policy is not None:
                reply = _parse_reply(self.policy(list(msgs), list(flat)), f"Policy reply to call {record.number}")
            elif self._position >= len(self._replies):
                raise ScriptError(
                    f"ScriptedChatGenerator script is exhausted: it has {len(self._replies)} "
                    f"repl{'y' if len(self._replies) == 1 else 'ies'}, and call {record.number} asked for one more. "
                    "Add replies to the script (or use a policy)."
                )
            else:
                reply = self._replies[self._position]
            self._check_tools(reply, flat, record.number)
            if self.policy is None:
                self._position += 1
            message = self._build(reply, msgs, flat)
            record.reply = message
        return message, self._chunks(message) if streaming else []

    def _check_tools(self, reply: _Reply, tools: list[Tool], number: int) -> None:
        source = "policy reply" if self.policy is not None else f"script reply {self._position + 1}"
        if not self.validate_tools:
            return
        names = [c.tool_name for c in reply.message.tool_calls] if reply.message else [n for n, _ in reply.tool_calls]
        available = [t.name for t in tools]
        for name in names:
            if name not in available:
                listed = ", ".join(f"'{n}'" for n in available) if available else "none (no tools were passed)"
                raise ScriptError(
                    f"The {source} (for call {number}) calls tool '{name}', which was not passed in `tools`. "
                    f"Available tools: {listed}."
                )

    def _build(self, reply: _Reply, messages: list[ChatMessage], tools: list[Tool]) -> ChatMessage:
        if reply.message is not None:
            return reply.message
        calls = []
        for name, args in reply.tool_calls:
            calls.append(ToolCall(tool_name=name, arguments=copy.deepcopy(args), id=f"call_{self._next_call_id}"))
            self._next_call_id += 1
        prompt = " ".join([*(_message_text(m) for m in messages), *(json.dumps(t.tool_spec) for t in tools)])
        completion = _message_text(ChatMessage.from_assistant(text=reply.text, tool_calls=calls))
        usage = {"prompt_tokens": _estimate_tokens(prompt), "completion_tokens": _estimate_tokens(completion)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        finish: Literal["stop", "tool_calls"] = "tool_calls" if calls else "stop"
        meta = {"model": self.model, "index": 0, "finish_reason": finish, "usage": usage}
        return ChatMessage.from_assistant(text=reply.text, tool_calls=calls, meta=meta)

    def _chunks(self, message: ChatMessage) -> list[StreamingChunk]:
        """Split a reply into streaming chunks: text first (block 0), then one block per tool call."""
        info = ComponentInfo.from_component(self)
        meta: dict[str, Any] = {"model": message.meta.get("model", self.model), "index": 0}
        size, chunks, block = self.chunk_size, [], 0
        text = message.text or ""
        for start in range(0, len(text), size):
            piece = text[start : start + size]
            chunks.append(StreamingChunk(piece, dict(meta), info, index=0, start=start == 0))
        block += bool(text)
        for call in message.tool_calls:
            arguments = json.dumps(call.arguments)
            head = ToolCallDelta(index=block, tool_name=call.tool_name, id=call.id, arguments=arguments[:size])
            chunks.append(StreamingChunk("", dict(meta), info, index=block, tool_calls=[head], start=True))
            for start in range(size, len(arguments), size):
                delta = ToolCallDelta(index=block, arguments=arguments[start : start + size])
                chunks.append(StreamingChunk("", dict(meta), info, index=block, tool_calls=[delta]))
            block += 1
        finish: FinishReason = "tool_calls" if message.tool_calls else "stop"
        final_meta = {**meta, "finish_reason": finish, "usage": message.meta.get("usage")}
        chunks.append(StreamingChunk("", final_meta, info, finish_reason=finish))
        return chunks
