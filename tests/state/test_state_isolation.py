"""Isolation without deep copies: nothing a caller does to a value it read from the state, or to a value it wrote
and kept, changes the state."""

import copy
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, Document, ToolCall
from pydantic import BaseModel

from haystack_state import FrozenDict, FrozenList, State, StateHandlerError, thaw


class Profile(BaseModel):
    name: str
    tags: list[str] = []
    extra: dict[str, Any] = {}


class Custom:
    def __init__(self) -> None:
        self.items: list[int] = [1]
        self.meta: dict[str, Any] = {"k": "v"}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom) and (other.items, other.meta) == (self.items, self.meta)

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass
class Record:
    name: str
    values: list[int]
    nested: dict[str, list[int]]


def _mutate_document(document: Document) -> None:
    document.meta["new"] = 1


def _document_warning() -> Any:
    """Haystack warns when a Document attribute is reassigned; the tests below do it on purpose."""
    return warnings.catch_warnings(action="ignore")


SCHEMA = {
    "nested": {"type": dict},
    "lists": {"type": list[list[int]]},
    "documents": {"type": list[Document]},
    "document": {"type": Document},
    "profile": {"type": Profile},
    "profiles": {"type": list[Profile]},
    "custom": {"type": Custom},
    "record": {"type": Record},
    "tags": {"type": set[str]},
}


def _filled() -> State:
    state = State(SCHEMA)
    state.set("nested", {"a": {"b": [1, 2]}, "c": [{"d": 1}], "s": {1, 2}})
    state.set("lists", [[1, 2], [3]])
    state.set("documents", [Document(content="a", meta={"tags": ["x"]}, embedding=[0.1])])
    state.set("document", Document(content="b", meta={"k": {"v": 1}}))
    state.set("profile", Profile(name="Ann", tags=["a"], extra={"k": [1]}))
    state.set("profiles", [Profile(name="Bob")])
    state.set("custom", Custom())
    state.set("record", Record(name="r", values=[1], nested={"a": [1]}))
    state.set("tags", {"a"})
    state.set(
        "messages",
        [
            ChatMessage.from_user("hi", meta={"k": [1]}),
            ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="t", arguments={"q": ["x"]})]),
        ],
    )
    return state


def _expected() -> dict[str, Any]:
    return thaw(_filled().data)  # type: ignore[no-any-return]


# Each mutation is tried on a value read with get() and with data; read-only parts raise TypeError, copied parts
# change only the copy. Either way the state must not change.
MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "top-level dict": lambda d: d["nested"].__setitem__("new", 1),
    "nested dict": lambda d: d["nested"]["a"].__setitem__("new", 1),
    "nested list in dict": lambda d: d["nested"]["a"]["b"].append(3),
    "dict in nested list": lambda d: d["nested"]["c"][0].__setitem__("d", 2),
    "nested set": lambda d: d["nested"]["s"].add(3),
    "nested set update": lambda d: d["nested"]["s"].__ior__({3}),
    "top-level list": lambda d: d["lists"].append([9]),
    "list in list": lambda d: d["lists"][0].append(9),
    "list item replaced": lambda d: d["lists"].__setitem__(0, [9]),
    "document content": lambda d: setattr(d["documents"][0], "content", "changed"),
    "document meta": lambda d: d["documents"][0].meta.__setitem__("new", 1),
    "document meta list": lambda d: d["documents"][0].meta["tags"].append("y"),
    "document embedding": lambda d: d["documents"][0].embedding.append(0.2),
    "single document meta": lambda d: d["document"].meta["k"].__setitem__("v", 2),
    "single document id": lambda d: setattr(d["document"], "id", "changed"),
    "pydantic field": lambda d: setattr(d["profile"], "name", "changed"),
    "pydantic list": lambda d: d["profile"].tags.append("b"),
    "pydantic dict": lambda d: d["profile"].extra["k"].append(2),
    "pydantic in list": lambda d: setattr(d["profiles"][0], "name", "changed"),
    "custom attribute": lambda d: setattr(d["custom"], "items", []),
    "custom list": lambda d: d["custom"].items.append(2),
    "custom dict": lambda d: d["custom"].meta.__setitem__("k", "changed"),
    "dataclass field": lambda d: setattr(d["record"], "name", "changed"),
    "dataclass list": lambda d: d["record"].values.append(2),
    "dataclass nested": lambda d: d["record"].nested["a"].append(2),
    "set": lambda d: d["tags"].add("b"),
    "message meta": lambda d: d["messages"][0].meta["k"].append(2),
    "message content": lambda d: d["messages"][0]._content.append("x"),
    "tool call arguments": lambda d: d["messages"][1].tool_calls[0].arguments["q"].append("y"),
    "tool call name": lambda d: setattr(d["messages"][1].tool_calls[0], "tool_name", "changed"),
    "message list": lambda d: d["messages"].clear(),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("source", ["get", "data"])
