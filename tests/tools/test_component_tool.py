"""Tests of ``ComponentTool``: schema from sockets, hidden state socket, invocation, errors, serialization."""

import asyncio
from typing import Any

import pytest
from haystack import component, default_from_dict, default_to_dict
from haystack.components.agents.state import State as HaystackState
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Tool
from haystack.tools.serde_utils import deserialize_tools_or_toolset_inplace, serialize_tools_or_toolset

from haystack_state.errors import ToolDefinitionError
from haystack_state.state import State
from haystack_state.tools import ComponentTool


def keep_last(current: Any, new: Any) -> Any:
    return new


@component
class DocumentSearch:
    """
    Find documents about a topic.

    Searches the in-memory index.
    """

    def __init__(self, prefix: str = "doc") -> None:
        self.prefix = prefix

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, prefix=self.prefix)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DocumentSearch":
        return default_from_dict(cls, data)

    @component.output_types(documents=list[str], count=int)
    def run(self, query: str, state: State, top_k: int = 2, user: str = "") -> dict[str, Any]:
        """
        Search.

        :param query: What to search for.
        :param state: The agent's state.
        :param top_k: How many documents to return.
        :param user: Who is searching.
        """
        state.set("seen", [query])
        documents = [f"{self.prefix}:{query}:{i}:{user}" for i in range(top_k)]
        return {"documents": documents, "count": len(documents)}


@component
class HaystackStateSearch:
    """Search, with haystack-ai's State."""

    @component.output_types(documents=list[str])
    def run(self, query: str, state: HaystackState | None = None) -> dict[str, Any]:
        """
        Search.

        :param query: What to search for.
        """
        if state is not None:
            state.set("seen", [query])
        return {"documents": [query.upper()]}


@component
class AsyncEcho:
    """Echo, also asynchronously."""

    @component.output_types(text=str)
    def run(self, text: str) -> dict[str, Any]:
        return {"text": text}

    @component.output_types(text=str)
    async def run_async(self, text: str) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"text": f"async:{text}"}


class Opaque:
    """A class pydantic cannot describe."""


@component
class NeedsOpaque:
    """Needs an object the model cannot send."""

    @component.output_types(ok=bool)
    def run(self, query: str, client: Opaque) -> dict[str, Any]:
        return {"ok": True}


def test_schema_comes_from_sockets_and_run_docstring() -> None:
    made = ComponentTool(DocumentSearch())
    assert isinstance(made, Tool) and isinstance(made, HaystackComponentTool)
    assert made.name == "document_search"
    assert made.description == DocumentSearch.__doc__  # the docstring as written, like haystack-ai
    assert made.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to search for."},
            "top_k": {"type": "integer", "description": "How many documents to return.", "default": 2},
            "user": {"type": "string", "description": "Who is searching.", "default": ""},
        },
        "required": ["query"],
    }


def test_inputs_from_state_socket_is_hidden_and_name_description_overridable() -> None:
    made = ComponentTool(
        DocumentSearch(), name="search", description="Search docs.", inputs_from_state={"user_id": "user"}
    )
    assert made.name == "search" and made.description == "Search docs."
    assert list(made.parameters["properties"]) == ["query", "top_k"]


def test_haystack_state_socket_is_hidden_too() -> None:
    made = ComponentTool(HaystackStateSearch())
    assert list(made.parameters["properties"]) == ["query"]
    assert made.parameters["required"] == ["query"]


def test_invoke_passes_the_state_object_through() -> None:
    made = ComponentTool(DocumentSearch(prefix="p"))
    state = State(schema={"seen": {"type": list[str]}})
    result = made.invoke(query="cats", state=state, top_k=1, user="ann")
    assert result == {"documents": ["p:cats:0:ann"], "count": 1}
    assert state.get("seen") == ["cats"]


def test_invoke_with_haystack_state() -> None:
    made = ComponentTool(HaystackStateSearch())
    state = HaystackState(schema={"seen": {"type": list[str]}})
    assert made.invoke(query="dogs", state=state) == {"documents": ["DOGS"]}
    assert state.get("seen") == ["dogs"]


def test_async_component_gets_an_async_function() -> None:
    made = ComponentTool(AsyncEcho())
    assert made.function is not None and made.async_function is not None
    assert made.invoke(text="hi") == {"text": "hi"}
    assert asyncio.run(made.invoke_async(text="hi")) == {"text": "async:hi"}


def test_component_property() -> None:
    search = DocumentSearch()
    assert ComponentTool(search).component is search


def test_round_trip_through_to_dict_and_from_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    made = ComponentTool(
        DocumentSearch(prefix="x"),
        name="search",
        inputs_from_state={"user_id": "user"},
        outputs_to_state={"documents": {"source": "documents", "handler": keep_last}},
        outputs_to_string={"source": "documents"},
    )
    data = made.to_dict()
    assert data["type"] == "haystack_state.tools.component_tool.ComponentTool"
    assert data["data"]["parameters"] is None  # the schema is derived again on load, not stored
    restored = ComponentTool.from_dict(data)
    assert isinstance(restored, ComponentTool)
    assert restored.name == "search"
    assert restored.description == made.description
    assert restored.parameters == made.parameters
    assert restored.inputs_from_state == {"user_id": "user"}
    assert restored.outputs_to_state == {"documents": {"source": "documents", "handler": keep_last}}
    assert restored.outputs_to_string == {"source": "documents"}
    state = State(schema={"seen": {"type": list[str]}})
    assert restored.invoke(query="q", state=state, top_k=1)["documents"] == ["x:q:0:"]

    listed = {"tools": serialize_tools_or_toolset([made])}
    deserialize_tools_or_toolset_inplace(listed)
    assert isinstance(listed["tools"][0], ComponentTool)
    assert listed["tools"][0].parameters == made.parameters


def test_not_a_component_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="Haystack component"):
        ComponentTool(object())  # type: ignore[arg-type]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ToolDefinitionError) as info:
        ComponentTool(
            DocumentSearch(),
            inputs_from_state={"who": "nobody", "s": "state"},
            outputs_to_state={"docs": {"source": "missing"}, "n": {"handler": "nope"}},
            outputs_to_string={"source": "also_missing"},
        )
    error = info.value
    joined = "\n".join(error.problems)
    assert error.tool_name == "document_search"
    assert len(error.problems) == 5
    assert "'nobody', which the tool does not have" in joined
    assert "'state' receives the State object" in joined
    assert "source 'missing', which is not an output of the tool (outputs: count, documents)" in joined
    assert "handler that is not callable" in joined
    assert "source 'also_missing'" in joined


def test_required_socket_without_json_schema_is_an_error_unless_filled_from_state() -> None:
    with pytest.raises(ToolDefinitionError, match="'client'"):
        ComponentTool(NeedsOpaque())
    made = ComponentTool(NeedsOpaque(), inputs_from_state={"client": "client"})
    assert list(made.parameters["properties"]) == ["query"]


def test_component_in_a_pipeline_is_rejected() -> None:
    from haystack import Pipeline

    search = DocumentSearch()
    Pipeline().add_component("search", search)
    with pytest.raises(ToolDefinitionError, match="added to a pipeline"):
        ComponentTool(search)
