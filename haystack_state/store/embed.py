"""
Embeddings for a store's semantic search: ``index={"embed": ..., "dims": n, "fields": [...]}``.

``embed`` is a Haystack text embedder component (anything with ``run(text=...)`` returning ``{"embedding": [...]}``,
and ``run_async`` if it has one), or a plain function from a list of texts to a list of vectors (sync or async).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from haystack.core.errors import DeserializationError, SerializationError
from haystack.core.serialization import component_to_dict
from haystack.utils import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.errors import StoreError

__all__ = ["Embedder", "index_from_dict"]


def _is_component(obj: object) -> bool:
    return hasattr(obj, "__haystack_input__") or (callable(getattr(obj, "run", None)) and not inspect.isfunction(obj))


class Embedder:
    """
    The ``index`` setting of a store, checked at construction.

    :param index: ``{"embed": component_or_function, "dims": int (optional), "fields": [...] (optional)}``.
    :raises ValueError: For a malformed setting.
    """

    def __init__(self, index: Mapping[str, Any]) -> None:
        unknown = set(index) - {"embed", "dims", "fields"}
        if unknown or "embed" not in index:
            raise ValueError(
                f"index must be {{'embed': embedder, 'dims': n, 'fields': [...]}}; got keys {sorted(index)}."
            )
        self.embed = index["embed"]
        if not (_is_component(self.embed) or callable(self.embed)):
            raise ValueError(f"index['embed'] must be a text embedder component or a function, got {self.embed!r}.")
        self.dims: int | None = index.get("dims")
        if self.dims is not None and (not isinstance(self.dims, int) or isinstance(self.dims, bool) or self.dims < 1):
            raise ValueError(f"index['dims'] must be a positive integer, got {self.dims!r}.")
        fields = index.get("fields")
        if fields is not None and (
            isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields) or not fields
        ):
            raise ValueError(f"index['fields'] must be a non-empty list of field names (or '$'), got {fields!r}.")
        self.fields: list[str] | None = list(fields) if fields is not None else None

    def _check(self, vectors: Any, count: int) -> list[list[float]]:
        try:
            result = [[float(x) for x in vector] for vector in vectors]
        except (TypeError, ValueError) as error:
            raise StoreError(
                f"The store's embedder returned something that is not a list of vectors: {error}"
            ) from error
        if len(result) != count:
            raise StoreError(f"The store's embedder returned {len(result)} vectors for {count} texts.")
        for vector in result:
            if self.dims is not None and len(vector) != self.dims:
                raise StoreError(f"The store's embedder returned a vector of {len(vector)} numbers, not {self.dims}.")
            if not all(math.isfinite(x) for x in vector):
                raise StoreError("The store's embedder returned a vector with a non-finite number.")
        return result

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed texts (blocking)."""
        if _is_component(self.embed):
            return self._check([self.embed.run(text=text)["embedding"] for text in texts], len(texts))
        result = self.embed(list(texts))
        if inspect.isawaitable(result):
            raise StoreError("The store's embed function is async: use the store's async methods (aput, asearch).")
        return self._check(result, len(texts))

    async def acall(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed texts without blocking the event loop (a sync embedder runs in a thread)."""
        if _is_component(self.embed):
            if callable(getattr(self.embed, "run_async", None)):
                found = [(await self.embed.run_async(text=text))["embedding"] for text in texts]
            else:
                found = [(await asyncio.to_thread(self.embed.run, text=text))["embedding"] for text in texts]
            return self._check(found, len(texts))
        if inspect.iscoroutinefunction(self.embed):
            return self._check(await self.embed(list(texts)), len(texts))
        return self._check(await asyncio.to_thread(self.embed, list(texts)), len(texts))

    def to_dict(self) -> dict[str, Any]:
        """The setting as data: a component by ``component_to_dict``, a function by its import path."""
        if _is_component(self.embed):
            embed: Any = component_to_dict(obj=self.embed, name="embed")
        else:
            embed = serialize_callable(self.embed)
            if "<lambda>" in embed or "<locals>" in embed:
                raise SerializationError(
                    f"The store's embed function {embed} cannot be serialized: use a module-level function."
                )
        data: dict[str, Any] = {"embed": embed}
        if self.dims is not None:
            data["dims"] = self.dims
        if self.fields is not None:
            data["fields"] = list(self.fields)
        return data


def index_from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild an ``index`` setting from :meth:`Embedder.to_dict` output."""
    params = dict(data)
    if isinstance(params.get("embed"), dict):
        deserialize_component_inplace(params, key="embed")
    elif isinstance(params.get("embed"), str):
        params["embed"] = deserialize_callable(params["embed"])
    else:
        raise DeserializationError(f"A serialized store index needs 'embed', got {data!r}.")
    return params
