"""The pure helpers under every checkpointer: delta operations, materialization and checkpoint ids."""

from __future__ import annotations

import gc
import sysconfig
import threading
import uuid
import weakref
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_state.errors import CodecError
from haystack_state.persistence._chain import PROMOTE_AFTER, SNAPSHOT_CHUNK, paused_gc, state_json
from haystack_state.persistence.codec import encode, from_json, to_json
from haystack_state.persistence.delta import (
    ExtendError,
    apply_delta,
    check_extends,
    compose_deltas,
    delete,
    encode_delta,
    extend,
    materialize,
    new_checkpoint_id,
    replace,
    validate_delta,
)
from haystack_state.values import freeze


def test_apply_delta_returns_a_new_state_and_leaves_the_old_one_alone() -> None:
    before = {"log": [1], "name": "a", "gone": True}
    after = apply_delta(before, {"log": extend([2]), "name": replace("b"), "gone": delete(), "new": extend([0])})
    assert after == {"log": [1, 2], "name": "b", "new": [0]}
    assert before == {"log": [1], "name": "a", "gone": True}


def test_materialize_applies_in_order() -> None:
    deltas = [{"x": extend([1])}, {"x": delete()}, {"x": extend([2])}, {"y": replace(None)}]
    assert materialize(deltas) == {"x": [2], "y": None}
    assert materialize(deltas[2:], base={"x": [0]}) == {"x": [0, 2], "y": None}
    with pytest.raises(ValueError, match="not a list"):
        materialize([{"x": replace(1)}, {"x": extend([2])}])


_KEYS = st.sampled_from(["a", "b", "c"])
_OPS = st.one_of(
    st.builds(extend, st.lists(st.integers(0, 9), max_size=3)),
    st.builds(replace, st.one_of(st.integers(0, 9), st.lists(st.integers(0, 9), max_size=3))),
    st.just(delete()),
)
_DELTAS = st.lists(st.dictionaries(_KEYS, _OPS, max_size=3), max_size=8)
_BASES = st.dictionaries(_KEYS, st.one_of(st.integers(0, 9), st.lists(st.integers(0, 9), max_size=3)), max_size=3)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(_DELTAS, _BASES)
def test_composed_deltas_act_like_the_deltas_one_by_one(deltas: list[dict[str, Any]], base: dict[str, Any]) -> None:
    try:
        expected = materialize(deltas, base)
    except ExtendError:
        with pytest.raises(ExtendError):
            composed, origins = compose_deltas(enumerate_ids(deltas))
            check_extends(base, origins)
            apply_delta(base, composed)
    else:
        composed, origins = compose_deltas(enumerate_ids(deltas))
        check_extends(base, origins)
        assert apply_delta(base, composed) == expected
        assert {key for key, op in composed.items() if op["op"] == "extend"} <= set(origins)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(_DELTAS)
def test_composing_from_an_empty_state_blames_the_first_broken_extend(deltas: list[dict[str, Any]]) -> None:
    culprit = None
    for index, delta in enumerate(deltas):
        try:
            materialize([delta], materialize(deltas[:index]))
        except ExtendError:
            culprit = f"cp{index}"
            break
    if culprit is None:
        assert apply_delta({}, compose_deltas(enumerate_ids(deltas))[0]) == materialize(deltas)
    else:
        with pytest.raises(ExtendError) as raised:
            compose_deltas(enumerate_ids(deltas))
        assert raised.value.checkpoint_id == culprit


def enumerate_ids(deltas: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"cp{index}", delta) for index, delta in enumerate(deltas)]


def test_compose_deltas_leaves_its_input_alone() -> None:
    first, second = {"x": replace([1])}, {"x": extend([2]), "y": extend([3])}
    third = {"y": extend([4])}
    composed, origins = compose_deltas([("a", first), ("b", second), ("c", third)])
    assert composed == {"x": replace([1, 2]), "y": extend([3, 4])} and origins == {"y": "b"}
    check_extends({"x": "not a list", "y": [0]}, origins)
    with pytest.raises(ExtendError, match="'y'") as raised:
        check_extends({"y": 0}, origins)
    assert raised.value.checkpoint_id == "b"
    assert (
        first == {"x": replace([1])} and second == {"x": extend([2]), "y": extend([3])} and third == {"y": extend([4])}
    )
    with pytest.raises(ExtendError, match="cannot extend state key 'x': its value is a int") as raised:
        compose_deltas([("a", {"x": replace(1)}), ("b", {"x": extend([2])})])
    assert raised.value.checkpoint_id == "b"


