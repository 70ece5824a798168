"""Tests of ``tool_spec``/``tool_specs`` on this package's tools and on haystack-ai's own tools."""

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from haystack import component
from haystack.components.agents import Agent
from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Tool, Toolset, create_tool_from_function
from haystack.tools import tool as haystack_tool

from haystack_state.errors import ToolDefinitionError
from haystack_state.state import State
from haystack_state.tools import ComponentTool, ToolSpec, tool, tool_spec, tool_specs


def append(current: Any, new: Any) -> Any:
    return [*(current or []), *new]


class Opaque:
    """A class pydantic cannot describe."""


# --- this package's tools --------------------------------------------------------------------------


def test_spec_of_a_function_tool() -> None:
    def render(text: str) -> str:
        return text

    @tool(
        inputs_from_state={"user_id": "user"},
        outputs_to_state={"notes": {"source": "note", "handler": append}, "last": {}},
        outputs_to_string={"source": "note", "handler": render},
    )
    def note(
        text: Annotated[str, "The note"],
        user: str,
        state: State,
        ctx: Annotated[HaystackState | None, "haystack's"] = None,
        client: Opaque | None = None,
        streaming_callback: Callable[..., None] | None = None,
    ) -> dict[str, Any]:
        """Take a note."""
        return {"note": text}

    spec = tool_spec(note)
    assert isinstance(spec, ToolSpec)
    assert spec.name == "note" and spec.description == "Take a note."
    assert spec.parameters == note.parameters
    assert list(spec.parameters["properties"]) == ["text"]
    assert spec.inputs_from_state == {"user_id": "user"}
    assert spec.outputs_to_state == {"notes": {"source": "note", "handler": append}, "last": {}}
    assert spec.state_params == ("state", "ctx")
    assert spec.hidden_params == {"user", "state", "ctx", "client", "streaming_callback"}
    assert spec.parameter_names == {"text", "user", "state", "ctx", "client", "streaming_callback"}
    assert not spec.accepts_any_keyword
    assert spec.streaming_callback
    assert not spec.is_async and spec.supports_sync
    assert spec.outputs_to_string == {"source": "note", "handler": render}
    assert spec.tool is note


def test_spec_of_an_async_function_tool() -> None:
    @tool
    async def fetch(url: str) -> str:
        """Fetch."""
        return url

    spec = tool_spec(fetch)
    assert spec.is_async and not spec.supports_sync
    assert not spec.streaming_callback
    assert spec.state_params == () and spec.hidden_params == frozenset()
    assert spec.inputs_from_state == {} and spec.outputs_to_state == {} and spec.outputs_to_string is None


def test_spec_of_a_component_tool() -> None:
    @component
    class Lookup:
        """Look up."""

        @component.output_types(answer=str)
        def run(
            self,
            query: str,
            state: State,
            user: str = "",
            streaming_callback: Callable[..., None] | None = None,
        ) -> dict[str, Any]:
            return {"answer": query}

    made = ComponentTool(Lookup(), inputs_from_state={"user_id": "user"}, outputs_to_state={"answers": {}})
    spec = tool_spec(made)
    assert list(spec.parameters["properties"]) == ["query"]
    assert spec.state_params == ("state",)
    assert spec.hidden_params == {"state", "user", "streaming_callback"}
    assert spec.parameter_names == {"query", "state", "user", "streaming_callback"}
    assert spec.streaming_callback
    assert spec.supports_sync and not spec.is_async
    assert spec.outputs_to_state == {"answers": {}}


# --- haystack-ai's tools ---------------------------------------------------------------------------


def test_spec_of_haystack_tool_decorator() -> None:
    @haystack_tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"log": {"source": "line"}})
    def greet(name: str, user: str, state: HaystackState, streaming_callback: Callable[..., None] | None = None) -> Any:
        """Greet someone."""
        return {"line": f"{user} greets {name}"}

    spec = tool_spec(greet)
    assert spec.parameters == greet.parameters
    assert list(spec.parameters["properties"]) == ["name"]
    assert spec.inputs_from_state == {"user_id": "user"}
    assert spec.outputs_to_state == {"log": {"source": "line"}}
    assert spec.state_params == ("state",)
    assert spec.hidden_params == {"user", "state", "streaming_callback"}
    assert spec.streaming_callback
    assert spec.supports_sync and not spec.is_async


def test_spec_of_haystack_async_function_tool() -> None:
    async def fetch(url: str, state: HaystackState | None = None) -> str:
        """Fetch."""
        return url

    made = create_tool_from_function(fetch)
    spec = tool_spec(made)
    assert spec.is_async and not spec.supports_sync
    assert spec.state_params == ("state",)
    assert spec.hidden_params == {"state"}


