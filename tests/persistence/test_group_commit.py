"""Concurrent async commits in one event loop (grouped into shared transactions on PostgreSQL) each behave alone."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import pytest

from haystack_state.errors import ThreadBusyError, ThreadConflictError
from haystack_state.persistence import extend

if TYPE_CHECKING:
    from haystack_state.persistence import Checkpointer, CheckpointMeta, Lease
    from persistence.harness import Harness


def _thread() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def _root(cp: Checkpointer, thread_id: str) -> CheckpointMeta:
    """A new thread's first checkpoint, ``xs == [0]``."""
    return cp.commit(thread_id, parent_id=None, expected_head=None, delta={"xs": extend([0])}, step=0, source="input")


def _append(
    cp: Checkpointer, thread_id: str, head: CheckpointMeta, value: int, step: int = 1, lease: Lease | None = None
) -> Coroutine[Any, Any, CheckpointMeta]:
    """An async commit after ``head`` (the head the caller expects) that appends ``value`` to ``xs``."""
    return cp.acommit(
        thread_id,
        parent_id=head.checkpoint_id,
        expected_head=head.checkpoint_id,
        delta={"xs": extend([value])},
        step=step,
        source="tools",
        lease=lease,
    )


@pytest.mark.slow
def test_many_concurrent_async_commits_all_apply_in_order(backend: Harness) -> None:
    threads = [_thread() for _ in range(30)]

    async def run(thread_id: str) -> list[str]:
        head = None
        ids = []
        for step in range(6):
            meta = await cp.acommit(
                thread_id, parent_id=head, expected_head=head, delta={"xs": extend([step])}, step=step, source="tools"
            )
            head = meta.checkpoint_id
            ids.append(head)
        return ids

    async def main() -> list[list[str]]:
        return await asyncio.gather(*(run(thread_id) for thread_id in threads))

    cp = backend.make()
    written = asyncio.run(main())
    with backend.make(cache_size=0) if backend.persistent else cp as fresh:
        for thread_id, ids in zip(threads, written, strict=True):
            assert fresh.get(thread_id).values == {"xs": [0, 1, 2, 3, 4, 5]}
            assert [meta.checkpoint_id for meta in fresh.history(thread_id)] == ids[::-1]


def test_a_stale_or_leased_commit_in_a_group_fails_alone(backend: Harness) -> None:
    thread, held = _thread(), _thread()
    cp = backend.make()
    root, other = _root(cp, thread), _root(cp, held)
    lease = cp.acquire_lease(held, owner="someone-else", ttl=60)
    mine = cp.acquire_lease(thread, owner="me", ttl=60)

    async def main() -> list[object]:
        commits = [_append(cp, thread, root, i, lease=mine) for i in (1, 2)]
        commits.append(_append(cp, held, other, 9, lease=mine))
        return await asyncio.gather(*commits, return_exceptions=True)

    results = asyncio.run(main())
    assert lease.owner == "someone-else"
    winners = [r for r in results[:2] if not isinstance(r, BaseException)]
    losers = [r for r in results[:2] if isinstance(r, BaseException)]
    assert len(winners) == 1 and len(losers) == 1 and isinstance(losers[0], ThreadConflictError)
    assert isinstance(results[2], ThreadBusyError)
    with backend.make(cache_size=0) if backend.persistent else cp as fresh:
        assert fresh.get(thread).values["xs"][0] == 0 and len(fresh.get(thread).values["xs"]) == 2
        assert fresh.get(held).values == {"xs": [0]}
        assert len(fresh.history(held)) == 1


@pytest.mark.parametrize("size", [1, 3])
def test_group_commit_batches_respect_their_limit(backend: Harness, size: int) -> None:
    if backend.name != "postgres":
        pytest.skip("the group commit is PostgreSQL's")
    threads = [_thread() for _ in range(10)]
    with backend.make() as cp:

        async def main() -> None:
            cp._async_connections().appends.limit = size  # type: ignore[attr-defined]
            roots = [
                await cp.acommit(
                    t, parent_id=None, expected_head=None, delta={"xs": extend([0])}, step=0, source="input"
                )
                for t in threads
            ]
            await asyncio.gather(*(_append(cp, t, r, 1) for t, r in zip(threads, roots, strict=True)))

        asyncio.run(main())
    with backend.make(cache_size=0) as fresh:
        assert all(fresh.get(t).values == {"xs": [0, 1]} for t in threads)


def test_a_commit_the_database_refuses_fails_alone_and_its_batch_still_applies(backend: Harness) -> None:
    from haystack_state.errors import CheckpointStorageError

    if not backend.persistent:
        pytest.skip("memory stores any int")
    threads = [_thread() for _ in range(6)]
    cp = backend.make()
    roots = [_root(cp, t) for t in threads]

    async def main() -> list[object]:
        return await asyncio.gather(
            *(
                _append(cp, t, r, 1, step=2**70 if index == 2 else 1)  # beyond a 64-bit integer column
                for index, (t, r) in enumerate(zip(threads, roots, strict=True))
            ),
            return_exceptions=True,
        )

    results = asyncio.run(main())
    assert isinstance(results[2], CheckpointStorageError)
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 2)
    with backend.make(cache_size=0) as fresh:
        for index, t in enumerate(threads):
            assert fresh.get(t).values == {"xs": [0] if index == 2 else [0, 1]}


