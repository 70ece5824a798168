"""
A lazy toolset over a real MCP server: ``mcp-haystack``'s ``MCPToolset`` starts ``tests/workers/mcp_server.py`` over
stdio and lists its tools only at ``warm_up`` (before that it holds one placeholder). Its tools are offered and called
through our ``ToolInvoker`` (sync and async) and our ``Agent``, as in haystack-ai.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall
from haystack_integrations.tools.mcp import MCPToolset, StdioServerInfo

from haystack_state import Agent, InMemoryCheckpointer, State, ToolInvoker
from haystack_state.testing import ScriptedChatGenerator

pytestmark = pytest.mark.slow

SERVER = Path(__file__).parent.parent / "workers" / "mcp_server.py"


@pytest.fixture
def toolset() -> Iterator[MCPToolset]:
    made = MCPToolset(StdioServerInfo(command=sys.executable, args=[str(SERVER)]), connection_timeout=60)
    try:
        yield made
    finally:
        made.close()


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ChatMessage]:
    tool_calls = [ToolCall(tool_name=name, arguments=args, id=f"c{i}") for i, (name, args) in enumerate(specs)]
    return [ChatMessage.from_assistant(tool_calls=tool_calls)]


def text_of(result: str) -> str:
    """The text an MCP tool result carries (mcp-haystack returns the server's JSON result)."""
    return "".join(part["text"] for part in json.loads(result)["content"] if part["type"] == "text")


def test_the_tools_appear_only_at_warm_up_and_are_called_through_the_invoker(toolset: MCPToolset) -> None:
    (placeholder,) = toolset.tools
    assert placeholder.name.startswith("mcp_not_connected_placeholder")
    invoker = ToolInvoker(toolset, raise_on_failure=False)
    invoker.warm_up()
    assert sorted(tool.name for tool in toolset) == ["add", "shout", "slow"]

    output = invoker.run(calls(("add", {"a": 2, "b": 40}), ("shout", {"text": "hi"}), ("nope", {})), state=State({}))
    results = [m.tool_call_result for m in output["tool_messages"]]
    assert [r.error for r in results] == [False, False, True]
    assert [text_of(r.result) for r in results[:2]] == ["42", "HI"]
    assert results[2].result == "Tool 'nope' not found. Available tools: add, shout, slow."


def test_run_warms_the_invoker_up_on_first_use_and_validates_against_the_servers_schema(toolset: MCPToolset) -> None:
    invoker = ToolInvoker([toolset], raise_on_failure=False)
    output = invoker.run(calls(("add", {"a": 1, "b": 2}), ("add", {"a": "one", "b": 2})))
    results = [m.tool_call_result for m in output["tool_messages"]]
    assert text_of(results[0].result) == "3"
    assert (
        results[1].error and results[1].result == "Tool 'add': invalid parameter 'a': 'one' is not of type 'integer'."
    )


def test_run_async_warms_up_and_calls_the_servers_tools(toolset: MCPToolset) -> None:
    async def main() -> list[Any]:
        invoker = ToolInvoker(toolset)
        await invoker.warm_up_async()
        output = await invoker.run_async(calls(("shout", {"text": "async"})))
        return [m.tool_call_result for m in output["tool_messages"]]

    (result,) = asyncio.run(main())
    assert text_of(result.result) == "ASYNC"


def test_a_slow_mcp_call_times_out_and_the_session_stays_usable(toolset: MCPToolset) -> None:
    invoker = ToolInvoker(toolset, raise_on_failure=False, tool_timeout=0.5)
    output = invoker.run(calls(("slow", {"seconds": 5})))
    (result,) = [m.tool_call_result for m in output["tool_messages"]]
    assert result.error and result.result.startswith("Tool 'slow' timed out after 0.5 s")
    output = invoker.run(calls(("add", {"a": 5, "b": 5})))
    assert text_of(output["tool_messages"][0].tool_call_result.result) == "10"


def test_an_agent_offers_the_servers_tools_and_exits_on_one_of_them(toolset: MCPToolset) -> None:
    generator = ScriptedChatGenerator(script=[[("add", {"a": 20, "b": 22})], [("shout", {"text": "done"})]])
    # "shout" exists only once the toolset is warmed up: exit_conditions are checked then
    agent = Agent(generator, tools=[toolset], exit_conditions=["shout"])
    result = agent.run([ChatMessage.from_user("add, then shout")])

    assert result["exit_reason"] == "shout"
    assert sorted(tool.name for tool in generator.calls[0].tools) == ["add", "shout", "slow"]
    results = [m.tool_call_result for m in result["messages"] if m.tool_call_result is not None]
    assert [text_of(r.result) for r in results] == ["42", "DONE"]
    assert result["tool_call_counts"] == {"add": 1, "shout": 1, "slow": 0}


def test_an_agent_checks_its_tool_names_against_the_servers_tools_after_warm_up(
    toolset: MCPToolset, caplog: pytest.LogCaptureFixture
) -> None:
    # As in haystack-ai, an exit condition naming no tool is a warning (a run's tools=... may provide it), given
    # once the toolset has loaded its tools; interrupt_before must name one of the agent's own tools.
    agent = Agent(ScriptedChatGenerator(script=["x"]), tools=[toolset], exit_conditions=["missing"])
    assert "missing" not in caplog.text
    agent.warm_up()
    assert "exit_conditions ['missing'] name no tool of this agent (its tools: add" in caplog.text
    strict = Agent(
        ScriptedChatGenerator(script=["x"]),
        tools=[toolset],
        checkpointer=InMemoryCheckpointer(),
        interrupt_before=["missing"],
    )
    with pytest.raises(ValueError, match=r"interrupt_before \['missing'\] name no tool of this agent"):
        strict.warm_up()


def test_an_async_agent_uses_the_servers_tools(toolset: MCPToolset) -> None:
    generator = ScriptedChatGenerator(script=[[("add", {"a": 1, "b": 1})], "two"])
    agent = Agent(generator, tools=toolset)
    result = asyncio.run(agent.run_async([ChatMessage.from_user("1+1?")]))
    assert result["last_message"].text == "two"
    (tool_result,) = [m.tool_call_result for m in result["messages"] if m.tool_call_result is not None]
    assert text_of(tool_result.result) == "2"
