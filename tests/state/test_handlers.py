"""Tests of the merge handlers (reducers): examples, properties, and their behaviour inside a State."""

from collections import Counter
from typing import Any

import pytest
from haystack.components.agents.state.state_utils import merge_lists as haystack_merge_lists
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_state import RESET, State, add, merge_dicts, merge_lists, replace_values, unique
from haystack_state.handlers import Reset

# JSON-like values without NaN (NaN != NaN would make equality-based properties meaningless).
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)
json_dicts = st.dictionaries(st.text(max_size=3), json_values, max_size=4)
items = st.lists(json_values, max_size=6)
item_or_items = json_values | items

FAST = settings(max_examples=100, deadline=None)
STATEFUL = settings(max_examples=50, deadline=None)  # each example builds a State


def test_handlers_are_importable_from_the_package() -> None:
    import haystack_state

    for name in ("merge_lists", "replace_values", "merge_dicts", "unique", "add", "RESET"):
        assert hasattr(haystack_state, name)


@pytest.mark.parametrize("handler", [merge_lists, replace_values, merge_dicts, unique, add])
def test_every_reducer_documents_an_example_that_holds(handler: Any) -> None:
    """Each ``call  # result`` line of the docstring example (the result may be on the next line) is true."""
    doc = handler.__doc__ or ""
    assert "```python" in doc
    example = doc.split("```python")[1].split("```")[0]
    checks: list[tuple[str, str]] = []
    for line in (raw.strip() for raw in example.splitlines()):
        if line.startswith("#") and checks and not checks[-1][1]:
            checks[-1] = (checks[-1][0], line[1:].strip())
        elif line:
            code, _, result = line.partition("#")
            checks.append((code.strip(), result.strip()))
    assert checks
    namespace = {handler.__name__: handler}
    for code, result in checks:
        assert eval(code, namespace) == eval(result, namespace), code


# --- merge_lists ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "new", "expected"),
    [
        ([1, 2], [3, 4], [1, 2, 3, 4]),
        (None, "a", ["a"]),
        (None, [1], [1]),
        ([1], 2, [1, 2]),
        (1, 2, [1, 2]),
        (1, [2, 3], [1, 2, 3]),
        ([], [], []),
        ([[1]], [[2]], [[1], [2]]),
        ({"a": 1}, {"b": 2}, [{"a": 1}, {"b": 2}]),
    ],
)
def test_merge_lists_examples(current: Any, new: Any, expected: list[Any]) -> None:
    assert merge_lists(current, new) == expected
    assert haystack_merge_lists(current, new) == expected  # the same contract as haystack-ai's


def test_merge_lists_does_not_mutate_its_arguments() -> None:
    current, new = [1], [2]
    merge_lists(current, new)
    assert current == [1] and new == [2]


@pytest.mark.slow
@FAST
@given(items, items)
def test_merge_lists_equals_list_concatenation(current: list[Any], new: list[Any]) -> None:
    assert merge_lists(current, new) == current + new


@pytest.mark.slow
@FAST
@given(st.none() | json_values | items, item_or_items)
def test_merge_lists_agrees_with_haystack_ai(current: Any, new: Any) -> None:
    assert merge_lists(current, new) == haystack_merge_lists(current, new)


# --- replace_values -------------------------------------------------------------------------------------------


@FAST
@given(st.none() | json_values, json_values)
def test_replace_values_returns_the_new_value(current: Any, new: Any) -> None:
    assert replace_values(current, new) is new


# --- merge_dicts ----------------------------------------------------------------------------------------------


def test_merge_dicts_docstring_example() -> None:
    merged = merge_dicts({"user": {"name": "Ann", "tz": "UTC"}}, {"user": {"tz": "CET"}, "lang": "de"})
    assert merged == {"user": {"name": "Ann", "tz": "CET"}, "lang": "de"}


def test_merge_dicts_is_recursive_and_new_wins_at_the_leaves() -> None:
    current = {"a": {"b": {"c": 1, "d": 2}, "e": [1]}, "f": 1}
    new = {"a": {"b": {"c": 10}, "e": [2]}, "f": {"g": 1}}
    assert merge_dicts(current, new) == {"a": {"b": {"c": 10, "d": 2}, "e": [2]}, "f": {"g": 1}}
    # a dict replaces a leaf, and a leaf replaces a dict
    assert merge_dicts({"a": 1}, {"a": {"b": 1}}) == {"a": {"b": 1}}
    assert merge_dicts({"a": {"b": 1}}, {"a": 1}) == {"a": 1}


def test_merge_dicts_with_none_current_and_no_mutation() -> None:
    assert merge_dicts(None, {"a": 1}) == {"a": 1}
    current, new = {"a": {"b": 1}}, {"a": {"c": 2}}
    merge_dicts(current, new)
    assert current == {"a": {"b": 1}} and new == {"a": {"c": 2}}


