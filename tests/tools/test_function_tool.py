"""
Tests of ``@tool``: schemas, descriptions, hidden parameters, async, invocation, serialization. Its decoration-time
errors are in ``test_function_tool_errors.py``.
"""

import asyncio
import dataclasses
import enum
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional

import pytest
from haystack import Document
from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import ChatMessage
from haystack.tools import Tool
from haystack.tools.errors import ToolInvocationError
from haystack.tools.serde_utils import deserialize_tools_or_toolset_inplace, serialize_tools_or_toolset
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from haystack_state.state import State
from haystack_state.tools import FunctionTool, tool
from tools.tool_helpers import Opaque, properties

# --- types used in signatures ----------------------------------------------------------------------


class Unit(enum.Enum):
    """A temperature unit."""

    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


@dataclasses.dataclass
class Place:
    """
    A place on earth.

    :param city: The city name.
    :param country: The ISO country code.
    """

    city: str
    country: str = "DE"


@dataclasses.dataclass
class Trip:
    """A trip through several places."""

    stops: list[Place]


class Options(BaseModel):
    """Search options."""

    limit: int = Field(5, description="At most this many results.")
    exact: bool = False


class TreeNode(BaseModel):
    """A node of a tree."""

    value: int
    children: list["TreeNode"] = []


class SubState(State):
    """A State subclass."""


class SubHaystackState(HaystackState):
    """A haystack State subclass."""


def contains_key(node: Any, key: str) -> bool:
    if isinstance(node, dict):
        return key in node or any(contains_key(v, key) for v in node.values())
    if isinstance(node, list):
        return any(contains_key(v, key) for v in node)
    return False


# --- the result is a haystack Tool -----------------------------------------------------------------


def test_bare_and_parametrized_decorator_make_haystack_tools() -> None:
    @tool
    def plain(x: int) -> int:
        """Plain."""
        return x

    @tool(name="renamed", description="Custom description.")
    def other(x: int) -> int:
        """Ignored docstring."""
        return x

    assert isinstance(plain, Tool) and isinstance(plain, FunctionTool)
    assert isinstance(other, Tool)
    assert plain.name == "plain" and plain.description == "Plain."  # the docstring as written
    assert other.name == "renamed" and other.description == "Custom description."
    assert plain.tool_spec == {"name": "plain", "description": "Plain.", "parameters": plain.parameters}


def test_function_form_matches_decorator() -> None:
    def double(x: int) -> int:
        """Double a number."""
        return 2 * x

    made = tool(double, name="twice")
    assert made.name == "twice"
    assert made.invoke(x=4) == 8


# --- schemas per type ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045 - the Optional form
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    ],
)
def test_schema_of_simple_types(annotation: Any, expected: dict[str, Any]) -> None:
    def f(value: Any) -> None:
        """F."""

    f.__annotations__["value"] = annotation
    made = tool(f)
    assert made.parameters == {"type": "object", "properties": {"value": expected}, "required": ["value"]}
    Draft202012Validator.check_schema(made.parameters)


def test_dataclasses_and_enums_are_defined_once_and_referenced() -> None:
    @tool
    def go(place: Place, trip: Trip | None = None, unit: Unit = Unit.CELSIUS) -> None:
        """Go somewhere."""

    schema = go.parameters
    assert schema["properties"] == {
        "place": {"$ref": "#/$defs/Place"},
        "trip": {"anyOf": [{"$ref": "#/$defs/Trip"}, {"type": "null"}], "default": None},
        "unit": {"$ref": "#/$defs/Unit", "default": "celsius"},
    }
    assert schema["$defs"]["Place"] == {
        "type": "object",
        "description": Place.__doc__.strip().replace("\n    ", "\n"),  # pydantic's reading of the docstring
        "properties": {"city": {"type": "string"}, "country": {"type": "string", "default": "DE"}},
        "required": ["city"],
    }
    assert schema["$defs"]["Trip"]["properties"]["stops"] == {"type": "array", "items": {"$ref": "#/$defs/Place"}}
    assert schema["$defs"]["Unit"] == {
        "type": "string",
        "enum": ["celsius", "fahrenheit"],
        "description": "A temperature unit.",
    }
    assert not contains_key(schema, "title")
    validator = Draft202012Validator(schema)
    assert validator.is_valid({"place": {"city": "Rome"}, "trip": {"stops": [{"city": "Oslo"}]}, "unit": "celsius"})
    assert not validator.is_valid({"place": {"city": "Rome"}, "trip": {"stops": [{"country": "NO"}]}})
    assert not validator.is_valid({"place": {"city": "Rome"}, "unit": "kelvin"})


