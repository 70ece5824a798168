"""Tests of the State API: haystack-ai compatibility, defaults, reset/update/apply, staging, serialization, display
and thread safety."""

import json
import sys
import threading
import typing
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from haystack.components.agents.state import State as HaystackState
from haystack.components.agents.state.state_utils import merge_lists as haystack_merge_lists
from haystack.core.serialization import allow_deserialization_module
from haystack.dataclasses import ByteStream, ChatMessage, Document, SparseEmbedding, ToolCall
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from haystack_state import (
    RESET,
    ReadOnlyStateKeyError,
    StagedState,
    State,
    StateHandlerError,
    StateSerializationError,
    StateTypeError,
    add,
    merge_dicts,
    merge_lists,
    replace_values,
    unique,
)

allow_deserialization_module(__name__)  # lets from_dict load the handlers and classes defined here


class Profile(BaseModel):
    name: str
    tags: list[str] = []


def double(current: Any, new: Any) -> Any:
    return (current or 0) + 2 * new


def make_tags() -> list[str]:
    return ["default"]


# --- the haystack-ai API --------------------------------------------------------------------------------------


def test_default_handlers_follow_the_type() -> None:
    state = State(
        {
            "documents": {"type": list},
            "ids": {"type": list[str]},
            "legacy": {"type": typing.List[int]},  # noqa: UP006 - the typing alias must work too
            "user_name": {"type": str},
            "maybe": {"type": list[int] | None},  # as in haystack-ai, not a list type
        }
    )
    schema = state.schema
    assert schema["documents"]["handler"] is merge_lists
    assert schema["ids"]["handler"] is merge_lists
    assert schema["legacy"]["handler"] is merge_lists
    assert schema["user_name"]["handler"] is replace_values
    assert schema["maybe"]["handler"] is replace_values


def test_explicit_handlers_are_kept() -> None:
    state = State({"numbers": {"type": list[int], "handler": replace_values}, "n": {"type": int, "handler": add}})
    assert state.schema["numbers"]["handler"] is replace_values
    state.set("numbers", [1])
    state.set("numbers", [2])
    assert state.get("numbers") == [2]


def test_messages_key_is_added_unless_declared() -> None:
    state = State({"user_id": {"type": str}})
    assert state.schema["messages"] == {"type": list[ChatMessage], "handler": merge_lists}
    assert state.get("messages", []) == []
    state.set("messages", ChatMessage.from_user("hi"))
    state.set("messages", [ChatMessage.from_assistant("hello")])
    assert [m.text for m in state.get("messages")] == ["hi", "hello"]

    def keep_last(current: Any, new: Any) -> Any:
        return new if isinstance(new, list) else [new]

    declared = State({"messages": {"type": list[ChatMessage], "handler": keep_last, "description": "chat"}})
    assert declared.schema["messages"]["handler"] is keep_last
    assert declared.schema["messages"]["description"] == "chat"
    declared.set("messages", ChatMessage.from_user("a"))
    declared.set("messages", ChatMessage.from_user("b"))
    assert [m.text for m in declared.get("messages")] == ["b"]
    assert "messages" in State({"messages": {"type": typing.List[ChatMessage]}}).schema  # noqa: UP006


def test_get_set_has_and_data() -> None:
    state = State({"user_name": {"type": str}, "documents": {"type": list}}, {"user_name": "Alice"})
    assert state.has("user_name") and not state.has("documents")
    assert state.get("documents") is None
    assert state.get("documents", []) == []
    assert state.get("not_in_schema", "fallback") == "fallback"  # as in haystack-ai
    assert not state.has("not_in_schema")
    state.set("documents", [1, 2])
    state.set("documents", [3, 4])
    state.set("user_name", "Bob")
    assert state.get("documents") == [1, 2, 3, 4]
    assert state.data == {"user_name": "Bob", "documents": [1, 2, 3, 4]}
    assert state.keys() == ["user_name", "documents", "messages"]


def test_data_is_a_snapshot_not_the_live_internals() -> None:
    state = State({"documents": {"type": list}, "name": {"type": str}})
    state.set("documents", [1])
    snapshot = state.data
    snapshot["documents"].append(2)
    snapshot["name"] = "X"
    snapshot["extra"] = 1
    assert state.data == {"documents": [1]}
    state.set("documents", [3])
    state.set("name", "Y")
    assert snapshot == {"documents": [1, 2], "name": "X", "extra": 1}  # later writes do not reach it


