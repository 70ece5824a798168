"""
A corpus of functions and components whose tool schemas are compared with haystack-ai 3.4's, side by side.

Each :class:`Case` is built into a tool twice, with haystack-ai (``create_tool_from_function`` or its
``ComponentTool``) and with haystack-state (``@tool`` or our ``ComponentTool``), with the same options. The schemas
the model sees must be equal, apart from the parameters we hide that haystack-ai shows (``hidden``). Where
haystack-ai's own schema is broken (it raises, or makes a schema no model can use), ``haystack_broken`` says why and
``reference`` is the schema we make instead.

``valid`` and ``invalid`` are arguments a model could send: the first must pass our ToolInvoker's validation and run
the tool, the second must be refused with an error naming the parameter (``invalid`` pairs the arguments with that
name).
"""

import dataclasses
import datetime
import enum
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, Optional, Union

from haystack import Document, Pipeline, SuperComponent, component, super_component
from haystack.components.agents import Agent as HaystackAgent
from haystack.components.agents.state import State as HaystackState
from haystack.components.builders import ChatPromptBuilder, PromptBuilder
from haystack.components.joiners import DocumentJoiner
from haystack.components.rankers import LostInTheMiddleRanker
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.components.writers import DocumentWriter
from haystack.dataclasses import ByteStream, ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.tools import Tool, Toolset
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from haystack_state.state import State
from haystack_state.testing import ScriptedChatGenerator


@dataclasses.dataclass(frozen=True)
class Case:
    """
    One function or component of the corpus.

    :param id: The test id.
    :param kind: ``"function"`` or ``"component"``.
    :param make: Returns the function, or a fresh component instance.
    :param options: Keyword arguments given to both tool constructors (``inputs_from_state``, ``name``...).
    :param hidden: Parameters we hide and haystack-ai shows: removed from haystack-ai's schema before comparing.
    :param valid: Arguments the schema accepts; each call must run.
    :param invalid: ``(arguments, parameter)`` pairs the schema refuses; the error names ``parameter``.
    :param state: Initial state values (and so the state schema) the calls run with.
    :param haystack_broken: Why haystack-ai's schema is not the reference, if it is not.
    :param reference: The schema expected from us when haystack-ai's is broken.
    """

    id: str
    kind: Literal["function", "component"]
    make: Callable[[], Any]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    hidden: tuple[str, ...] = ()
    valid: tuple[dict[str, Any], ...] = ()
    invalid: tuple[tuple[dict[str, Any], str], ...] = ()
    state: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    haystack_broken: str | None = None
    reference: dict[str, Any] | None = None


# --- types used by the corpus ----------------------------------------------------------------------


class Unit(enum.Enum):
    """A temperature unit."""

    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Filters(BaseModel):
    """Search filters."""

    year: int | None = Field(default=None, ge=1900, le=2100, description="Publication year.")
    tags: list[str] = Field(default_factory=list, max_length=5, examples=[["news"]])
    language: Literal["en", "de"] = "en"


class SearchRequest(BaseModel):
    """A search request."""

    query: str = Field(min_length=1, pattern=r"\S", description="What to look for.")
    filters: Filters = Field(default_factory=Filters)
    unit: Unit = Unit.CELSIUS


class TreeNode(BaseModel):
    """A node of a tree."""

    label: str
    children: list["TreeNode"] = []


@dataclasses.dataclass
class Address:
    """
    A postal address.

    :param street: Street and number.
    :param city: The city.
    """

    street: str
    city: str


@dataclasses.dataclass
class Person:
    """A person with an address."""

    name: str
    address: Address
    nicknames: list[str] = dataclasses.field(default_factory=list)
    age: int | None = None


@dataclasses.dataclass
class Node:
    """A node that contains nodes."""

    value: int
    children: list["Node"] = dataclasses.field(default_factory=list)


class Point(TypedDict):
    """A point."""

    x: float
    y: float


# --- functions ----------------------------------------------------------------------------------------


def plain_types(city: str, days: int, threshold: float, verbose: bool) -> str:
    """Get the weather forecast."""
    return f"{city} {days} {threshold} {verbose}"


