"""
The one-line switch: a module written for haystack-ai changes ``from haystack.components.agents import Agent, State``
to ``from haystack_state import Agent, State`` and keeps making its tools with haystack's own ``@tool``,
``create_tool_from_function`` and ``ComponentTool``. The State parameter stays hidden from the model and receives
the live State, in our Agent and in haystack-ai's.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from haystack import component
from haystack.components.agents import Agent as HaystackAgent
from haystack.dataclasses import ChatMessage
from haystack.tools import ComponentTool, create_tool_from_function, tool

from haystack_state import Agent, State
from haystack_state.testing import ScriptedChatGenerator
from haystack_state.tools._haystack_compat import HAYSTACK_MODULES, recognize_our_state

SCHEMA = {"documents": {"type": list[str]}}


@tool
def retrieve_and_store(query: str, state: State) -> str:
    """
    Retrieve documents and keep them in the state.

    :param query: What to look for.
    """
    state.set("documents", [f"doc about {query}"])
    return f"stored 1 document about {query}"


def count_documents(state: State | None = None) -> str:
    """Count the documents kept so far."""
    assert state is not None
    return f"{len(state.get('documents') or [])} documents"


@component
class Keeper:
    """A component that keeps a note in the state it is handed."""

    @component.output_types(reply=str)
    def run(self, note: str, state: State) -> dict[str, Any]:
        state.set("documents", [note])
        return {"reply": f"kept {note}"}


def test_haystacks_tool_makers_hide_our_state_from_the_model() -> None:
    assert retrieve_and_store.parameters["properties"] == {"query": {"type": "string"}}
    assert "state" not in create_tool_from_function(count_documents).parameters.get("properties", {})
    keeper = ComponentTool(component=Keeper(), name="keeper", description="Keep a note.")
    assert set(keeper.parameters["properties"]) == {"note"}
    assert recognize_our_state() == list(HAYSTACK_MODULES)  # idempotent: every module already widened


def script() -> ScriptedChatGenerator:
    return ScriptedChatGenerator(
        script=[
            [("retrieve_and_store", {"query": "tides"})],
            [("count_documents", {}), ("keeper", {"note": "moon"})],
            "Done.",
        ]
    )


@pytest.mark.parametrize("agent_class", [Agent, HaystackAgent], ids=["ours", "haystack-ai"])
def test_the_swapped_tools_run_in_either_agent(agent_class: Any) -> None:
    tools = [
        retrieve_and_store,
        create_tool_from_function(count_documents),
        ComponentTool(component=Keeper(), name="keeper", description="Keep a note."),
    ]
    agent = agent_class(chat_generator=script(), tools=tools, state_schema=SCHEMA)
    result = agent.run(messages=[ChatMessage.from_user("Find tides")])
    assert result["documents"] == ["doc about tides", "moon"]
    results = [m.tool_call_result.result for m in result["messages"] if m.tool_call_result is not None]
    assert results[0] == "stored 1 document about tides"
    assert "1 documents" in results[1] and "kept moon" in results[2]
    assert not any(m.tool_call_result.error for m in result["messages"] if m.tool_call_result is not None)


def test_a_haystack_module_without_the_check_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(HAYSTACK_MODULES[0])
    monkeypatch.delattr(module, "_is_state_annotation")
    assert HAYSTACK_MODULES[0] not in recognize_our_state()
