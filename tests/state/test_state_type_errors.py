"""
Tests of ``UnstorableValueError`` (a ``StateTypeError``): an object the State cannot copy (a sqlite3 connection, a
lock, a socket, a generator, an open file), put into the State at construction, by ``set``, ``update``/``apply``,
through a staged view or by a tool's output mapping, is refused with an error that names the key and the type and
points to ``run(context=...)`` and ``RunContext``, with the copy's error chained. The state is unchanged.
"""

from __future__ import annotations

import socket
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state import (
    State,
    StateSchemaError,
    StateTypeError,
    ToolInvoker,
    ToolMergeError,
    UnstorableValueError,
    tool,
)


def _lock() -> Any:
    return threading.Lock()


def _connection() -> Any:
    return sqlite3.connect(":memory:")


def _socket() -> Any:
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def _generator() -> Any:
    return (n for n in range(3))


def _file() -> Any:
    return tempfile.TemporaryFile()


LIVE: list[tuple[Callable[[], Any], str]] = [
    (_lock, "_thread.lock"),
    (_connection, "sqlite3.Connection"),
    (_socket, "socket.socket"),
    (_generator, "generator"),
    (_file, "_io.BufferedRandom"),
]


@pytest.fixture(params=LIVE, ids=[name for _, name in LIVE])
def live(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    value = request.param[0]()
    yield value, request.param[1]
    close = getattr(value, "close", None)
    if close is not None:
        close()


def check_error(error: BaseException, key: str, type_name: str) -> None:
    assert isinstance(error, UnstorableValueError)
    assert isinstance(error, StateTypeError) and isinstance(error, TypeError)
    assert error.key == key
    text = str(error)
    assert text.startswith(f"State key '{key}' cannot hold a {type_name}: ")
    assert "run(..., context=obj)" in text and "RunContext[T]" in text
    assert isinstance(error.__cause__, TypeError)  # the copy's own error


def schema() -> dict[str, Any]:
    return {"thing": {"type": object}, "things": {"type": list}, "name": {"type": str}, "cfg": {"type": dict}}


def test_state_init_refuses_a_live_object(live: tuple[Any, str]) -> None:
    value, type_name = live
    with pytest.raises(UnstorableValueError) as info:
        State(schema(), {"name": "a", "thing": value})
    check_error(info.value, "thing", type_name)


def test_set_refuses_a_live_object_and_changes_nothing(live: tuple[Any, str]) -> None:
    value, type_name = live
    state = State(schema(), {"name": "a", "thing": 1, "things": [1], "cfg": {"x": 1}})
    before = state.data
    for key, written in [
        ("thing", value),
        ("cfg", {"db": {"inner": [value]}}),
        ("things", value),
        ("things", [2, value]),
    ]:
        with pytest.raises(UnstorableValueError) as info:
            state.set(key, written)
        check_error(info.value, key, type_name)
    assert state.data == before


def test_the_fresh_list_and_replace_paths_refuse_too() -> None:
    state = State(schema())
    with pytest.raises(UnstorableValueError) as info:
        state.set("things", [threading.Lock()])  # the key holds nothing yet
    check_error(info.value, "things", "_thread.lock")
    with pytest.raises(UnstorableValueError) as info:
        state.set("things", threading.Lock(), handler_override=lambda current, new: [new])
    check_error(info.value, "things", "_thread.lock")
    assert state.data == {}


def test_update_is_atomic_when_a_later_value_cannot_be_stored() -> None:
    state = State(schema(), {"name": "a", "things": [1]})
    connection = _connection()
    with pytest.raises(UnstorableValueError) as info:
        state.update({"name": "b", "things": [2], "thing": connection})
    connection.close()
    check_error(info.value, "thing", "sqlite3.Connection")
    assert state.data == {"name": "a", "things": [1]}


def test_a_staged_write_is_refused_and_not_staged() -> None:
    state = State(schema(), {"name": "a"})
    staged = state.stage()
    with pytest.raises(UnstorableValueError) as info:
        staged.set("thing", _lock())
    check_error(info.value, "thing", "_thread.lock")
    assert staged.writes == []
    staged.commit()
    assert state.data == {"name": "a"}


def test_a_tool_output_mapping_with_a_live_object_is_an_error_result_and_merges_nothing() -> None:
    connection = sqlite3.connect(":memory:")

    @tool(outputs_to_state={"name": {"source": "name"}, "thing": {"source": "db"}})
    def open_db(path: str) -> dict[str, Any]:
        """Open a database."""
        return {"name": path, "db": connection}

    calls = [ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="open_db", arguments={"path": "x"}, id="c0")])]
    state = State(schema(), {"name": "a"})
    try:
        output = ToolInvoker(tools=[open_db], raise_on_failure=False).run(messages=calls, state=state)
        result = output["tool_messages"][0].tool_call_results[0]
        assert result.error
        assert (
            "Tool 'open_db'" in result.result and "State key 'thing' cannot hold a sqlite3.Connection" in result.result
        )
        assert "context=" in result.result
        assert state.data == {"name": "a"}
        with pytest.raises(ToolMergeError) as info:
            ToolInvoker(tools=[open_db]).run(messages=calls, state=state)
        assert isinstance(info.value.__cause__, UnstorableValueError)
        assert state.data == {"name": "a"}
    finally:
        connection.close()


def test_a_tool_writing_a_live_object_through_the_state_fails_and_merges_nothing() -> None:
    @tool
    def stash(name: str, state: State) -> str:
        """Stash a lock."""
        state.set("name", name)
        state.set("thing", threading.Lock())
        return "stashed"

    calls = [ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="stash", arguments={"name": "b"}, id="c0")])]
    state = State(schema(), {"name": "a"})
    output = ToolInvoker(tools=[stash], raise_on_failure=False).run(messages=calls, state=state)
    result = output["tool_messages"][0].tool_call_results[0]
    assert result.error and "State key 'thing' cannot hold a _thread.lock" in result.result
    assert state.data == {"name": "a"}


def test_copyable_objects_are_still_stored_as_private_copies() -> None:
    class Plain:
        def __init__(self) -> None:
            self.items = [1]

    state = State(schema())
    value = Plain()
    state.set("thing", value)
    value.items.append(2)
    assert state.get("thing").items == [1]


def test_a_schema_default_that_cannot_be_copied_is_a_schema_problem() -> None:
    with pytest.raises(StateSchemaError, match=r"Key 'thing': the default cannot be copied.*_thread\.lock"):
        State({"thing": {"type": object, "default": threading.Lock()}})