def test_schema_is_a_copy() -> None:
    state = State({"n": {"type": int, "default": 1}})
    schema = state.schema
    schema["n"]["type"] = str
    schema["x"] = {"type": int}
    assert state.schema["n"]["type"] is int and "x" not in state.schema
    state.set("n", 2)


def test_the_schema_passed_in_is_not_modified() -> None:
    schema: dict[str, Any] = {"documents": {"type": list}}
    State(schema)
    assert schema == {"documents": {"type": list}}


def test_single_items_and_lists_are_appended_and_mixed_types_are_kept() -> None:
    state = State({"documents": {"type": list}})
    state.set("documents", {"title": "Doc 1"})
    state.set("documents", [{"title": "Doc 2"}, {"title": "Doc 3"}])
    state.set("documents", "text")
    assert state.get("documents") == [{"title": "Doc 1"}, {"title": "Doc 2"}, {"title": "Doc 3"}, "text"]


def test_a_list_read_from_the_state_can_be_appended_back() -> None:
    state = State({"ids": {"type": list[int]}, "config": {"type": dict}, "copy": {"type": list[int]}})
    state.set("config", {"ids": [1, 2]})
    state.set("ids", state.get("config")["ids"])  # a read-only FrozenList: appended item by item
    state.set("copy", state.get("ids"))
    assert state.get("ids") == [1, 2] and state.get("copy") == [1, 2]
    staged = state.stage()
    staged.set("ids", [3])
    staged.commit()
    assert state.get("ids") == [1, 2, 3]


def test_merge_lists_appends_in_place_without_touching_the_stored_items() -> None:
    """O(1) appends: an append copies and checks only what it appends, never the list already stored."""
    copies: list[int] = []

    class Item:
        def __init__(self, n: int) -> None:
            self.n = n

        def __deepcopy__(self, memo: dict[int, Any]) -> "Item":
            copies.append(self.n)
            return Item(self.n)

    state = State({"items": {"type": list[Item]}})
    state.set("items", Item(0))
    mark = state.watch("items")
    for n in range(1, 50):
        state.set("items", Item(n) if n % 2 else [Item(n)])
    state.set("items", Item(50), handler_override=merge_lists)
    state.set("items", Item(51), handler_override=haystack_merge_lists)
    appended = state.appended_since("items", mark)  # None if the list had been replaced rather than grown
    assert appended is not None and [item.n for item in appended] == list(range(1, 52))
    assert copies == list(range(52))  # each item was copied once, when it was appended


def test_initial_data_is_not_passed_through_handlers() -> None:
    state = State({"ids": {"type": list[int]}, "n": {"type": int, "handler": add}}, {"ids": [1, 2], "n": 5})
    assert state.get("ids") == [1, 2] and state.get("n") == 5


def test_from_dict_returns_cls() -> None:
    class MyState(State):
        pass

    original = MyState({"n": {"type": int}}, {"n": 1})
    restored = MyState.from_dict(original.to_dict())
    assert type(restored) is MyState
    assert restored.get("n") == 1
    assert type(State.from_dict(original.to_dict())) is State


# --- haystack-ai's own documentation examples run unchanged ---------------------------------------------------


def _haystack_docs_default_handlers(state_class: type) -> list[Any]:
    schema = {"documents": {"type": list}, "user_name": {"type": str}, "count": {"type": int}}
    state = state_class(schema=schema)
    state.set("documents", [1, 2])
    state.set("documents", [3, 4])
    state.set("user_name", "Alice")
    state.set("user_name", "Bob")
    return [state.get("documents"), state.get("user_name")]


def _haystack_docs_custom_merge(state_class: type) -> list[Any]:
    def custom_merge(current_value, new_value):  # type: ignore[no-untyped-def]
        """Custom handler that merges and sorts lists."""
        current_list = current_value or []
        new_list = new_value if isinstance(new_value, list) else [new_value]
        return sorted(current_list + new_list)

    schema = {"numbers": {"type": list, "handler": custom_merge}}
    state = state_class(schema=schema)
    state.set("numbers", [3, 1])
    state.set("numbers", [2, 4])
    return [state.get("numbers")]


