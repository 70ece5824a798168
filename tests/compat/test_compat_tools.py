"""
haystack-ai's own tests of ``@tool``/``create_tool_from_function``, ``Tool``, ``ComponentTool`` and the parameter
schema utilities (``test/tools/test_from_function.py``, ``test_tool.py``, ``test_component_tool.py``,
``test_parameters_schema_utils.py``), re-expressed against haystack-state's ``@tool`` and ``ComponentTool``: the
behaviours a Haystack user relies on, checked against haystack-ai 3.4 as installed.

Left out, because they test haystack-ai's internals rather than what a user sees: ``_remove_title_from_schema`` called
directly (re-expressed below through the schemas it affects), ``_check_duplicate_tool_names`` (re-expressed through
ToolInvoker), ``_deepcopy_with_exceptions`` (re-expressed through a Pipeline that copies its inputs), the warm-up
counter checked with a mock (re-expressed with a real component), and the integration tests that need OpenAI or
SerperDev keys (re-expressed against the local fake OpenAI server). Deliberate differences are noted where they
show: the serialized ``type`` names our classes, and a few mistakes haystack-ai lets through raise here at
construction.
"""

import asyncio
import copy
import dataclasses
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional

import pytest
from fake_openai import FakeOpenAIServer
from haystack import Document, Pipeline, SuperComponent, component
from haystack.components.agents.state import State as HaystackState
from haystack.components.builders import PromptBuilder
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ByteStream, ChatMessage, TextContent, ToolCall, ToolCallResult
from haystack.tools import ComponentTool as HaystackComponentTool
from haystack.tools import Tool, create_tool_from_function
from haystack.tools import tool as haystack_tool
from haystack.tools.errors import SchemaGenerationError, ToolInvocationError
from haystack.tools.serde_utils import deserialize_tools_or_toolset_inplace, serialize_tools_or_toolset
from haystack.utils import Secret
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state import State, ToolInvoker
from haystack_state.tools import ComponentTool, FunctionTool, tool

CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def function_with_docstring(city: str) -> str:
    """Get weather report for a city."""
    return f"Weather report for {city}: 20°C, sunny"


def get_weather_report(city: str) -> str:
    return f"Weather report for {city}: 20°C, sunny"


def output_handler(old: Any, new: Any) -> Any:
    return old + new


def reply_formatter(input_text: str) -> str:
    return f"Formatted reply: {input_text}"


# === test_from_function.py ===========================================================================


def test_from_function_description_from_docstring() -> None:
    made = tool(function_with_docstring)
    assert made.name == "function_with_docstring"
    assert made.description == "Get weather report for a city."
    assert made.parameters == CITY_SCHEMA
    assert made.function is function_with_docstring


def test_from_function_with_empty_description() -> None:
    made = tool(function_with_docstring, description="")
    assert made.description == ""
    assert made.parameters == CITY_SCHEMA


def test_from_function_with_custom_description() -> None:
    assert tool(function_with_docstring, description="custom description").description == "custom description"


def test_from_function_with_custom_name() -> None:
    made = tool(function_with_docstring, name="custom_name")
    assert made.name == "custom_name"
    assert made.description == "Get weather report for a city."


def test_from_function_multiline_docstring_is_the_description_as_written() -> None:
    def documented(city: str) -> str:
        """
        Get the weather.

        :param city: The city.
        """
        return city

    made = tool(documented)
    assert made.description == documented.__doc__
    assert made.description == create_tool_from_function(documented).description


def test_from_function_annotated() -> None:
    def function_with_annotations(
        city: Annotated[str, "the city for which to get the weather"] = "Munich",
        unit: Annotated[Literal["Celsius", "Fahrenheit"], "the unit for the temperature"] = "Celsius",
        nullable_param: Annotated[str | None, "a nullable parameter"] = None,
    ) -> str:
        """A simple function to get the current weather for a location."""
        return f"Weather report for {city}: 20 {unit}, sunny"

    made = tool(function_with_annotations)
    assert made.description == "A simple function to get the current weather for a location."
    assert made.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city for which to get the weather", "default": "Munich"},
            "unit": {
                "type": "string",
                "enum": ["Celsius", "Fahrenheit"],
                "description": "the unit for the temperature",
                "default": "Celsius",
            },
            "nullable_param": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "a nullable parameter",
                "default": None,
            },
        },
    }


def test_from_function_missing_type_hint() -> None:
    def function_missing_type_hint(city) -> str:  # type: ignore[no-untyped-def]
        return f"Weather report for {city}: 20°C, sunny"

    with pytest.raises(ValueError, match="city"):
        tool(function_missing_type_hint)