def defaults_and_optionals(
    query: str,
    top_k: int = 5,
    language: str | None = None,
    page: Optional[int] = None,  # noqa: UP045 - the Optional form is part of the corpus
    tags: list[str] | None = None,
) -> str:
    """Search with defaults."""
    return query


def literals_and_enums(
    unit: Unit,
    mode: Literal["fast", "exact"] = "fast",
    priority: Priority = Priority.LOW,
    level: Literal[1, 2, 3] = 1,
) -> str:
    """Choose some options."""
    return f"{unit.value} {mode} {priority} {level}"


def containers(
    ids: list[int],
    scores: dict[str, float],
    pair: tuple[int, str],
    unique: set[str],
    nested: list[dict[str, list[int]]],
    frozen: frozenset[int] = frozenset(),
) -> str:
    """Take containers."""
    return "ok"


def annotated_descriptions(
    city: Annotated[str, "The city to look up"],
    unit: Annotated[Literal["C", "F"], "The unit of the temperature"] = "C",
    nullable: Annotated[str | None, "May be null"] = None,
) -> str:
    """
    Get the weather.

    :param city: This docstring line is part of the description, not of the parameter.
    """
    return city


def field_defaults(
    top_k: int = Field(default=3, ge=1, le=20, description="How many results."),
    query: str = Field(description="What to find.", min_length=2, examples=["tax"]),
    tags: list[str] = Field(default_factory=list, max_length=4),  # noqa: B008 - what is tested
) -> dict[str, Any]:
    """Search with pydantic Fields as defaults."""
    return {"top_k": top_k, "query": query, "tags": tags}


def annotated_fields(
    score: Annotated[float, "The minimal score", Field(ge=0, le=1)],
    name: Annotated[str, "A name", Field(max_length=10, pattern=r"^[a-z]+$")] = "abc",
) -> str:
    """Descriptions first, constraints after."""
    return f"{score} {name}"


def pydantic_models(request: SearchRequest, extra: Filters | None = None) -> str:
    """Search with a request model."""
    return request.query


def recursive_model(tree: TreeNode) -> str:
    """Walk a tree."""
    return tree.label


def dataclass_params(person: Person, others: list[Person] | None = None) -> str:
    """Greet a person."""
    return person.name


def documents(docs: list[Document], top_k: int = 3, extra: Document | None = None) -> int:
    """Count documents."""
    return len(docs)


def chat_messages(messages: list[ChatMessage]) -> str:
    """Reply to messages."""
    return messages[0].text or ""


def byte_streams(blob: ByteStream, more: list[ByteStream] | None = None) -> int:
    """Measure a blob."""
    return len(blob.data)


def unions(value: int | str, values: Union[int, list[int]] = 0, maybe: float | None = None) -> str:  # noqa: UP007
    """Take unions."""
    return str(value)


def state_hidden(query: str, user: str, state: HaystackState, limit: int = 2) -> str:
    """Search for the current user."""
    return f"{user}:{query}"


def callable_skipped(query: str, on_result: Callable[[str], None] | None = None) -> str:
    """Search, with a callback the model cannot send."""
    return query


async def async_function(url: str, timeout: float = 1.0) -> str:
    """Fetch a page."""
    return url


def streaming_passthrough(query: str, streaming_callback: Any = None) -> str:
    """Take the streaming callback under a type that is not Callable."""
    return query


def keyword_names(title: str, json: str = "", schema: int = 0, copy: bool = False) -> str:
    """Parameters named like pydantic attributes and schema keywords."""
    return title


def no_parameters() -> str:
    """Say pong."""
    return "pong"


def google_docstring(query: str, top_k: int = 3) -> str:
    """
    Search the web.

    Args:
        query: What to search for.
        top_k: How many results.
    """
    return query


def numpy_docstring(query: str) -> str:
    """
    Search the web.

    Parameters
    ----------
    query : str
        What to search for.
    """
    return query


def special_formats(when: datetime.datetime, day: datetime.date, uid: uuid.UUID, data: bytes = b"") -> str:
    """Schedule something."""
    return uid.hex


