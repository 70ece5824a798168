"""Bad input, one test each: every error names what is at fault, and the state is unchanged."""

import json
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage

from haystack_state import (
    HaystackStateError,
    State,
    StateHandlerError,
    StateSchemaError,
    StateSerializationError,
    StateTypeError,
    UnknownStateKeyError,
    add,
)


def failing_handler(current: Any, new: Any) -> Any:
    raise ValueError("handler exploded")


@pytest.fixture
def state() -> State:
    return State(
        {"name": {"type": str}, "ids": {"type": list[int]}, "n": {"type": int, "handler": failing_handler}},
        {"name": "a", "ids": [1], "n": 1},
    )


# --- writes -------------------------------------------------------------------------------------------------------


def test_set_on_an_unknown_key_lists_the_known_keys(state: State) -> None:
    with pytest.raises(UnknownStateKeyError) as info:
        state.set("nmae", "b")
    assert isinstance(info.value, ValueError)  # haystack-ai raises ValueError here
    assert info.value.key == "nmae" and info.value.known == ["ids", "messages", "n", "name"]
    assert str(info.value) == "State: Key 'nmae' not found in schema. Known keys: ids, messages, n, name."
    assert state.data == {"name": "a", "ids": [1], "n": 1}


def test_reset_and_update_on_an_unknown_key(state: State) -> None:
    with pytest.raises(UnknownStateKeyError, match="Known keys: ids, messages, n, name"):
        state.reset("unknown")
    with pytest.raises(UnknownStateKeyError):
        state.update({"name": "b", "unknown": 1})
    assert state.data == {"name": "a", "ids": [1], "n": 1}


def test_a_value_of_the_wrong_type(state: State) -> None:
    with pytest.raises(StateTypeError) as info:
        state.set("name", 3)
    assert isinstance(info.value, TypeError) and isinstance(info.value, HaystackStateError)
    assert str(info.value) == "State key 'name' expects str, got int (3)."
    assert state.get("name") == "a"


def test_a_long_wrong_value_is_shortened_in_the_message(state: State) -> None:
    with pytest.raises(StateTypeError) as info:
        state.set("name", list(range(1000)))
    assert len(str(info.value)) < 200 and "..." in str(info.value)


def test_a_handler_that_raises_names_the_key_and_the_handler(state: State) -> None:
    with pytest.raises(StateHandlerError) as info:
        state.set("n", 2)
    error = info.value
    assert error.key == "n" and error.handler == "failing_handler"
    assert "'failing_handler'" in str(error) and "'n'" in str(error) and "handler exploded" in str(error)
    assert isinstance(error.__cause__, ValueError)
    assert state.get("n") == 1


def test_a_handler_override_that_raises(state: State) -> None:
    with pytest.raises(StateHandlerError, match="Handler 'add' failed while merging into state key 'name'"):
        state.set("name", {"x": 1}, handler_override=add)
    assert state.get("name") == "a"


def test_a_handler_override_that_is_not_callable(state: State) -> None:
    with pytest.raises(TypeError, match="handler_override for state key 'name' must be callable, got 'oops'"):
        state.set("name", "b", handler_override="oops")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be callable"):
        state.set("ids", 2, handler_override=5)  # type: ignore[arg-type]
    assert state.data == {"name": "a", "ids": [1], "n": 1}


def test_a_value_that_cannot_be_copied_into_the_state(state: State) -> None:
    import threading

    locked = State({"thing": {"type": object}})
    with pytest.raises(TypeError):
        locked.set("thing", threading.Lock())
    assert not locked.has("thing")


# --- schemas ------------------------------------------------------------------------------------------------------


def _problems(schema: Any) -> list[str]:
    with pytest.raises(StateSchemaError) as info:
        State(schema)
    assert isinstance(info.value, ValueError)  # haystack-ai raises ValueError for schema problems
    return info.value.problems


def test_schema_missing_type() -> None:
    assert _problems({"name": {"handler": add}}) == ["Key 'name' is missing a 'type' entry."]


@pytest.mark.parametrize("not_a_type", [42, "str", None, [int], {"a": int}])
def test_schema_type_that_is_not_a_type(not_a_type: Any) -> None:
    assert _problems({"name": {"type": not_a_type}}) == [
        f"Key 'name': 'type' must be a Python type, got {not_a_type!r}."
    ]


def test_schema_handler_that_is_not_callable() -> None:
    assert _problems({"name": {"type": str, "handler": "replace_values"}}) == [
        "Key 'name': 'handler' must be callable or None, got 'replace_values'."
    ]


@pytest.mark.parametrize("wrong", [list[str], list, str, list[ChatMessage] | None, dict[str, ChatMessage]])
def test_schema_messages_that_is_not_a_list_of_chat_messages(wrong: Any) -> None:
    problems = _problems({"messages": {"type": wrong}})
    assert len(problems) == 1 and problems[0].startswith("Key 'messages' must be of type list[ChatMessage], got ")


def test_schema_unknown_entry_field() -> None:
    assert _problems({"name": {"type": str, "hander": add}}) == [
        "Key 'name' has an unknown field 'hander' (did you mean 'handler'?); "
        "allowed: type, handler, default, description, scope, loader, input, output."
    ]
    assert _problems({"name": {"type": str, "xyz": 1}}) == [
        "Key 'name' has an unknown field 'xyz'; "
        "allowed: type, handler, default, description, scope, loader, input, output."
    ]