def test_from_function_schema_generation_error() -> None:
    def function_with_invalid_type_hint(city: "invalid") -> str:  # type: ignore[name-defined]  # noqa: F821
        return f"Weather report for {city}: 20°C, sunny"

    with pytest.raises(SchemaGenerationError, match="city"):
        tool(function_with_invalid_type_hint)


def test_from_function_with_callable_params_skipped() -> None:
    def function_with_callback(query: str, callback: Callable[[str], None] | None = None) -> str:
        """A function with a callable parameter."""
        return query

    made = tool(function_with_callback)
    assert list(made.parameters["properties"]) == ["query"]


def test_tool_decorator() -> None:
    @tool
    def get_weather(city: str) -> str:
        """Get weather report for a city."""
        return f"Weather report for {city}: 20°C, sunny"

    assert isinstance(get_weather, Tool)
    assert get_weather.name == "get_weather"
    assert get_weather.description == "Get weather report for a city."
    assert get_weather.parameters == CITY_SCHEMA
    assert get_weather.function is not None
    assert get_weather.function("Berlin") == "Weather report for Berlin: 20°C, sunny"


@tool
def weather_tool_with_decorator(city: str) -> str:
    """Get weather report for a city."""
    return f"Weather report for {city}: 20°C, sunny"


def test_tool_decorator_deserialization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    serialized = weather_tool_with_decorator.to_dict()
    deserialized = Tool.from_dict(serialized)
    assert deserialized.name == "weather_tool_with_decorator"
    assert deserialized.description == "Get weather report for a city."
    assert deserialized.parameters == CITY_SCHEMA
    assert deserialized.invoke(city="Oslo") == "Weather report for Oslo: 20°C, sunny"


def test_tool_decorator_with_annotated_params() -> None:
    @tool
    def get_weather(
        city: Annotated[str, "The target city"] = "Berlin",
        output_format: Annotated[Literal["short", "long"], "Output format"] = "short",
    ) -> str:
        """Get weather report for a city."""
        return f"Weather report for {city} ({output_format} format): 20°C, sunny"

    assert get_weather.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The target city", "default": "Berlin"},
            "output_format": {
                "type": "string",
                "enum": ["short", "long"],
                "description": "Output format",
                "default": "short",
            },
        },
    }
    assert get_weather.function is not None
    assert get_weather.function("Berlin", "short") == "Weather report for Berlin (short format): 20°C, sunny"


def test_tool_decorator_with_parameters() -> None:
    @tool(name="fetch_weather", description="A tool to check the weather.")
    def get_weather(city: Annotated[str, "The target city"] = "Berlin") -> str:
        """Get weather report for a city."""
        return city

    assert get_weather.name == "fetch_weather"
    assert get_weather.description == "A tool to check the weather."


def test_tool_decorator_with_inputs_and_outputs() -> None:
    @tool(inputs_from_state={"output_format": "output_format"}, outputs_to_state={"output": {"source": "output"}})
    def get_weather(
        city: Annotated[str, "The target city"] = "Berlin",
        output_format: Annotated[Literal["short", "long"], "Output format"] = "short",
    ) -> str:
        """Get weather report for a city."""
        return f"Weather report for {city} ({output_format} format): 20°C, sunny"

    assert get_weather.inputs_from_state == {"output_format": "output_format"}
    assert get_weather.outputs_to_state == {"output": {"source": "output"}}
    assert get_weather.parameters == {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The target city", "default": "Berlin"}},
    }


def test_inputs_from_state_parameter_needs_no_type_hint() -> None:
    def lookup(query: str, user) -> str:  # type: ignore[no-untyped-def]
        """Look up."""
        return f"{user}:{query}"

    assert list(tool(lookup, inputs_from_state={"user_id": "user"}).parameters["properties"]) == ["query"]
    assert list(create_tool_from_function(lookup, inputs_from_state={"user_id": "user"}).parameters["properties"]) == [
        "query"
    ]


def test_inputs_from_state_naming_an_unknown_parameter_raises_value_error() -> None:
    with pytest.raises(ValueError, match="missing"):
        tool(function_with_docstring, inputs_from_state={"user_id": "missing"})