def _haystack_docs_concatenate_strings(state_class: type) -> list[Any]:
    def concatenate_strings(current, new):  # type: ignore[no-untyped-def]
        return f"{current}-{new}" if current else new

    schema = {"user_name": {"type": str}}
    state = state_class(schema=schema)
    state.set("user_name", "Alice")
    state.set("user_name", "Bob", handler_override=concatenate_strings)
    return [state.get("user_name")]


def _deduplicate_documents(state_class: type) -> list[Any]:
    def deduplicate(current, new):  # type: ignore[no-untyped-def]
        """Append the new documents whose ids are not in the state yet."""
        current = current or []
        new = new if isinstance(new, list) else [new]
        seen = {doc.id for doc in current}
        return current + [doc for doc in new if doc.id not in seen]

    state = state_class(schema={"documents": {"type": list[Document], "handler": deduplicate}})
    state.set("documents", [Document(content="a"), Document(content="b")])
    state.set("documents", [Document(content="b"), Document(content="c")])
    state.set("documents", Document(content="a"))
    return [[doc.content for doc in state.get("documents")]]


def _haystack_docs_creating_and_reading(state_class: type) -> list[Any]:
    schema = {"user_name": {"type": str}, "documents": {"type": list}, "count": {"type": int}}
    state = state_class(schema=schema, data={"user_name": "Alice", "documents": [], "count": 0})
    user_name = state.get("user_name")
    documents = state.get("documents", [])
    state.set("user_name", "Bob")
    state.set("documents", [{"title": "Doc 1", "content": "Content 1"}])
    return [
        user_name,
        documents,
        state.has("user_name"),
        state.get("documents"),
        "messages" in state.schema,
        state.schema["messages"]["type"],
        state.get("messages", []),
    ]


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        (_haystack_docs_default_handlers, [[1, 2, 3, 4], "Bob"]),
        (_haystack_docs_custom_merge, [[1, 2, 3, 4]]),
        (_haystack_docs_concatenate_strings, ["Alice-Bob"]),
        (_deduplicate_documents, [["a", "b", "c"]]),
        (
            _haystack_docs_creating_and_reading,
            ["Alice", [], True, [{"title": "Doc 1", "content": "Content 1"}], True, list[ChatMessage], []],
        ),
    ],
)
def test_haystack_documentation_examples_behave_the_same(
    example: Callable[[type], list[Any]], expected: list[Any]
) -> None:
    assert example(HaystackState) == expected
    assert example(State) == expected


def test_haystack_merge_lists_as_a_schema_handler() -> None:
    state = State({"items": {"type": list[int], "handler": haystack_merge_lists}})
    assert state.schema["items"]["handler"] is merge_lists  # recognised: appends in place
    state.set("items", 1)
    state.set("items", [2, 3])
    state.set("items", [4], handler_override=haystack_merge_lists)
    assert state.get("items") == [1, 2, 3, 4]


# --- defaults and descriptions ----------------------------------------------------------------------------------


def test_defaults_values_and_factories_are_applied_when_the_state_is_built() -> None:
    state = State(
        {
            "count": {"type": int, "default": 0},
            "tags": {"type": list[str], "default": make_tags},
            "profile": {"type": dict, "default": dict},
            "names": {"type": list[str], "default": ["a"]},
            "model": {"type": Profile, "default": Profile(name="anon")},
            "none": {"type": str | None, "default": None},
            "kind": {"type": type, "default": dict},  # a class that is a valid value is a value, not a factory
        },
        {"count": 5},
    )
    assert state.data == {
        "count": 5,
        "tags": ["default"],
        "profile": {},
        "names": ["a"],
        "model": Profile(name="anon"),
        "none": None,
        "kind": dict,
    }
    state.set("tags", "x")
    assert state.get("tags") == ["default", "x"]


def test_a_default_factory_runs_once_per_state() -> None:
    calls: list[int] = []

    def factory() -> list[int]:
        calls.append(1)
        return [len(calls)]

    first = State({"ids": {"type": list[int], "default": factory}})
    second = State({"ids": {"type": list[int], "default": factory}})
    assert len(calls) == 2
    assert first.get("ids") == [1] and second.get("ids") == [2]
    first.set("ids", 9)
    assert second.get("ids") == [2]  # every state gets its own default
    first.reset("ids")
    assert first.get("ids") == [3]


def test_a_mutable_default_value_is_copied() -> None:
    default = ["a"]
    schema = {"names": {"type": list[str], "default": default}}
    first = State(schema)
    default.append("b")  # the caller changes its object after building the state
    first.set("names", "c")
    assert first.get("names") == ["a", "c"]
    first.reset("names")
    assert first.get("names") == ["a"]
    assert first.schema["names"]["default"] == ["a"]