def typed_dict(point: Point, anything: Any = None, raw: dict = {}, items: list = []) -> float:  # noqa: B006
    """Take a TypedDict and untyped values."""
    return point["x"]


def our_state(query: str, state: State) -> str:
    """Search, reading our State."""
    return query


def field_first_in_annotated(n: Annotated[int, Field(ge=1)], s: Annotated[str, Field(max_length=3), "Short"]) -> str:
    """Pydantic Field as the first Annotated metadata."""
    return s * n


def private_names(_cursor: int = 0, model_config: str = "x") -> str:
    """Parameters pydantic models cannot have as field names."""
    return model_config


# --- components -----------------------------------------------------------------------------------------


@component
class RestDocumented:
    """Greet someone."""

    @component.output_types(reply=str)
    def run(self, name: str, polite: bool = True) -> dict[str, Any]:
        """
        Greet someone.

        :param name: Who to greet.
        :param polite: Whether to be polite
            about it.
        """
        return {"reply": f"Hello {name}"}


@component
class GoogleDocumented:
    """Count words."""

    @component.output_types(count=int)
    def run(self, text: str, minimum: int = 1) -> dict[str, Any]:
        """
        Count words.

        Args:
            text: The text to count.
            minimum: The shortest word that counts.
        """
        return {"count": len([w for w in text.split() if len(w) >= minimum])}


@component
class Undocumented:
    @component.output_types(out=str)
    def run(self, text: str, level: int = 0, note: Annotated[str, "ignored by haystack-ai"] = "") -> dict[str, Any]:
        """
        :param level:
        """
        return {"out": text}


@component
class UserGreeter:
    """Greet a person."""

    @component.output_types(message=str)
    def run(self, person: Person) -> dict[str, Any]:
        """
        Greet a person.

        :param person: The person to greet.
        """
        return {"message": f"Hi {person.name} from {person.address.city}"}


@component
class DocumentProcessor:
    """Join the contents of documents."""

    @component.output_types(text=str)
    def run(self, documents: list[Document], top_k: int = 5) -> dict[str, Any]:
        """
        Join document contents.

        :param documents: The documents to join.
        :param top_k: How many to join.
        """
        return {"text": "\n".join(doc.content or "" for doc in documents[:top_k])}


@component
class MessageReplier:
    """Reply to chat messages."""

    @component.output_types(reply=str)
    def run(self, messages: list[ChatMessage], prefix: str | None = None) -> dict[str, Any]:
        """
        Reply.

        :param messages: The conversation so far.
        """
        return {"reply": (prefix or "") + (messages[-1].text or "")}


@component
class BlobSizer:
    """Measure blobs."""

    @component.output_types(sizes=list[int])
    def run(self, sources: list[ByteStream], extra: ByteStream | None = None) -> dict[str, Any]:
        return {"sizes": [len(source.data) for source in sources]}


@component
class MixedInputs:
    """Many kinds of inputs."""

    @component.output_types(out=str)
    def run(
        self,
        unit: Unit,
        mode: Literal["a", "b"] = "a",
        scores: dict[str, Document] | None = None,
        pair: tuple[Document, int] | None = None,
        seq: Sequence[Address] = (),
        limit: Annotated[int, Field(ge=1, le=9, description="overridden by the socket description")] = 3,
    ) -> dict[str, Any]:
        """
        Take many inputs.

        :param unit: The unit.
        """
        return {"out": unit.value}


@component
class StateReader:
    """Read the state."""

    @component.output_types(out=str)
    def run(self, query: str, user: str, state: HaystackState | None = None) -> dict[str, Any]:
        """
        Read the state.

        :param query: The query.
        :param user: The user, filled from state.
        """
        return {"out": f"{user}:{query}"}


@component
class ToolTaker:
    """Take tools."""

    @component.output_types(names=list[str])
    def run(self, tools: list[Tool] | Toolset | None = None, query: str = "") -> dict[str, Any]:
        return {"names": []}


@component
class BaseSearcher:
    """Search (base class)."""

    @component.output_types(out=str)
    def run(self, query: str) -> dict[str, Any]:
        """
        Search.

        :param query: The inherited description.
        """
        return {"out": query}