def test_title_keywords_are_removed_but_title_properties_and_values_kept() -> None:
    # what haystack-ai's _remove_title_from_schema tests check, seen through the schemas it produces
    @dataclasses.dataclass
    class Book:
        title: str
        pages: int = 0

    def complex_function(
        title: str,
        parameter1: str | int = "default_value",
        parameter2: list[str | int] = [1, 2, 3],  # noqa: B006 - a default shown in the schema
        parameter3: str | int | list[str | int] = 42,
        parameter4: str | list[int] | dict[str, Any] = {"key": "value", "title": "kept"},  # noqa: B006
        book: Book | None = None,
    ) -> None:
        """Complex."""

    made = tool(complex_function)
    props = made.parameters["properties"]
    assert list(props) == ["title", "parameter1", "parameter2", "parameter3", "parameter4", "book"]
    assert props["title"] == {"type": "string"}
    assert props["parameter1"] == {"anyOf": [{"type": "string"}, {"type": "integer"}], "default": "default_value"}
    assert props["parameter2"] == {
        "type": "array",
        "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "default": [1, 2, 3],
    }
    assert props["parameter4"]["default"] == {"key": "value", "title": "kept"}
    assert made.parameters["$defs"]["Book"]["properties"]["title"] == {"type": "string"}
    assert "title" not in made.parameters and "title" not in made.parameters["$defs"]["Book"]
    assert made.parameters == create_tool_from_function(complex_function).parameters


def test_async_function_becomes_async_tool() -> None:
    async def async_get_weather(city: str) -> str:
        """Get weather report for a city."""
        await asyncio.sleep(0)
        return f"Weather report for {city}: 20°C, sunny"

    made = tool(async_get_weather)
    theirs = create_tool_from_function(async_get_weather)
    assert made.function is None and made.async_function is async_get_weather
    assert (theirs.function, theirs.async_function) == (made.function, made.async_function)
    assert made.parameters == theirs.parameters == CITY_SCHEMA
    assert asyncio.run(made.invoke_async(city="Rome")) == "Weather report for Rome: 20°C, sunny"
    with pytest.raises(ToolInvocationError):
        made.invoke(city="Rome")


@pytest.mark.parametrize(
    "annotation",
    [HaystackState, Optional[HaystackState], HaystackState | None, Annotated[HaystackState, "the state"]],  # noqa: UP045
    ids=["bare", "Optional", "union", "Annotated"],
)
def test_state_parameters_are_hidden(annotation: Any) -> None:
    def search(query: str, state: Any = None) -> str:
        """Search."""
        return query

    search.__annotations__["state"] = annotation
    made = tool(search)
    assert made.parameters == create_tool_from_function(search).parameters
    assert list(made.parameters["properties"]) == ["query"]


def test_postponed_annotations_are_resolved() -> None:
    def search(query: "str", top_k: "int" = 3, state: "HaystackState | None" = None) -> str:
        """Search."""
        return query

    made = tool(search)
    assert made.parameters == create_tool_from_function(search).parameters
    assert made.parameters == {
        "type": "object",
        "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 3}},
        "required": ["query"],
    }


def test_haystack_tool_decorator_and_ours_agree_on_a_typical_tool() -> None:
    def search(query: Annotated[str, "What to find"], top_k: int = 5, tags: list[str] | None = None) -> str:
        """Search the knowledge base."""
        return query

    ours, theirs = tool(search), haystack_tool(search)
    assert (ours.name, ours.description, ours.parameters) == (theirs.name, theirs.description, theirs.parameters)
    assert ours.tool_spec == theirs.tool_spec


# === test_tool.py ====================================================================================


def test_tool_init_defaults() -> None:
    made = tool(get_weather_report, description="Get weather report")
    assert isinstance(made, Tool)
    assert made.parameters == CITY_SCHEMA
    assert made.function is get_weather_report
    assert made.inputs_from_state is None
    assert made.outputs_to_state is None
    assert made.outputs_to_string is None


def test_tool_init_invalid_parameters() -> None:
    with pytest.raises(ValueError):
        FunctionTool(
            name="irrelevant",
            description="irrelevant",
            parameters={"type": "invalid", "properties": {"city": {"type": "string"}}},
            function=get_weather_report,
        )
    with pytest.raises(ValueError):
        ComponentTool(SimpleComponent(), parameters={"type": "invalid", "properties": {}})