def test_description_is_kept_in_the_schema_and_its_serialization() -> None:
    state = State({"user": {"type": str, "description": "who is asking"}})
    assert state.schema["user"]["description"] == "who is asking"
    assert state.to_dict()["schema"]["user"]["description"] == "who is asking"
    restored = State.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.schema["user"]["description"] == "who is asking"
    assert "description" not in state.schema["messages"]


# --- update, apply ------------------------------------------------------------------------------------------------


def test_update_applies_every_write() -> None:
    state = State({"ids": {"type": list[int]}, "name": {"type": str}, "n": {"type": int, "handler": add}})
    state.update({"ids": [1], "name": "a", "n": 1})
    state.update({"ids": 2, "n": 2})
    assert state.data == {"ids": [1, 2], "name": "a", "n": 3}


@pytest.mark.parametrize(
    "bad_write",
    [
        ("n", "not an int", None),
        ("ids", ["not an int"], None),
        ("unknown", 1, None),
        ("name", "x", lambda current, new: 1 / 0),
        ("name", "x", 42),
    ],
)
def test_apply_is_all_or_nothing(bad_write: tuple[str, Any, Any]) -> None:
    state = State(
        {"ids": {"type": list[int]}, "name": {"type": str}, "n": {"type": int, "handler": add}},
        {"ids": [1], "name": "a", "n": 1},
    )
    before = state.data
    writes = [("ids", [2, 3], None), ("name", "b", None), ("n", 5, None), ("ids", 4, None), bad_write]
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        state.apply(writes)
    assert state.data == before
    state.set("ids", 9)  # the list is still appendable in place
    assert state.get("ids") == [1, 9]


def test_apply_undoes_a_reset_and_a_write_to_an_unset_key() -> None:
    state = State({"ids": {"type": list[int]}, "name": {"type": str}}, {"ids": [1, 2]})
    with pytest.raises(StateTypeError):
        state.apply([("ids", RESET, None), ("name", "b", None), ("ids", [3], None), ("name", 1, None)])
    assert state.data == {"ids": [1, 2]}


def test_apply_with_handler_overrides() -> None:
    state = State({"name": {"type": str}}, {"name": "a"})
    state.apply([("name", "b", lambda current, new: current + new), ("name", "c", None)])
    assert state.get("name") == "c"


# --- staging --------------------------------------------------------------------------------------------------


def test_staged_writes_are_invisible_to_the_parent_until_commit() -> None:
    parent = State({"ids": {"type": list[int]}, "name": {"type": str}, "n": {"type": int, "handler": add}})
    parent.update({"ids": [1], "n": 1})
    staged = parent.stage()
    assert isinstance(staged, State) and isinstance(staged, StagedState)
    staged.set("ids", [2])
    staged.set("name", "b")
    staged.set("n", 2)
    assert staged.data == {"ids": [1, 2], "name": "b", "n": 3}
    assert parent.data == {"ids": [1], "n": 1}
    staged.commit()
    assert parent.data == {"ids": [1, 2], "name": "b", "n": 3}
    assert staged.writes == []
    staged.commit()  # nothing left to apply
    assert parent.data == {"ids": [1, 2], "name": "b", "n": 3}


def test_commit_reapplies_handlers_on_the_current_parent() -> None:
    parent = State({"ids": {"type": list[int]}, "n": {"type": int, "handler": add}}, {"ids": [1], "n": 1})
    staged = parent.stage()
    staged.set("ids", 3)
    staged.set("n", 10)
    parent.set("ids", 2)  # a write the staged view does not see
    parent.set("n", 100)
    staged.commit()
    assert parent.data == {"ids": [1, 2, 3], "n": 111}


def test_a_failing_commit_leaves_the_parent_unchanged() -> None:
    def fails_on_big(current: Any, new: Any) -> Any:
        if (current or 0) + new > 10:
            raise ValueError("too big")
        return (current or 0) + new

    parent = State({"ids": {"type": list[int]}, "n": {"type": int, "handler": fails_on_big}}, {"n": 1})
    staged = parent.stage()
    staged.set("ids", [1, 2])
    staged.set("n", 5)
    parent.set("n", 8, handler_override=replace_values)  # now the staged write no longer fits
    with pytest.raises(StateHandlerError, match="too big"):
        staged.commit()
    assert parent.data == {"n": 8}
    assert staged.writes  # still there: nothing was committed


