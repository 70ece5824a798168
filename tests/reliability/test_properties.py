"""
Property-based tests (hypothesis).

1. Random sequences of writes, resets, batched updates, bad writes and tool calls (results merged through
   ``outputs_to_state``, writes through an injected State, failing tools) against a reference model made of plain
   dicts and lists that implements ``merge_lists``, ``replace_values``, ``unique``, ``add``, ``merge_dicts`` and
   resets by hand. After every operation the State equals the model; at random points the State's change journal is
   committed as a checkpoint (in memory, or to a SQLite file), and the checkpoint read back equals the model too, as
   does ``State.from_dict(state.to_dict())`` at the end.
2. Random batches of tool calls run by a ``ToolInvoker`` with several workers (tools writing through
   ``outputs_to_state`` and through an injected State, reading state inputs, sleeping a random few hundred
   microseconds, some failing) give the same tool results and the same final state as the same calls run one at a
   time, in order; so does ``run_async``.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ToolCall
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from haystack_state import (
    State,
    StateHandlerError,
    StateTypeError,
    ToolInvoker,
    add,
    merge_dicts,
    tool,
    unique,
)
from haystack_state.persistence import Checkpointer, InMemoryCheckpointer, SQLiteCheckpointer
from reliability.common import record

#: What the examples exercised, reported when the module is done.
pytestmark = pytest.mark.slow

STATS: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def figures(request: pytest.FixtureRequest) -> Iterator[None]:
    failed = request.session.testsfailed
    yield
    record(
        f"properties: state-vs-model sequences={STATS['sequences']} operations={STATS['operations']} "
        f"(tool calls={STATS['tool calls']}, rejected bad writes={STATS['bad']}, checkpoints={STATS['checkpoints']}) "
        f"parallel-vs-sequential batches={STATS['batches']} calls={STATS['calls']} "
        f"(failed calls={STATS['failed calls']}) failed-properties={request.session.testsfailed - failed}"
    )


PROPERTY_SETTINGS = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

# --- 1. the State against a reference model ----------------------------------------------------------------------

SCHEMA: dict[str, Any] = {
    "items": {"type": list[int]},  # merge_lists, no default
    "tags": {"type": list[str], "handler": unique, "default": list},
    "total": {"type": int, "handler": add, "default": 0},
    "counts": {"type": dict[str, int], "handler": add, "default": dict},
    "name": {"type": str},  # replace_values, no default
    "prefs": {"type": dict[str, Any], "handler": merge_dicts, "default": dict},
}
DEFAULTS: dict[str, Any] = {"tags": [], "total": 0, "counts": {}, "prefs": {}}


def _deep_merge(current: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    merged = dict(current)
    for key, value in new.items():
        if isinstance(merged.get(key), dict) and isinstance(value, dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class Model:
    """What the State should hold, computed with plain dicts and lists."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = copy.deepcopy(DEFAULTS)

    def set(self, key: str, value: Any) -> None:
        current = self.values.get(key)
        new = copy.deepcopy(value)
        if key == "items":
            self.values[key] = (current or []) + (new if isinstance(new, list) else [new])
        elif key == "tags":
            merged = list(current or [])
            for item in new if isinstance(new, list) else [new]:
                if item not in merged:
                    merged.append(item)
            self.values[key] = merged
        elif key == "total":
            self.values[key] = (current or 0) + new
        elif key == "counts":
            self.values[key] = {**(current or {}), **{k: (current or {}).get(k, 0) + v for k, v in new.items()}}
        elif key == "name":
            self.values[key] = new
        else:
            self.values[key] = _deep_merge(current or {}, new)

    def reset(self, key: str) -> None:
        if key in DEFAULTS:
            self.values[key] = copy.deepcopy(DEFAULTS[key])
        else:
            self.values.pop(key, None)


ints = st.integers(-20, 20)
words = st.sampled_from(["a", "b", "c", "d", "e"])
VALID: dict[str, st.SearchStrategy[Any]] = {
    "items": ints | st.lists(ints, max_size=4),
    "tags": words | st.lists(words, max_size=4),
    "total": ints,
    "counts": st.dictionaries(st.sampled_from(["x", "y", "z"]), ints, max_size=3),
    "name": st.text(max_size=6),
    "prefs": st.dictionaries(
        st.sampled_from(["p", "q", "r"]),
        ints | st.text(max_size=3) | st.dictionaries(st.sampled_from(["p", "q"]), ints, max_size=2),
        max_size=3,
    ),
}
#: A value of the wrong type for each key: a type error or a failing handler; the State must not change.
INVALID: dict[str, Any] = {
    "items": ["1"],
    "tags": [3],
    "total": "3",
    "counts": {"x": "1"},
    "name": 3,
    "prefs": ["p"],
}
keys = st.sampled_from(list(SCHEMA))