@pytest.mark.parametrize(
    "outputs_to_state",
    [
        pytest.param({"documents": ["some_value"]}, id="config-not-a-dict"),
        pytest.param({"documents": {"source": get_weather_report}}, id="source-not-a-string"),
        pytest.param({"documents": {"handler": "some_string", "source": "docs"}}, id="handler-not-callable"),
    ],
)
def test_tool_init_invalid_output_structure(outputs_to_state: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        tool(get_weather_report, outputs_to_state=outputs_to_state)
    with pytest.raises(ValueError):
        ComponentTool(SimpleComponent(), outputs_to_state=outputs_to_state)


def test_tool_spec() -> None:
    made = tool(get_weather_report, name="weather", description="Get weather report")
    assert made.tool_spec == {"name": "weather", "description": "Get weather report", "parameters": CITY_SCHEMA}


def test_tool_invoke() -> None:
    made = tool(get_weather_report, name="weather", description="Get weather report")
    assert made.invoke(city="Berlin") == "Weather report for Berlin: 20°C, sunny"


def test_tool_invoke_fail() -> None:
    made = tool(get_weather_report, name="weather", description="Get weather report")
    with pytest.raises(ToolInvocationError) as info:
        made.invoke()
    assert str(info.value) == (
        "Failed to invoke Tool `weather` with parameters {}. "
        "Error: get_weather_report() missing 1 required positional argument: 'city'"
    )


def test_tool_to_dict_and_from_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    made = tool(
        get_weather_report,
        name="weather",
        description="Get weather report",
        outputs_to_state={"documents": {"handler": output_handler, "source": "docs"}},
    )
    data = made.to_dict()
    # deliberate difference: the type names our class (a haystack Tool subclass); the data is haystack-ai's
    assert data == {
        "type": "haystack_state.tools.function_tool.FunctionTool",
        "data": {
            "name": "weather",
            "description": "Get weather report",
            "parameters": CITY_SCHEMA,
            "function": f"{__name__}.get_weather_report",
            "outputs_to_string": None,
            "inputs_from_state": None,
            "outputs_to_state": {"documents": {"source": "docs", "handler": f"{__name__}.output_handler"}},
            "async_function": None,
        },
    }
    plain = Tool.from_dict(copy.deepcopy(data))  # haystack's Tool.from_dict (which edits its argument) makes a Tool
    assert plain.function is get_weather_report
    assert plain.outputs_to_state == {"documents": {"source": "docs", "handler": output_handler}}
    restored = FunctionTool.from_dict(data)
    assert isinstance(restored, FunctionTool)
    assert restored == made


def test_deserialize_tools_inplace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    made = tool(get_weather_report, name="weather", description="Get weather report")
    data: dict[str, Any] = {"tools": serialize_tools_or_toolset([made])}
    deserialize_tools_or_toolset_inplace(data)
    assert data["tools"] == [made]

    data = {"mytools": serialize_tools_or_toolset([made])}
    deserialize_tools_or_toolset_inplace(data, key="mytools")
    assert data["mytools"] == [made]


def test_duplicate_tool_names_are_refused() -> None:
    first = tool(get_weather_report, name="weather")
    second = tool(function_with_docstring, name="weather")
    with pytest.raises(ValueError, match="weather"):
        ToolInvoker(tools=[first, second])
    ToolInvoker(tools=[first, tool(function_with_docstring, name="weather2")])


# === test_component_tool.py ==========================================================================


@component
class SimpleComponentUsingChatMessages:
    """A simple component that generates text."""

    @component.output_types(reply=str)
    def run(self, messages: list[ChatMessage]) -> dict[str, str]:
        """
        A simple component that generates text.

        :param messages: Users messages
        :return: A dictionary with the generated text.
        """
        return {"reply": f"Hello, {messages[0].text}!"}


@component
class SimpleComponent:
    """A simple component that generates text."""

    @component.output_types(reply=str)
    def run(self, text: str) -> dict[str, str]:
        """
        A simple component that generates text.

        :param text: user's name
        :return: A dictionary with the generated text.
        """
        return {"reply": f"Hello, {text}!"}


@dataclasses.dataclass
class User:
    """A simple user dataclass."""

    name: str = "Anonymous"
    age: int = 0


@component
class UserGreeter:
    """A simple component that processes a User."""

    @component.output_types(message=str)
    def run(self, user: User) -> dict[str, str]:
        """
        A simple component that processes a User.

        :param user: The User object to process.
        :return: A dictionary with a message about the user.
        """
        return {"message": f"User {user.name} is {user.age} years old"}


@component
class ListProcessor:
    """A component that processes a list of strings."""

    @component.output_types(concatenated=str)
    def run(self, texts: list[str]) -> dict[str, str]:
        """
        Concatenates a list of strings into a single string.

        :param texts: The list of strings to concatenate.
        :return: A dictionary with the concatenated string.
        """
        return {"concatenated": " ".join(texts)}


@dataclasses.dataclass
class Address:
    """A dataclass representing a physical address."""

    street: str
    city: str


@dataclasses.dataclass
class Person:
    """A person with an address."""

    name: str
    address: Address


@component
class PersonProcessor:
    """A component that processes a Person with nested Address."""

    @component.output_types(info=str)
    def run(self, person: Person) -> dict[str, str]:
        """
        Creates information about the person.

        :param person: The Person to process.
        :return: A dictionary with the person's information.
        """
        return {"info": f"{person.name} lives at {person.address.street}, {person.address.city}."}


@component
class DocumentProcessor:
    """A component that processes a list of Documents."""

    @component.output_types(concatenated=str)
    def run(self, documents: list[Document], top_k: int = 5) -> dict[str, str]:
        """
        Concatenates the content of multiple documents with newlines.

        :param documents: List of Documents whose content will be concatenated
        :param top_k: The number of top documents to concatenate
        :returns: Dictionary containing the concatenated document contents
        """
        return {"concatenated": "\n".join(doc.content or "" for doc in documents[:top_k])}


def test_from_component_basic() -> None:
    made = ComponentTool(component=SimpleComponent())
    assert made.name == "simple_component"
    assert made.description == "A simple component that generates text."
    assert made.parameters == {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "user's name"}},
        "required": ["text"],
    }
    assert made.invoke(text="world") == {"reply": "Hello, world!"}


