"""
The head cache: decoded, frozen states that reads share (``read_only=True``) or copy (the default), kept in step by
commits; warm reads must equal cold ones, and nothing a caller holds may reach into the cache.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from typing import TYPE_CHECKING, Any, NamedTuple

import pydantic
import pytest
from haystack.dataclasses import ChatMessage, Document, ToolCall

from haystack_state.errors import CheckpointError
from haystack_state.persistence import Checkpointer, delete, extend, register_type, replace
from haystack_state.persistence._cache import MAX_TAIL, freeze_owned, fresh_copy
from haystack_state.persistence.codec import decode, encode
from haystack_state.persistence.delta import materialize
from haystack_state.persistence.ops import ReadChain, ReadMeta
from haystack_state.values import FrozenDict, FrozenList, freeze, thaw

if TYPE_CHECKING:
    from persistence.harness import Harness

from persistence.test_checkpointers import commit_all, new_thread


@register_type(name="test_cache.Point")
@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    tags: list[str]


@register_type(name="test_cache.Pair")
class Pair(NamedTuple):
    left: list[int]
    right: str


@register_type(name="test_cache.Profile")
class Profile(pydantic.BaseModel):
    name: str
    scores: list[int]


@register_type(name="test_cache.Color")
class Color(enum.Enum):
    RED = "red"


def message(i: int) -> ChatMessage:
    call = ToolCall(tool_name="search", arguments={"query": f"q{i}", "filters": {"page": i}}, id=f"c{i}")
    return ChatMessage.from_assistant(tool_calls=[call], meta={"usage": {"total_tokens": i}})


def rich_values() -> dict[str, Any]:
    """One value of every kind the codec stores, nested where it can be."""
    return {
        "messages": [message(0), ChatMessage.from_tool("result", origin=message(0).tool_calls[0])],
        "doc": Document(content="d", meta={"k": [1, 2], "when": dt.date(2024, 1, 2)}, embedding=[0.5, 1.5]),
        "point": Point(1, ["a"]),
        "pair": Pair([1, 2], "r"),
        "profile": Profile(name="p", scores=[1]),
        "color": Color.RED,
        "numbers": (1, 2.5, decimal.Decimal("1.10"), float("inf")),
        "sets": {"s": {1, 2}, "f": frozenset({"x"})},
        "blobs": [b"\x00\x01", bytearray(b"ab")],
        "keys": {1: "int key", (1, 2): "tuple key"},
        "ids": [uuid.UUID(int=7), dt.datetime(2024, 1, 2, 3, 4, tzinfo=dt.UTC), dt.timedelta(seconds=3)],
        "plain": {"a": [{"b": None, "c": True}]},
    }


def shape(value: Any) -> Any:
    """The value's structure: every container, object and scalar replaced by its type, recursively."""
    if isinstance(value, dict):
        return (type(value).__name__, sorted((repr(k), shape(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, [shape(v) for v in value])
    if isinstance(value, set | frozenset):
        return (type(value).__name__, sorted(repr(v) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, [(f.name, shape(getattr(value, f.name))) for f in dataclasses.fields(value)])
    return type(value).__name__


def mutable_parts(value: Any, found: dict[int, Any] | None = None) -> dict[int, Any]:
    """Every mutable object reachable from ``value`` (containers, dataclass and other instances), by id."""
    found = {} if found is None else found
    if isinstance(value, str | bytes | int | float | bool | enum.Enum | dt.date | dt.timedelta | type(None)):
        return found
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return found
    if not isinstance(value, tuple | frozenset):
        found[id(value)] = value
    if isinstance(value, dict):
        for key, item in value.items():
            mutable_parts(key, found)
            mutable_parts(item, found)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            mutable_parts(item, found)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            mutable_parts(getattr(value, f.name), found)
    elif isinstance(value, pydantic.BaseModel):
        for item in value.__dict__.values():
            mutable_parts(item, found)
    return found


# --- what reads hand out -------------------------------------------------------------------------------------------


def test_read_only_values_are_frozen_shared_and_equal_to_copies(checkpointer: Checkpointer) -> None:
    thread = new_thread()
    commit_all(checkpointer, thread, [{"log": extend([{"n": 1}]), "meta": replace({"a": [1]})}, {"log": extend([2])}])
    shared = checkpointer.get(thread, read_only=True).values
    assert shared == checkpointer.get(thread).values == {"log": [{"n": 1}, 2], "meta": {"a": [1]}}
    assert isinstance(shared["log"], FrozenList) and isinstance(shared["meta"], FrozenDict)
    with pytest.raises(TypeError, match="read-only"):
        shared["log"].append(3)
    with pytest.raises(TypeError, match="read-only"):
        shared["log"][0]["n"] = 99
    with pytest.raises(TypeError, match="read-only"):
        shared["meta"]["a"].append(2)
    shared["new"] = "the top-level dict is the caller's own"
    again = checkpointer.get(thread, read_only=True).values
    assert again == {"log": [{"n": 1}, 2], "meta": {"a": [1]}}
    assert again["log"] is shared["log"]  # nothing copied


def test_copies_of_cached_values_share_nothing_with_the_cache(checkpointer: Checkpointer) -> None:
    thread = new_thread()
    values = rich_values()
    commit_all(checkpointer, thread, [{key: replace(value)} for key, value in values.items()])
    cached = checkpointer.get(thread, read_only=True).values
    copy = checkpointer.get(thread).values
    assert copy == cached == values
    assert shape(copy) == shape(values)
    shared = set(mutable_parts(copy)) & set(mutable_parts(cached))
    assert not shared, [type(mutable_parts(copy)[i]).__name__ for i in shared]

    # Change everything that can be changed in place; the next reads do not see it.
    copy["messages"][0].meta["usage"]["total_tokens"] = 99
    copy["messages"][0].tool_calls[0].arguments["filters"]["page"] = 99
    copy["doc"].meta["k"].append(3)
    object.__setattr__(copy["doc"], "content", "changed")  # haystack warns on plain attribute assignment
    copy["point"].tags.append("b")
    copy["pair"].left.append(3)
    copy["profile"].scores.append(2)
    copy["sets"]["s"].add(3)
    copy["blobs"][1].extend(b"cd")
    copy["plain"]["a"][0]["b"] = "changed"
    assert checkpointer.get(thread).values == values
    assert checkpointer.get(thread, read_only=True).values == values


def test_committed_objects_are_not_captured_by_the_cache(checkpointer: Checkpointer) -> None:
    thread = new_thread()
    item = {"n": [1]}
    doc = Document(content="d", meta={"k": [1]})
    commit_all(checkpointer, thread, [{"log": extend([item]), "doc": replace(doc)}])
    item["n"].append(2)
    doc.meta["k"].append(2)
    assert checkpointer.get(thread, read_only=True).values == {
        "log": [{"n": [1]}],
        "doc": Document(content="d", meta={"k": [1]}),
    }


# --- warm reads equal cold ones -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_warm_reads_equal_cold_reads_value_for_value(backend: Harness) -> None:
    cp, thread = backend.make(), new_thread()
    values = rich_values()
    deltas: list[dict[str, Any]] = [{key: replace(value)} for key, value in values.items()]
    deltas += [
        {"messages": extend([message(i)]), "counter": replace(i), "doc": delete() if i == 3 else extend([i])}
        if i >= 3
        else {"messages": extend([message(i)]), "counter": replace(i)}
        for i in range(1, 2 * MAX_TAIL + 5)  # folds the cached tail more than once
    ]
    deltas[-1] = {"messages": extend([message(-1)]), "sets": delete(), "blobs": extend([b"\xff"])}
    commit_all(cp, thread, deltas)
    expected = materialize(deltas)
    warm, shared = cp.get(thread).values, cp.get(thread, read_only=True).values
    assert warm == shared == expected
    assert shape(warm) == shape(expected)
    assert shape(thaw(shared)) == shape(expected)
    cold = backend.make(cache_size=0) if backend.persistent else None
    if cold is not None:
        assert cold.get(thread).values == warm and shape(cold.get(thread).values) == shape(warm)
        fresh = backend.make()
        assert fresh.get(thread, read_only=True).values == warm  # a cold read straight into the cache
        assert fresh.get(thread).values == warm and shape(fresh.get(thread).values) == shape(warm)


@pytest.mark.slow
def test_the_head_is_read_from_the_cache_after_many_commits(backend: Harness) -> None:
    cp = backend.make()
    fetched: list[int] = []
    execute = cp._execute

    def counting(op: Any) -> Any:
        result = execute(op)
        if isinstance(op, ReadChain):
            fetched.append(len(result))
        return result

    cp._execute = counting  # type: ignore[method-assign]
    thread = new_thread()
    count = 3 * MAX_TAIL + 7
    commit_all(cp, thread, [{"log": extend([i]), "last": replace(i)} for i in range(count)])
    assert cp.get(thread, read_only=True).values == {"log": list(range(count)), "last": count - 1}
    commit_all(cp, thread, [{"log": extend(["x"])}])
    assert cp.get(thread).values == {"log": [*range(count), "x"], "last": count - 1}
    assert fetched == []


@pytest.mark.slow
@pytest.mark.parametrize("cache_size", [0, 2])
def test_commits_read_no_parent_record_with_more_threads_than_cached(backend: Harness, cache_size: int) -> None:
    # A server runs more threads at once than its cache keeps states for: their commits still decide on snapshots
    # without reading the parent's record first, and store them at the same commits a large cache would.
    small, large = backend.make(cache_size=cache_size, snapshot_min_bytes=300), backend.make(snapshot_min_bytes=300)
    parent_reads: list[Any] = []
    execute = small._execute

    def counting(op: Any) -> Any:
        if isinstance(op, ReadMeta):
            parent_reads.append(op)
        return execute(op)

    small._execute = counting  # type: ignore[method-assign]
    threads = {cp: [new_thread() for _ in range(5)] for cp in (small, large)}
    heads: dict[str, str | None] = {thread: None for ids in threads.values() for thread in ids}
    for step in range(12):
        for index in range(5):
            for cp in (small, large):
                thread = threads[cp][index]
                delta = {"log": extend([f"{step}-{'x' * 40}"] * 3)}
                head = heads[thread]
                heads[thread] = cp.commit(
                    thread, parent_id=head, expected_head=head, delta=delta, step=step, source="update"
                ).checkpoint_id
    assert parent_reads == []
    for index in range(5):
        chains = [cp._execute(ReadChain(threads[cp][index], heads[threads[cp][index]], None)) for cp in (small, large)]
        assert len(chains[0]) == len(chains[1]) < 12  # snapshots were stored, at the same commits
        assert [link.snapshot is not None for link in chains[0]] == [link.snapshot is not None for link in chains[1]]
        expected = [f"{step}-{'x' * 40}" for step in range(12) for _ in range(3)]
        assert small.get(threads[small][index]).values == large.get(threads[large][index]).values == {"log": expected}


@pytest.mark.parametrize("read_first", [True, False])
def test_an_extend_of_a_non_list_names_its_checkpoint_with_the_cache_on(backend: Harness, read_first: bool) -> None:
    cp, thread = backend.make(), new_thread()
    (first,) = commit_all(cp, thread, [{"x": replace(1), "log": extend([0])}])
    if read_first:
        cp.get(thread)
    # The extend of x fails against the state before it, even though a later replace hides it in a composed delta.
    later = commit_all(cp, thread, [{"log": extend([1])}, {"x": extend([2])}, {"x": replace(5)}])
    for read_only in (True, False):
        with pytest.raises(CheckpointError, match=f"checkpoint '{later[1].checkpoint_id}'.*'x'"):
            cp.get(thread, read_only=read_only)
    assert cp.get(thread, first.checkpoint_id).values == {"x": 1, "log": [0]}
    assert cp.get(thread, later[0].checkpoint_id).values == {"x": 1, "log": [0, 1]}


# --- the helpers ----------------------------------------------------------------------------------------------------


def test_fresh_copy_is_equal_and_shares_nothing_mutable() -> None:
    values = rich_values()
    for source in (values, freeze(values), {key: decode(encode(value)) for key, value in values.items()}):
        copy = fresh_copy(source)
        assert copy == values
        assert shape(copy) == shape(values)
        assert not set(mutable_parts(copy)) & set(mutable_parts(source))


@dataclasses.dataclass
class Tagged:
    tags: list[str]
    label: str = "class default"


def test_fresh_copy_of_a_dataclass_missing_a_field_in_its_dict_reads_as_the_source_does() -> None:
    item = Tagged(["a"], "own")
    del item.label  # the field now reads from the class, as a source built by hand or unpickled may
    copy = fresh_copy(freeze(item))
    assert copy == Tagged(["a"])
    assert copy.label == "class default" and "label" not in vars(copy)
    assert type(copy.tags) is list and copy.tags is not item.tags
    whole = fresh_copy(Tagged(["b"], "own"))
    assert whole == Tagged(["b"], "own") and type(whole.tags) is list


def test_freeze_owned_gives_the_shape_freeze_gives() -> None:
    for value in rich_values().values():
        decoded = decode(encode(value))
        frozen = freeze(decode(encode(value)))
        owned = freeze_owned(decoded)
        assert owned == frozen == value
        assert shape(owned) == shape(frozen)
        assert getattr(owned, "has_objects", None) == getattr(frozen, "has_objects", None)
    decoded = decode(encode([message(1)]))
    assert freeze_owned(decoded)[0] is decoded[0]  # frozen in place, not copied
