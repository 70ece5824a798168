"""
Test utilities: ``ScriptedChatGenerator``, a deterministic chat generator that needs no API key.

It replays a script of replies (or asks a policy callable) and behaves like a real Haystack chat generator: it
accepts ``tools``, streams ``StreamingChunk``s, gives tool calls ids and reports ``usage`` in the reply meta.
``ScriptedChatGenerator.summarizer()`` is one that writes context summaries deterministically, for the
``Summarize`` context policy.
"""

import copy
import inspect
import json
import threading
from collections import deque
from collections.abc import Sequence
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
from haystack.token_counters import TokenCounter
from haystack.tools import ToolsType, flatten_tools_or_toolsets
from haystack.tools.tool import Tool
from haystack.utils import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.agent.context._tokens import APPROXIMATE_COUNTER, token_meter
from haystack_state.testing._replies import Policy, Reply, ScriptError, ScriptReply, ToolCallSpec, parse_reply
from haystack_state.testing._summarizer import SUMMARY_MAX_LINES, fold_summary

__all__ = [
    "SUMMARY_MAX_LINES",
    "Policy",
    "ScriptError",
    "ScriptReply",
    "ScriptedCall",
    "ScriptedChatGenerator",
    "ToolCallSpec",
    "fold_summary",
]


@dataclass
class ScriptedCall:
    """
    What one call of a ``ScriptedChatGenerator`` received, and what it replied.

    :param number: The 1-based number of the call over the generator's life (since the last ``reset``).
    :param messages: The messages the call received: the very list it was given (not a copy), so do not change it.
    :param tools: The tools the call received, flattened (Toolsets expanded).
    :param generation_kwargs: The ``generation_kwargs`` the call received.
    :param streamed: Whether a streaming callback was given.
    :param reply: The reply returned, or ``None`` if the call raised.
    :param tokens: The size of what the call received (messages and tools' schemas), by the generator's counter.
    """

    number: int
    messages: list[ChatMessage]
    tools: list[Tool]
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    streamed: bool = False
    reply: ChatMessage | None = None
    tokens: int = 0

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools the call received, in order."""
        return [t.name for t in self.tools]


@component
class ScriptedChatGenerator:
    """
    A deterministic chat generator for tests, notebooks and offline demos: no model, no API key.

    Each call returns the next reply of ``script``, or asks ``policy``. A reply is a ``str`` (text), a
    ``ChatMessage`` (returned as is), a list of ``(tool_name, arguments)`` tool calls, or a dict
    ``{"text": ..., "tool_calls": [...]}`` for both. Tool calls get ids ``call_1``, ``call_2``, ... counted over the
    generator's life; replies carry ``model``, ``finish_reason`` and ``usage`` meta like a real generator.

    Each call is recorded in ``calls`` (the last ``record`` calls; ``call_count`` counts them all): the messages it
    received (a copy: an Agent keeps extending the list it sends), the tools, and their size in tokens.

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
        record: int | bool = 100,
        token_counter: TokenCounter | None = None,
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
        :param record: How many of the latest calls ``calls`` keeps (``True``: 100; ``False`` or 0: none), so that
            recording stays bounded over long runs.
        :param token_counter: The haystack ``TokenCounter`` that sizes each call (``calls[i].tokens`` and the reply's
            ``usage``); ``ApproximateTokenCounter`` if None.
        :raises ValueError: If both or neither of ``script`` and ``policy`` are given, ``chunk_size`` < 1 or
            ``record`` < 0.
        :raises TypeError: If a scripted reply has an unsupported form.
        """
        if (script is None) == (policy is None):
            raise ValueError("ScriptedChatGenerator needs exactly one of `script` and `policy`.")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}.")
        if record is True:
            record = 100
        if not isinstance(record, int) or record < 0:
            raise ValueError(f"record must be a number of calls (0 or more) or a bool, got {record!r}.")
        if isinstance(script, str | ChatMessage | dict):
            raise TypeError("`script` must be a list of replies; wrap a single reply in a list.")
        self._replies = [parse_reply(r, f"Script reply {i}") for i, r in enumerate(script or [], start=1)]
        self.policy = policy
        self.chunk_size = chunk_size
        self.model = model
        self.validate_tools = validate_tools
        self.streaming_callback = streaming_callback
        self.record = int(record)
        self.token_counter = token_counter
        self._calls: deque[ScriptedCall] = deque(maxlen=self.record)
        self.call_count = 0
        self._position = 0
        self._next_call_id = 1
        self._lock = threading.Lock()
        #: Whether :meth:`warm_up` was called (and :meth:`close` not since).
        self.is_warmed_up = False
        # The last conversation counted: (the list, its length then, its first and last message then, their tokens).
        self._tally: tuple[list[ChatMessage], int, ChatMessage, ChatMessage, int] | None = None

    @classmethod
    def summarizer(cls, *, model: str = "scripted-summarizer", **kwargs: Any) -> "ScriptedChatGenerator":
        """
        A generator that writes context summaries deterministically (with :func:`fold_summary`), for ``Summarize``.

        Each summary is the previous one's lines and one line per folded turn; replies carry ``usage`` meta.

        :param model: The model name reported in the reply meta.
        :param kwargs: Other ``ScriptedChatGenerator`` parameters (``record``, ``token_counter``, ...).
        :returns: The generator.
        """
        return cls(policy=fold_summary, model=model, **kwargs)

    @property
    def calls(self) -> list[ScriptedCall]:
        """The recorded calls, oldest first: the last ``record`` calls."""
        with self._lock:
            return list(self._calls)

    @property
    def remaining(self) -> int | None:
        """How many scripted replies are left, or ``None`` with a policy."""
        return None if self.policy is not None else len(self._replies) - self._position

    def warm_up(self) -> None:
        """
        Get ready to answer, as a real chat generator loads its client: nothing to load here, but haystack's patterns
        that warm a generator up (a hook or a component that holds one) run on this one unchanged.
        ``is_warmed_up`` tells whether it was.
        """
        self.is_warmed_up = True

    async def warm_up_async(self) -> None:
        """:meth:`warm_up`, for callers that await it."""
        self.warm_up()

    def close(self) -> None:
        """Release what the generator holds (nothing: it keeps its script and its recorded calls). Idempotent."""
        self.is_warmed_up = False

    async def close_async(self) -> None:
        """:meth:`close`, for callers that await it."""
        self.close()

    def reset(self) -> None:
        """Rewind the script, restart tool-call ids at ``call_1`` and forget the recorded calls."""
        with self._lock:
            self._calls.clear()
            self.call_count = 0
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
            record=self.record,
            token_counter=self.token_counter.to_dict() if self.token_counter is not None else None,
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
        if params.get("token_counter"):
            deserialize_component_inplace(params, key="token_counter")
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
        Return the next scripted reply: :meth:`run`, with the same parameters, results and errors; the streaming
        callback may be async (it is awaited).
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

    def _conversation_tokens(self, meter: Any, msgs: list[ChatMessage]) -> int:
        """
        The tokens of the conversation. An Agent sends the same list again at each step, extended (a new list when
        its messages were rewritten): then only the new messages are counted, so a long run costs no sum over the
        whole conversation per call.
        """
        tally = self._tally
        if (
            tally is not None
            and msgs is tally[0]
            and len(msgs) >= tally[1] > 0
            and msgs[0] is tally[2]
            and msgs[tally[1] - 1] is tally[3]
        ):
            tokens = tally[4] + meter.messages(msgs[tally[1] :])
        else:
            tokens = meter.messages(msgs)
        self._tally = (msgs, len(msgs), msgs[0], msgs[-1], tokens) if msgs else None
        return int(tokens)

    def _respond(
        self,
        messages: list[ChatMessage] | str,
        tools: ToolsType | None,
        generation_kwargs: dict[str, Any] | None,
        *,
        streaming: bool,
    ) -> tuple[ChatMessage, list[StreamingChunk]]:
        if isinstance(messages, str):
            msgs = [ChatMessage.from_user(messages)]
        else:
            msgs = messages if isinstance(messages, list) else list(messages)
        flat = flatten_tools_or_toolsets(list(tools) if isinstance(tools, Sequence) else tools)
        meter = token_meter(self.token_counter or APPROXIMATE_COUNTER)
        tokens = self._conversation_tokens(meter, msgs) + meter.tools(flat)
        with self._lock:
            self.call_count += 1
            # A copy: an Agent keeps extending the list it sends (as haystack-ai's does), so the list itself would
            # show later messages. Only the last `record` calls are kept, so memory stays bounded.
            seen = list(msgs) if self.record else msgs
            record = ScriptedCall(self.call_count, seen, flat, dict(generation_kwargs or {}), streaming, tokens=tokens)
            self._calls.append(record)
            if self.policy is not None:
                reply = parse_reply(self.policy(msgs, list(flat)), f"Policy reply to call {record.number}")
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
            message = self._build(reply, tokens)
            record.reply = message
        return message, self._chunks(message) if streaming else []

    def _check_tools(self, reply: Reply, tools: list[Tool], number: int) -> None:
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

    def _build(self, reply: Reply, prompt_tokens: int) -> ChatMessage:
        if reply.message is not None:
            return reply.message
        calls = []
        for name, args in reply.tool_calls:
            calls.append(ToolCall(tool_name=name, arguments=copy.deepcopy(args), id=f"call_{self._next_call_id}"))
            self._next_call_id += 1
        completion = ChatMessage.from_assistant(text=reply.text, tool_calls=calls)
        counter = self.token_counter or APPROXIMATE_COUNTER
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max(counter.count([completion]), 1)}
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
