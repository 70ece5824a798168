"""
Reading a checkpoint's state: materializing it from the head cache, the nearest snapshot or the root, decoding what
survives, and keeping the cache in step with commits. A mixin of :class:`~haystack_state.persistence.base.Checkpointer`;
its methods are flows (see :mod:`haystack_state.persistence.ops`) that yield the reads they need.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from haystack_state._text import repaired
from haystack_state.errors import CodecError
from haystack_state.persistence import ops
from haystack_state.persistence._cache import HeadCache, merge_frozen
from haystack_state.persistence._chain import (
    check_chain,
    compose_chain,
    corrupt_error,
    encoded_values,
    extend_error,
    parse_delta,
    paused_gc,
)
from haystack_state.persistence.codec import decode, from_json
from haystack_state.persistence.delta import ExtendError, check_extends
from haystack_state.persistence.ops import Flow
from haystack_state.persistence.records import ChainLink, CheckpointMeta, StoredCheckpoint, shared_fields

__all__ = ["Materialized", "StateReader", "adopt_op", "decode_op_values"]


def decode_op_values(op: Mapping[str, Any], key: str, *, frozen: bool = False) -> dict[str, Any]:
    """
    Decode the values of a stored delta operation.

    :param frozen: Decode them read-only, as the head cache holds them (``extend`` items one by one, in a plain
        list; a ``replace`` value as a frozen value).
    """
    if op["op"] == "extend":
        items = op.get("items")
        if frozen and type(items) is list:
            return {"op": "extend", "items": [decode(item, key=key, frozen=True) for item in items]}
        return {"op": "extend", "items": decode(items, key=key, owned=True)}
    if op["op"] == "replace":
        return {"op": "replace", "value": decode(op.get("value"), key=key, frozen=frozen, owned=True)}
    return {"op": "delete"}


@dataclasses.dataclass(frozen=True)
class Materialized:
    """A materialized state: frozen (maybe shared with the cache), or freshly decoded and owned by no one."""

    frozen: dict[str, Any] | None
    plain: dict[str, Any] | None


def adopt_op(op: Mapping[str, Any]) -> dict[str, Any]:
    """A delta operation whose values are a State's read-only values, as the cache holds it (no copy of the values)."""
    if op["op"] == "extend":
        return {"op": "extend", "items": list(op["items"])}
    if op["op"] == "replace":
        return {"op": "replace", "value": op["value"]}
    return {"op": "delete"}