def test_a_closed_loops_connections_are_closed_when_a_new_loop_takes_its_id(backend: Harness) -> None:
    """
    Each ``asyncio.run`` is a new loop, which may get the id (the address) of a closed one: the checkpointer then
    closes the closed loop's connections rather than dropping them open (a ``ResourceWarning`` at some later garbage
    collection). The reuse of an id is up to the allocator, so the test gives the new loop's entry a closed loop.
    """
    if backend.name != "postgres":
        pytest.skip("only the PostgreSQL checkpointer keeps connections per event loop")
    import weakref

    thread = _thread()
    cp = backend.make()
    head = _root(cp, thread)
    closed = asyncio.new_event_loop()
    closed.close()

    async def main() -> None:
        first = cp._async_connections()
        conn = await first.get()
        first.put(conn)
        first.loop = weakref.ref(closed)  # what a closed loop's entry under this loop's id looks like
        assert cp._async_connections() is not first
        assert conn.closed  # closed, not dropped open
        await _append(cp, thread, head, 1)

    asyncio.run(main())
    assert cp.get(thread).values == {"xs": [0, 1]}


def test_new_threads_first_commits_in_one_group_each_apply_or_fail_alone(backend: Harness) -> None:
    """
    First commits of new threads go with the other commits of the loop (on PostgreSQL, in the same batch): each new
    thread is created once, and a creator that loses a race, meets an existing thread or another owner's lease fails
    on its own.
    """
    fresh_threads = [_thread() for _ in range(6)]
    raced, existing, held, appended = _thread(), _thread(), _thread(), _thread()
    cp = backend.make()
    old, root = _root(cp, existing), _root(cp, appended)
    cp.acquire_lease(held, owner="someone-else", ttl=60)
    mine = cp.acquire_lease(fresh_threads[0], owner="me", ttl=60)

    def create(thread_id: str, value: int, lease: object = None) -> object:
        return cp.acommit(
            thread_id,
            parent_id=None,
            expected_head=None,
            delta={"xs": extend([value])},
            step=0,
            source="input",
            lease=lease,  # type: ignore[arg-type]
        )

    async def main() -> list[object]:
        commits = [create(t, i, mine if i == 0 else None) for i, t in enumerate(fresh_threads)]
        commits += [create(raced, 1), create(raced, 2), create(existing, 9)]
        commits.append(create(held, 9, cp.acquire_lease(_thread(), owner="me", ttl=60)))
        commits.append(_append(cp, appended, root, 1))
        return await asyncio.gather(*commits, return_exceptions=True)

    results = asyncio.run(main())
    assert all(not isinstance(r, BaseException) for r in results[:6]), results[:6]
    race = results[6:8]
    assert sum(isinstance(r, ThreadConflictError) for r in race) == 1, race
    assert isinstance(results[8], ThreadConflictError) and old.checkpoint_id in str(results[8])
    assert isinstance(results[9], ThreadBusyError) and "someone-else" in str(results[9])
    assert not isinstance(results[10], BaseException)
    with backend.make(cache_size=0) if backend.persistent else cp as fresh:
        for index, thread_id in enumerate(fresh_threads):
            assert fresh.get(thread_id).values == {"xs": [index]}
            assert len(fresh.history(thread_id)) == 1
        won = 1 if not isinstance(race[0], BaseException) else 2
        assert fresh.get(raced).values == {"xs": [won]} and len(fresh.history(raced)) == 1
        assert fresh.get(existing).values == {"xs": [0]} and len(fresh.history(existing)) == 1
        assert fresh.head(held) is None
        assert fresh.get(appended).values == {"xs": [0, 1]}


def test_concurrent_lease_releases_each_report_whether_they_held_it(backend: Harness) -> None:
    threads = [_thread() for _ in range(8)]
    cp = backend.make()
    leases = [cp.acquire_lease(t, owner=f"owner-{i}", ttl=60) for i, t in enumerate(threads)]
    other = cp.acquire_lease(_thread(), owner="someone-else", ttl=60)
    batches: list[int] = []
    if backend.name == "postgres":  # record the batches the releases went in (the real statement still runs)
        write = cp._release_batch  # type: ignore[attr-defined]

        async def recording(connections: object, batch: list[object]) -> list[object]:
            batches.append(len(batch))
            return await write(connections, batch)  # type: ignore[no-any-return]

        cp._release_batch = recording  # type: ignore[attr-defined]
    not_mine = dataclasses.replace(other, owner="me")

    async def main() -> list[bool]:
        return await asyncio.gather(*(cp.arelease_lease(lease) for lease in [*leases, not_mine, leases[0]]))

    results = asyncio.run(main())
    # Each lease is released once: the same release twice in one batch reports it held once.
    assert results[:8].count(True) + results[9:].count(True) == 8 and results[8] is False
    assert all(cp.read_lease(t) is None for t in threads)
    assert cp.read_lease(other.thread_id) == other
    if backend.name == "postgres":
        assert sum(batches) == 10 and len(batches) < 10, batches