def test_a_failing_staged_update_stages_nothing() -> None:
    parent = State({"a": {"type": int}, "b": {"type": int}})
    staged = parent.stage()
    with pytest.raises(StateTypeError):
        staged.update({"a": 1, "b": "x"})
    assert not staged.has("a") and staged.writes == []
    staged.commit()
    assert parent.data == {}


def test_staged_reset_and_nested_stages() -> None:
    parent = State({"ids": {"type": list[int], "default": list}}, {"ids": [1]})
    staged = parent.stage()
    staged.reset("ids")
    inner = staged.stage()
    inner.set("ids", 5)
    assert parent.get("ids") == [1] and staged.get("ids") == [] and inner.get("ids") == [5]
    inner.commit()
    assert staged.get("ids") == [5] and parent.get("ids") == [1]
    staged.commit()
    assert parent.get("ids") == [5]


def test_staged_state_is_isolated_from_later_parent_appends() -> None:
    parent = State({"ids": {"type": list[int]}}, {"ids": [1]})
    staged = parent.stage()
    parent.set("ids", 2)
    staged.set("ids", 3)
    assert parent.get("ids") == [1, 2] and staged.get("ids") == [1, 3]


# --- serialization ------------------------------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip_through_json() -> None:
    state = State(
        {
            "name": {"type": str, "description": "the user"},
            "ids": {"type": list[int], "handler": unique, "default": list},
            "profile": {"type": dict, "handler": merge_dicts},
            "n": {"type": int, "handler": double},
            "maybe": {"type": str | None},
            "pair": {"type": tuple[int, int]},
            "tags": {"type": set[str]},
            "counter": {"type": Counter, "handler": add},
            "model": {"type": Profile, "default": Profile(name="anon", tags=["x"])},
        },
        {"name": "Ann", "ids": [1, 2], "profile": {"a": {"b": [1]}}, "maybe": None, "pair": (1, 2)},
    )
    state.set("tags", {"x", "y"})
    state.set("counter", Counter(a=2))
    state.set("n", 2)
    payload = json.loads(json.dumps(state.to_dict()))
    restored = State.from_dict(payload)
    assert restored.data == state.data
    assert type(restored.get("counter")) is Counter and type(restored.get("pair")) is tuple
    assert restored.schema == state.schema
    restored.set("ids", [2, 3])
    restored.set("n", 1)
    assert restored.get("ids") == [1, 2, 3] and restored.get("n") == 6


def test_haystack_types_round_trip() -> None:
    document = Document(
        content="text",
        meta={"source": "a", "pages": [1, 2]},
        embedding=[0.1, 0.2],
        sparse_embedding=SparseEmbedding(indices=[1], values=[0.5]),
        blob=ByteStream(data=b"bytes", mime_type="text/plain"),
        score=0.5,
    )
    messages = [
        ChatMessage.from_system("be brief"),
        ChatMessage.from_user("hi", meta={"k": "v"}),
        ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="search", arguments={"q": "x"}, id="1")]),
        ChatMessage.from_tool("result", origin=ToolCall(tool_name="search", arguments={"q": "x"}, id="1")),
    ]
    state = State(
        {"documents": {"type": list[Document]}, "best": {"type": Document | None}, "blob": {"type": ByteStream}},
        {"documents": [document, Document(content="other")], "best": document, "blob": document.blob},
    )
    state.set("messages", messages)
    restored = State.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.get("documents") == [document, Document(content="other")]
    assert restored.get("best") == document
    assert restored.get("blob") == document.blob
    assert restored.get("messages") == messages


def test_state_serialized_by_haystack_ai_loads() -> None:
    theirs = HaystackState(
        {"name": {"type": str}, "docs": {"type": list[Document]}, "n": {"type": int, "handler": replace_values}},
        {"name": "Ann", "docs": [Document(content="x")], "n": 1},
    )
    ours = State.from_dict(theirs.to_dict())
    assert ours.data == {"name": "Ann", "docs": [Document(content="x")], "n": 1}
    # haystack-ai's merge_lists and replace_values are read as ours (the same functions), so appends stay O(1)
    assert ours.schema["docs"]["handler"] is merge_lists
    assert ours.schema["n"]["handler"] is replace_values
    ours.set("docs", Document(content="y"))
    assert len(ours.get("docs")) == 2


