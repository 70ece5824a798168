"""Tests of how component input types are rewritten, bytes strings converted, and variadic sockets called."""

import asyncio
import dataclasses
from typing import Any

import pytest
from haystack import Document, component
from haystack.core.component.types import Variadic
from haystack.dataclasses import ByteStream, ChatMessage
from jsonschema import Draft202012Validator
from pydantic import Field

from haystack_state.tools import ComponentTool, tool
from haystack_state.tools._coercion import binary_strings_to_bytes
from haystack_state.tools._component_types import component_schema_type
from haystack_state.tools._docstrings import parse_docstring
from haystack_state.tools.spec import tool_spec


@dataclasses.dataclass
class Left:
    right: "Right | None" = None


@dataclasses.dataclass
class Right:
    left: Left | None = None
    size: int = 0


@dataclasses.dataclass
class Hidden:
    """A dataclass whose fields have leading underscores and no from_dict."""

    _secret: str = ""


@component
class Pairs:
    """Take dataclasses that refer to each other."""

    @component.output_types(ok=bool)
    def run(self, left: Left, hidden: Hidden | None = None) -> dict[str, Any]:
        return {"ok": True}


def test_dataclasses_referring_to_each_other_are_described_natively() -> None:
    made = ComponentTool(Pairs())
    schema = made.parameters
    Draft202012Validator.check_schema(schema)
    assert set(schema["$defs"]) >= {"Left", "Right", "Hidden"}
    # natively described: no "Field 'x' of 'Y'." descriptions, references in both directions
    assert schema["$defs"]["Left"]["properties"]["right"]["anyOf"][0] == {"$ref": "#/$defs/Right"}
    assert schema["$defs"]["Right"]["properties"]["left"]["anyOf"][0] == {"$ref": "#/$defs/Left"}
    assert set(schema["$defs"]["Hidden"]["properties"]) == {"_secret"}
    validator = Draft202012Validator(schema)
    assert validator.is_valid({"left": {"right": {"left": {}, "size": 2}}})
    assert not validator.is_valid({"left": {"right": {"size": "2"}}})


def test_component_schema_type_rewrites_through_containers_only() -> None:
    rewritten = component_schema_type(list[Document] | None)
    [inner, none] = rewritten.__args__
    assert none is type(None)
    assert inner.__args__[0].__name__ == "Document" and inner.__args__[0] is not Document
    assert component_schema_type(tuple[Document, int]) == tuple[Document, int]  # left to pydantic, as haystack-ai
    assert component_schema_type(dict[str, Document]).__args__[1] is inner.__args__[0]  # built once, then reused


def test_docstrings_are_inherited_and_keep_their_line_breaks() -> None:
    class Base:
        def run(self, query: str) -> None:
            """
            Search.

            :param query: The query,
                on two lines.
            :param empty:
            """

    class Derived(Base):
        def run(self, query: str) -> None:
            pass

    assert parse_docstring(Derived().run).params == {"query": "The query,\non two lines.", "empty": ""}


@pytest.mark.parametrize(
    ("value", "annotation", "expected"),
    [
        ({"data": "abc"}, ByteStream, {"data": b"abc"}),
        ([{"data": "a"}, {"data": b"b"}], list[ByteStream], [{"data": b"a"}, {"data": b"b"}]),
        ({"content": "x", "blob": {"data": "é"}}, Document | None, {"content": "x", "blob": {"data": "é".encode()}}),
        ({"data": "abc"}, str | ByteStream, {"data": b"abc"}),
        ("text", bytes, b"text"),
        ({"role": "user", "content": []}, ChatMessage, {"role": "user", "content": []}),
    ],
    ids=["bytestream", "list", "nested-in-document", "union", "bare-bytes", "nothing-to-convert"],
)
def test_binary_strings_to_bytes(value: Any, annotation: Any, expected: Any) -> None:
    assert binary_strings_to_bytes(value, annotation) == expected


def test_binary_strings_to_bytes_returns_the_value_itself_when_nothing_changes() -> None:
    value = {"data": b"abc", "meta": {}}
    assert binary_strings_to_bytes(value, ByteStream) is value


def test_function_tool_gets_bytestreams_from_strings() -> None:
    @tool
    def size(blob: ByteStream, docs: list[Document]) -> list[int]:
        """Measure."""
        return [len(blob.data), *(len(doc.blob.data) for doc in docs if doc.blob)]

    assert size.invoke(blob={"data": "abcd"}, docs=[{"blob": {"data": "xy"}}]) == [4, 2]


@component
class Joiner:
    """Join lists of strings, also asynchronously."""

    @component.output_types(joined=str)
    def run(self, parts: Variadic[list[str]], separator: str = " ") -> dict[str, Any]:
        """
        :param parts: The strings to join.
        """
        return {"joined": separator.join(item for part in parts for item in part)}

    @component.output_types(joined=str)
    async def run_async(self, parts: Variadic[list[str]], separator: str = " ") -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"joined": "async:" + separator.join(item for part in parts for item in part)}


def test_variadic_socket_gets_the_models_value_as_its_only_input() -> None:
    made = ComponentTool(Joiner())
    assert made.parameters["properties"]["parts"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "The strings to join.",
    }
    assert made.invoke(parts=["a", "b"], separator="-") == {"joined": "a-b"}
    assert asyncio.run(made.invoke_async(parts=["a", "b"])) == {"joined": "async:a b"}


def test_field_without_default_is_required() -> None:
    def search(query: str = Field(description="What to find."), top_k: int = Field(3)) -> str:
        """Search."""
        return f"{query}:{top_k}"

    made = tool(search)
    assert made.parameters["required"] == ["query"]
    assert tool_spec(made).required_params == {"query"}
    assert made.invoke(query="q") == "q:3"