def test_pydantic_model_and_enum_schemas() -> None:
    @tool
    def search(options: Options, unit: Unit = Unit.CELSIUS) -> None:
        """Search."""

    options = search.parameters["$defs"]["Options"]
    assert options["description"] == "Search options."
    assert options["properties"]["limit"] == {
        "type": "integer",
        "default": 5,
        "description": "At most this many results.",
    }
    assert properties(search)["unit"] == {"$ref": "#/$defs/Unit", "default": "celsius"}
    assert search.parameters["required"] == ["options"]


def test_recursive_model_is_referenced_from_inside_itself() -> None:
    @tool
    def walk(tree: TreeNode) -> None:
        """Walk a tree."""

    schema = walk.parameters
    assert set(schema["$defs"]) == {"TreeNode"}
    assert schema["properties"]["tree"] == {"$ref": "#/$defs/TreeNode"}
    assert schema["$defs"]["TreeNode"]["properties"]["children"]["items"] == {"$ref": "#/$defs/TreeNode"}
    validator = Draft202012Validator(schema)
    assert validator.is_valid({"tree": {"value": 1, "children": [{"value": 2, "children": []}]}})
    assert not validator.is_valid({"tree": {"value": 1, "children": [{"value": "x"}]}})


def test_parameter_named_title_survives_title_removal() -> None:
    @tool
    def publish(title: str, json: str = "", schema: int = 0) -> None:
        """Publish."""

    assert list(properties(publish)) == ["title", "json", "schema"]
    assert publish.parameters["required"] == ["title"]


# --- required vs default ---------------------------------------------------------------------------


def test_parameters_with_defaults_are_not_required() -> None:
    @tool
    def f(a: str, b: int = 3, c: list[str] | None = None, d: Literal["x", "y"] = "y") -> None:
        """F."""

    assert f.parameters["required"] == ["a"]
    props = properties(f)
    assert props["b"]["default"] == 3
    assert props["c"]["default"] is None
    assert props["d"]["default"] == "y"


def test_no_parameters_gives_an_empty_object_schema() -> None:
    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    assert ping.parameters == {"type": "object", "properties": {}}
    assert ping.invoke() == "pong"


def test_default_that_is_not_json_is_left_out_of_the_schema() -> None:
    marker = object()

    @tool
    def f(x: Any = marker) -> None:
        """F."""

    assert properties(f)["x"] == {}
    assert "required" not in f.parameters


# --- descriptions ----------------------------------------------------------------------------------


def test_annotated_description() -> None:
    @tool
    def f(city: Annotated[str, "The city to look up"], n: Annotated[int, Field(description="From Field")] = 1) -> None:
        """F."""

    props = properties(f)
    assert props["city"] == {"type": "string", "description": "The city to look up"}
    assert props["n"]["description"] == "From Field"


def test_pydantic_field_defaults_constraints_and_examples() -> None:
    @tool
    def f(
        top_k: Annotated[int, Field(ge=1, le=10)] = 3,
        query: str = Field(description="What to find.", min_length=2, examples=["tax"]),
        tags: list[str] = Field(default_factory=list, max_length=3),  # noqa: B008 - what is tested
    ) -> dict[str, Any]:
        """F."""
        return {"top_k": top_k, "query": query, "tags": tags}

    props = properties(f)
    assert props["top_k"] == {"type": "integer", "minimum": 1, "maximum": 10, "default": 3}
    assert props["query"] == {"type": "string", "description": "What to find.", "minLength": 2, "examples": ["tax"]}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "maxItems": 3}
    assert f.parameters["required"] == ["query"]
    # a Field(...) default the call leaves out is its value (or its factory's), not the FieldInfo object
    assert f.invoke(query="tax") == {"top_k": 3, "query": "tax", "tags": []}