@component
class DerivedSearcher(BaseSearcher):
    """Search (derived class, run without a docstring)."""

    @component.output_types(out=str)
    def run(self, query: str) -> dict[str, Any]:
        return {"out": query.upper()}


@component
class RecursiveNodes:
    """Sum a tree of nodes."""

    @component.output_types(total=int)
    def run(self, root: Node) -> dict[str, Any]:
        def total(node: Node) -> int:
            return node.value + sum(total(child) for child in node.children)

        return {"total": total(root)}


@component
class OurStateReader:
    """Read our State."""

    @component.output_types(out=str)
    def run(self, query: str, state: State) -> dict[str, Any]:
        return {"out": query}


@component
class AnnotatedProcessor:
    """An annotated component with descriptive parameter docstrings."""

    @component.output_types(result=str)
    def run(self, text: str, number: int = 42) -> dict[str, Any]:
        """
        Process inputs.

        :param text: The text to process.
        :param number: A number to use.
        """
        return {"result": f"{text}:{number}"}


@component
class QueryUpper:
    """Upper-case a query."""

    @component.output_types(query=str)
    def run(self, query: str) -> dict[str, Any]:
        """
        Upper-case.

        :param query: The query for the upper-caser.
        """
        return {"query": query.upper()}


def super_single() -> SuperComponent:
    pipeline = Pipeline()
    pipeline.add_component("processor", AnnotatedProcessor())
    return SuperComponent(
        pipeline=pipeline,
        input_mapping={"input_text": ["processor.text"], "input_number": ["processor.number"]},
        output_mapping={"processor.result": "processed"},
    )


def super_multi() -> SuperComponent:
    pipeline = Pipeline()
    pipeline.add_component("upper", QueryUpper())
    pipeline.add_component("processor", AnnotatedProcessor())
    return SuperComponent(pipeline=pipeline, input_mapping={"query": ["upper.query", "processor.text"]})


def super_prompt() -> SuperComponent:
    pipeline = Pipeline()
    pipeline.add_component("builder", PromptBuilder(template="Answer {{question}} using {{documents|length}} docs"))
    return SuperComponent(pipeline=pipeline)


@super_component
class DecoratedSuper:
    """Process text through a small pipeline."""

    def __init__(self) -> None:
        self.pipeline = Pipeline()
        self.pipeline.add_component("processor", AnnotatedProcessor())
        self.input_mapping = {"text": ["processor.text"]}
        self.output_mapping = {"processor.result": "result"}


def haystack_agent() -> HaystackAgent:
    return HaystackAgent(
        chat_generator=ScriptedChatGenerator(script=["Done."]), state_schema={"notes": {"type": list[str]}}
    )


def store_with_documents() -> InMemoryDocumentStore:
    store = InMemoryDocumentStore()
    store.write_documents([Document(content="Paris is in France"), Document(content="Rome is in Italy")])
    return store


# --- the corpus -----------------------------------------------------------------------------------------

DOCUMENT_ARG = {"content": "hello", "meta": {"lang": "en"}}

