"""
``OffloadToolResults``: big tool results stay whole in the state; the model is sent a preview, and a tool to read on.

haystack-ai's ``ToolResultOffloadHook`` writes big results to an external store and replaces them in the stored
conversation with a pointer. Here nothing is written anywhere: the stored conversation already holds the result,
and the reader tool reads it back from the State by the call's id.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, ClassVar, overload

from haystack.dataclasses import ChatMessage, ChatRole, TextContent, ToolCallResult
from haystack.tools.tool import Tool

from haystack_state.agent.context._shape import CONTEXT_META_KEY
from haystack_state.agent.context._tokens import IdentityCache
from haystack_state.agent.context.base import ContextPlan, ContextView, PolicyBase, check_count
from haystack_state.state import State
from haystack_state.tools import tool

__all__ = ["MAX_READ_CHARS", "READ_TOOL_RESULT", "OffloadToolResults", "OffloadedMessages", "read_tool_result"]

#: The name of the reader tool.
READ_TOOL_RESULT = "read_tool_result"
#: The most characters ``read_tool_result`` returns in one call.
MAX_READ_CHARS = 4000


def result_text(result: ToolCallResult) -> str | None:
    """
    A tool result's text: the string, or the text blocks joined; None if it holds an image or a file.

    :param result: The tool result.
    :returns: The text, or None.
    """
    value = result.result
    if isinstance(value, str):
        return value
    if all(isinstance(block, TextContent) for block in value):
        return "".join(block.text for block in value if isinstance(block, TextContent))
    return None


@tool(name=READ_TOOL_RESULT)
def read_tool_result(
    call_id: Annotated[str, "The id of the tool call whose result to read, as the truncated result gives it."],
    state: State,
    offset: Annotated[int, "The first character to read (0 is the start of the result)."] = 0,
    length: Annotated[int, f"How many characters to read, at most {MAX_READ_CHARS}."] = MAX_READ_CHARS,
) -> str:
    """
    Read part of a tool result that was shown truncated, by the tool call's id.

    :param call_id: The id of the tool call whose result to read.
    :param state: The agent's State (injected), whose messages hold the whole result.
    :param offset: The first character to read.
    :param length: How many characters to read.
    :returns: The characters, after a line saying which they are and how many are left.
    :raises ValueError: If no result has that call id, it has no text, or offset and length are out of range.
    """
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, got {offset}.")
    if not 1 <= length <= MAX_READ_CHARS:
        raise ValueError(f"length must be between 1 and {MAX_READ_CHARS}, got {length}.")
    messages: list[ChatMessage] = state.get("messages") or []
    for message in reversed(messages):
        for result in message.tool_call_results:
            if result.origin.id != call_id:
                continue
            text = result_text(result)
            if text is None:
                raise ValueError(f"The result of tool call '{call_id}' holds an image or a file, not text.")
            if offset >= len(text) and text:
                raise ValueError(
                    f"offset {offset} is past the end of the result of '{call_id}' ({len(text)} characters)."
                )
            end = min(offset + length, len(text))
            more = f"; read on with offset={end}" if end < len(text) else "; that is the end"
            header = f"[characters {offset} to {end} of {len(text)} of the result of call '{call_id}'{more}]"
            return f"{header}\n{text[offset:end]}"
    raise ValueError(f"No tool result with call id '{call_id}' in this conversation.")


class OffloadedMessages(Sequence[ChatMessage]):
    """
    The conversation as an ``OffloadToolResults`` policy sends it: big tool results replaced by previews, lazily.

    Only the messages read are looked at, so a policy composed after it pays for what it sends, not for the whole
    conversation.

    :param source: The conversation.
    :param policy: The policy that decides and builds the previews.
    """

    def __init__(self, source: Sequence[ChatMessage], policy: OffloadToolResults) -> None:
        """
        Wrap a conversation.

        :param source: The conversation.
        :param policy: The policy.
        """
        self._source = source
        self._policy = policy

    def __len__(self) -> int:
        return len(self._source)

    @overload
    def __getitem__(self, index: int) -> ChatMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[ChatMessage]: ...

    def __getitem__(self, index: int | slice) -> ChatMessage | list[ChatMessage]:
        if isinstance(index, slice):
            return [self._policy.preview(m) for m in self._source[index]]
        return self._policy.preview(self._source[index])

    def __iter__(self) -> Iterator[ChatMessage]:
        for message in self._source:
            yield self._policy.preview(message)


class OffloadToolResults(PolicyBase):
    """
    Send big tool results as a preview and a note saying how to read the rest; the state keeps them whole.

    A tool result longer than the limit (``max_chars``, or the tool's own in ``tools``) is sent as its first
    ``preview_chars`` characters and a note with the call id and the total size, pointing at the
    ``read_tool_result`` tool, which reads any part of it back from the State (the Agent adds that tool unless
    ``reader_tool=False``). Results of ``read_tool_result`` itself, and results holding images or files, are sent
    as they are. Messages keep their positions, so ``Summarize`` may follow it in a composition (its summarizer then
    reads previews too).

    :param max_chars: Results longer than this are previewed.
    :param preview_chars: How much of a previewed result the model sees.
    :param tools: ``{tool_name: max_chars}``: only these tools' results are previewed, each with its own limit
        (``"*"`` for the others); all tools, with ``max_chars``, if None.
    :param reader_tool: Whether the Agent gives the model ``read_tool_result``.
    :raises ValueError: If a limit is not positive, or ``preview_chars`` is not below ``max_chars``.
    """

    preserves_positions: ClassVar[bool] = True

    def __init__(
        self,
        max_chars: int = 8000,
        preview_chars: int = 1000,
        *,
        tools: Mapping[str, int] | None = None,
        reader_tool: bool = True,
    ) -> None:
        """
        Create the policy.

        :param max_chars: Results longer than this are previewed.
        :param preview_chars: How much of a previewed result the model sees.
        :param tools: ``{tool_name: max_chars}``; ``"*"`` for unlisted tools; all tools with ``max_chars`` if None.
        :param reader_tool: Whether the Agent gives the model ``read_tool_result``.
        """
        limits = dict(tools) if tools is not None else {}
        for name, limit in [("max_chars", max_chars), *((f"tools[{k!r}]", v) for k, v in limits.items())]:
            check_count(limit, 1, f"OffloadToolResults: {name}")
        if not isinstance(preview_chars, int) or preview_chars < 0:
            raise ValueError(f"OffloadToolResults: preview_chars must be an int >= 0, got {preview_chars!r}.")
        too_small = [name for name, limit in [("max_chars", max_chars), *limits.items()] if preview_chars >= limit]
        if too_small:
            raise ValueError(
                f"OffloadToolResults: preview_chars ({preview_chars}) must be below the limit of {too_small[0]}, or "
                "the preview would be as long as the result."
            )
        self.max_chars = max_chars
        self.preview_chars = preview_chars
        self.limits = limits if tools is not None else None
        self.reader_tool = reader_tool
        self._previews: IdentityCache[ChatMessage | bool] = IdentityCache()  # False: sent as it is

    def limit(self, tool_name: str) -> int | None:
        """
        The length above which a tool's results are previewed.

        :param tool_name: The tool's name.
        :returns: The limit, or None if its results are never previewed.
        """
        if tool_name == READ_TOOL_RESULT:
            return None
        if self.limits is None:
            return self.max_chars
        return self.limits.get(tool_name, self.limits.get("*"))

    def preview(self, message: ChatMessage) -> ChatMessage:
        """
        The message as the model is sent it: itself, or a preview of its big result (the same object every time).

        :param message: A message of the conversation.
        :returns: The message or its preview.
        """
        if message.role is not ChatRole.TOOL:
            return message
        cached = self._previews.get(message)
        if isinstance(cached, ChatMessage):
            return cached
        if cached is False:
            return message
        result = message.tool_call_result
        limit = self.limit(result.origin.tool_name) if result is not None else None
        text = result_text(result) if result is not None and limit is not None else None
        if result is None or text is None or limit is None or len(text) <= limit:
            self._previews.put(message, False)
            return message
        call_id = result.origin.id
        shown = text[: self.preview_chars]
        if call_id is not None and self.reader_tool:
            how = (
                f'call {READ_TOOL_RESULT}(call_id="{call_id}", offset={len(shown)}) to read on, up to '
                f"{MAX_READ_CHARS} characters a call"
            )
        else:
            how = "the rest cannot be read back here"
        note = f"\n[... truncated: the first {len(shown)} of {len(text)} characters are shown; {how}.]"
        preview = ChatMessage.from_tool(
            tool_result=shown + note,
            origin=result.origin,
            error=result.error,
            meta={**message.meta, CONTEXT_META_KEY: {"kind": "preview", "call_id": call_id, "chars": len(text)}},
        )
        self._previews.put(message, preview)
        return preview

    def plan(self, view: ContextView) -> ContextPlan:
        """
        Send every message, big tool results as previews.

        :param view: The conversation.
        :returns: The plan (its messages are built lazily, as they are read).
        """
        return ContextPlan(OffloadedMessages(view.messages, self), run_start=view.run_start)

    def tools(self) -> list[Tool]:
        """
        The reader tool, unless ``reader_tool=False``.

        :returns: ``[read_tool_result]`` or ``[]``.
        """
        return [read_tool_result] if self.reader_tool else []

    def _init_parameters(self) -> dict[str, Any]:
        return {
            "max_chars": self.max_chars,
            "preview_chars": self.preview_chars,
            "tools": self.limits,
            "reader_tool": self.reader_tool,
        }