def test_every_schema_problem_is_reported_in_one_error() -> None:
    with pytest.raises(StateSchemaError) as info:
        State(
            {
                "a": {"handler": add},
                "b": {"type": 42},
                "c": {"type": int, "handler": 5},
                "messages": {"type": list[str]},
                "e": {"type": int, "hander": add},
                "f": {"type": str, "default": 1},
                "g": "not an entry",
                "h": {"type": str, "description": 3},
                "ok": {"type": int},
            }
        )
    problems = info.value.problems
    assert len(problems) == 8
    for key in "abcefgh":
        assert any(f"'{key}'" in problem for problem in problems), key
    assert any("'messages'" in problem for problem in problems)
    message = str(info.value)
    assert message.startswith("Invalid state schema (8 problem(s)):\n  - ")
    assert message.count("\n  - ") == 8


def test_schema_that_is_not_a_dict_and_entries_that_are_not_dicts() -> None:
    assert _problems([("name", str)]) == ["The schema must be a dict of key -> entry, got list."]
    assert _problems({"name": str}) == ["Key 'name': the entry must be a dict like {'type': str}, got type."]
    assert _problems({1: {"type": str}}) == ["Key 1 must be a string."]


def test_schema_default_of_the_wrong_type() -> None:
    problems = _problems({"n": {"type": int, "default": "0"}})
    assert problems == ["Key 'n': the default does not match the type: State key 'n' expects int, got str ('0')."]
    assert "the default does not match" in _problems({"n": {"type": list[int], "default": lambda: ["x"]}})[0]


def test_schema_default_factory_that_raises() -> None:
    def broken() -> list[int]:
        raise RuntimeError("no default")

    assert _problems({"n": {"type": list[int], "default": broken}}) == [
        "Key 'n': the default factory raised RuntimeError: no default"
    ]


def test_schema_description_that_is_not_a_string() -> None:
    assert _problems({"n": {"type": int, "description": ["x"]}}) == [
        "Key 'n': 'description' must be a string, got list."
    ]


def test_initial_data_with_an_unknown_key_or_a_wrong_type() -> None:
    with pytest.raises(UnknownStateKeyError, match="'other'"):
        State({"name": {"type": str}}, {"other": 1})
    with pytest.raises(StateTypeError, match="State key 'name' expects str, got int"):
        State({"name": {"type": str}}, {"name": 1})


# --- from_dict ----------------------------------------------------------------------------------------------------

VALID = State({"name": {"type": str}, "ids": {"type": list[int]}}, {"name": "a", "ids": [1]}).to_dict()


def _with(**changes: Any) -> dict[str, Any]:
    payload = json.loads(json.dumps(VALID))
    payload.update(changes)
    return payload


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (None, "expects a dict with 'schema' and 'data'"),
        ("state", "expects a dict with 'schema' and 'data'"),
        ([VALID], "expects a dict with 'schema' and 'data'"),
        ({"data": VALID["data"]}, "expects a dict with 'schema' and 'data'"),
        (_with(schema=["name"]), "The serialized schema must be a dict, got list"),
        (_with(schema={"name": "str"}), "Serialized schema key 'name' needs a 'type' string"),
        (_with(schema={"name": {"handler": "x"}}), "Serialized schema key 'name' needs a 'type' string"),
        (_with(schema={"name": {"type": 3}}), "Serialized schema key 'name' needs a 'type' string"),
        (_with(schema={"name": {"type": "no_such_module.Thing"}}), "Serialized schema key 'name' cannot be loaded"),
        (_with(schema={"name": {"type": "str", "handler": "os.system"}}), "Serialized schema key 'name' cannot be"),
        (_with(schema={"messages": {"type": "list[str]"}}), "Key 'messages' must be of type list[ChatMessage]"),
        (_with(data=[1, 2]), "cannot read the 'data' entry"),
        (_with(data={"name": "a"}), "cannot read the 'data' entry"),
        (
            _with(
                data={"serialization_schema": {"type": "array", "items": {"type": "integer"}}, "serialized_data": [1]}
            ),
            "'data' must hold an object, got list",
        ),
        (
            _with(data={"serialization_schema": {"type": "object", "properties": {"name": {"type": "integer"}}}}),
            "cannot read the 'data' entry",
        ),
        (
            _with(
                data={
                    "serialization_schema": {"type": "object", "properties": {"name": {"type": "integer"}}},
                    "serialized_data": {"name": 3},
                }
            ),
            "State key 'name' expects str, got int",
        ),
        (
            _with(
                data={
                    "serialization_schema": {"type": "object", "properties": {"age": {"type": "integer"}}},
                    "serialized_data": {"age": 3},
                }
            ),
            "State: Key 'age' not found in schema",
        ),
        (
            _with(
                data={
                    "serialization_schema": {
                        "type": "object",
                        "properties": {"ids": {"type": "array", "items": {"type": "string"}}},
                    },
                    "serialized_data": {"ids": ["1"]},
                }
            ),
            "State key 'ids' expects list[int], got list",  # nothing is coerced on the way in either
        ),
    ],
)
def test_from_dict_on_malformed_input(payload: Any, message: str) -> None:
    with pytest.raises(StateSerializationError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        State.from_dict(payload)
    assert isinstance(info.value, ValueError)


def test_from_dict_accepts_an_empty_or_missing_data_entry() -> None:
    for payload in (_with(data={}), _with(data=None), {"schema": VALID["schema"]}):
        assert State.from_dict(payload).data == {}
