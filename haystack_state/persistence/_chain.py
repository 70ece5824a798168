"""
Pure helpers for reading a checkpoint's state from its chain of stored rows: parsing and checking the rows, folding
their deltas (from the nearest snapshot, or the root), and deciding when a commit stores a snapshot.

A checkpoint's chain is the walk from it back to the nearest ancestor holding a *snapshot* (its full state, stored
beside its delta) or to the root. A commit stores a snapshot when the deltas since the last one add up to more bytes
than that snapshot (and than ``min_bytes``), so the chain a cold read replays is never longer, in bytes, than the state
it produces, while the bytes written per step stay flat on average (each snapshot is paid for by at least as many
bytes of deltas before it).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from haystack_state._text import repaired
from haystack_state.errors import CheckpointError, CheckpointNotFoundError, CodecError
from haystack_state.persistence.codec import encode, from_json, to_json
from haystack_state.persistence.delta import ExtendError, compose_deltas, validate_delta
from haystack_state.persistence.records import ChainLink
from haystack_state.values import FrozenList, FrozenListWithObjects

__all__ = [
    "check_chain",
    "compose_chain",
    "corrupt_error",
    "encoded_values",
    "needs_snapshot",
    "paused_gc",
    "state_json",
    "parse_delta",
    "parse_snapshot",
]


# A paused block that leaves more young objects than this behind hands them to the oldest generation (see paused_gc).
PROMOTE_AFTER = 20_000


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """
    Pause the cyclic garbage collector while a whole state is parsed, decoded or copied.

    Such a burst allocates objects by the hundred thousand, none of them garbage, and each allocation threshold it
    crosses makes the collector walk the young objects again (and, as the old generation grows, all of them): in a
    process holding a large heap, that was a third of a cold read. Reference counting still frees everything as
    usual.

    When the block leaves more than :data:`PROMOTE_AFTER` young objects behind, they go straight to the oldest
    generation (``gc.freeze()`` then ``gc.unfreeze()``, which moves lists, not objects) instead of being walked by the
    first young collection after the block and again when they are promoted: for the 20,000-step thread of
    ``bench_checkpoints``, those two walks were 0.33 s of a 1 s cold read. A cycle of garbage among them waits for the
    next full collection, as any old object's would. Skipped when the process keeps a frozen generation of its own
    (``gc.get_freeze_count()``), which ``unfreeze`` would release.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_count()[0] > PROMOTE_AFTER and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()


def corrupt_error(thread_id: str, checkpoint_id: str, error: Exception) -> CodecError:
    """
    Build the error for stored data that cannot be read.

    :param thread_id: The thread.
    :param checkpoint_id: The checkpoint whose stored data is at fault.
    :param error: What went wrong.
    """
    return CodecError(f"Thread '{thread_id}', checkpoint '{checkpoint_id}': stored data is unreadable: {error}")


def parse_delta(thread_id: str, checkpoint_id: str, text: str) -> dict[str, Any]:
    """
    Parse and check one stored delta (each row on its own: two broken rows never join into a valid one).

    :raises CodecError: Naming the thread and the checkpoint.
    """
    try:
        delta = from_json(text)
        validate_delta(delta)
    except ValueError as error:  # CodecError is a ValueError too
        raise corrupt_error(thread_id, checkpoint_id, error) from None
    return dict(repaired(delta, text, thread_id=thread_id, checkpoint_id=checkpoint_id, what="delta"))


def parse_snapshot(thread_id: str, checkpoint_id: str, text: str) -> dict[str, Any]:
    """
    Parse a stored snapshot: a JSON object from state keys to encoded values.

    :raises CodecError: Naming the thread and the checkpoint.
    """
    try:
        state = from_json(text)
    except CodecError as error:
        raise corrupt_error(thread_id, checkpoint_id, error) from None
    if type(state) is not dict or not all(isinstance(key, str) and key for key in state):
        raise corrupt_error(thread_id, checkpoint_id, CodecError("its snapshot is not a mapping of state keys"))
    return dict(repaired(state, text, thread_id=thread_id, checkpoint_id=checkpoint_id, what="snapshot"))


