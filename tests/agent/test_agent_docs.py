"""
The examples of haystack's State documentation page, run end to end with haystack_state.Agent.

Each example is taken as the page gives it (haystack's ``@tool``, ``State``, ``ComponentTool`` and
``print_streaming_chunk``), with ``OpenAIChatGenerator`` swapped for the offline ``ScriptedChatGenerator`` playing
the model's part. The function-tool examples also run with this package's ``@tool``.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
from haystack import component
from haystack.components.agents import State as HaystackState
from haystack.components.generators.utils import print_streaming_chunk
from haystack.dataclasses import ChatMessage, ChatRole, Document
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import tool as haystack_tool

from haystack_state import Agent, ComponentTool, State
from haystack_state import tool as our_tool
from haystack_state.testing import ScriptedChatGenerator

Decorator = Callable[..., Any]


@pytest.fixture(params=["haystack", "haystack_state"])
def tool(request: pytest.FixtureRequest) -> Decorator:
    """The page's ``@tool`` (haystack-ai's), and this package's."""
    return haystack_tool if request.param == "haystack" else our_tool


def schema_of(generator: ScriptedChatGenerator, tool_name: str) -> dict[str, Any]:
    """The parameters schema the model was shown for a tool (on the first call)."""
    [shown] = [t for t in generator.calls[0].tools if t.name == tool_name]
    return shown.parameters


def tool_results(result: dict[str, Any]) -> list[str]:
    return [m.tool_call_result.result for m in result["messages"] if m.tool_call_result is not None]


# --- Reading from State: inputs_from_state ------------------------------------------------------------


def search_documents(
    query: Annotated[str, "The search query"],
    user_context: str,  # injected from state; excluded from LLM schema
) -> dict:
    """Search documents using query and user context."""
    return {"results": [f"Found results for '{query}' (user: {user_context})"]}


def test_inputs_from_state(tool: Decorator, capsys: pytest.CaptureFixture[str]) -> None:
    generator = ScriptedChatGenerator(
        script=[[("search_documents", {"query": "Python tutorials"})], "Here are some Python tutorials."]
    )
    agent = Agent(
        chat_generator=generator,
        tools=[tool(inputs_from_state={"user_name": "user_context"})(search_documents)],
        system_prompt="Use the search_documents tool to find information.",
        streaming_callback=print_streaming_chunk,
        state_schema={"user_name": {"type": str}},
    )
    result = agent.run(
        messages=[ChatMessage.from_user("Search for Python tutorials")],
        user_name="Alice",  # state key "user_name" is pre-populated by passing user_name= to agent.run()
    )

    assert result["last_message"].text == "Here are some Python tutorials."
    assert result["user_name"] == "Alice"
    assert tool_results(result) == ['{"results": ["Found results for \'Python tutorials\' (user: Alice)"]}']
    schema = schema_of(generator, "search_documents")
    assert set(schema["properties"]) == {"query"}  # the model never sees user_context
    assert schema["properties"]["query"]["description"] == "The search query"
    assert schema["required"] == ["query"]
    assert generator.calls[0].messages[0].text == "Use the search_documents tool to find information."
    printed = capsys.readouterr().out
    assert "[TOOL CALL]\nTool: search_documents" in printed
    assert "[TOOL RESULT]\n" in printed and "(user: Alice)" in printed
    assert "Here are some Python tutorials." in printed


def test_a_value_the_model_sends_for_a_state_filled_parameter_is_ignored(tool: Decorator) -> None:
    generator = ScriptedChatGenerator(
        script=[[("search_documents", {"query": "secrets", "user_context": "Mallory"})], "done"]
    )
    agent = Agent(
        chat_generator=generator,
        tools=[tool(inputs_from_state={"user_name": "user_context"})(search_documents)],
        state_schema={"user_name": {"type": str}},
    )
    result = agent.run(messages=[ChatMessage.from_user("Search")], user_name="Alice")
    assert tool_results(result) == ['{"results": ["Found results for \'secrets\' (user: Alice)"]}']


# --- Writing to State: outputs_to_state ------------------------------------------------------------------


def retrieve_documents(
    query: Annotated[str, "The search query"],
) -> dict:
    """Retrieve relevant documents."""
    return {
        "documents": [
            {"title": "Doc 1", "content": "Content about Python"},
            {"title": "Doc 2", "content": "More about Python"},
        ],
        "count": 2,
        "query": query,
    }