def test_from_component_long_description() -> None:
    made = ComponentTool(component=SimpleComponent(), description="A" * 1024)
    assert len(made.description) == 1024


@pytest.mark.parametrize("state_key", ["text", "state_text"])
def test_from_component_with_inputs_from_state(state_key: str) -> None:
    made = ComponentTool(component=SimpleComponent(), inputs_from_state={state_key: "text"})
    assert made.inputs_from_state == {state_key: "text"}
    assert made.parameters == {"type": "object", "properties": {}}


def test_from_component_with_outputs_to_state() -> None:
    made = ComponentTool(component=SimpleComponent(), outputs_to_state={"replies": {"source": "reply"}})
    assert made.outputs_to_state == {"replies": {"source": "reply"}}


def test_from_component_with_dataclass() -> None:
    made = ComponentTool(component=UserGreeter())
    assert made.parameters == {
        "$defs": {
            "User": {
                "properties": {
                    "name": {"description": "Field 'name' of 'User'.", "type": "string", "default": "Anonymous"},
                    "age": {"description": "Field 'age' of 'User'.", "type": "integer", "default": 0},
                },
                "type": "object",
            }
        },
        "properties": {"user": {"$ref": "#/$defs/User", "description": "The User object to process."}},
        "required": ["user"],
        "type": "object",
    }
    assert made.name == "user_greeter"
    assert made.description == "A simple component that processes a User."
    assert made.invoke(user={"name": "Alice", "age": 30}) == {"message": "User Alice is 30 years old"}


def test_from_component_with_list_input() -> None:
    made = ComponentTool(
        component=ListProcessor(), name="list_processing_tool", description="A tool that concatenates strings"
    )
    assert made.parameters == {
        "type": "object",
        "properties": {
            "texts": {
                "type": "array",
                "description": "The list of strings to concatenate.",
                "items": {"type": "string"},
            }
        },
        "required": ["texts"],
    }
    assert made.invoke(texts=["hello", "world"]) == {"concatenated": "hello world"}


def test_from_component_with_nested_dataclass() -> None:
    made = ComponentTool(component=PersonProcessor(), name="person_tool", description="A tool that processes people")
    assert made.parameters == {
        "$defs": {
            "Address": {
                "properties": {
                    "street": {"description": "Field 'street' of 'Address'.", "type": "string"},
                    "city": {"description": "Field 'city' of 'Address'.", "type": "string"},
                },
                "required": ["street", "city"],
                "type": "object",
            },
            "Person": {
                "properties": {
                    "name": {"description": "Field 'name' of 'Person'.", "type": "string"},
                    "address": {"$ref": "#/$defs/Address", "description": "Field 'address' of 'Person'."},
                },
                "required": ["name", "address"],
                "type": "object",
            },
        },
        "properties": {"person": {"$ref": "#/$defs/Person", "description": "The Person to process."}},
        "required": ["person"],
        "type": "object",
    }
    result = made.invoke(person={"name": "Diana", "address": {"street": "123 Elm Street", "city": "Metropolis"}})
    assert result == {"info": "Diana lives at 123 Elm Street, Metropolis."}


def test_from_component_with_list_of_documents() -> None:
    made = ComponentTool(
        component=DocumentProcessor(),
        name="document_processor",
        description="A tool that concatenates document contents",
    )
    theirs = HaystackComponentTool(component=DocumentProcessor(), name="document_processor")
    assert made.parameters == theirs.parameters
    assert set(made.parameters["$defs"]) == {"ByteStream", "Document", "SparseEmbedding"}
    assert made.parameters["properties"] == {
        "documents": {
            "description": "List of Documents whose content will be concatenated",
            "items": {"$ref": "#/$defs/Document"},
            "type": "array",
        },
        "top_k": {"description": "The number of top documents to concatenate", "type": "integer", "default": 5},
    }
    assert made.parameters["required"] == ["documents"]
    result = made.invoke(documents=[{"content": "First document"}, {"content": "Second document"}])
    assert result == {"concatenated": "First document\nSecond document"}