def test_merge_dicts_rejects_a_non_mapping() -> None:
    with pytest.raises(TypeError, match="merge_dicts expects a dict"):
        merge_dicts({"a": 1}, [("a", 2)])  # type: ignore[arg-type]


@pytest.mark.slow
@FAST
@given(json_dicts)
def test_merge_dicts_with_an_empty_dict_is_the_identity(value: dict[str, Any]) -> None:
    assert merge_dicts(value, {}) == value
    assert merge_dicts({}, value) == value
    assert merge_dicts(None, value) == value


@pytest.mark.slow
@FAST
@given(json_dicts, json_dicts)
def test_merge_dicts_is_idempotent_and_new_keys_win(current: dict[str, Any], new: dict[str, Any]) -> None:
    merged = merge_dicts(current, new)
    assert merge_dicts(merged, new) == merged
    assert set(merged) == set(current) | set(new)
    for key, value in new.items():
        if not isinstance(value, dict):
            assert merged[key] == value


# --- unique ---------------------------------------------------------------------------------------------------


def test_unique_docstring_examples() -> None:
    assert unique(["doc-1", "doc-2"], ["doc-2", "doc-3"]) == ["doc-1", "doc-2", "doc-3"]
    assert unique([{"id": 1}], [{"id": 1}, {"id": 2}]) == [{"id": 1}, {"id": 2}]


def test_unique_keeps_order_skips_duplicates_within_new_and_accepts_single_items() -> None:
    assert unique(None, ["b", "a", "b"]) == ["b", "a"]
    assert unique(["a"], "a") == ["a"]
    assert unique(["a"], "b") == ["a", "b"]
    assert unique("a", ["a", "c"]) == ["a", "c"]
    assert unique([[1], {"x": [1]}], [[1], {"x": [1]}, {"x": [2]}]) == [[1], {"x": [1]}, {"x": [2]}]


@pytest.mark.slow
@FAST
@given(items, items)
def test_unique_is_idempotent(current: list[Any], new: list[Any]) -> None:
    once = unique(current, new)
    assert unique(once, new) == once
    assert once[: len(current)] == current  # what was there stays, in order


@pytest.mark.slow
@FAST
@given(items, items)
def test_unique_appends_exactly_the_missing_items(current: list[Any], new: list[Any]) -> None:
    result = unique(current, new)
    appended = result[len(current) :]
    for item in new:
        assert item in result
    for index, item in enumerate(appended):
        assert item not in current and item not in appended[:index]


# --- add ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "new", "expected"),
    [
        (3, 4, 7),
        (None, 4, 4),
        (1.5, 1, 2.5),
        ({"search": 1}, {"search": 2, "fetch": 1}, {"search": 3, "fetch": 1}),
        (None, {"a": 1}, {"a": 1}),
        (Counter(a=1), Counter(a=2, b=1), Counter(a=3, b=1)),
        (Counter(a=1), {"a": 1}, Counter(a=2)),
    ],
)
def test_add_examples(current: Any, new: Any, expected: Any) -> None:
    result = add(current, new)
    assert result == expected and type(result) is type(expected)


def test_add_does_not_mutate_and_rejects_mismatches() -> None:
    current = {"a": 1}
    add(current, {"a": 1})
    assert current == {"a": 1}
    for left, right in ((True, 1), (1, True), ({"a": 1}, 1), (1, {"a": 1})):
        with pytest.raises(TypeError, match="add cannot add"):
            add(left, right)


@pytest.mark.slow
@FAST
@given(st.lists(st.integers(), max_size=20))
def test_add_sums_like_sum(numbers: list[int]) -> None:
    total = None
    for number in numbers:
        total = add(total, number)
    assert (total or 0) == sum(numbers)


@FAST
@given(st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(), max_size=3), max_size=10))
def test_add_counts_like_counter(counts: list[dict[str, int]]) -> None:
    total: Any = None
    expected: dict[str, int] = {}
    for count in counts:
        total = add(total, count)
        for key, value in count.items():
            expected[key] = expected.get(key, 0) + value
    assert (total or {}) == expected


# --- RESET ----------------------------------------------------------------------------------------------------


def test_reset_is_a_singleton_with_a_readable_repr() -> None:
    import copy
    import pickle

    assert Reset() is RESET
    assert repr(RESET) == "RESET"
    assert copy.deepcopy(RESET) is RESET
    assert pickle.loads(pickle.dumps(RESET)) is RESET


# --- inside a State -------------------------------------------------------------------------------------------


