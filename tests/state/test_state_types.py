"""Typed writes: every supported type accepts its values and rejects others, strictly, and a rejected write leaves
the state unchanged."""

import dataclasses
import datetime
import enum
import re
import threading
import typing
from collections import Counter
from typing import Any, Literal, Optional

import pytest
import typing_extensions
from haystack.dataclasses import ChatMessage, Document
from pydantic import BaseModel, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from haystack_state import State, StateTypeError, add


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pydantic_dataclass
class PydanticPoint:
    x: int


class Profile(BaseModel):
    name: str
    age: int = 0


class Custom:
    """An arbitrary class pydantic knows nothing about."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.value == self.value  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]


class SubCustom(Custom):
    pass


class Color(enum.Enum):
    RED = "red"


class Opaque:
    """A class pydantic cannot build a schema for even with arbitrary types (its __get_pydantic_core_schema__
    raises): checked with isinstance."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        raise TypeError("no schema for Opaque")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    __hash__ = None  # type: ignore[assignment]


ACCEPTED: list[tuple[Any, Any]] = [
    (str, "text"),
    (str, ""),
    (int, 3),
    (int, -1),
    (float, 1.5),
    (float, 2),  # an int is a float (PEP 484), and it is stored as it is, not converted
    (bool, True),
    (dict, {"a": [1]}),
    (dict, {}),
    (list, [1, "a", None]),
    (list[str], ["a", "b"]),
    (list[int], [1, 2]),
    (list[Document], [Document(content="x")]),
    (dict[str, int], {"a": 1}),
    (dict[str, list[int]], {"a": [1]}),
    (tuple[int, str], (1, "a")),
    (set[int], {1, 2}),
    (str | int, "a"),
    (str | int, 1),
    (str | None, None),
    (str | None, "a"),
    (Optional[int], None),  # noqa: UP045 - the typing spelling must work too
    (Optional[int], 1),  # noqa: UP045
    (typing.Union[str, list[str]], ["a"]),  # noqa: UP007
    (Literal["a", "b"], "a"),
    (Literal[1, 2], 2),
    (Point, Point(1, 2)),
    (PydanticPoint, PydanticPoint(x=1)),
    (Profile, Profile(name="a")),
    (list[Profile], [Profile(name="a")]),
    (Profile | None, None),
    (Custom, Custom()),
    (Custom, SubCustom()),
    (list[Custom], [Custom(), SubCustom()]),
    (Opaque, Opaque()),
    (Document, Document(content="x")),
    (ChatMessage, ChatMessage.from_user("hi")),
    (Color, Color.RED),
    (datetime.date, datetime.date(2024, 1, 1)),
    (Counter, Counter(a=1)),
    (Any, object()),
    (object, 1),
]

REJECTED: list[tuple[Any, Any, str]] = [
    (int, "3", "int"),  # nothing is coerced
    (int, 3.0, "int"),
    (int, True, "int"),
    (int, None, "int"),
    (float, "1.5", "float"),
    (bool, 1, "bool"),
    (bool, "true", "bool"),
    (str, 3, "str"),
    (str, b"bytes", "str"),
    (dict, [("a", 1)], "dict"),
    (list, (1, 2), "list"),
    (list, "ab", "list"),
    (list[str], ["a", 1], "list[str]"),
    (dict[str, int], {"a": "1"}, "dict[str, int]"),
    (tuple[int, str], [1, "a"], "tuple[int, str]"),
    (set[int], [1], "set[int]"),
    (str | int, 1.5, "str | int"),
    (str | None, 1, "str | None"),
    (Optional[int], "1", "int | None"),  # noqa: UP045
    (Literal["a", "b"], "c", "Literal['a', 'b']"),
    (Literal[1, 2], "1", "Literal[1, 2]"),
    (Point, {"x": 1, "y": 2}, "Point"),
    (PydanticPoint, {"x": 1}, "PydanticPoint"),
    (Profile, {"name": "a"}, "Profile"),  # a model is not built from a dict: that would be coercion
    (list[Profile], [{"name": "a"}], "list[Profile]"),
    (Custom, 1, "Custom"),
    (SubCustom, Custom(), "SubCustom"),
    (Opaque, Custom(), "Opaque"),
    (Document, {"content": "x"}, "Document"),
    (Document, "x", "Document"),
    (ChatMessage, "hi", "ChatMessage"),
    (Color, "red", "Color"),
    (datetime.date, "2024-01-01", "date"),
    (Counter, {"a": 1}, "Counter"),
]