RETRIEVE_OUTPUTS = {
    "documents": {"source": "documents"},
    "result_count": {"source": "count"},
    "last_query": {"source": "query"},
}
DOCS = [{"title": "Doc 1", "content": "Content about Python"}, {"title": "Doc 2", "content": "More about Python"}]


def test_outputs_to_state_with_a_source(tool: Decorator) -> None:
    generator = ScriptedChatGenerator(script=[[("retrieve_documents", {"query": "Python"})], "Found 2 documents."])
    agent = Agent(
        chat_generator=generator,
        tools=[tool(outputs_to_state=RETRIEVE_OUTPUTS)(retrieve_documents)],
        system_prompt="Use the retrieve_documents tool to find information.",
        state_schema={
            "documents": {"type": list},
            "result_count": {"type": int},
            "last_query": {"type": str},
        },
    )
    result = agent.run(messages=[ChatMessage.from_user("Find information about Python")])

    assert result["documents"] == DOCS
    assert result["result_count"] == 2
    assert result["last_query"] == "Python"
    assert result["last_message"].text == "Found 2 documents."


def get_user_info() -> dict:
    """Get user information."""
    return {"name": "Alice", "email": "alice@example.com", "role": "admin"}


def test_outputs_to_state_without_a_source_stores_the_whole_result(tool: Decorator) -> None:
    generator = ScriptedChatGenerator(script=[[("get_user_info", {})], "Alice is an admin."])
    agent = Agent(
        chat_generator=generator,
        tools=[tool(outputs_to_state={"user_info": {}})(get_user_info)],
        system_prompt="Use the get_user_info tool to look up user details.",
        state_schema={"user_info": {"type": dict}},
    )
    result = agent.run(messages=[ChatMessage.from_user("What are the user's details?")])

    assert result["user_info"] == {"name": "Alice", "email": "alice@example.com", "role": "admin"}
    assert result["last_message"].text == "Alice is an admin."
    assert schema_of(generator, "get_user_info")["properties"] == {}


def replace_documents(current: list | None, new: list) -> list:
    return new


def test_an_outputs_to_state_handler_overrides_the_schema_handler_for_that_mapping(tool: Decorator) -> None:
    outputs = {**RETRIEVE_OUTPUTS, "documents": {"source": "documents", "handler": replace_documents}}
    script = [[("retrieve_documents", {"query": "a"})], [("retrieve_documents", {"query": "b"})], "done"]
    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=script),
        tools=[tool(outputs_to_state=outputs)(retrieve_documents)],
        state_schema={"documents": {"type": list}, "result_count": {"type": int}, "last_query": {"type": str}},
    )
    result = agent.run(messages=[ChatMessage.from_user("twice")])
    assert result["documents"] == DOCS  # replaced, not appended to
    assert result["last_query"] == "b"


# --- Combining inputs and outputs ------------------------------------------------------------------------


def process_documents(
    max_results: Annotated[int, "Maximum number of documents to return"],
    documents: list = None,  # type: ignore[assignment]  # noqa: RUF013 - verbatim from the docs: injected from state
) -> dict:
    """Process retrieved documents and return a filtered subset."""
    processed = (documents or [])[:max_results]
    return {"processed_docs": processed, "processed_count": len(processed)}


CHAINED_SCHEMA = {
    "documents": {"type": list},
    "result_count": {"type": int},
    "last_query": {"type": str},
    "final_docs": {"type": list},
    "final_count": {"type": int},
}


def chained_agent(tool: Decorator, script: list[Any]) -> tuple[Agent, ScriptedChatGenerator]:
    generator = ScriptedChatGenerator(script=script)
    process = tool(
        inputs_from_state={"documents": "documents"},
        outputs_to_state={
            "final_docs": {"source": "processed_docs"},
            "final_count": {"source": "processed_count"},
        },
    )(process_documents)
    agent = Agent(
        chat_generator=generator,
        tools=[tool(outputs_to_state=RETRIEVE_OUTPUTS)(retrieve_documents), process],  # chained through state
        system_prompt="Use the available tools to retrieve and process documents.",
        state_schema=CHAINED_SCHEMA,
    )
    return agent, generator


def test_chained_tools_across_steps(tool: Decorator) -> None:
    script = [
        [("retrieve_documents", {"query": "Python"})],
        [("retrieve_documents", {"query": "Haystack"})],
        [("process_documents", {"max_results": 3})],
        "Processed 3 documents.",
    ]
    agent, generator = chained_agent(tool, script)
    result = agent.run(messages=[ChatMessage.from_user("Find and process 3 documents about Python")])

    assert result["documents"] == DOCS + DOCS
    assert (result["result_count"], result["last_query"]) == (2, "Haystack")
    assert result["final_docs"] == DOCS + DOCS[:1]
    assert result["final_count"] == 3
    assert set(schema_of(generator, "process_documents")["properties"]) == {"max_results"}
    assert result["step_count"] == 4