def check_chain(thread_id: str, checkpoint_id: str, stop_at: str | None, chain: Sequence[ChainLink]) -> None:
    """
    Check a chain as a backend read it: it ends at the checkpoint, starts at the root, at ``stop_at``'s child or at
    a snapshot, holds no cycle, and every link's parent is the link before it.

    :raises CheckpointNotFoundError: If the chain is empty (no such checkpoint).
    :raises CheckpointError: Naming the checkpoint whose parent link is broken or cyclic.
    """
    if not chain:
        raise CheckpointNotFoundError(thread_id, checkpoint_id)
    seen: set[str] = set()
    for link in chain:
        if link.checkpoint_id in seen:
            raise CheckpointError(
                f"Thread '{thread_id}', checkpoint '{link.checkpoint_id}': its chain of parents is a cycle "
                "(the stored parent links are corrupt)."
            )
        seen.add(link.checkpoint_id)
    first = chain[0]
    if chain[-1].checkpoint_id != checkpoint_id or (first.parent_id not in (None, stop_at) and first.snapshot is None):
        raise CheckpointError(
            f"Thread '{thread_id}', checkpoint '{checkpoint_id}': its chain of parents is broken at "
            f"'{first.checkpoint_id}' (its parent '{first.parent_id}' is missing)."
        )
    for parent, child in itertools.pairwise(chain):
        if child.parent_id != parent.checkpoint_id:
            raise CheckpointError(
                f"Thread '{thread_id}', checkpoint '{child.checkpoint_id}': its parent "
                f"'{child.parent_id}' is missing from the stored chain."
            )


def compose_chain(
    thread_id: str, chain: Sequence[ChainLink], *, from_snapshot: bool, extra: Mapping[str, Any] | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """
    Fold a chain's deltas into one (see :func:`~haystack_state.persistence.delta.compose_deltas`).

    :param thread_id: The thread.
    :param chain: The links, oldest first.
    :param from_snapshot: Start from the first link's snapshot (its delta is part of it) instead of its delta.
    :param extra: A further delta applied last (a commit's own, when writing its snapshot).
    :returns: The composed delta and the keys whose first operation is an ``extend`` (see ``compose_deltas``).
    :raises CodecError: For a corrupt row (naming its checkpoint).
    :raises ExtendError: If a delta extends a value that is not a list.
    """
    deltas: list[tuple[str, Mapping[str, Any]]] = []
    links = list(chain)
    if from_snapshot:
        first = links.pop(0)
        assert first.snapshot is not None
        state = parse_snapshot(thread_id, first.checkpoint_id, first.snapshot)
        deltas.append((first.checkpoint_id, {key: {"op": "replace", "value": value} for key, value in state.items()}))
    deltas.extend((link.checkpoint_id, parse_delta(thread_id, link.checkpoint_id, link.delta)) for link in links)
    if extra is not None:
        deltas.append(("", extra))
    return compose_deltas(deltas)


def encoded_values(composed: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """
    The state a composed delta produces from an empty state (encoded values, as stored).

    :param composed: A delta composed from the root or from a snapshot.
    :returns: key -> encoded value.
    """
    return {
        key: op["items"] if op["op"] == "extend" else op["value"]
        for key, op in composed.items()
        if op["op"] != "delete"
    }


def extend_error(thread_id: str, error: ExtendError, checkpoint_id: str) -> CheckpointError:
    """The error for an ``extend`` of a stored value that is not a list."""
    return CheckpointError(f"Thread '{thread_id}', checkpoint '{checkpoint_id}': {error}.")


_LISTS = frozenset({list, FrozenList, FrozenListWithObjects})

#: How many items of a list a snapshot encodes at once (one call of the encoder, one JSON text).
SNAPSHOT_CHUNK = 512


def state_json(values: Mapping[str, Any]) -> str:
    """
    A state's snapshot text, from its values (decoded, frozen or not): the JSON a snapshot composed from the stored
    rows gives, but built a slice of each list at a time, so that only the text is ever held whole (never the encoded
    data of the whole state, several times its size in Python objects).

    :param values: The state.
    :returns: The JSON text of ``{key: encoded value}``.
    :raises CodecError: If a value cannot be encoded.
    """
    parts = ["{"]
    for key, value in values.items():
        if len(parts) > 1:
            parts.append(",")
        parts.append(to_json(key))
        if type(value) in _LISTS:
            parts.append(":[")
            for start in range(0, len(value), SNAPSHOT_CHUNK):
                if start:
                    parts.append(",")
                chunk = to_json(encode(value[start : start + SNAPSHOT_CHUNK], key=key, compact=True))
                parts.append(chunk[1:-1])  # the items, without the chunk's brackets
            parts.append("]")
        else:
            parts.append(":")
            parts.append(to_json(encode(value, key=key, compact=True)))
    parts.append("}")
    return "".join(parts)  # joined once: the pieces and the text are the only copies


def needs_snapshot(chain_bytes: int, base_bytes: int, *, min_bytes: int, ratio: float) -> bool:
    """
    Whether a commit whose chain holds ``chain_bytes`` of deltas since the last snapshot (of ``base_bytes``) stores a
    snapshot: when the chain outweighs ``ratio`` times that snapshot and ``min_bytes``.

    :param chain_bytes: The bytes of the deltas since the nearest snapshot (or the root), the commit's included.
    :param base_bytes: The size of that snapshot (0 if none).
    :param min_bytes: The smallest chain worth a snapshot.
    :param ratio: How many times the last snapshot's size the chain may reach.
    """
    return chain_bytes >= max(min_bytes, ratio * base_bytes)
