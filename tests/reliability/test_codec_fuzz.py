"""
Codec safety: stored data naming types outside the allowlist (modules that run code on import, callables that run
commands or unpickle, modules that do not exist, dotted tricks and look-alikes of allowed names), in every place a type
tag can sit: at the top, in lists and dicts, as a dict key, in tuples and sets, inside the data of allowed haystack
types, in a checkpoint's delta and in its metadata, in rows written straight into a SQLite file; and in the places
haystack-ai's serialization format (``State.to_dict``/``from_dict``) names a type or a callable.

Each case must be a ``CodecError`` that names the stored type (and, for a stored checkpoint, the thread and the
checkpoint), and must import nothing: ``sys.modules`` is compared before and after, here and in a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from haystack_state import CodecError, State, StateSerializationError
from haystack_state.persistence import decode, registered_names
from haystack_state.persistence._registry import BUILTIN_TAGS
from reliability.codec_cases import (
    EVIL_NAMES,
    NAMED_MODULES,
    POSITIONS,
    ROW_VARIANTS,
    benign_values,
    read_hostile_row,
    shown,
    tag,
    write_hostile_row,
)

TESTS_DIR = Path(__file__).resolve().parent.parent
FUZZ_SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def warm() -> None:
    """Load one value of every kind first, so that lazily imported modules do not count as the cases' imports."""
    for data in benign_values():
        decode(data)
    for where in SERIALIZED_PLACES:  # haystack-ai's deserializer imports some of its own modules on first use
        with contextlib.suppress(StateSerializationError):
            State.from_dict(_serialized(where, "nonexistent_module_7f3a.Thing"))


@contextmanager
def imports_nothing() -> Iterator[None]:
    before = set(sys.modules)
    absent = [name for name in NAMED_MODULES if name not in sys.modules]
    yield
    assert set(sys.modules) - before == set()
    assert [name for name in absent if name in sys.modules] == []


@pytest.mark.parametrize("position", list(POSITIONS))
def test_hostile_type_names_fail_cleanly_in_every_position(position: str) -> None:
    build = POSITIONS[position]
    with imports_nothing():
        for name in EVIL_NAMES:
            with pytest.raises(CodecError) as raised:
                decode(build(tag(name)), key="notes")
            message = str(raised.value)
            assert message.startswith("State key 'notes': cannot decode stored value")
            if position != "tag-inside-unknown-tag-data":  # there the outer tag, os.system, is the one named
                assert shown(name) in message, message
            assert "register_type" in message or "malformed" in message


@pytest.mark.parametrize(
    "data",
    [
        {"__type__": 42, "data": 1},
        {"__type__": None, "data": 1},
        {"__type__": ["os", "system"], "data": "ls"},
        {"__type__": {"__type__": "os.system", "data": "ls"}, "data": 1},
        {"__type__": "os.system", "data": "ls", "args": ["-la"]},
        {"__type__": "os.system"},
        [{"a": {"__type__": "subprocess.Popen", "data": ["sh"], "shell": True}}],
    ],
    ids=["int", "null", "list", "tag-as-name", "extra-key", "no-data", "nested-extra-key"],
)
def test_malformed_tags_fail_cleanly(data: Any) -> None:
    with imports_nothing(), pytest.raises(CodecError, match=r"malformed tagged object at notes"):
        decode(data, key="notes")


@pytest.mark.parametrize("variant", ROW_VARIANTS)
@pytest.mark.parametrize("name", ["os.system", "antigravity", "pickle.loads", "haystack.dataclasses.ChatMessage"])
def test_hostile_rows_written_into_sqlite_fail_naming_thread_checkpoint_and_type(
    tmp_path: Path, variant: str, name: str
) -> None:
    path = tmp_path / "hostile.sqlite"
    honest, hostile = write_hostile_row(path, "victim", variant, tag(name))
    with imports_nothing():
        message = read_hostile_row(path, "victim", variant, honest)
    assert f"Thread 'victim', checkpoint '{hostile}'" in message
    assert shown(name) in message


# --- haystack-ai's serialization format (State.to_dict / from_dict) ------------------------------------------------

#: The names haystack-ai's deserializer must refuse. Left out: haystack's own names, and those it rightly loads (a
#: harmless standard type on its allowlist, ``typing.Dict``, and "" which means "no handler").
FOREIGN_NAMES = [
    name
    for name in EVIL_NAMES
    if "haystack" not in name.lower() and name not in ("collections.OrderedDict", "Dict", "")
]