def test_chained_tools_in_one_reply_run_in_dependency_order(tool: Decorator) -> None:
    """process_documents reads what retrieve_documents writes, so it waits for it even in the same step."""
    script = [[("retrieve_documents", {"query": "Python"}), ("process_documents", {"max_results": 1})], "done"]
    agent, _ = chained_agent(tool, script)
    result = agent.run(messages=[ChatMessage.from_user("Find and process 1 document about Python")])
    assert result["final_docs"] == DOCS[:1]
    assert result["final_count"] == 1
    assert result["step_count"] == 2


# --- Injecting State directly into tools -------------------------------------------------------------


def make_retrieve_and_store(state_class: type) -> Callable[..., str]:
    def retrieve_and_store(
        query: Annotated[str, "The search query"],
        state: state_class,  # type: ignore[valid-type]
    ) -> str:
        """Retrieve documents and store them directly in state."""
        documents = [Document(content=f"Result for '{query}'")]
        state.set("documents", documents)
        user_name = state.get("user_name", "unknown")
        return f"Retrieved {len(documents)} document(s) for {user_name}"

    return retrieve_and_store


@pytest.mark.parametrize(
    ("decorator", "state_class"),
    [(haystack_tool, HaystackState), (our_tool, State), (our_tool, HaystackState)],
    ids=["haystack-tool-haystack-state", "our-tool-our-state", "our-tool-haystack-state"],
)
def test_state_injected_into_a_function_tool(decorator: Decorator, state_class: type) -> None:
    generator = ScriptedChatGenerator(script=[[("retrieve_and_store", {"query": "Python"})], "Stored."])
    agent = Agent(
        chat_generator=generator,
        tools=[decorator(make_retrieve_and_store(state_class))],
        system_prompt="Use the retrieve_and_store tool to find documents.",
        state_schema={"documents": {"type": list[Document]}, "user_name": {"type": str}},
    )
    result = agent.run(
        messages=[ChatMessage.from_user("Find documents about Python")],
        user_name="Alice",
    )

    assert result["last_message"].text == "Stored."
    assert [d.content for d in result["documents"]] == ["Result for 'Python'"]
    assert isinstance(result["documents"][0], Document)
    assert tool_results(result) == ["Retrieved 1 document(s) for Alice"]
    assert set(schema_of(generator, "retrieve_and_store")["properties"]) == {"query"}  # the State is never shown


def test_without_the_key_the_injected_state_gives_the_default() -> None:
    generator = ScriptedChatGenerator(script=[[("retrieve_and_store", {"query": "x"})], "ok"])
    agent = Agent(
        chat_generator=generator,
        tools=[haystack_tool(make_retrieve_and_store(HaystackState))],
        state_schema={"documents": {"type": list[Document]}, "user_name": {"type": str}},
    )
    assert tool_results(agent.run(messages=[ChatMessage.from_user("go")])) == ["Retrieved 1 document(s) for unknown"]


@component
class DocumentRetriever:
    """Retrieve documents and store them in state."""

    @component.output_types(reply=str)
    def run(self, query: str, state: HaystackState) -> dict[str, str]:
        """
        Retrieve documents based on query and store them in state.

        :param query: The search query
        """
        documents = [Document(content=f"Result for '{query}'")]
        state.set("documents", documents)
        return {"reply": f"Retrieved {len(documents)} document(s)"}


@component
class OurDocumentRetriever:
    """Retrieve documents and store them in state."""

    @component.output_types(reply=str)
    def run(self, query: str, state: State) -> dict[str, str]:
        """
        Retrieve documents based on query and store them in state.

        :param query: The search query
        """
        documents = [Document(content=f"Result for '{query}'")]
        state.set("documents", documents)
        return {"reply": f"Retrieved {len(documents)} document(s)"}