@STATEFUL
@given(st.lists(st.lists(st.integers(), max_size=4) | st.integers(), max_size=10))
def test_state_appends_equal_a_plain_list_reference_model(writes: list[Any]) -> None:
    state = State({"numbers": {"type": list[int]}})
    model: list[int] = []
    for write in writes:
        state.set("numbers", write)
        model = model + (write if isinstance(write, list) else [write])
        assert state.get("numbers", []) == model
    assert state.has("numbers") is bool(writes)


@pytest.mark.slow
@STATEFUL
@given(st.lists(item_or_items, max_size=8))
def test_merge_lists_in_a_state_equals_the_pure_function(writes: list[Any]) -> None:
    state = State({"values": {"type": list}})
    expected: Any = None
    for write in writes:
        state.set("values", write)
        expected = merge_lists(expected, write)
    assert state.get("values") == expected


@pytest.mark.slow
@STATEFUL
@given(st.lists(item_or_items, max_size=8))
def test_merge_lists_as_override_equals_the_schema_handler(writes: list[Any]) -> None:
    by_schema = State({"values": {"type": list}})
    by_override = State({"values": {"type": list, "handler": replace_values}})
    for write in writes:
        by_schema.set("values", write)
        by_override.set("values", write, handler_override=merge_lists)
    assert by_schema.get("values") == by_override.get("values")


@pytest.mark.slow
@STATEFUL
@given(st.lists(items, max_size=6))
def test_unique_in_a_state_equals_the_pure_function(writes: list[list[Any]]) -> None:
    state = State({"values": {"type": list, "handler": unique}})
    expected: Any = None
    for write in writes:
        state.set("values", write)
        expected = unique(expected, write)
    assert state.get("values") == expected


@pytest.mark.slow
@STATEFUL
@given(st.lists(json_dicts, max_size=6))
def test_merge_dicts_in_a_state_equals_the_pure_function(writes: list[dict[str, Any]]) -> None:
    state = State({"profile": {"type": dict, "handler": merge_dicts}})
    expected: Any = None
    for write in writes:
        state.set("profile", write)
        expected = merge_dicts(expected, write)
    assert state.get("profile") == expected


def test_reducers_in_a_state() -> None:
    state = State(
        {
            "ids": {"type": list[str], "handler": unique},
            "profile": {"type": dict, "handler": merge_dicts, "default": dict},
            "calls": {"type": int, "handler": add, "default": 0},
            "cost": {"type": float, "handler": add},
            "tools": {"type": dict[str, int], "handler": add},
            "counter": {"type": Counter, "handler": add, "default": Counter},
        }
    )
    state.set("ids", ["a", "b"])
    state.set("ids", "b")
    state.set("ids", ["c", "a"])
    assert state.get("ids") == ["a", "b", "c"]
    state.set("profile", {"prefs": {"lang": "en"}})
    state.set("profile", {"prefs": {"tz": "UTC"}, "name": "Ann"})
    assert state.get("profile") == {"prefs": {"lang": "en", "tz": "UTC"}, "name": "Ann"}
    state.set("calls", 1)
    state.set("calls", 2)
    assert state.get("calls") == 3
    state.set("cost", 0.5)
    state.set("cost", 1.0)
    assert state.get("cost") == 1.5
    state.set("tools", {"search": 1})
    state.set("tools", {"search": 1, "fetch": 1})
    assert state.get("tools") == {"search": 2, "fetch": 1}
    state.set("counter", Counter(a=1))
    state.set("counter", Counter(a=2, b=1))
    assert state.get("counter") == Counter(a=3, b=1) and type(state.get("counter")) is Counter


def test_reset_empties_a_reducer_field_or_restores_its_default() -> None:
    state = State(
        {
            "ids": {"type": list[str], "handler": unique},
            "docs": {"type": list[str]},
            "profile": {"type": dict, "handler": merge_dicts, "default": dict},
            "calls": {"type": int, "handler": add, "default": 0},
        }
    )
    state.update({"ids": ["a"], "docs": ["d"], "profile": {"a": 1}, "calls": 5})
    state.reset("ids")
    state.set("docs", RESET)
    state.reset("profile")
    state.set("calls", RESET)
    assert not state.has("ids") and state.get("ids") is None
    assert not state.has("docs") and state.get("docs", []) == []
    assert state.get("profile") == {} and state.get("calls") == 0
    # after a reset the reducers start again from empty
    state.set("ids", ["b", "b"])
    state.set("docs", "e")
    state.set("profile", {"b": 1})
    state.set("calls", 1)
    assert state.data == {"ids": ["b"], "docs": ["e"], "profile": {"b": 1}, "calls": 1}


def test_reset_of_an_unset_key_and_reset_with_a_handler_override() -> None:
    state = State({"calls": {"type": int, "handler": add}})
    state.reset("calls")
    assert not state.has("calls")
    state.set("calls", 2)
    state.set("calls", RESET, handler_override=add)  # RESET wins over any handler
    assert not state.has("calls")