SERIALIZED_PLACES = ["schema-type", "schema-handler", "schema-default-factory", "data-type"]


def _serialized(where: str, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "list"}
    data: dict[str, Any] = {"serialization_schema": {"type": "object", "properties": {}}, "serialized_data": {}}
    if where == "schema-type":
        entry = {"type": name}
    elif where == "schema-handler":
        entry["handler"] = name
    elif where == "schema-default-factory":
        entry["default_factory"] = name
    else:
        data = {
            "serialization_schema": {"type": "object", "properties": {"k": {"type": name}}},
            "serialized_data": {"k": {}},
        }
    return {"schema": {"k": entry}, "data": data}


@pytest.mark.parametrize("where", SERIALIZED_PLACES)
def test_hostile_names_in_a_serialized_state_fail_cleanly(where: str) -> None:
    with imports_nothing():
        for name in FOREIGN_NAMES:
            with pytest.raises(StateSerializationError, match=r"'k'|'data'"):
                State.from_dict(_serialized(where, name))


# --- hypothesis ---------------------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
json_data = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4).filter(lambda k: k != "__type__"), inner, max_size=3)
    ),
    max_leaves=12,
)
unknown_names = st.sampled_from(EVIL_NAMES) | st.text(max_size=30).filter(
    lambda name: name not in BUILTIN_TAGS and name not in registered_names()
)
WRAPPERS: dict[str, Callable[[Any, Any], Any]] = {
    "list": lambda inner, junk: [junk, inner, junk],
    "dict": lambda inner, junk: {"junk": junk, "value": inner},
    "dict-key": lambda inner, junk: tag("dict", [["junk", junk], [inner, 1]]),
    "dict-value": lambda inner, junk: tag("dict", [[0, inner]]),
    "tuple": lambda inner, junk: tag("tuple", [junk, inner]),
    "set": lambda inner, junk: tag("set", [inner]),
    "document": lambda inner, junk: tag("haystack.Document", {"content": "x", "meta": {"m": inner}}),
}


@st.composite
def hostile_structures(draw: st.DrawFn) -> tuple[Any, str]:
    name = draw(unknown_names)
    data: Any = tag(name, draw(json_data))
    for kind in draw(st.lists(st.sampled_from(list(WRAPPERS)), max_size=6)):
        data = WRAPPERS[kind](data, draw(json_data))
    return data, name


@pytest.mark.slow
@FUZZ_SETTINGS
@given(case=hostile_structures())
def test_a_hostile_tag_anywhere_in_random_data_fails_naming_it(case: tuple[Any, str]) -> None:
    data, name = case
    with imports_nothing(), pytest.raises(CodecError) as raised:
        decode(data, key="k")
    assert shown(name) in str(raised.value)


any_tag_name = (
    st.sampled_from(sorted(BUILTIN_TAGS))
    | st.sampled_from(registered_names())
    | st.sampled_from(EVIL_NAMES)
    | st.text(max_size=12)
)
tagged_data = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        | st.builds(tag, any_tag_name, inner)
    ),
    max_leaves=15,
)


@pytest.mark.slow
@settings(FUZZ_SETTINGS, max_examples=200)
@given(data=tagged_data)
def test_random_tagged_data_decodes_or_fails_with_a_codec_error_only(data: Any) -> None:
    with imports_nothing():
        try:
            decode(data, key="k")
        except CodecError as error:
            assert str(error).startswith("State key 'k': ")


# --- a clean interpreter ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_fresh_interpreter_imports_nothing_while_loading_hostile_data(report: Callable[[str], None]) -> None:
    env = {
        **os.environ,
        "HAYSTACK_TELEMETRY_ENABLED": "False",
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "reliability.codec_cases"],
        cwd=TESTS_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    report(
        f"codec: hostile-cases={result['cases']} (type names={len(EVIL_NAMES)}, positions={len(POSITIONS)}, "
        f"sqlite row variants={len(ROW_VARIANTS)}) clean-codec-errors={result['cases'] - len(result['failures'])} "
        f"modules-imported={len(result['new_modules'])} named-modules-loaded={len(result['named_modules_loaded'])}"
    )
    assert result["failures"] == []
    assert result["new_modules"] == []
    assert {"antigravity", "this"} <= set(result["named_modules_absent_before"])
    assert result["named_modules_loaded"] == []
    assert result["registered_names_unchanged"]