@tool(outputs_to_state={"items": {"source": "items"}, "total": {"source": "total"}, "tags": {"source": "tag"}})
def emit(items: list[int], total: int, tag: str) -> dict[str, Any]:
    """Emit items, an amount and a tag."""
    return {"items": items, "total": total, "tag": tag}


@tool
def edit(name: str, amount: int, reset_tags: bool, fail: bool, state: State) -> str:
    """Write through the State, then fail if asked."""
    state.set("name", name)
    state.set("total", amount)
    if reset_tags:
        state.reset("tags")
    if fail:
        raise RuntimeError("asked to fail")
    return "edited"


def _tool_ops() -> st.SearchStrategy[tuple[Any, ...]]:
    emit_op = st.tuples(st.just("emit"), st.lists(ints, max_size=3), ints, words)
    # The model's text arguments: any text but NUL and lone surrogates, which the invoker refuses in arguments (an
    # error result, tested in tests/invocation/test_invocation_hostile.py) since the provider would get them back
    # every turn.
    model_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=4)
    edit_op = st.tuples(st.just("edit"), model_text, ints, st.booleans(), st.booleans())
    return emit_op | edit_op


operations = st.lists(
    st.one_of(
        keys.flatmap(lambda key: st.tuples(st.just("set"), st.just(key), VALID[key])),
        st.tuples(st.just("reset"), keys),
        st.tuples(st.just("bad"), keys),
        st.tuples(
            st.just("update"),
            st.dictionaries(keys, st.none(), min_size=1, max_size=3).flatmap(
                lambda chosen: st.fixed_dictionaries({key: VALID[key] for key in chosen})
            ),
            st.booleans(),
        ),
        _tool_ops(),
        st.tuples(st.just("checkpoint")),
    ),
    min_size=5,
    max_size=40,
)


def _apply(state: State, model: Model, invoker: ToolInvoker, op: tuple[Any, ...]) -> None:
    kind = op[0]
    STATS["operations"] += 1
    STATS["tool calls"] += kind in ("emit", "edit")
    STATS["bad"] += kind == "bad" or (kind == "update" and op[2])
    if kind == "set":
        state.set(op[1], op[2])
        model.set(op[1], op[2])
    elif kind == "reset":
        state.reset(op[1])
        model.reset(op[1])
    elif kind == "bad":
        with pytest.raises((StateTypeError, StateHandlerError), match=f"'{op[1]}'"):
            state.set(op[1], INVALID[op[1]])
    elif kind == "update":
        values, spoil = dict(op[1]), op[2]
        if spoil:  # one bad value spoils the whole batch
            bad_key = sorted(values)[0]
            values[bad_key] = INVALID[bad_key]
            with pytest.raises((StateTypeError, StateHandlerError)):
                state.update(values)
        else:
            state.update(values)
            for key, value in values.items():
                model.set(key, value)
    elif kind == "emit":
        arguments = {"items": op[1], "total": op[2], "tag": op[3]}
        reply = ChatMessage.from_assistant(tool_calls=[ToolCall("emit", arguments, id="e")])
        invoker.run(messages=[reply], state=state)
        model.set("items", op[1])
        model.set("total", op[2])
        model.set("tags", op[3])
    elif kind == "edit":
        arguments = {"name": op[1], "amount": op[2], "reset_tags": op[3], "fail": op[4]}
        reply = ChatMessage.from_assistant(tool_calls=[ToolCall("edit", arguments, id="w")])
        [message] = invoker.run(messages=[reply], state=state)["tool_messages"]
        assert message.tool_call_result is not None
        assert message.tool_call_result.error is op[4]
        if not op[4]:  # a failed call merges nothing, not even what it wrote through the State
            model.set("name", op[1])
            model.set("total", op[2])
            if op[3]:
                model.reset("tags")


def _commit(cp: Checkpointer, state: State, step: int) -> None:
    STATS["checkpoints"] += 1
    head = cp.head("t")
    cp.commit("t", parent_id=head, expected_head=head, delta=state.drain_changes(), step=step, source="update")


def _check_sequence(cp: Checkpointer, ops: list[tuple[Any, ...]]) -> None:
    STATS["sequences"] += 1
    state, model = State(SCHEMA), Model()
    invoker = ToolInvoker(tools=[emit, edit], raise_on_failure=False)
    assert state.data == model.values
    for step, op in enumerate(ops):
        if op[0] == "checkpoint":
            _commit(cp, state, step)
            assert cp.get("t").values == model.values
            continue
        _apply(state, model, invoker, op)
        assert state.data == model.values, op
    _commit(cp, state, len(ops))
    assert cp.get("t").values == model.values
    assert State.from_dict(state.to_dict()).data == model.values


