"""Tests of haystack_state.values: freeze, read, thaw and the read-only containers."""

import copy
import dataclasses
import json
import pickle
from collections import Counter, OrderedDict, defaultdict, namedtuple
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, Document
from pydantic import BaseModel, TypeAdapter

from haystack_state import FrozenDict, FrozenList, thaw
from haystack_state.values import FrozenSet, freeze, needs_copy_on_read, read

Point = namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Box:
    items: list[int]
    label: str = "box"


@dataclasses.dataclass(frozen=True)
class Tag:
    name: str


class Model(BaseModel):
    tags: list[str]


class Plain:
    def __init__(self) -> None:
        self.items = [1]


# --- the read-only containers behave as dict and list --------------------------------------------------------


@pytest.fixture
def frozen_dict() -> FrozenDict:
    value = freeze({"a": 1, "nested": {"b": [1, 2]}})
    assert isinstance(value, FrozenDict)
    return value


@pytest.fixture
def frozen_list() -> FrozenList:
    value = freeze([1, {"a": 2}, [3]])
    assert isinstance(value, FrozenList)
    return value


def test_frozen_dict_equals_and_is_a_dict(frozen_dict: FrozenDict) -> None:
    assert isinstance(frozen_dict, dict)
    assert frozen_dict == {"a": 1, "nested": {"b": [1, 2]}}
    assert {"a": 1, "nested": {"b": [1, 2]}} == frozen_dict  # noqa: SIM300 - the reflected comparison
    assert repr(frozen_dict) == repr({"a": 1, "nested": {"b": [1, 2]}})
    assert frozen_dict | {"c": 3} == {"a": 1, "nested": {"b": [1, 2]}, "c": 3}


def test_frozen_list_equals_and_is_a_list(frozen_list: FrozenList) -> None:
    assert isinstance(frozen_list, list)
    assert frozen_list == [1, {"a": 2}, [3]]
    assert repr(frozen_list) == repr([1, {"a": 2}, [3]])
    assert frozen_list + [4] == [1, {"a": 2}, [3], 4]  # noqa: RUF005 - list.__add__ on the subclass
    assert frozen_list[1:] == [{"a": 2}, [3]]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.__setitem__("x", 1),
        lambda d: d.__delitem__("a"),
        lambda d: d.clear(),
        lambda d: d.pop("a"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("x", 1),
        lambda d: d.update(x=1),
        lambda d: d.__ior__({"x": 1}),
        lambda d: d["nested"].__setitem__("x", 1),
        lambda d: d["nested"]["b"].append(3),
    ],
)
def test_frozen_dict_rejects_every_mutation(frozen_dict: FrozenDict, mutate: Any) -> None:
    with pytest.raises(TypeError, match="read-only"):
        mutate(frozen_dict)
    assert frozen_dict == {"a": 1, "nested": {"b": [1, 2]}}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda v: v.__setitem__(0, 9),
        lambda v: v.__delitem__(0),
        lambda v: v.append(4),
        lambda v: v.extend([4]),
        lambda v: v.insert(0, 4),
        lambda v: v.pop(),
        lambda v: v.remove(1),
        lambda v: v.clear(),
        lambda v: v.sort(key=str),
        lambda v: v.reverse(),
        lambda v: v.__iadd__([4]),
        lambda v: v.__imul__(2),
        lambda v: v[1].__setitem__("a", 3),
        lambda v: v[2].append(4),
    ],
)
def test_frozen_list_rejects_every_mutation(frozen_list: FrozenList, mutate: Any) -> None:
    with pytest.raises(TypeError, match="read-only"):
        mutate(frozen_list)
    assert frozen_list == [1, {"a": 2}, [3]]


def test_frozen_containers_encode_as_json(frozen_dict: FrozenDict, frozen_list: FrozenList) -> None:
    assert json.loads(json.dumps(frozen_dict)) == {"a": 1, "nested": {"b": [1, 2]}}
    assert json.loads(json.dumps(frozen_list)) == [1, {"a": 2}, [3]]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_frozen_containers_pickle(frozen_dict: FrozenDict, frozen_list: FrozenList, protocol: int) -> None:
    for value in (frozen_dict, frozen_list):
        restored = pickle.loads(pickle.dumps(value, protocol=protocol))
        assert restored == value
        assert type(restored) is type(value)  # still read-only after the round trip
    restored_dict = pickle.loads(pickle.dumps(frozen_dict, protocol=protocol))
    with pytest.raises(TypeError):
        restored_dict["nested"]["x"] = 1