CASES: list[Case] = [
    Case(
        "plain_types",
        "function",
        lambda: plain_types,
        valid=({"city": "Rome", "days": 3, "threshold": 0.5, "verbose": True},),
        invalid=(({"city": "Rome", "days": "3", "threshold": 0.5, "verbose": True}, "days"),),
    ),
    Case(
        "defaults_and_optionals",
        "function",
        lambda: defaults_and_optionals,
        valid=({"query": "q"}, {"query": "q", "language": None, "tags": ["a"]}),
        invalid=(({"query": "q", "tags": [1]}, "tags"),),
    ),
    Case(
        "literals_and_enums",
        "function",
        lambda: literals_and_enums,
        valid=({"unit": "celsius", "mode": "exact", "priority": 2, "level": 3},),
        invalid=(({"unit": "kelvin"}, "unit"), ({"unit": "celsius", "level": 4}, "level")),
    ),
    Case(
        "containers",
        "function",
        lambda: containers,
        valid=({"ids": [1], "scores": {"a": 1.0}, "pair": [1, "x"], "unique": ["a"], "nested": [{"k": [1]}]},),
        invalid=(({"ids": [1], "scores": {"a": 1.0}, "pair": [1, 2], "unique": [], "nested": []}, "pair"),),
    ),
    Case(
        "annotated_descriptions",
        "function",
        lambda: annotated_descriptions,
        valid=({"city": "Oslo", "unit": "F"},),
        invalid=(({"city": "Oslo", "unit": "K"}, "unit"),),
    ),
    Case(
        "field_defaults",
        "function",
        lambda: field_defaults,
        valid=({"query": "tax"}, {"query": "tax", "top_k": 20, "tags": ["a"]}),
        invalid=(({"query": "t"}, "query"), ({"query": "tax", "top_k": 0}, "top_k")),
    ),
    Case(
        "annotated_fields",
        "function",
        lambda: annotated_fields,
        valid=({"score": 0.5, "name": "abc"},),
        invalid=(({"score": 1.5}, "score"), ({"score": 0.5, "name": "ABC"}, "name")),
    ),
    Case(
        "pydantic_models",
        "function",
        lambda: pydantic_models,
        valid=({"request": {"query": "x", "filters": {"year": 2000}}},),
        invalid=(({"request": {"query": "x", "filters": {"year": 1800}}}, "request.filters.year"),),
    ),
    Case(
        "recursive_model",
        "function",
        lambda: recursive_model,
        valid=({"tree": {"label": "a", "children": [{"label": "b"}]}},),
        invalid=(({"tree": {"label": "a", "children": [{"children": []}]}}, "tree.children.0"),),
    ),
    Case(
        "dataclass_params",
        "function",
        lambda: dataclass_params,
        valid=({"person": {"name": "Ann", "address": {"street": "Main 1", "city": "Oslo"}}},),
        invalid=(({"person": {"name": "Ann", "address": {"street": "Main 1"}}}, "person.address"),),
    ),
    Case(
        "documents",
        "function",
        lambda: documents,
        valid=(
            {"docs": [DOCUMENT_ARG], "extra": {"content": "x", "blob": {"data": "abc", "mime_type": "text/plain"}}},
        ),
        invalid=(({"docs": [{"content": 3}]}, "docs.0.content"),),
    ),
    Case(
        "chat_messages",
        "function",
        lambda: chat_messages,
        valid=({"messages": [{"_role": "user", "_content": [{"text": "hi"}]}]},),
        invalid=(({"messages": [{"_role": "robot", "_content": []}]}, "messages.0._role"),),
    ),
    Case(
        "byte_streams",
        "function",
        lambda: byte_streams,
        valid=({"blob": {"data": "abc"}}, {"blob": {"data": "abc"}, "more": [{"data": "de", "mime_type": "a/b"}]}),
        invalid=(({"blob": {"meta": {}}}, "blob"),),
    ),
    Case(
        "unions",
        "function",
        lambda: unions,
        valid=({"value": 1}, {"value": "x", "values": [1, 2], "maybe": None}),
        invalid=(({"value": 1.5}, "value"),),
    ),
    Case(
        "state_hidden",
        "function",
        lambda: state_hidden,
        options={"inputs_from_state": {"user_id": "user"}},
        valid=({"query": "q"},),
        invalid=(({"query": "q", "limit": "2"}, "limit"),),
        state={"user_id": "alice"},
    ),
    Case(
        "callable_skipped",
        "function",
        lambda: callable_skipped,
        valid=({"query": "q"},),
        invalid=(({"query": None}, "query"),),
    ),
    Case(
        "async_function",
        "function",
        lambda: async_function,
        valid=({"url": "http://x"},),
        invalid=(({"url": "http://x", "timeout": "1"}, "timeout"),),
    ),
    Case(
        "streaming_passthrough",
        "function",
        lambda: streaming_passthrough,
        hidden=("streaming_callback",),  # haystack-ai shows it unless it is typed Callable; the runner fills it
        valid=({"query": "q"},),
        invalid=(({"query": ["q"]}, "query"),),
    ),
    Case(
        "keyword_names",
        "function",
        lambda: keyword_names,
        valid=({"title": "t", "json": "j", "schema": 1, "copy": True},),
        invalid=(({"title": "t", "schema": "1"}, "schema"),),
    ),
    Case("no_parameters", "function", lambda: no_parameters, valid=({},)),
    Case(
        "google_docstring",
        "function",
        lambda: google_docstring,
        options={"name": "web_search"},
        valid=({"query": "q"},),
        invalid=(({}, "query"),),
    ),
    Case(
        "numpy_docstring",
        "function",
        lambda: numpy_docstring,
        options={"description": "Search the web (custom description)."},
        valid=({"query": "q"},),
    ),
    Case(
        "special_formats",
        "function",
        lambda: special_formats,
        valid=({"when": "2024-01-01T10:00:00", "day": "2024-01-01", "uid": str(uuid.UUID(int=1))},),
        invalid=(({"when": 3, "day": "2024-01-01", "uid": "x"}, "when"),),
    ),
    Case(
        "typed_dict",
        "function",
        lambda: typed_dict,
        valid=({"point": {"x": 1.0, "y": 2.0}, "raw": {"a": 1}, "items": [1, "a"]},),
        invalid=(({"point": {"x": 1.0}}, "point"),),
    ),
    Case(
        "our_state",
        "function",
        lambda: our_state,
        valid=({"query": "q"},),  # (haystack-ai hides our State too, once haystack_state is imported)
    ),
    Case(
        "field_first_in_annotated",
        "function",
        lambda: field_first_in_annotated,
        valid=({"n": 2, "s": "ab"},),
        invalid=(({"n": 0, "s": "ab"}, "n"), ({"n": 1, "s": "abcd"}, "s")),
        haystack_broken="haystack-ai takes the first Annotated metadata as the description even when it is a "
        "FieldInfo, and its Tool then rejects the schema (ValueError); we keep pydantic's constraints and use the "
        "first string as the description",
        reference={
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 1},
                "s": {"type": "string", "maxLength": 3, "description": "Short"},
            },
            "required": ["n", "s"],
        },
    ),
    Case(
        "private_names",
        "function",
        lambda: private_names,
        valid=({"_cursor": 1, "model_config": "y"},),
        invalid=(({"_cursor": "1"}, "_cursor"),),
        haystack_broken="pydantic models cannot have fields named '_cursor' or 'model_config', so haystack-ai "
        "raises SchemaGenerationError; we declare fields under internal names with the parameter names as aliases",
        reference={
            "type": "object",
            "properties": {
                "_cursor": {"type": "integer", "default": 0},
                "model_config": {"type": "string", "default": "x"},
            },
        },
    ),
    # --- components ---
    Case(
        "rest_documented",
        "component",
        RestDocumented,
        valid=({"name": "Ann"},),
        invalid=(({"name": "Ann", "polite": "yes"}, "polite"),),
    ),
    Case("google_documented", "component", GoogleDocumented, valid=({"text": "a bb ccc", "minimum": 2},)),
    Case(
        "undocumented",
        "component",
        Undocumented,
        valid=({"text": "x", "note": "n"},),
        invalid=(({"text": 1}, "text"),),
    ),
    Case(
        "user_greeter_dataclass",
        "component",
        UserGreeter,
        valid=({"person": {"name": "Ann", "address": {"street": "Main 1", "city": "Oslo"}}},),
        invalid=(({"person": {"name": "Ann", "address": {"city": "Oslo"}}}, "person.address"),),
    ),
    Case(
        "document_processor",
        "component",
        DocumentProcessor,
        valid=({"documents": [DOCUMENT_ARG, {"content": "b"}], "top_k": 1},),
        invalid=(({"documents": [{"meta": []}]}, "documents.0.meta"),),
    ),
    Case(
        "message_replier",
        "component",
        MessageReplier,
        valid=({"messages": [{"role": "user", "content": [{"text": "hi"}]}]},),
        invalid=(({"messages": [{"role": "robot", "content": []}]}, "messages.0.role"),),
    ),
    Case(
        "blob_sizer",
        "component",
        BlobSizer,
        valid=({"sources": [{"data": "abc", "mime_type": "text/plain"}]},),
        invalid=(({"sources": [{"mime_type": "text/plain"}]}, "sources.0"),),
    ),
    Case(
        "mixed_inputs",
        "component",
        MixedInputs,
        # (no "scores": haystack-ai builds dict[str, Document] values with pydantic, and Document warns about it)
        valid=({"unit": "celsius", "seq": [{"street": "Main 1", "city": "Oslo"}], "limit": 9},),
        invalid=(({"unit": "celsius", "limit": 10}, "limit"),),
    ),
    Case(
        "state_reader",
        "component",
        StateReader,
        options={"inputs_from_state": {"user_id": "user"}},
        valid=({"query": "q"},),
        invalid=(({"query": 3}, "query"),),
        state={"user_id": "alice"},
    ),
    Case("tool_taker", "component", ToolTaker, valid=({"query": "q"},)),
    Case("inherited_run_docstring", "component", DerivedSearcher, valid=({"query": "q"},)),
    Case(
        "recursive_dataclass",
        "component",
        RecursiveNodes,
        valid=({"root": {"value": 1, "children": [{"value": 2}]}},),
        invalid=(({"root": {"value": 1, "children": [{"children": []}]}}, "root.children.0"),),
    ),
    Case(
        "our_state_socket",
        "component",
        OurStateReader,
        valid=({"query": "q"},),  # (haystack-ai hides our State too, once haystack_state is imported)
    ),
    Case(
        "prompt_builder",
        "component",
        lambda: PromptBuilder(template="Hello {{name}}, about {{topic}}"),
        valid=({"name": "Ann", "topic": "tax"},),
        invalid=(({"name": "Ann", "topic": "tax", "template": 3}, "template"),),
    ),
    Case(
        "chat_prompt_builder",
        "component",
        lambda: ChatPromptBuilder(template=[ChatMessage.from_user("Hi {{name}}")]),
        valid=({"name": "Ann"},),
    ),
    Case(
        "document_writer",
        "component",
        lambda: DocumentWriter(document_store=InMemoryDocumentStore()),
        valid=({"documents": [DOCUMENT_ARG], "policy": "skip"},),
        invalid=(({"documents": [DOCUMENT_ARG], "policy": "merge"}, "policy"),),
    ),
    Case(
        "bm25_retriever",
        "component",
        lambda: InMemoryBM25Retriever(document_store=store_with_documents()),
        valid=({"query": "France", "top_k": 1},),
        invalid=(({"query": "France", "top_k": "1"}, "top_k"),),
    ),
    Case(
        "document_joiner_variadic",
        "component",
        DocumentJoiner,
        valid=({"documents": [DOCUMENT_ARG], "top_k": 1},),
        invalid=(({"documents": [[DOCUMENT_ARG]]}, "documents.0"),),
    ),
    Case("lost_in_the_middle", "component", LostInTheMiddleRanker, valid=({"documents": [DOCUMENT_ARG]},)),
    Case(
        "super_component_docstrings",
        "component",
        super_single,
        options={"name": "text_processor"},
        valid=({"input_text": "hi", "input_number": 1},),
        invalid=(({"input_number": 1}, "input_text"),),
    ),
    Case(
        "super_component_multiple_mapping",
        "component",
        super_multi,
        options={"name": "combined"},
        valid=({"query": "hi"},),
    ),
    Case(
        "super_component_prompt",
        "component",
        super_prompt,
        valid=({"question": "why?", "documents": ["a", "b"]},),
        invalid=(({"question": "why?"}, "documents"),),
    ),
    Case("super_component_decorated", "component", DecoratedSuper, valid=({"text": "hi"},)),
    Case(
        "haystack_agent_as_tool",
        "component",
        haystack_agent,
        options={"name": "sub_agent", "description": "A helper agent."},
        valid=({"messages": [{"role": "user", "content": [{"text": "hi"}]}], "notes": ["n"]},),
        invalid=(({"messages": [{"role": "user", "content": "hi"}]}, "messages.0.content"),),
    ),
]