class StateReader:
    """The reading side of a checkpointer (its head cache, materializing and decoding states)."""

    _cache: HeadCache

    def _meta(self, row: StoredCheckpoint, metadata: dict[str, Any] | None = None) -> CheckpointMeta:
        """Build a row's record, decoding its metadata unless given (decoded already)."""
        if metadata is None:
            try:
                metadata = {} if row.metadata == "{}" else decode(self._stored_metadata(row), where="metadata")
            except CodecError as error:
                raise corrupt_error(row.thread_id, row.checkpoint_id, error) from None
            if not isinstance(metadata, dict):
                raise corrupt_error(row.thread_id, row.checkpoint_id, CodecError("metadata is not a mapping"))
        return CheckpointMeta(*shared_fields(row), metadata)

    @staticmethod
    def _stored_metadata(row: StoredCheckpoint) -> Any:
        """A row's metadata, parsed (text stored before lone surrogates were refused reads repaired)."""
        data = from_json(row.metadata)
        return repaired(data, row.metadata, thread_id=row.thread_id, checkpoint_id=row.checkpoint_id, what="metadata")

    def _materialize(self, row: StoredCheckpoint, *, cache: bool, read_only: bool) -> Flow[Materialized]:
        """
        Build the state at ``row``: from the cached state if the row is the cached checkpoint or descends from it
        (decoding only the deltas since), otherwise from the nearest snapshot or the root (decoding only the values
        that survive).

        :param row: The checkpoint.
        :param cache: Whether to cache the result as the thread's head state (only frozen states are cached).
        :param read_only: Whether the caller takes a frozen state (then a state decoded from storage is decoded
            frozen and shared with the cache); otherwise a state decoded from storage is decoded plain for the caller
            and not cached.
        """
        thread_id, checkpoint_id = row.thread_id, row.checkpoint_id
        cached = self._cache.get(thread_id)
        if cached is not None and cached[0] == checkpoint_id:
            return Materialized(frozen=cached[1], plain=None)
        stop_at = cached[0] if cached is not None else None
        chain: list[ChainLink] = yield ops.ReadChain(thread_id, checkpoint_id, stop_at)
        check_chain(thread_id, checkpoint_id, stop_at, chain)
        if cached is not None and chain[0].parent_id == stop_at:
            try:
                composed, origins = compose_chain(thread_id, chain, from_snapshot=False)
                check_extends(cached[1], origins)
                decoded = yield from self._decode_delta(row, composed, frozen=True)
                frozen = merge_frozen(cached[1], decoded)
            except ExtendError:
                # A delta extends a value that is not a list; the walk from the root names the checkpoint exactly.
                chain = yield ops.ReadChain(thread_id, checkpoint_id, None)
                check_chain(thread_id, checkpoint_id, None, chain)
            else:
                if cache:
                    self._cache.put(thread_id, checkpoint_id, frozen, (row.chain_bytes, row.base_bytes))
                return Materialized(frozen=frozen, plain=None)
        try:
            with paused_gc():
                composed, _ = compose_chain(thread_id, chain, from_snapshot=chain[0].snapshot is not None)
        except ExtendError as error:
            raise extend_error(thread_id, error, error.checkpoint_id or checkpoint_id) from None
        encoded = encoded_values(composed)
        if not read_only:
            # The caller's own values, decoded once; not cached (that would take a second decode, or a copy, on
            # every such read). The reads of a run (read-only) fill the cache.
            plain = yield from self._decode_state(row, encoded)
            return Materialized(frozen=None, plain=plain)
        # Decoded straight into frozen values (read-only, as the cache and a State hold them): no copy.
        frozen = yield from self._decode_state(row, encoded, frozen=True)
        if cache and self._cache.size > 0:
            self._cache.put(thread_id, checkpoint_id, frozen, (row.chain_bytes, row.base_bytes))
        return Materialized(frozen=frozen, plain=None)

    def _decode_delta(
        self, row: StoredCheckpoint, delta: Mapping[str, Mapping[str, Any]], *, frozen: bool = False
    ) -> Flow[dict[str, Any]]:
        try:
            return {key: decode_op_values(op, key, frozen=frozen) for key, op in delta.items()}
        except CodecError as error:
            culprit = yield from self._find_unreadable(row)
            raise corrupt_error(row.thread_id, culprit, error) from None

    def _decode_state(
        self, row: StoredCheckpoint, state: dict[str, Any], *, frozen: bool = False
    ) -> Flow[dict[str, Any]]:
        try:
            with paused_gc():
                return {key: decode(value, key=key, frozen=frozen, owned=True) for key, value in state.items()}
        except CodecError as error:
            culprit = yield from self._find_unreadable(row)
            raise corrupt_error(row.thread_id, culprit, error) from None

    def _find_unreadable(self, row: StoredCheckpoint) -> Flow[str]:
        """Find the checkpoint whose delta holds the value that failed to decode (slow path, errors only)."""
        chain: list[ChainLink] = yield ops.ReadChain(row.thread_id, row.checkpoint_id, None)
        for link in chain:
            if link is chain[0] and link.snapshot is not None:
                try:
                    for key, value in encoded_values(
                        compose_chain(row.thread_id, [link], from_snapshot=True)[0]
                    ).items():
                        decode(value, key=key)
                except CodecError:
                    return link.checkpoint_id
                continue
            for key, op in parse_delta(row.thread_id, link.checkpoint_id, link.delta).items():
                try:
                    decode_op_values(op, key)
                except CodecError:
                    return link.checkpoint_id
        return row.checkpoint_id

    def _advance_cache(
        self,
        row: StoredCheckpoint,
        encoded: Mapping[str, Mapping[str, Any]],
        frozen: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """
        After a commit, move the cached state to the new head: adopting the committed delta's values when they are a
        State's read-only values already (``frozen``: nothing decoded or copied, each value held once in the process),
        otherwise decoding and freezing only the delta.
        """
        if self._cache.size > 0:
            try:
                if frozen is not None:
                    delta = {key: adopt_op(op) for key, op in frozen.items()}
                else:
                    delta = {key: decode_op_values(op, key, frozen=True) for key, op in encoded.items()}
            except Exception:  # the commit is written: a delta the cache cannot take only costs the cache entry
                self._cache.drop(row.thread_id)
            else:
                self._cache.advance(row.thread_id, row.parent_id, row.checkpoint_id, delta)
        # Kept whatever the cache keeps of states (see HeadCache), so the next commit reads nothing to decide whether
        # it stores a snapshot.
        self._cache.note_chain(row.thread_id, row.checkpoint_id, (row.chain_bytes, row.base_bytes))