def test_copy_gives_a_shallow_mutable_container(frozen_dict: FrozenDict, frozen_list: FrozenList) -> None:
    for copied in (copy.copy(frozen_dict), frozen_dict.copy()):
        assert type(copied) is dict and copied == frozen_dict
        copied["x"] = 1
    for copied_list in (copy.copy(frozen_list), frozen_list.copy()):
        assert type(copied_list) is list and copied_list == frozen_list
        copied_list.append(4)
    assert frozen_dict == {"a": 1, "nested": {"b": [1, 2]}}
    assert frozen_list == [1, {"a": 2}, [3]]


def test_deepcopy_gives_a_fully_mutable_container(frozen_dict: FrozenDict, frozen_list: FrozenList) -> None:
    deep = copy.deepcopy(frozen_dict)
    assert type(deep) is dict and type(deep["nested"]) is dict and type(deep["nested"]["b"]) is list
    deep["nested"]["b"].append(3)
    deep_list = copy.deepcopy(frozen_list)
    assert type(deep_list) is list and type(deep_list[1]) is dict and type(deep_list[2]) is list
    deep_list[2].append(4)
    assert frozen_dict == {"a": 1, "nested": {"b": [1, 2]}}
    assert frozen_list == [1, {"a": 2}, [3]]


def test_pydantic_validates_frozen_containers_strictly(frozen_dict: FrozenDict) -> None:
    assert TypeAdapter(dict[str, Any]).validate_python(frozen_dict, strict=True) == frozen_dict
    assert TypeAdapter(list[int]).validate_python(freeze([1, 2]), strict=True) == [1, 2]
    assert TypeAdapter(dict[str, list[int]]).validate_python(freeze({"a": [1]}), strict=True) == {"a": [1]}

    class Holder(BaseModel):
        data: dict[str, Any]
        items: list[int]

    holder = Holder(data=frozen_dict, items=freeze([1, 2]))
    assert holder.data == {"a": 1, "nested": {"b": [1, 2]}}
    assert holder.model_dump() == {"data": {"a": 1, "nested": {"b": [1, 2]}}, "items": [1, 2]}


@pytest.fixture
def frozen_set() -> FrozenSet:
    value = freeze({1, "a"})
    assert isinstance(value, FrozenSet)
    return value


def test_frozen_set_equals_and_is_a_set(frozen_set: FrozenSet) -> None:
    assert isinstance(frozen_set, set)
    assert frozen_set == {1, "a"} and {1, "a"} == frozen_set
    assert repr(frozen_set) == repr({1, "a"})
    assert frozen_set | {2} == {1, "a", 2} and frozen_set - {1} == {"a"}
    assert TypeAdapter(set[int | str]).validate_python(frozen_set, strict=True) == {1, "a"}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.add(2),
        lambda s: s.discard(1),
        lambda s: s.remove(1),
        lambda s: s.pop(),
        lambda s: s.clear(),
        lambda s: s.update({2}),
        lambda s: s.intersection_update({1}),
        lambda s: s.difference_update({1}),
        lambda s: s.symmetric_difference_update({1}),
        lambda s: s.__ior__({2}),
        lambda s: s.__iand__({1}),
        lambda s: s.__isub__({1}),
        lambda s: s.__ixor__({1}),
    ],
)
def test_frozen_set_rejects_every_mutation(frozen_set: FrozenSet, mutate: Any) -> None:
    with pytest.raises(TypeError, match="read-only"):
        mutate(frozen_set)
    assert frozen_set == {1, "a"}


def test_frozen_set_copies_and_pickles(frozen_set: FrozenSet) -> None:
    for copied in (copy.copy(frozen_set), copy.deepcopy(frozen_set), frozen_set.copy(), thaw(frozen_set)):
        assert type(copied) is set and copied == {1, "a"}
        copied.add(2)
    restored = pickle.loads(pickle.dumps(frozen_set))
    assert restored == frozen_set and type(restored) is FrozenSet


def test_sets_of_mutable_objects_are_isolated() -> None:
    class Item:
        def __init__(self) -> None:
            self.tags = ["a"]

    item = Item()
    stored = freeze({item})
    item.tags.append("b")
    assert [i.tags for i in stored] == [["a"]]
    assert needs_copy_on_read(stored)
    first = read(stored)
    next(iter(first)).tags.append("c")
    assert [i.tags for i in read(stored)] == [["a"]]
    nested = freeze({"items": frozenset({item})})
    next(iter(read(nested)["items"])).tags.append("d")
    assert [i.tags for i in read(nested)["items"]] == [["a", "b"]]


# --- freeze --------------------------------------------------------------------------------------------------


def test_freeze_copies_so_later_changes_to_the_original_do_not_leak() -> None:
    original = {"a": [1], "b": {"c": 1}}
    frozen = freeze(original)
    original["a"].append(2)
    original["b"]["c"] = 2
    original["d"] = 3
    assert frozen == {"a": [1], "b": {"c": 1}}


