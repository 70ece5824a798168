"""Concurrent async commits in one event loop (grouped into shared transactions on PostgreSQL) each behave alone."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import pytest

from haystack_state.errors import ThreadBusyError, ThreadConflictError
from haystack_state.persistence import extend

if TYPE_CHECKING:
    from tests.persistence.conftest import Harness


def _thread() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


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
    root = cp.commit(thread, parent_id=None, expected_head=None, delta={"xs": extend([0])}, step=0, source="input")
    other = cp.commit(held, parent_id=None, expected_head=None, delta={"xs": extend([0])}, step=0, source="input")
    lease = cp.acquire_lease(held, owner="someone-else", ttl=60)
    mine = cp.acquire_lease(thread, owner="me", ttl=60)

    async def main() -> list[object]:
        commits = [
            cp.acommit(
                thread,
                parent_id=root.checkpoint_id,
                expected_head=root.checkpoint_id,
                delta={"xs": extend([i])},
                step=1,
                source="tools",
                lease=mine,
            )
            for i in (1, 2)
        ]
        commits.append(
            cp.acommit(
                held,
                parent_id=other.checkpoint_id,
                expected_head=other.checkpoint_id,
                delta={"xs": extend([9])},
                step=1,
                source="tools",
                lease=mine,
            )
        )
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
            await asyncio.gather(
                *(
                    cp.acommit(
                        t,
                        parent_id=r.checkpoint_id,
                        expected_head=r.checkpoint_id,
                        delta={"xs": extend([1])},
                        step=1,
                        source="tools",
                    )
                    for t, r in zip(threads, roots, strict=True)
                )
            )

        asyncio.run(main())
    with backend.make(cache_size=0) as fresh:
        assert all(fresh.get(t).values == {"xs": [0, 1]} for t in threads)


def test_a_commit_the_database_refuses_fails_alone_and_its_batch_still_applies(backend: Harness) -> None:
    from haystack_state.errors import CheckpointStorageError

    if not backend.persistent:
        pytest.skip("memory stores any int")
    threads = [_thread() for _ in range(6)]
    cp = backend.make()
    roots = [
        cp.commit(t, parent_id=None, expected_head=None, delta={"xs": extend([0])}, step=0, source="input")
        for t in threads
    ]

    async def main() -> list[object]:
        return await asyncio.gather(
            *(
                cp.acommit(
                    t,
                    parent_id=r.checkpoint_id,
                    expected_head=r.checkpoint_id,
                    delta={"xs": extend([1])},
                    step=2**70 if index == 2 else 1,  # beyond a 64-bit integer column
                    source="tools",
                )
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
    head = cp.commit(thread, parent_id=None, expected_head=None, delta={"xs": extend([0])}, step=0, source="input")
    closed = asyncio.new_event_loop()
    closed.close()

    async def main() -> None:
        first = cp._async_connections()
        conn = await first.get()
        first.put(conn)
        first.loop = weakref.ref(closed)  # what a closed loop's entry under this loop's id looks like
        assert cp._async_connections() is not first
        assert conn.closed  # closed, not dropped open
        await cp.acommit(
            thread,
            parent_id=head.checkpoint_id,
            expected_head=head.checkpoint_id,
            delta={"xs": extend([1])},
            step=1,
            source="tools",
        )

    asyncio.run(main())
    assert cp.get(thread).values == {"xs": [0, 1]}