def test_our_serialization_loads_in_haystack_ai() -> None:
    ours = State({"name": {"type": str}, "docs": {"type": list[Document]}}, {"name": "Ann", "docs": [Document("x")]})
    theirs = HaystackState.from_dict(ours.to_dict())
    assert theirs.data == {"name": "Ann", "docs": [Document("x")]}


def test_to_dict_skip_keys() -> None:
    state = State({"name": {"type": str}, "secret": {"type": str}}, {"name": "a", "secret": "s"})
    payload = state.to_dict(skip_keys=["secret"])
    assert "secret" not in payload["schema"]
    assert State.from_dict(payload).data == {"name": "a"}


def test_default_values_that_are_not_plain_json_round_trip() -> None:
    state = State(
        {
            "pair": {"type": tuple[int, int], "default": (1, 2)},
            "doc": {"type": Document, "default": Document(content="d")},
            "tags": {"type": list[str], "default": ["a"]},
        }
    )
    restored = State.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.data == {"pair": (1, 2), "doc": Document(content="d"), "tags": ["a"]}
    restored.reset("pair")
    assert restored.get("pair") == (1, 2)


def test_to_dict_names_the_key_it_cannot_serialize(caplog: pytest.LogCaptureFixture) -> None:
    class Opaque:
        pass

    # As haystack-ai: a value that cannot be serialized is left out with a warning naming its key (the key stays in
    # the schema); a handler that cannot be serialized is still an error.
    state = State({"thing": {"type": Opaque}, "n": {"type": int}}, {"thing": Opaque(), "n": 1})
    data = state.to_dict()
    assert data["data"]["serialized_data"] == {"n": 1} and "thing" in data["schema"]
    assert "Failed to serialize the 'thing' field" in caplog.text
    with pytest.raises(StateSerializationError, match="'n'"):
        State({"n": {"type": int, "handler": lambda current, new: new}}).to_dict()


# --- display ------------------------------------------------------------------------------------------------------


def test_repr_is_short_and_readable() -> None:
    state = State({"documents": {"type": list[Document]}, "user_name": {"type": str}, "n": {"type": int}})
    state.set("documents", [Document(content="a"), Document(content="b")])
    state.set("user_name", "Bob")
    text = repr(state)
    assert text == (
        "State(documents: list[Document] = 2 items, user_name: str = 'Bob', n: int = <unset>, "
        "messages: list[ChatMessage] = <unset>)"
    )
    state.set("user_name", "x" * 1000)
    assert len(repr(state)) < 200


def test_repr_of_a_subclass_and_of_unrepresentable_values() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    class MyState(State):
        pass

    state = MyState({"thing": {"type": Broken}, "d": {"type": dict}}, {"thing": Broken(), "d": {"a": 1}})
    assert repr(state).startswith("MyState(thing: Broken = <Broken>, d: dict = 1 key")
    assert "&lt;Broken&gt;" in state._repr_html_()


def test_repr_html_renders_a_table_of_key_type_handler_and_value() -> None:
    state = State(
        {"documents": {"type": list[Document], "description": "retrieved <docs>"}, "name": {"type": str | None}}
    )
    state.set("documents", Document(content="a"))
    state.set("name", "<b>Bob</b>")
    html = state._repr_html_()
    assert html.startswith("<table") and html.endswith("</table>")
    for header in ("key", "type", "handler", "value", "description"):
        assert f"<th>{header}</th>" in html
    assert "<td>documents</td><td>list[Document]</td><td>merge_lists</td><td>1 item</td>" in html
    assert "<td>name</td><td>str | None</td><td>replace_values</td>" in html
    assert "&lt;b&gt;Bob&lt;/b&gt;" in html and "<b>Bob" not in html  # values are escaped
    assert "retrieved &lt;docs&gt;" in html
    assert "<td>messages</td><td>list[ChatMessage]</td><td>merge_lists</td><td>&lt;unset&gt;</td>" in html