def test_freeze_keeps_scalars_and_frozen_values_as_they_are() -> None:
    for value in ("s", 1, 1.5, True, None, b"x"):
        assert freeze(value) is value
    frozen = freeze({"a": [1]})
    assert freeze(frozen) is frozen


def test_freeze_tuples_sets_and_namedtuples() -> None:
    frozen = freeze((1, [2]))
    assert frozen == (1, [2]) and isinstance(frozen[1], FrozenList)
    point = freeze(Point(1, [2]))
    assert isinstance(point, Point) and isinstance(point.y, FrozenList)
    frozen_set = freeze({1, 2})
    assert frozen_set == {1, 2} and isinstance(frozen_set, FrozenSet)
    assert read(frozen_set) == {1, 2} and type(read(frozen_set)) is set


def test_freeze_copies_dataclasses_field_by_field() -> None:
    box = Box(items=[1, 2])
    frozen = freeze(box)
    assert frozen == box and frozen is not box
    assert isinstance(frozen.items, FrozenList)
    box.items.append(3)
    assert frozen.items == [1, 2]


def test_freeze_preserves_dict_and_list_subclasses() -> None:
    for value in (Counter(a=1), OrderedDict(a=1), defaultdict(list, a=[1])):
        frozen = freeze(value)
        assert type(frozen) is type(value) and frozen == value and frozen is not value
        assert type(read(frozen)) is type(value)
        assert type(thaw(frozen)) is type(value)
    counter = Counter(a=1)
    frozen_counter = freeze(counter)
    counter["a"] += 1
    assert frozen_counter == Counter(a=1)
    read(frozen_counter)["a"] += 5
    assert frozen_counter == Counter(a=1)


def test_freeze_deep_copies_other_objects() -> None:
    model = Model(tags=["a"])
    frozen = freeze(model)
    model.tags.append("b")
    assert frozen.tags == ["a"]
    plain = Plain()
    frozen_plain = freeze(plain)
    plain.items.append(2)
    assert frozen_plain.items == [1]


# --- read ----------------------------------------------------------------------------------------------------


def test_read_gives_a_fresh_top_level_container_that_shares_read_only_contents() -> None:
    stored = freeze({"a": {"b": 1}})
    first = read(stored)
    assert type(first) is dict
    first["x"] = 1
    assert read(stored) == {"a": {"b": 1}}
    assert first["a"] is stored["a"]  # no copy of what cannot change


def test_read_copies_mutable_objects_inside_containers() -> None:
    stored = freeze([Box(items=[1])])
    assert needs_copy_on_read(stored)
    first = read(stored)
    first[0].label = "changed"
    assert read(stored)[0].label == "box"


@pytest.mark.parametrize(
    ("value", "needs_copy"),
    [
        (1, False),
        ("s", False),
        ({"a": 1}, False),
        ([1, [2]], False),
        (Tag("x"), False),
        ((1, 2), False),
        (frozenset({1}), False),
        ({1, "a"}, False),
        ({"s": {1}}, False),
        (Box(items=[]), True),
        (Document(content="x"), True),
        (ChatMessage.from_user("hi"), True),
        (Model(tags=[]), True),
        (Plain(), True),
        ([Box(items=[])], True),
        ({"a": Plain()}, True),
        ((1, Plain()), True),
        (Counter(a=1), True),
    ],
)
def test_needs_copy_on_read(value: Any, needs_copy: bool) -> None:
    assert needs_copy_on_read(freeze(value)) is needs_copy


# --- thaw ----------------------------------------------------------------------------------------------------


def test_thaw_returns_a_fully_mutable_deep_copy() -> None:
    stored = freeze({"a": [{"b": 1}], "s": {1}, "t": (1, [2])})
    thawed = thaw(stored)
    assert thawed == {"a": [{"b": 1}], "s": {1}, "t": (1, [2])}
    assert type(thawed) is dict and type(thawed["a"]) is list and type(thawed["a"][0]) is dict
    assert type(thawed["s"]) is set and type(thawed["t"][1]) is list
    thawed["a"][0]["b"] = 2
    assert stored["a"][0]["b"] == 1


def test_thaw_dataclasses_and_haystack_types() -> None:
    document = freeze(Document(content="x", meta={"tags": ["a"]}, embedding=[0.1]))
    thawed = thaw(document)
    assert type(thawed.meta) is dict and type(thawed.meta["tags"]) is list and type(thawed.embedding) is list
    thawed.meta["tags"].append("b")
    assert document.meta == {"tags": ["a"]}
    message = thaw(freeze(ChatMessage.from_user("hi")))
    assert message.text == "hi" and type(message._content) is list


def test_thaw_leaves_scalars_alone() -> None:
    for value in ("s", 1, None, 1.5):
        assert thaw(value) is value