def _id(value: Any) -> str:
    return getattr(value, "__name__", None) or str(value).replace("typing.", "")


def _shown(value: object) -> str:
    """A value's repr without memory addresses (test ids must be the same in every pytest-xdist worker)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


@pytest.mark.parametrize(("tp", "value"), ACCEPTED, ids=[f"{_id(t)}-{_shown(v)}"[:60] for t, v in ACCEPTED])
def test_accepted_values(tp: Any, value: Any) -> None:
    state = State({"key": {"type": tp, "handler": lambda current, new: new}})
    state.set("key", value)
    assert state.get("key") == value or tp in (Any, object)
    assert type(state.get("key")) is type(value)  # stored as given, never converted
    assert State({"key": {"type": tp}}, {"key": value}).has("key")  # initial data is checked the same way


@pytest.mark.parametrize(
    ("tp", "value", "expected"), REJECTED, ids=[f"{_id(t)}-{_shown(v)}"[:60] for t, v, _ in REJECTED]
)
def test_rejected_values(tp: Any, value: Any, expected: str) -> None:
    state = State({"key": {"type": tp, "handler": lambda current, new: new}})
    with pytest.raises(StateTypeError) as info:
        state.set("key", value)
    error = info.value
    assert isinstance(error, TypeError)
    assert error.key == "key" and error.expected == expected and error.value is value
    message = str(error)
    assert "'key'" in message and expected in message and type(value).__name__ in message
    assert not state.has("key")
    with pytest.raises(StateTypeError):
        State({"key": {"type": tp}}, {"key": value})


def test_a_rejected_write_leaves_the_old_value() -> None:
    state = State({"n": {"type": int}, "name": {"type": str | None}}, {"n": 1, "name": "a"})
    for _ in range(3):  # also once the fast path has seen an int
        with pytest.raises(StateTypeError):
            state.set("n", "2")
        state.set("n", 2)
    with pytest.raises(StateTypeError):
        state.set("name", 1)
    assert state.data == {"n": 2, "name": "a"}


def test_the_error_points_into_containers() -> None:
    state = State({"scores": {"type": dict[str, list[int]]}})
    with pytest.raises(StateTypeError, match=r"At scores\['b'\]\[1\]: Input should be a valid integer"):
        state.set("scores", {"a": [1], "b": [2, "x"]})


# --- merge_lists keys: only the new items are checked -----------------------------------------------------------


def test_merge_lists_checks_each_new_item() -> None:
    state = State({"tags": {"type": list[str]}})
    state.set("tags", "a")
    state.set("tags", ["b", "c"])
    with pytest.raises(StateTypeError) as info:
        state.set("tags", ["d", 3])
    assert info.value.key == "tags" and info.value.value == 3
    assert str(info.value) == "State key 'tags' expects items of type str (list[str]), got int (3)."
    with pytest.raises(StateTypeError, match="expects items of type str"):
        state.set("tags", 4)
    with pytest.raises(StateTypeError, match="got tuple"):
        state.set("tags", ("e", "f"))  # a tuple is one item, as in haystack-ai
    assert state.get("tags") == ["a", "b", "c"]  # no item of a rejected write is appended


def test_merge_lists_does_not_check_the_whole_list_again() -> None:
    calls: list[Any] = []

    class Counted:
        pass

    state = State({"items": {"type": list[Counted]}})
    spec = state.specs["items"]
    original = spec.item_check.adapter
    try:

        class Spy:
            def validate_python(self, value: Any, **kwargs: Any) -> Any:
                calls.append(value)
                return original.validate_python(value, **kwargs)

        spec.item_check.adapter = Spy()  # type: ignore[assignment]
        for _ in range(10):
            state.set("items", Counted())
        assert len(calls) == 10  # one check per appended item, never the stored list
    finally:
        spec.item_check.adapter = original


def test_items_of_document_and_message_lists() -> None:
    state = State({"documents": {"type": list[Document]}})
    state.set("documents", Document(content="a"))
    with pytest.raises(StateTypeError, match="expects items of type Document"):
        state.set("documents", [{"content": "b"}])
    with pytest.raises(StateTypeError, match="ChatMessage"):
        state.set("messages", "hello")
    assert len(state.get("documents")) == 1 and not state.has("messages")


def test_bare_list_accepts_any_item() -> None:
    state = State({"anything": {"type": list}})
    state.set("anything", [1, "a", None, {"b": 2}, Custom()])
    assert len(state.get("anything")) == 5


# --- other handlers: the merged value is checked ------------------------------------------------------------------


def test_the_merged_value_of_other_handlers_is_checked() -> None:
    state = State({"n": {"type": int, "handler": add}}, {"n": 1})
    with pytest.raises(StateTypeError, match="expects int, got float"):
        state.set("n", 0.5)
    assert state.get("n") == 1

    def to_text(current: Any, new: Any) -> Any:
        return str(new)

    with pytest.raises(StateTypeError, match="expects int, got str"):
        state.set("n", 5, handler_override=to_text)
    assert state.get("n") == 1


def test_a_custom_list_handler_gets_the_whole_list_checked() -> None:
    def sorted_merge(current: Any, new: Any) -> Any:
        return sorted((current or []) + (new if isinstance(new, list) else [new]))

    state = State({"numbers": {"type": list[int], "handler": sorted_merge}})
    state.set("numbers", [3, 1])
    with pytest.raises(StateTypeError, match=r"list\[int\]"):
        state.set("numbers", [1.5])
    assert state.get("numbers") == [1, 3]


# --- the lock-free path for replaces still checks every value -----------------------------------------------------


def test_fast_replace_path_checks_types_it_has_not_seen() -> None:
    state = State({"value": {"type": str | None}, "flag": {"type": bool}, "n": {"type": int}})
    state.set("value", "a")
    state.set("value", None)
    state.set("flag", True)
    state.set("n", 1)
    for key, bad in (("value", 1), ("value", 1.5), ("flag", 1), ("n", True), ("n", "1")):
        with pytest.raises(StateTypeError):
            state.set(key, bad)
    assert state.data == {"value": None, "flag": True, "n": 1}


def test_literal_values_are_checked_every_time() -> None:
    state = State({"mode": {"type": Literal["fast", "slow"]}})
    state.set("mode", "fast")
    with pytest.raises(StateTypeError):
        state.set("mode", "medium")  # a str like the last one, but not an allowed value
    assert state.get("mode") == "fast"


def test_annotated_constraints_are_enforced() -> None:
    state = State({"score": {"type": typing.Annotated[int, Field(ge=0, le=10)]}})
    state.set("score", 5)
    with pytest.raises(StateTypeError, match="less than or equal to 10"):
        state.set("score", 11)
    assert state.get("score") == 5


def test_typing_typeddict_falls_back_to_a_dict_check() -> None:
    class Movie(typing.TypedDict):
        title: str

    state = State({"movie": {"type": Movie}})
    state.set("movie", {"title": "x"})
    with pytest.raises(StateTypeError):
        state.set("movie", "x")


def test_a_typeddict_checks_every_dict() -> None:
    """Whether a dict is a TypedDict depends on its keys: acceptance of one dict is not remembered for the next."""

    class Movie(typing_extensions.TypedDict):
        title: str

    state = State({"movie": {"type": Movie}, "movies": {"type": list[Movie]}})
    state.set("movie", {"title": "x"})
    state.set("movies", {"title": "x"})
    with pytest.raises(StateTypeError, match="movie"):
        state.set("movie", {"wrong": 1})
    with pytest.raises(StateTypeError, match="movies"):
        state.set("movies", {"title": 1})
    assert state.data == {"movie": {"title": "x"}, "movies": [{"title": "x"}]}


def test_a_named_tuple_key_takes_instances_only() -> None:
    class Pair(typing.NamedTuple):
        left: int
        right: int

    state = State({"pair": {"type": Pair}})
    state.set("pair", Pair(1, 2))
    with pytest.raises(StateTypeError, match="expects Pair, got tuple"):
        state.set("pair", (1, 2))
    assert type(state.get("pair")) is Pair


def test_concurrent_checks_of_a_shared_type() -> None:
    """Type checks are cached per type and shared between states: concurrent states agree on every value."""
    errors: list[str] = []

    def work() -> None:
        state = State({"value": {"type": int | str}})
        for i in range(200):
            state.set("value", i if i % 2 else str(i))
            try:
                state.set("value", 1.5)
                errors.append("accepted a float")
            except StateTypeError:
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