@PROPERTY_SETTINGS
@given(ops=operations)
def test_random_writes_resets_and_tool_calls_match_the_reference_model(ops: list[tuple[Any, ...]]) -> None:
    with InMemoryCheckpointer() as cp:
        _check_sequence(cp, ops)


@settings(PROPERTY_SETTINGS, max_examples=30)
@given(ops=operations)
def test_the_sequences_checkpointed_to_sqlite_read_back_equal(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as folder, SQLiteCheckpointer(Path(folder) / "p.sqlite") as cp:
        _check_sequence(cp, ops)
        with SQLiteCheckpointer(Path(folder) / "p.sqlite", cache_size=0) as fresh:  # read from the file, not a cache
            assert fresh.get("t").values == cp.get("t").values


# --- 2. parallel tool calls equal sequential ones -----------------------------------------------------------------

BATCH_SCHEMA: dict[str, Any] = {
    "log": {"type": list[int]},
    "total": {"type": int, "handler": add, "default": 0},
    "seen": {"type": list[int]},
}


def _pause(sleep_us: int) -> None:
    time.sleep(sleep_us / 1_000_000)


@tool(outputs_to_state={"log": {"source": "x"}})
def append(x: int, sleep_us: int) -> dict[str, int]:
    """Append x to the log."""
    _pause(sleep_us)
    return {"x": x}


@tool(outputs_to_state={"total": {"source": "n"}})
def bump(x: int, sleep_us: int) -> dict[str, int]:
    """Add x to the total."""
    _pause(sleep_us)
    return {"n": x}


@tool(inputs_from_state={"total": "total"}, outputs_to_state={"seen": {"source": "total"}})
def read_total(x: int, sleep_us: int, total: int) -> dict[str, int]:
    """Record the total as this call sees it."""
    _pause(sleep_us)
    return {"total": total}


@tool
def via_state(x: int, sleep_us: int, state: State) -> str:
    """Write through the State; fail (after writing) for multiples of 5."""
    state.set("log", x)
    state.set("total", 1)
    seen = state.get("total")
    _pause(sleep_us)
    if x % 5 == 0:
        raise ValueError(f"{x} is a multiple of 5")
    return f"total={seen} log={len(state.get('log') or [])}"


@tool(outputs_to_state={"log": {"source": "x"}, "total": {"source": "n"}})
def both(x: int, sleep_us: int) -> dict[str, Any]:
    """Append x and add 1; for multiples of 7 the amount is not a number, so the call merges nothing."""
    _pause(sleep_us)
    return {"x": x, "n": "seven" if x % 7 == 0 else 1}


BATCH_TOOLS = [append, bump, read_total, via_state, both]
calls = st.lists(
    st.tuples(st.sampled_from([t.name for t in BATCH_TOOLS]), st.integers(0, 40), st.integers(0, 1500)),
    min_size=1,
    max_size=8,
)


def _reply(batch: list[tuple[str, int, int]]) -> ChatMessage:
    tool_calls = [
        ToolCall(name, {"x": x, "sleep_us": sleep_us}, id=f"c{i}") for i, (name, x, sleep_us) in enumerate(batch)
    ]
    return ChatMessage.from_assistant(tool_calls=tool_calls)


def _outcome(messages: list[ChatMessage], state: State) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    results = []
    for message in messages:
        result = message.tool_call_result
        assert result is not None
        results.append((result.origin.id, result.result, result.error))
    return results, state.data


@PROPERTY_SETTINGS
@given(batch=calls, workers=st.integers(2, 6), initial=st.integers(0, 5))
def test_parallel_tool_calls_equal_sequential_execution(
    batch: list[tuple[str, int, int]], workers: int, initial: int
) -> None:
    STATS["batches"] += 1
    STATS["calls"] += len(batch)
    reply = _reply(batch)
    sequential_state = State(BATCH_SCHEMA, {"total": initial})
    one_at_a_time = ToolInvoker(tools=BATCH_TOOLS, raise_on_failure=False, max_workers=1)
    sequential_messages = []
    for call in reply.tool_calls:
        single = ChatMessage.from_assistant(tool_calls=[call])
        sequential_messages += one_at_a_time.run(messages=[single], state=sequential_state)["tool_messages"]
    expected = _outcome(sequential_messages, sequential_state)
    STATS["failed calls"] += sum(error for _, _, error in expected[0])

    parallel = ToolInvoker(tools=BATCH_TOOLS, raise_on_failure=False, max_workers=workers)
    state = State(BATCH_SCHEMA, {"total": initial})
    assert _outcome(parallel.run(messages=[reply], state=state)["tool_messages"], state) == expected

    state = State(BATCH_SCHEMA, {"total": initial})
    messages = asyncio.run(parallel.run_async(messages=[reply], state=state))["tool_messages"]
    assert _outcome(messages, state) == expected