def test_spec_of_a_hand_built_tool() -> None:
    def run(query: str, repo: str, state: State, limit: int = 3) -> str:
        return query

    made = Tool(
        name="hand",
        description="Built by hand.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}, "repo": {"type": "string"}},
            "required": ["query", "repo"],
        },
        function=run,
        inputs_from_state={"repository": "repo"},
    )
    spec = tool_spec(made)
    # the schema shows "repo", which is filled from state: the spec hides it from the model
    assert spec.parameters == {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    assert made.parameters["properties"].keys() == {"query", "repo"}  # the tool itself is untouched
    assert spec.state_params == ("state",)
    assert spec.hidden_params == {"repo", "state", "limit"}
    assert not spec.streaming_callback


def test_spec_of_a_tool_taking_any_keyword() -> None:
    def anything(**kwargs: Any) -> Any:
        return kwargs

    made = Tool(name="any", description="Any.", parameters={"type": "object", "properties": {}}, function=anything)
    spec = tool_spec(made)
    assert spec.accepts_any_keyword
    assert spec.parameter_names == frozenset() and spec.hidden_params == frozenset()


def test_spec_of_haystack_component_tool() -> None:
    @component
    class Finder:
        """Find."""

        @component.output_types(found=list[str])
        def run(self, query: str, state: HaystackState, top_k: int = 1) -> dict[str, Any]:
            return {"found": [query] * top_k}

    made = HaystackComponentTool(Finder(), outputs_to_state={"found": {"source": "found"}})
    spec = tool_spec(made)
    assert set(spec.parameters["properties"]) == {"query", "top_k"}
    assert spec.state_params == ("state",)
    assert spec.hidden_params == {"state"}
    assert spec.parameter_names == {"query", "state", "top_k"}
    assert spec.outputs_to_state == {"found": {"source": "found"}}


def test_specs_of_a_toolset_and_mixed_lists() -> None:
    @haystack_tool
    def one(x: int) -> int:
        """One."""
        return x

    @tool
    def two(y: int) -> int:
        """Two."""
        return y

    @tool
    def three(z: int) -> int:
        """Three."""
        return z

    assert list(tool_specs(Toolset([one, two]))) == ["one", "two"]
    specs = tool_specs([Toolset([one]), two, three])
    assert list(specs) == ["one", "two", "three"]
    assert specs["two"].tool is two
    assert tool_specs(None) == {}


def test_duplicate_names_and_non_tools() -> None:
    @tool
    def same(x: int) -> int:
        """Same."""
        return x

    with pytest.raises(ToolDefinitionError, match="two tools have this name"):
        tool_specs([same, Toolset([same])])
    with pytest.raises(TypeError, match="haystack Tool"):
        tool_spec("not a tool")  # type: ignore[arg-type]


# --- haystack-ai's Agent runs these tools unchanged --------------------------------------------------


@component
class ScriptedChatGenerator:
    """Replies with the scripted messages, one per call."""

    def __init__(self, replies: list[ChatMessage]) -> None:
        self.replies = list(replies)

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
        return {"replies": [self.replies.pop(0)]}


def test_haystack_agent_runs_a_function_tool_and_a_component_tool() -> None:
    calls: list[Any] = []

    @tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"source": "note"}})
    def take_note(text: str, user: str, state: HaystackState) -> dict[str, Any]:
        """Take a note."""
        calls.append((text, user, state.get("user_id")))
        return {"note": [f"{user}:{text}"]}

    @component
    class Counter:
        """Count words."""

        @component.output_types(count=int)
        def run(self, text: str, state: HaystackState) -> dict[str, Any]:
            state.set("notes", ["counted"])
            return {"count": len(text.split())}

    counter = ComponentTool(Counter(), name="count_words")
    replies = [
        ChatMessage.from_assistant(
            tool_calls=[
                ToolCall(tool_name="take_note", arguments={"text": "buy milk"}),
                ToolCall(tool_name="count_words", arguments={"text": "a b c"}),
            ]
        ),
        ChatMessage.from_assistant("done"),
    ]
    agent = Agent(
        chat_generator=ScriptedChatGenerator(replies),
        tools=[take_note, counter],
        state_schema={"notes": {"type": list[str]}, "user_id": {"type": str}},
    )
    result = agent.run(messages=[ChatMessage.from_user("go")], user_id="ann")
    assert calls == [("buy milk", "ann", "ann")]
    assert sorted(result["notes"]) == ["ann:buy milk", "counted"]
    tool_results = [m.tool_call_result.result for m in result["messages"] if m.tool_call_result]
    assert '{"count": 3}' in tool_results
    assert result["last_message"].text == "done"


def test_async_tool_spec_matches_what_invoke_async_runs() -> None:
    @tool
    async def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    spec = tool_spec(shout)
    assert spec.is_async
    assert asyncio.run(spec.tool.invoke_async(text="hey")) == "HEY"