def test_mutating_a_read_value_cannot_change_the_state(source: str, mutation: str) -> None:
    state = _filled()
    expected = _expected()
    values = (
        state.data
        if source == "data"
        else {key: state.get(key) for key in SCHEMA} | {"messages": state.get("messages")}
    )
    with _document_warning():
        try:
            MUTATIONS[mutation](values)
        except TypeError as error:
            assert "read-only" in str(error)
    assert thaw(state.data) == expected
    # and a second reader gets a clean value too
    assert thaw({key: state.get(key) for key in expected}) == expected


def test_read_values_are_fresh_top_level_containers() -> None:
    state = _filled()
    first, second = state.get("lists"), state.get("lists")
    assert type(first) is list and first is not second
    first.append([9])  # the top level is the caller's own
    assert state.get("lists") == [[1, 2], [3]]
    assert isinstance(first[0], FrozenList)  # what is nested is shared, read-only
    nested = state.get("nested")
    assert type(nested) is dict and isinstance(nested["a"], FrozenDict)


@pytest.mark.parametrize(
    ("key", "make", "mutate"),
    [
        ("nested", lambda: {"a": {"b": [1]}}, lambda v: v["a"]["b"].append(2)),
        ("nested", lambda: {"a": {"b": [1]}}, lambda v: v.clear()),
        ("lists", lambda: [[1]], lambda v: v[0].append(2)),
        ("lists", lambda: [[1]], lambda v: v.append([2])),
        ("documents", lambda: [Document(content="a", meta={"m": [1]})], lambda v: v[0].meta["m"].append(2)),
        ("document", lambda: Document(content="a", meta={"m": [1]}), lambda v: v.meta.clear()),
        ("document", lambda: Document(content="a", embedding=[0.1]), lambda v: v.embedding.append(0.2)),
        ("profile", lambda: Profile(name="a", tags=["x"]), lambda v: v.tags.append("y")),
        ("profiles", lambda: [Profile(name="a")], lambda v: setattr(v[0], "name", "changed")),
        ("custom", Custom, lambda v: v.items.append(2)),
        ("record", lambda: Record("r", [1], {"a": [1]}), lambda v: v.nested["a"].append(2)),
        ("tags", lambda: {"a"}, lambda v: v.add("b")),
        ("messages", lambda: [ChatMessage.from_user("hi", meta={"k": [1]})], lambda v: v[0].meta["k"].append(2)),
    ],
)
@pytest.mark.parametrize("how", ["set", "initial data", "update", "staged commit"])
def test_mutating_a_value_after_writing_it_cannot_change_the_state(
    key: str, make: Callable[[], Any], mutate: Callable[[Any], None], how: str
) -> None:
    value = make()
    expected = thaw(copy.deepcopy(value))
    if how == "initial data":
        state = State(SCHEMA, {key: value})
    else:
        state = State(SCHEMA)
        if how == "set":
            state.set(key, value)
        elif how == "update":
            state.update({key: value})
        else:
            staged = state.stage()
            staged.set(key, value)
            with _document_warning():
                mutate(value)  # before the commit
            staged.commit()
    with _document_warning():
        mutate(value)
    assert thaw(state.get(key)) == expected


def test_a_custom_handler_cannot_change_the_state_through_its_arguments() -> None:
    def appends_in_place(current: Any, new: Any) -> Any:
        current = current or []
        current.append({"x": "appended by handler"})  # the top-level list is the handler's own copy
        return current + new

    state = State({"items": {"type": list[dict], "handler": appends_in_place}}, {"items": [{"x": 1}]})
    state.set("items", [{"x": 2}])
    assert state.get("items") == [{"x": 1}, {"x": "appended by handler"}, {"x": 2}]  # only through its result

    def edits_nested(current: Any, new: Any) -> Any:
        current[0]["x"] = "edited"
        return current

    with pytest.raises(StateHandlerError, match="read-only") as info:
        state.set("items", [{"x": 3}], handler_override=edits_nested)
    assert isinstance(info.value.__cause__, TypeError)
    assert state.get("items") == [{"x": 1}, {"x": "appended by handler"}, {"x": 2}]


def test_reading_does_not_deep_copy_plain_data() -> None:
    """The same nested objects come back on every read: no copy of what cannot change."""
    state = State({"docs": {"type": list[dict]}}, {"docs": [{"id": i, "tags": ["a"]} for i in range(100)]})
    first, second = state.get("docs"), state.get("docs")
    assert all(a is b for a, b in zip(first, second, strict=True))
    assert state.data["docs"][0] is first[0]


def test_thaw_gives_an_editable_copy_that_can_be_written_back() -> None:
    state = _filled()
    nested = thaw(state.get("nested"))
    nested["a"]["b"].append(3)
    state.set("nested", nested)
    assert state.get("nested")["a"]["b"] == [1, 2, 3]
    document = thaw(state.get("document"))
    document.meta["k"]["v"] = 2
    state.set("document", document)
    assert state.get("document").meta == {"k": {"v": 2}}


def test_mutating_a_document_in_place_warns_and_still_cannot_change_the_state() -> None:
    state = State({"document": {"type": Document}}, {"document": Document(content="a")})
    document = state.get("document")
    with pytest.warns(Warning):
        document.content = "b"
    assert state.get("document").content == "a"
