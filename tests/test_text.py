"""The text checks every layer shares: finding text that cannot be stored, and reading back what was stored before."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from haystack_state._text import find_bad_text, lenient_text, repaired, replace_surrogates, surrogate_at, text_problem


@dataclasses.dataclass
class Doc:
    title: str
    tags: tuple[str, ...] = ()


def test_text_problems_name_the_character_and_its_position() -> None:
    assert text_problem("plain") is None and text_problem("é \U0001f600 \ufffd") is None
    assert text_problem("ab\ud800") == "lone surrogate '\\ud800' at position 2 is not valid Unicode text"
    assert text_problem("a\x00") is None
    assert text_problem("a\x00", nul=True) == (
        "NUL character '\\x00' at position 1 cannot be stored or queried (PostgreSQL refuses it)"
    )
    assert surrogate_at("\ud83d\ude00") == 0  # a pair as two code points is not a character in a str either
    assert surrogate_at(json.loads('"\\ud83d\\ude00"')) == -1  # JSON's pair escapes decode to the character


@pytest.mark.parametrize(
    ("value", "python", "wire"),
    [
        ("\udfff", "", ""),
        ({"a": [1, {"b": "\ud800"}]}, "['a'][1]['b']", "a.1.b"),
        ({"a": {"\ud800": 1}}, "['a']", "a"),
        ([Doc("ok", ("x", "\ud800"))], "[0].tags[1]", "0.tags.1"),
        ({("k", "\ud800"): 1}, "{('k', '\\ud800')}[1]", "('k', '\\ud800').1"),
    ],
)
def test_find_bad_text_names_where_it_is(value: object, python: str, wire: str) -> None:
    found = find_bad_text(value)
    assert found is not None and "lone surrogate" in found.problem
    assert found.python_path() == python and found.wire_path("") == wire


def test_find_bad_text_finds_nul_and_non_finite_numbers_only_when_asked() -> None:
    value = {"k": ["a\x00", float("nan")]}
    assert find_bad_text(value) is None
    assert find_bad_text(value, nul=True).wire_path("body") == "body.k.0"  # type: ignore[union-attr]
    assert find_bad_text({"k": [float("-inf")]}, finite=True).problem == "-Infinity is not a JSON number"  # type: ignore[union-attr]
    cycle: list[object] = []
    cycle.append(cycle)
    assert find_bad_text(cycle) is None


def test_stored_escapes_read_back_replaced_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    text = '{"a\\ud800":["x\\udc80y",{"k":"\\ud83d\\ude00"}]}'
    with caplog.at_level(logging.WARNING):
        data = repaired(json.loads(text), text, thread_id="t-text", checkpoint_id="c1", what="delta")
        repaired(json.loads(text), text, thread_id="t-text", checkpoint_id="c1", what="delta")
    assert data == {"a\ufffd": ["x\ufffdy", {"k": "\U0001f600"}]}
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "Thread 't-text', checkpoint 'c1': the stored delta" in caplog.records[0].getMessage()
    clean = '{"a":"\\\\ud800 is how JSON escapes it"}'
    assert repaired(json.loads(clean), clean, thread_id="t", what="x") == {"a": "\\ud800 is how JSON escapes it"}


def test_invalid_utf8_decodes_to_escapes_that_read_back_replaced() -> None:
    raw = b'{"a":"x\xed\xa0\x80\xffy"}'
    text = lenient_text(raw)
    assert text.isascii() or text.encode("utf-8")
    assert repaired(json.loads(text), text, thread_id=None, what="value") == {"a": "x\ufffd\ufffd\ufffd\ufffdy"}
    assert replace_surrogates("ok") == "ok" and replace_surrogates("a\ud800\udc00") == "a\ufffd\ufffd"