@pytest.mark.parametrize(
    "make_tool",
    [
        lambda: HaystackComponentTool(
            component=DocumentRetriever(), name="retrieve", description="Retrieve documents based on a search query"
        ),
        lambda: ComponentTool(
            component=OurDocumentRetriever(), name="retrieve", description="Retrieve documents based on a search query"
        ),
    ],
    ids=["haystack-component-tool", "our-component-tool"],
)
def test_state_injected_into_a_component_tool(make_tool: Callable[[], Any]) -> None:
    generator = ScriptedChatGenerator(script=[[("retrieve", {"query": "Python"})], "Done."])
    agent = Agent(
        chat_generator=generator,
        tools=[make_tool()],
        system_prompt="Use the retrieve tool to find documents.",
        state_schema={"documents": {"type": list[Document]}},
    )
    result = agent.run(messages=[ChatMessage.from_user("Find documents about Python")])

    assert result["last_message"].text == "Done."
    assert [d.content for d in result["documents"]] == ["Result for 'Python'"]
    assert tool_results(result) == ['{"reply": "Retrieved 1 document(s)"}']
    shown = schema_of(generator, "retrieve")
    assert set(shown["properties"]) == {"query"}
    assert shown["properties"]["query"]["description"] == "The search query"


# --- Schema handlers and types, in an agent run ----------------------------------------------------------


def deduplicate(current_value: list | None, new_value: list) -> list:
    """Append new items, skipping any already in the list."""
    existing = set(current_value or [])
    return (current_value or []) + [item for item in new_value if item not in existing]


def find_ids(query: str) -> dict:
    """Find document ids."""
    return {"ids": {"a": ["doc-1", "doc-2"], "b": ["doc-2", "doc-3"]}[query]}


def test_a_custom_handler_merges_overlapping_tool_results(tool: Decorator) -> None:
    script = [[("find_ids", {"query": "a"}), ("find_ids", {"query": "b"})], "done"]
    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=script),
        tools=[tool(outputs_to_state={"doc_ids": {"source": "ids"}})(find_ids)],
        state_schema={"doc_ids": {"type": list, "handler": deduplicate}},
    )
    assert agent.run(messages=[ChatMessage.from_user("ids")])["doc_ids"] == ["doc-1", "doc-2", "doc-3"]


@dataclass
class Profile:
    name: str
    age: int | None = None


def load_profile(name: str) -> dict:
    """Load a profile."""
    return {"profile": Profile(name=name, age=36 if name == "Alice" else None), "score": 3 if name == "Alice" else "?"}


def test_union_and_dataclass_types(tool: Decorator) -> None:
    script = [[("load_profile", {"name": "Alice"})], [("load_profile", {"name": "Bob"})], "done"]
    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=script),
        tools=[tool(outputs_to_state={"profile": {"source": "profile"}, "score": {"source": "score"}})(load_profile)],
        state_schema={"profile": {"type": Profile | None}, "score": {"type": str | int}},
    )
    result = agent.run(messages=[ChatMessage.from_user("profiles")])
    assert result["profile"] == Profile(name="Bob")
    assert result["score"] == "?"


def test_a_result_of_the_wrong_type_is_an_error_result_and_changes_nothing(tool: Decorator) -> None:
    script = [[("load_profile", {"name": "Alice"})], [("load_profile", {"name": "Bob"})], "done"]
    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=script),
        tools=[tool(outputs_to_state={"profile": {"source": "profile"}, "score": {"source": "score"}})(load_profile)],
        state_schema={"profile": {"type": Profile}, "score": {"type": int}},
    )
    result = agent.run(messages=[ChatMessage.from_user("profiles")])

    bob = result["messages"][4].tool_call_result
    assert bob.error is True
    assert "score" in bob.result
    assert result["profile"] == Profile(name="Alice", age=36)  # Bob's call merged nothing, not even his profile
    assert result["score"] == 3


# --- Automatic message handling ------------------------------------------------------------------------


def test_messages_hold_the_whole_conversation_without_being_declared(tool: Decorator) -> None:
    script = [[("get_user_info", {})], "Alice is an admin."]
    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=script),
        tools=[tool(outputs_to_state={"user_info": {}})(get_user_info)],
        system_prompt="Be helpful.",
        state_schema={"user_info": {"type": dict}},
    )
    result = agent.run(messages=[ChatMessage.from_user("Who is the user?")])

    assert [m.role for m in result["messages"]] == [
        ChatRole.SYSTEM,
        ChatRole.USER,
        ChatRole.ASSISTANT,
        ChatRole.TOOL,
        ChatRole.ASSISTANT,
    ]
    assert result["last_message"] is result["messages"][-1]
    run_facts = {"step_count", "exit_reason", "token_usage", "tool_call_counts", "context_tokens"}
    run_facts |= {"pending_tool_calls", "pending_interrupts", "checkpoint_id"}
    assert set(result) == {"messages", "last_message", "user_info", *run_facts}