@pytest.mark.parametrize(
    "delta",
    [
        [("x", extend([1]))],
        {"": replace(1)},
        {1: replace(1)},
        {"x": {"op": "extend", "items": "abc"}},
        {"x": {"op": "extend"}},
        {"x": {"op": "replace", "value": 1, "extra": 2}},
        {"x": {"op": "append", "items": []}},
        {"x": "replace"},
    ],
)
def test_malformed_deltas_are_rejected(delta: Any) -> None:
    with pytest.raises(ValueError):
        validate_delta(delta)


def test_encode_delta_names_the_key_of_an_unencodable_value() -> None:
    assert encode_delta({"t": replace((1, 2)), "d": delete()}) == {
        "t": {"op": "replace", "value": {"__type__": "tuple", "data": [1, 2]}},
        "d": {"op": "delete"},
    }
    with pytest.raises(CodecError, match=r"State key 'items': cannot encode value of type object at items\[1\]"):
        encode_delta({"ok": extend([1]), "items": extend([1, object()])})


def test_checkpoint_ids_are_uuid7_and_strictly_increasing_across_threads() -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def make() -> None:
        made = [new_checkpoint_id() for _ in range(2000)]
        with lock:
            ids.extend(made)

    workers = [threading.Thread(target=make) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(set(ids)) == len(ids) == 8000
    assert all(uuid.UUID(i).version == 7 for i in ids[:50])
    sequential = [new_checkpoint_id() for _ in range(5000)]
    assert sequential == sorted(sequential)


@pytest.mark.parametrize("length", [0, 1, SNAPSHOT_CHUNK - 1, SNAPSHOT_CHUNK, SNAPSHOT_CHUNK + 1, 3 * SNAPSHOT_CHUNK])
def test_a_snapshot_text_built_a_slice_at_a_time_is_the_text_of_the_whole_state(length: int) -> None:
    messages = [ChatMessage.from_user(f"question {i} é") for i in range(length)]
    values = {"messages": freeze(messages), "log": list(range(length)), "name": "x", "empty": []}
    text = state_json(values)
    assert text == to_json({key: encode(value, key=key, compact=True) for key, value in values.items()})
    assert len(from_json(text)["messages"]) == length


@pytest.mark.slow
def test_a_large_paused_block_hands_what_it_built_to_the_old_generation_and_cycles_are_still_collected() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

    walks: list[dict[str, int]] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            walks.append(info)

    gc.collect()
    gc.callbacks.append(record)
    try:
        with paused_gc():
            assert not gc.isenabled()
            kept = [{"n": [i]} for i in range(PROMOTE_AFTER)]
            garbage = Node()
        assert gc.isenabled()
        assert walks == [], "the collector walked what the block built"
    finally:
        gc.callbacks.remove(record)
    old = {id(obj) for obj in gc.get_objects(generation=2)}
    assert id(kept) in old and id(kept[-1]) in old and id(kept[-1]["n"]) in old
    assert kept[-1] == {"n": [PROMOTE_AFTER - 1]}
    ref = weakref.ref(garbage)
    del garbage
    gc.collect()
    assert ref() is None, "a cycle built inside the block is never freed"


@pytest.mark.slow
def test_a_paused_block_leaves_the_processs_frozen_generation_alone() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with paused_gc():
            kept = [[i] for i in range(PROMOTE_AFTER * 2)]
        assert gc.isenabled()
        assert gc.get_freeze_count() == frozen, "the process's frozen objects were released"
        assert len(kept) == PROMOTE_AFTER * 2
    finally:
        gc.unfreeze()


@pytest.mark.slow
@pytest.mark.skipif(
    bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    reason="the free-threaded build's collector has no young generation to count",
)
def test_a_small_paused_block_leaves_its_objects_young() -> None:
    gc.collect()
    with paused_gc():
        kept = [[i] for i in range(100)]
    assert gc.isenabled()
    assert gc.get_count()[0] >= 100
    assert len(kept) == 100