def google(query: str, top_k: int = 3) -> None:
    """
    Search the web.

    Looks things up online.

    Args:
        query: What to search
            for.
        top_k: How many results.
    """


def rest(query: str, top_k: int = 3) -> None:
    """
    Search the web.

    Looks things up online.

    :param query: What to search
        for.
    :param top_k: How many results.
    """


def numpy(query: str, top_k: int = 3) -> None:
    """
    Search the web.

    Looks things up online.

    Parameters
    ----------
    query : str
        What to search for.
    top_k : int
        How many results.
    """


@pytest.mark.parametrize("function", [google, rest, numpy], ids=["google", "rest", "numpy"])
def test_the_whole_docstring_is_the_description(function: Callable[..., Any]) -> None:
    # As in haystack-ai: the docstring, parameter section included, describes the tool; the parameters themselves
    # carry only the descriptions written in Annotated[...].
    made = tool(function)
    assert made.description == function.__doc__
    assert properties(made) == {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 3}}


def test_annotated_description_and_missing_docstring_gives_empty_description() -> None:
    def f(query: Annotated[str, "From Annotated"]) -> None:
        pass

    f.__doc__ = ":param query: From the docstring."
    assert properties(tool(f))["query"]["description"] == "From Annotated"

    def g(query: str) -> None:
        pass

    assert tool(g).description == ""
    assert "description" not in properties(tool(g))["query"]


# --- hidden parameters -----------------------------------------------------------------------------

STATE_FORMS: list[Callable[[type], Any]] = [
    lambda cls: cls,
    lambda cls: cls | None,
    lambda cls: Optional[cls],  # noqa: UP045 - the Optional form is what is tested
    lambda cls: Annotated[cls, "the state"],
    lambda cls: Optional[Annotated[cls, "the state"]],  # noqa: UP045
]


@pytest.mark.parametrize("state_class", [State, HaystackState, SubState, SubHaystackState])
@pytest.mark.parametrize("form", range(len(STATE_FORMS)))
def test_state_parameters_are_hidden(state_class: type, form: int) -> None:
    def f(query: str, state: Any) -> str:
        """F."""
        return query

    annotation = STATE_FORMS[form](state_class)
    f.__annotations__["state"] = annotation
    made = tool(f)
    assert list(properties(made)) == ["query"]
    assert made.parameters["required"] == ["query"]


def test_inputs_from_state_and_streaming_callback_are_hidden() -> None:
    @tool(inputs_from_state={"user_id": "user", "documents": "docs"})
    def f(query: str, user: str, docs: list[str], streaming_callback: Callable[..., None] | None = None) -> None:
        """F."""

    assert list(properties(f)) == ["query"]
    assert f.parameters["required"] == ["query"]
    assert f.inputs_from_state == {"user_id": "user", "documents": "docs"}


def test_optional_parameters_without_a_json_schema_are_hidden() -> None:
    @tool
    def f(query: str, on_done: Callable[[str], None] | None = None, client: Opaque | None = None) -> None:
        """F."""

    assert list(properties(f)) == ["query"]


def test_string_annotations_are_resolved() -> None:
    def f(query: "str", state: "State", unit: "Unit" = Unit.CELSIUS) -> None:
        """F."""

    made = tool(f)
    assert list(properties(made)) == ["query", "unit"]


# --- async -----------------------------------------------------------------------------------------


def test_async_function_becomes_an_async_haystack_tool() -> None:
    @tool
    async def fetch(place: Place, unit: Unit = Unit.CELSIUS) -> str:
        """Fetch the weather."""
        await asyncio.sleep(0)
        return f"{place.city}/{place.country}/{unit.value}"

    assert isinstance(fetch, Tool)
    assert fetch.function is None
    assert fetch.async_function is not None
    assert list(properties(fetch)) == ["place", "unit"]
    assert asyncio.run(fetch.invoke_async(place={"city": "Oslo", "country": "NO"}, unit="fahrenheit")) == (
        "Oslo/NO/fahrenheit"
    )
    with pytest.raises(ToolInvocationError, match="invoke_async"):
        fetch.invoke(place={"city": "Oslo"})