def test_protected_keys_refuse_every_kind_of_write_and_staged_views_inherit_them() -> None:
    state = State({"name": {"type": str}, "ids": {"type": list[int]}}, {"name": "a", "ids": [1]})
    state.set("name", "b")  # a type the key has accepted: the next such replace may skip the lock
    state.protect({"name": "the caller sets it", "ids": "the caller sets it"})
    for key, value in (("name", "c"), ("ids", 2), ("ids", [2, 3])):
        with pytest.raises(ReadOnlyStateKeyError, match="the caller sets it"):
            state.set(key, value)
        with pytest.raises(ReadOnlyStateKeyError, match="the caller sets it"):
            state.stage().set(key, value)
    assert state.get("name") == "b" and state.get("ids") == [1]
    state.unprotect()
    staged = state.stage()
    staged.set("name", "c")  # recorded by the view, not stored in the parent
    staged.set("ids", 2)
    assert state.get("name") == "b" and state.get("ids") == [1]
    staged.commit()
    assert state.get("name") == "c" and state.get("ids") == [1, 2]


# --- thread safety ------------------------------------------------------------------------------------------------


THREADS = 8


@pytest.fixture(autouse=True)
def _switch_threads_often() -> Any:
    """Make the interpreter switch threads far more often than every 5 ms, so races show up."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _run_threads(target: Callable[[int], None], count: int = THREADS) -> None:
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            target(index)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_concurrent_appends_lose_nothing() -> None:
    state = State({"items": {"type": list[tuple[int, int]]}, "docs": {"type": list[dict]}})

    def append(thread: int) -> None:
        for i in range(500):
            state.set("items", (thread, i))
            state.set("docs", [{"t": thread, "i": i}, {"t": thread, "i": -i}])

    _run_threads(append)
    items = state.get("items")
    assert len(items) == THREADS * 500
    assert sorted(items) == sorted((t, i) for t in range(THREADS) for i in range(500))
    for thread in range(THREADS):  # each thread's own appends stay in order
        assert [i for t, i in items if t == thread] == list(range(500))
    assert len(state.get("docs")) == THREADS * 1000


def test_concurrent_add_counters_are_exact() -> None:
    state = State({"n": {"type": int, "handler": add, "default": 0}, "calls": {"type": dict[str, int], "handler": add}})

    def count(thread: int) -> None:
        for _ in range(300):
            state.set("n", 1)
            state.set("calls", {"search": 1, f"t{thread}": 1})

    _run_threads(count)
    assert state.get("n") == THREADS * 300
    calls = state.get("calls")
    assert calls["search"] == THREADS * 300 and all(calls[f"t{t}"] == 300 for t in range(THREADS))


def test_concurrent_handler_overrides_are_exact() -> None:
    state = State({"n": {"type": int}}, {"n": 0})

    def count(thread: int) -> None:
        for _ in range(300):
            state.set("n", 1, handler_override=add)

    _run_threads(count)
    assert state.get("n") == THREADS * 300


def test_replaces_interleaved_with_appends() -> None:
    state = State({"name": {"type": str}, "step": {"type": int}, "log": {"type": list[str]}})

    def work(thread: int) -> None:
        for i in range(400):
            state.set("name", f"t{thread}")
            state.set("step", i)
            state.set("log", f"{thread}:{i}")
            assert isinstance(state.get("name"), str)

    _run_threads(work)
    assert len(state.get("log")) == THREADS * 400
    assert state.get("name") in {f"t{t}" for t in range(THREADS)}
    assert state.get("step") == 399


def test_replaces_racing_a_locked_read_modify_write() -> None:
    """Lock-free replaces and a handler-based write on the same key: the handler never merges a stale value."""
    state = State({"n": {"type": int}}, {"n": 0})

    def work(thread: int) -> None:
        for i in range(300):
            if thread % 2:
                state.set("n", i)
            else:
                state.set("n", 1, handler_override=add)

    _run_threads(work)
    assert isinstance(state.get("n"), int)


def test_update_and_apply_are_atomic_under_contention() -> None:
    state = State({"a": {"type": list[int]}, "b": {"type": list[int]}, "total": {"type": int, "handler": add}})
    seen_torn: list[dict[str, Any]] = []

    def writer(thread: int) -> None:
        for i in range(200):
            if i % 5 == 0:  # a failing batch: its first writes must be undone
                with pytest.raises(StateTypeError):
                    state.apply([("a", i, None), ("total", 1, None), ("b", "bad", None)])
            else:
                state.update({"a": i, "total": 1, "b": i})
            snapshot = state.data
            if len(snapshot.get("a", [])) != len(snapshot.get("b", [])):
                seen_torn.append(snapshot)

    _run_threads(writer)
    assert not seen_torn
    assert len(state.get("a")) == len(state.get("b")) == THREADS * 160
    assert state.get("total") == THREADS * 160


def test_concurrent_staged_commits() -> None:
    state = State({"ids": {"type": list[int]}, "n": {"type": int, "handler": add}})

    def tool(thread: int) -> None:
        for i in range(100):
            staged = state.stage()
            staged.set("ids", [thread * 1000 + i])
            staged.set("n", 1)
            staged.commit()

    _run_threads(tool)
    assert len(state.get("ids")) == THREADS * 100 and state.get("n") == THREADS * 100


@settings(max_examples=20, deadline=None)
@given(st.lists(st.lists(st.integers(), min_size=1, max_size=5), min_size=2, max_size=4))
def test_concurrent_appends_match_the_sequential_model(batches: list[list[int]]) -> None:
    state = State({"items": {"type": list[int]}})

    def append(thread: int) -> None:
        for item in batches[thread]:
            state.set("items", item)

    _run_threads(append, count=len(batches))
    assert sorted(state.get("items")) == sorted(item for batch in batches for item in batch)


def test_a_failed_apply_does_not_undo_a_concurrent_lock_free_replace() -> None:
    state = State({"name": {"type": int}, "other": {"type": int}}, {"name": 0, "other": 0})
    lost: list[tuple[int, Any]] = []

    def work(thread: int) -> None:
        if thread == 0:  # the only writer of "name" that succeeds: lock-free replaces
            for i in range(1, 10000):
                state.set("name", i)
                seen = state.get("name")
                if seen != i:
                    lost.append((i, seen))
        else:  # batches that fail on "name" after writing "other": "name" is never changed by them
            for i in range(3000):
                with pytest.raises(StateTypeError):
                    state.apply([("other", i, None), ("name", "bad", None)])

    _run_threads(work, count=3)
    assert not lost
    assert state.get("name") == 9999 and state.get("other") == 0


def test_a_staged_view_does_not_see_later_parent_appends_and_copies_lists_lazily() -> None:
    parent = State({"items": {"type": list[int]}, "other": {"type": list[int]}}, {"items": [1, 2], "other": [9]})
    staged = parent.stage()
    parent.set("items", 3)  # the parent moves on after the view was taken
    assert staged.get("items") == [1, 2]
    staged.set("other", 10)
    assert parent.get("other") == [9]
    assert staged.data == {"items": [1, 2], "other": [9, 10]}
    staged.commit()
    assert parent.get("other") == [9, 10]
    assert parent.get("items") == [1, 2, 3]


def test_a_failed_staged_batch_leaves_the_parent_lists_alone() -> None:
    parent = State({"items": {"type": list[int]}}, {"items": [1, 2]})
    staged = parent.stage()
    with pytest.raises(StateTypeError):
        staged.update({"items": "not an int"})
    parent.set("items", 3)
    assert parent.get("items") == [1, 2, 3]
    assert staged.get("items") == [1, 2]
    assert staged.writes == []


def test_draining_changes_while_replacing_lock_free_loses_no_change() -> None:
    """A lock-free replace racing drain_changes is in this drain's delta or in the next one, never in neither."""
    state = State({"n": {"type": int}, "log": {"type": list[int]}}, {"n": -1})
    state.drain_changes()
    drained: list[int] = []
    done = threading.Event()

    def work(thread: int) -> None:
        if thread == 0:
            for i in range(20000):
                state.set("n", i)
            done.set()
        else:
            while not done.is_set():
                change = state.drain_changes().get("n")
                if change is not None:
                    drained.append(change["value"])

    _run_threads(work, count=2)
    last = state.drain_changes().get("n")
    seen = drained + ([last["value"]] if last is not None else [])
    assert seen and seen[-1] == 19999  # the last replace reached a delta
    assert seen == sorted(seen)


def test_reading_everything_while_new_keys_are_set_lock_free() -> None:
    """data, size, to_dict and repr copy the values first: a first lock-free write of a key cannot break them."""
    keys = [f"k{i}" for i in range(200)]
    state = State({key: {"type": int} for key in keys})
    state.set("k0", 0)  # the type is accepted once on the locked path; later ints skip the lock

    def work(thread: int) -> None:
        if thread == 0:
            for key in keys:
                state.set(key, 1)
        else:
            for _ in range(50):
                state.data, state.size(), state.to_dict(), repr(state)

    _run_threads(work, count=2)
    assert all(state.get(key) == 1 for key in keys)
