"""
The tools and helpers the ``ToolInvoker`` tests share (``test_invoker*.py``): building a model's tool calls, reading
the results, and small tools in our ``@tool`` and in haystack-ai's formats.
"""

from __future__ import annotations

import asyncio
from typing import Any

from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import tool as haystack_tool

from haystack_state import tool


def calls(*specs: tuple[str, Any], text: str | None = None) -> list[ChatMessage]:
    """One assistant message with a tool call per ``(tool_name, arguments)`` pair, ids ``c0``, ``c1``, ..."""
    tool_calls = [ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(specs)]
    return [ChatMessage.from_assistant(text=text, tool_calls=tool_calls)]


def results(output: dict[str, Any]) -> list[tuple[str, bool]]:
    """``(text, error)`` of each tool message."""
    return [(m.tool_call_results[0].result, m.tool_call_results[0].error) for m in output["tool_messages"]]


def only_result(output: dict[str, Any]) -> tuple[Any, bool]:
    messages = output["tool_messages"]
    assert len(messages) == 1
    result = messages[0].tool_call_results[0]
    return result.result, result.error


def concat(current: Any, new: Any) -> Any:
    return f"{current or ''}{new}"


def failing_handler(current: Any, new: Any) -> Any:
    raise RuntimeError("handler refuses")


def shout(value: Any) -> str:
    return str(value).upper()


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool(outputs_to_state={"total": {"source": "sum"}})
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@tool
def explode(reason: str) -> str:
    """Fail."""
    raise ValueError(reason)


@haystack_tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"source": "note"}})
def hs_note(text: str, user: str) -> dict[str, str]:
    """Take a note (haystack-ai's @tool)."""
    return {"note": f"{user}: {text}"}


@haystack_tool(outputs_to_state={"count": {"source": "count", "handler": lambda old, new: (old or 0) + new}})
def hs_count(state: HaystackState, amount: int) -> dict[str, int]:
    """Count with haystack-ai's State annotation."""
    state.set("seen", [amount])
    return {"count": amount}


@tool(outputs_to_state={"log": {}})
async def async_double(x: int) -> int:
    """Double, asynchronously."""
    await asyncio.sleep(0)
    return 2 * x


@tool
async def async_fail(x: int) -> int:
    """Fail, asynchronously."""
    await asyncio.sleep(0)
    raise LookupError(f"no {x}")