def test_sync_tool_runs_through_invoke_async_too() -> None:
    @tool
    def where(place: Place) -> str:
        """Where."""
        return place.city

    assert asyncio.run(where.invoke_async(place={"city": "Rome"})) == "Rome"


# --- invocation ------------------------------------------------------------------------------------


def test_invoke_converts_json_arguments_and_passes_injected_ones_through() -> None:
    received: dict[str, Any] = {}

    @tool(inputs_from_state={"documents": "docs"})
    def record(place: Place, options: Options, unit: Unit, state: State, docs: list[str]) -> str:
        """Record."""
        received.update(place=place, options=options, unit=unit, state=state, docs=docs)
        return "ok"

    state = State(schema={"documents": {"type": list[str]}})
    docs = ["d1"]
    assert record.invoke(place={"city": "Paris"}, options={"limit": 2}, unit="celsius", state=state, docs=docs) == "ok"
    assert received["place"] == Place(city="Paris")
    assert received["options"] == Options(limit=2)
    assert received["unit"] is Unit.CELSIUS
    assert received["state"] is state
    assert received["docs"] is docs


def test_invoke_rejects_arguments_of_the_wrong_type() -> None:
    @tool
    def f(n: int) -> int:
        """F."""
        return n

    with pytest.raises(ToolInvocationError, match="Invalid arguments for Tool `f`"):
        f.invoke(n="not a number")


def test_invoke_wraps_function_errors() -> None:
    @tool
    def boom(n: int) -> int:
        """Boom."""
        raise RuntimeError("kaput")

    with pytest.raises(ToolInvocationError, match="kaput"):
        boom.invoke(n=1)


# --- serialization ---------------------------------------------------------------------------------


def handler(current: Any, new: Any) -> Any:
    return new


def lookup(city: Annotated[str, "The city"], state: State, user: str = "") -> dict[str, str]:
    """Look a city up."""
    return {"answer": f"{city} for {user}"}


def test_to_dict_from_dict_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", f"haystack_state,{__name__}")
    made = tool(
        lookup,
        inputs_from_state={"user_id": "user"},
        outputs_to_state={"answers": {"source": "answer", "handler": handler}},
        outputs_to_string={"source": "answer"},
    )
    data = {"tools": serialize_tools_or_toolset([made])}
    assert data["tools"][0]["type"] == "haystack_state.tools.function_tool.FunctionTool"
    deserialize_tools_or_toolset_inplace(data)
    restored = data["tools"][0]
    assert isinstance(restored, FunctionTool)
    assert restored == made
    assert restored.outputs_to_state == {"answers": {"source": "answer", "handler": handler}}
    assert restored.invoke(city="Rome", state=None, user="ann") == {"answer": "Rome for ann"}


# --- haystack dataclasses --------------------------------------------------------------------------


def test_haystack_documents_are_referenced_and_converted_with_from_dict() -> None:
    @tool
    def index(docs: list[Document], extra: Document | None = None) -> list[Any]:
        """Index documents."""
        return [docs, extra]

    assert properties(index)["docs"] == {"type": "array", "items": {"$ref": "#/$defs/Document"}}
    assert {"content", "meta"} <= set(index.parameters["$defs"]["Document"]["properties"])
    docs, extra = index.invoke(docs=[{"content": "hi", "meta": {"a": 1}}], extra=None)
    assert docs == [Document(content="hi", meta={"a": 1})]
    assert extra is None


def test_chat_messages_are_converted_with_from_dict_whatever_the_field_names() -> None:
    @tool
    def reply(messages: list[ChatMessage]) -> str:
        """Reply."""
        return messages[0].text or ""

    # pydantic shows ChatMessage's own field names (haystack-ai's @tool does the same); from_dict reads both forms
    assert {"_role", "_content"} <= set(reply.parameters["$defs"]["ChatMessage"]["properties"])
    assert reply.invoke(messages=[{"_role": "user", "_content": [{"text": "hello"}]}]) == "hello"
    assert reply.invoke(messages=[{"role": "user", "content": [{"text": "hi"}]}]) == "hi"
