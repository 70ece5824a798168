"""State.diff and State.size: what changed between two states, and which key is growing."""

import json

from haystack.dataclasses import ChatMessage

from haystack_state import State
from haystack_state._display import StateDiff

SCHEMA = {"docs": {"type": list[dict]}, "name": {"type": str}, "count": {"type": int}}


def test_diff_lists_only_the_keys_that_differ() -> None:
    before = State(SCHEMA, {"docs": [{"id": 1}], "name": "Ann", "count": 1})
    after = State(SCHEMA, {"docs": [{"id": 1}], "name": "Ann", "count": 1})
    after.set("docs", {"id": 2})
    after.set("name", "Bob")
    diff = before.diff(after)
    assert isinstance(diff, StateDiff)
    assert dict(diff) == {"docs": ([{"id": 1}], [{"id": 1}, {"id": 2}]), "name": ("Ann", "Bob")}
    assert str(diff).splitlines() == ["docs: +1 item", "name: 'Ann' -> 'Bob'"]


def test_diff_of_equal_states_is_empty() -> None:
    state = State(SCHEMA, {"name": "Ann"})
    assert state.diff(State(SCHEMA, {"name": "Ann"})) == {}
    assert str(state.diff(state)) == "no changes"


def test_diff_shows_keys_set_on_one_side_only() -> None:
    before = State(SCHEMA)
    after = State(SCHEMA, {"count": 3})
    assert dict(before.diff(after)) == {"count": (None, 3)}
    assert str(before.diff(after)) == "count: unset -> 3"
    assert str(after.diff(before)) == "count: 3 -> unset"


def test_diff_renders_as_an_html_table() -> None:
    before = State(SCHEMA, {"name": "<b>Ann</b>"})
    after = State(SCHEMA, {"name": "Bob"})
    page = before.diff(after)._repr_html_()
    assert page.startswith('<table class="haystack-state-diff">')
    assert "<td>name</td>" in page
    assert "&lt;b&gt;" in page  # values are escaped


def test_size_reports_json_bytes_per_key_largest_first() -> None:
    state = State(SCHEMA, {"docs": [{"text": "x" * 100}], "name": "Ann"})
    state.set("messages", ChatMessage.from_user("héllo"))
    sizes = state.size()
    assert list(sizes) == sorted(sizes, key=sizes.__getitem__, reverse=True)
    assert sizes["docs"] == len(json.dumps([{"text": "x" * 100}]).encode())
    assert sizes["name"] == len(b'"Ann"')
    assert "count" not in sizes  # no value, no size
    assert sizes["messages"] > len("héllo".encode())


def test_size_grows_with_the_key_that_grows() -> None:
    state = State(SCHEMA, {"name": "Ann"})
    first = state.size()
    for i in range(50):
        state.set("docs", {"i": i, "text": "lorem ipsum"})
    second = state.size()
    assert second["name"] == first["name"]
    assert second["docs"] > 50 * len("lorem ipsum")
