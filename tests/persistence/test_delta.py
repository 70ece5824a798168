"""The pure helpers under every checkpointer: delta operations, materialization and checkpoint ids."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from haystack_state.errors import CodecError
from haystack_state.persistence.delta import (
    apply_delta,
    delete,
    encode_delta,
    extend,
    materialize,
    new_checkpoint_id,
    replace,
    validate_delta,
)


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