def test_from_component_with_dynamic_input_types() -> None:
    made = ComponentTool(component=PromptBuilder(template="Hello, {{name}}!"), name="prompt_builder_tool")
    theirs = HaystackComponentTool(component=PromptBuilder(template="Hello, {{name}}!"), name="prompt_builder_tool")
    assert made.parameters == theirs.parameters
    assert made.parameters["properties"]["name"] == {"description": "Input 'name' for the component."}
    assert made.parameters["properties"]["template"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    assert made.invoke(name="Ann") == {"prompt": "Hello, Ann!"}


def test_from_component_with_invalid_component() -> None:
    class NotAComponent:
        def foo(self, text: str) -> dict[str, str]:
            return {"reply": f"Hello, {text}!"}

    with pytest.raises(TypeError):
        ComponentTool(component=NotAComponent(), name="invalid_tool", description="This should fail")  # type: ignore[arg-type]


def test_component_invoker_with_chat_message_input() -> None:
    made = ComponentTool(component=SimpleComponentUsingChatMessages(), name="simple_tool", description="A tool")
    assert made.invoke(messages=[ChatMessage.from_user(text="world")]) == {"reply": "Hello, world!"}
    assert made.invoke(messages=[{"role": "user", "content": [{"text": "you"}]}]) == {"reply": "Hello, you!"}


@component
class AnnotatedComponent:
    """An annotated component with descriptive parameter docstrings."""

    @component.output_types(result=str)
    def run(self, text: str, number: int = 42) -> dict[str, str]:
        """
        Process inputs and return result.

        :param text: A detailed description of the text parameter that should be preserved
        :param number: A detailed description of the number parameter that should be preserved
        """
        return {"result": f"Processed: {text} and {number}"}


def test_component_tool_with_super_component_docstrings() -> None:
    pipeline = Pipeline()
    pipeline.add_component("processor", AnnotatedComponent())
    super_comp = SuperComponent(
        pipeline=pipeline,
        input_mapping={"input_text": ["processor.text"], "input_number": ["processor.number"]},
        output_mapping={"processor.result": "processed_result"},
    )
    made = ComponentTool(component=super_comp, name="text_processor")
    assert made.parameters == {
        "type": "object",
        "properties": {
            "input_text": {
                "type": "string",
                "description": "Provided to the 'processor' component as: 'A detailed description of the text "
                "parameter that should be preserved'.",
            },
            "input_number": {  # its default is SuperComponent's "delegate" marker, which has no JSON form
                "type": "integer",
                "description": "Provided to the 'processor' component as: 'A detailed description of the number "
                "parameter that should be preserved'.",
            },
        },
        "required": ["input_text"],
    }
    assert made.description == SuperComponent.__doc__  # the component's docstring, as in haystack-ai
    assert made.invoke(input_text="Hello", input_number=42)["processed_result"] == "Processed: Hello and 42"


def test_component_tool_with_multiple_mapped_docstrings() -> None:
    @component
    class ComponentA:
        """Component A with descriptive docstrings."""

        @component.output_types(output_a=str)
        def run(self, query: str) -> dict[str, str]:
            """
            Process query in component A.

            :param query: The query string for component A
            """
            return {"output_a": f"A processed: {query}"}

    @component
    class ComponentB:
        """Component B with descriptive docstrings."""

        @component.output_types(output_b=str)
        def run(self, text: str) -> dict[str, str]:
            """
            Process text in component B.

            :param text: Text to process in component B
            """
            return {"output_b": f"B processed: {text}"}

    pipeline = Pipeline()
    pipeline.add_component("comp_a", ComponentA())
    pipeline.add_component("comp_b", ComponentB())
    super_comp = SuperComponent(pipeline=pipeline, input_mapping={"combined_input": ["comp_a.query", "comp_b.text"]})
    made = ComponentTool(component=super_comp, name="combined_processor")
    assert made.parameters == {
        "type": "object",
        "properties": {
            "combined_input": {
                "type": "string",
                "description": "Provided to the 'comp_a' component as: 'The query string for component A', and "
                "Provided to the 'comp_b' component as: 'Text to process in component B'.",
            }
        },
        "required": ["combined_input"],
    }
    result = made.invoke(combined_input="test input")
    assert result["output_a"] == "A processed: test input"
    assert result["output_b"] == "B processed: test input"


def test_warm_up_reaches_the_component() -> None:
    @component
    class WarmingComponent:
        def __init__(self) -> None:
            self.warm_ups = 0

        def warm_up(self) -> None:
            self.warm_ups += 1

        @component.output_types(reply=str)
        def run(self, text: str) -> dict[str, str]:
            return {"reply": text}

    inner = WarmingComponent()
    made = ComponentTool(component=inner)
    made.warm_up()
    assert inner.warm_ups == 1


def test_component_tool_serde(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    made = ComponentTool(
        component=SimpleComponent(),
        name="simple_tool",
        description="A simple tool",
        outputs_to_string={"source": "reply", "handler": reply_formatter},
        inputs_from_state={"test": "text"},
        outputs_to_state={"output": {"source": "reply", "handler": output_handler}},
    )
    data = made.to_dict()
    # deliberate difference: the type names our class; the data is haystack-ai's
    assert data == {
        "type": "haystack_state.tools.component_tool.ComponentTool",
        "data": {
            "component": {"type": f"{__name__}.SimpleComponent", "init_parameters": {}},
            "name": "simple_tool",
            "description": "A simple tool",
            "parameters": None,
            "outputs_to_string": {"source": "reply", "handler": f"{__name__}.reply_formatter"},
            "inputs_from_state": {"test": "text"},
            "outputs_to_state": {"output": {"source": "reply", "handler": f"{__name__}.output_handler"}},
        },
    }
    restored = ComponentTool.from_dict(data)
    assert restored.name == made.name
    assert restored.description == made.description
    assert restored.parameters == made.parameters
    assert restored.outputs_to_string == made.outputs_to_string
    assert restored.inputs_from_state == made.inputs_from_state
    assert restored.outputs_to_state == made.outputs_to_state
    assert isinstance(restored.component, SimpleComponent)


def test_pipeline_component_fails() -> None:
    comp = SimpleComponent()
    Pipeline().add_component("simple", comp)
    with pytest.raises(ValueError, match="added to a pipeline"):
        ComponentTool(component=comp)


@pytest.mark.slow
def test_jinja_based_component_tool_passed_at_run_time_through_a_pipeline() -> None:
    # haystack-ai's version mocks the OpenAI client; here the request goes over HTTP to the local fake server, and
    # the Pipeline deep-copies the tool (with its Jinja template) on the way in
    made = ComponentTool(component=PromptBuilder("{{query}}"))
    with FakeOpenAIServer(script=["A response from the model"]) as server:
        pipeline = Pipeline()
        pipeline.add_component(
            "llm", OpenAIChatGenerator(api_key=Secret.from_token("test"), api_base_url=server.base_url)
        )
        result = pipeline.run({"llm": {"messages": [ChatMessage.from_user(text="Hello")], "tools": [made]}})
    assert result["llm"]["replies"][0].text == "A response from the model"
    [sent] = server.requests[0].body["tools"]
    assert sent["function"]["name"] == "prompt_builder"
    assert sent["function"]["parameters"] == json.loads(json.dumps(made.parameters))


def test_component_tool_in_a_serialized_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    made = ComponentTool(component=SimpleComponent(), name="hello_tool", description="Greet the user")
    pipeline = Pipeline()
    pipeline.add_component("tool_invoker", ToolInvoker(tools=[made]))
    pipeline.add_component("llm", OpenAIChatGenerator(tools=[made]))
    pipeline.connect("tool_invoker.tool_messages", "llm.messages")
    as_dict = pipeline.to_dict()
    [tool_dict] = as_dict["components"]["tool_invoker"]["init_parameters"]["tools"]
    assert tool_dict["type"] == "haystack_state.tools.component_tool.ComponentTool"
    assert tool_dict["data"]["name"] == "hello_tool"
    assert tool_dict["data"]["component"]["type"] == f"{__name__}.SimpleComponent"
    assert Pipeline.loads(pipeline.dumps()) == pipeline


def test_tool_calls_from_a_model_run_through_the_tool_invoker() -> None:
    # haystack-ai's integration tests need OpenAI; the same flow runs here against the fake server
    made = ComponentTool(component=PersonProcessor(), name="person_processor")
    arguments = {"person": {"name": "Diana", "address": {"street": "123 Elm Street", "city": "Metropolis"}}}
    with FakeOpenAIServer(script=[[("person_processor", arguments)]]) as server:
        pipeline = Pipeline()
        pipeline.add_component(
            "llm", OpenAIChatGenerator(api_key=Secret.from_token("t"), api_base_url=server.base_url, tools=[made])
        )
        pipeline.add_component("tool_invoker", ToolInvoker(tools=[made]))
        pipeline.connect("llm.replies", "tool_invoker.messages")
        result = pipeline.run({"llm": {"messages": [ChatMessage.from_user("Diana lives at 123 Elm Street")]}})
    [message] = result["tool_invoker"]["tool_messages"]
    assert message.tool_call_result.error is False
    assert "Diana lives at 123 Elm Street, Metropolis." in message.tool_call_result.result


# === test_parameters_schema_utils.py =================================================================


@component
class OneInput:
    """A component with one input of a given type."""

    def __init__(self, annotation: Any) -> None:
        component.set_input_type(self, "input_name", annotation)

    @component.output_types(received=dict)
    def run(self, **kwargs: Any) -> dict[str, Any]:
        return {"received": kwargs}


@pytest.mark.parametrize(
    ("annotation", "expected_property", "expected_defs"),
    [
        (ByteStream, {"$ref": "#/$defs/ByteStream"}, {"ByteStream"}),
        (Document, {"$ref": "#/$defs/Document"}, {"Document", "ByteStream", "SparseEmbedding"}),
        (TextContent, {"$ref": "#/$defs/TextContent"}, {"TextContent"}),
        (ToolCall, {"$ref": "#/$defs/ToolCall"}, {"ToolCall"}),
        (ToolCallResult, {"$ref": "#/$defs/ToolCallResult"}, {"ToolCallResult", "ToolCall"}),
        (ChatMessage, {"$ref": "#/$defs/ChatMessage"}, {"ChatMessage", "ChatRole", "TextContent", "ToolCall"}),
        (list[Document], {"type": "array", "items": {"$ref": "#/$defs/Document"}}, {"Document"}),
        (list[ChatMessage], {"type": "array", "items": {"$ref": "#/$defs/ChatMessage"}}, {"ChatMessage"}),
    ],
    ids=["ByteStream", "Document", "TextContent", "ToolCall", "ToolCallResult", "ChatMessage", "docs", "messages"],
)
def test_haystack_dataclass_inputs(annotation: Any, expected_property: dict[str, Any], expected_defs: set[str]) -> None:
    made = ComponentTool(OneInput(annotation), name="one")
    theirs = HaystackComponentTool(OneInput(annotation), name="one")
    assert made.parameters == theirs.parameters
    assert made.parameters["properties"]["input_name"] == {
        **expected_property,
        "description": "Input 'input_name' for the component.",
    }
    assert expected_defs <= set(made.parameters["$defs"])
    # every field of a rewritten dataclass is described; ChatMessage's underscored fields are shown without it
    for definition in made.parameters["$defs"].values():
        for field in definition.get("properties", {}).values():
            assert field["description"]
    if annotation in (ChatMessage, list[ChatMessage]):
        assert set(made.parameters["$defs"]["ChatMessage"]["properties"]) == {"role", "content", "name", "meta"}


def test_document_schema_details() -> None:
    made = ComponentTool(OneInput(Document), name="one")
    document = made.parameters["$defs"]["Document"]
    assert "required" not in document
    assert document["properties"]["id"] == {
        "type": "string",
        "default": "",
        "description": "Unique identifier for the document. When not set, it's generated based on the Document "
        "fields' values.",
    }
    assert document["properties"]["meta"]["default"] == {}  # the default factory's value
    assert document["properties"]["blob"]["anyOf"] == [{"$ref": "#/$defs/ByteStream"}, {"type": "null"}]
    assert made.parameters["$defs"]["ByteStream"]["properties"]["data"] == {
        "type": "string",
        "format": "binary",
        "description": "The binary data stored in Bytestream.",
    }
    # a string for ByteStream.data (what the schema asks for) reaches the component as bytes
    result = made.invoke(input_name={"content": "x", "blob": {"data": "abc", "mime_type": "text/plain"}})
    received = result["received"]["input_name"]
    assert isinstance(received, Document)
    assert received.blob == ByteStream(data=b"abc", mime_type="text/plain")


def test_component_with_state_socket_gets_the_state_object() -> None:
    @component
    class Counter:
        """Count calls in the state."""

        @component.output_types(count=int)
        def run(self, step: int, state: State) -> dict[str, int]:
            """
            :param step: How much to add.
            """
            count = (state.get("count") or 0) + step
            state.set("count", count)
            return {"count": count}

    made = ComponentTool(component=Counter())
    assert made.parameters == {
        "type": "object",
        "properties": {"step": {"type": "integer", "description": "How much to add."}},
        "required": ["step"],
    }
    state = State({"count": {"type": int}})
    reply = ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="counter", arguments={"step": 2}, id="c")])
    ToolInvoker(tools=[made]).run(messages=[reply], state=state)
    assert state.get("count") == 2


def test_component_round_trips_through_haystack_deserialization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    data = {"component": ComponentTool(component=ListProcessor()).to_dict()["data"]["component"]}
    deserialize_component_inplace(data, key="component")
    assert isinstance(data["component"], ListProcessor)
