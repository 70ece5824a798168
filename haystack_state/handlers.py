"""
Merge handlers (reducers): pure functions ``(current, new) -> merged`` that decide how ``State.set`` combines a
new value with the one already stored.

``merge_lists`` and ``replace_values`` behave exactly as haystack-ai's. The others cover the needs agent
frameworks keep meeting: deep-merging dicts, appending without duplicates, counting, and an explicit reset.
None of them mutates its arguments.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Any, Final, TypeVar

T = TypeVar("T")

__all__ = ["RESET", "Reset", "add", "merge_dicts", "merge_lists", "replace_values", "unique"]


class Reset:
    """
    The type of the ``RESET`` sentinel. Writing ``RESET`` to a key restores its initial value: the field's
    ``default`` if the schema declares one, otherwise the key is emptied (``has(key)`` becomes False).

    ```python
    state.set("documents", RESET)   # same as state.reset("documents")
    ```
    """

    _instance: Reset | None = None

    def __new__(cls) -> Reset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "RESET"

    def __reduce__(self) -> str:
        return "RESET"


RESET: Final = Reset()


def as_items(value: Any) -> list[Any]:
    """
    The items that ``merge_lists`` appends for ``value``: the value itself if it is a list, else a one-item list.

    :param value: A single item or a list of items.
    :returns: A list of items (the same object when ``value`` is already a list).
    """
    return value if isinstance(value, list) else [value]


def merge_lists(current: list[T] | T | None, new: list[T] | T) -> list[T]:
    """
    Append ``new`` to ``current``. Either may be a single item or a list; a ``None`` current counts as empty.

    This is the default handler of list-typed keys. Inside a ``State`` it runs in O(items appended): the state
    recognises it and appends in place instead of building a new list.

    ```python
    merge_lists([1, 2], [3, 4])  # [1, 2, 3, 4]
    merge_lists(None, "a")       # ["a"]
    ```

    :param current: The stored value: a list, a single item, or None.
    :param new: The item or items to append.
    :returns: A new list: the current items followed by the new ones.
    """
    current_list: list[T] = [] if current is None else list(current) if isinstance(current, list) else [current]
    return current_list + as_items(new)


def replace_values(current: object, new: T) -> T:
    """
    Replace the stored value with ``new``. This is the default handler of every key that is not a list.

    ```python
    replace_values("Alice", "Bob")  # "Bob"
    ```

    :param current: The stored value (ignored).
    :param new: The value to store.
    :returns: ``new``.
    """
    return new


def merge_dicts(current: Mapping[Any, Any] | None, new: Mapping[Any, Any]) -> dict[Any, Any]:
    """
    Merge ``new`` into ``current`` recursively: nested dicts are merged key by key, and at the leaves the new
    value wins. Merging ``{}`` changes nothing.

    ```python
    merge_dicts({"user": {"name": "Ann", "tz": "UTC"}}, {"user": {"tz": "CET"}, "lang": "de"})
    # {"user": {"name": "Ann", "tz": "CET"}, "lang": "de"}
    ```

    :param current: The stored dict, or None.
    :param new: The dict to merge in.
    :returns: A new dict; neither argument is modified.
    :raises TypeError: If ``new`` is not a mapping.
    """
    if not isinstance(new, Mapping):
        raise TypeError(f"merge_dicts expects a dict to merge, got {type(new).__name__}")
    merged: dict[Any, Any] = dict(current or {})
    for key, value in new.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = merge_dicts(old, value)
        else:
            merged[key] = value
    return merged


def _marker(item: object) -> tuple[int, object]:
    """A lookup key for ``item``: the item itself if hashable, else its repr-independent identity by equality."""
    if isinstance(item, Hashable):
        try:
            hash(item)
            return (0, item)
        except TypeError:
            pass
    return (1, None)


def unique(current: list[T] | T | None, new: list[T] | T) -> list[T]:
    """
    Append the items of ``new`` that are not already present, keeping first-seen order. Works for unhashable
    items such as dicts (they are compared by equality). Applying the same ``new`` twice changes nothing.

    ```python
    unique(["doc-1", "doc-2"], ["doc-2", "doc-3"])  # ["doc-1", "doc-2", "doc-3"]
    unique([{"id": 1}], [{"id": 1}, {"id": 2}])      # [{"id": 1}, {"id": 2}]
    ```

    :param current: The stored list, a single item, or None.
    :param new: The item or items to append.
    :returns: A new list without duplicates among the appended items.
    """
    result: list[T] = [] if current is None else list(current) if isinstance(current, list) else [current]
    seen: set[Any] = set()
    unhashable: list[Any] = []
    for item in result:
        kind, marker = _marker(item)
        if kind == 0:
            seen.add(marker)
        else:
            unhashable.append(item)
    for item in as_items(new):
        kind, marker = _marker(item)
        if kind == 0:
            if marker in seen:
                continue
            seen.add(marker)
        else:
            if any(item == other for other in unhashable):
                continue
            unhashable.append(item)
        result.append(item)
    return result


def add(current: Any, new: Any) -> Any:
    """
    Add ``new`` to ``current``: numbers are summed, and counters (``collections.Counter`` or dicts of numbers)
    are summed key by key. A ``None`` current counts as zero.

    ```python
    add(3, 4)                              # 7
    add({"search": 1}, {"search": 2, "fetch": 1})  # {"search": 3, "fetch": 1}
    ```

    :param current: The stored number or counter, or None.
    :param new: The number or counter to add.
    :returns: The sum, as a new object.
    :raises TypeError: If the values cannot be added.
    """
    if current is None:
        return Counter(new) if isinstance(new, Counter) else dict(new) if isinstance(new, Mapping) else new
    if isinstance(current, Mapping) and isinstance(new, Mapping):
        total: dict[Any, Any] = Counter() if isinstance(current, Counter) else {}
        total.update(current)
        for key, value in new.items():
            total[key] = total.get(key, 0) + value
        return total
    if isinstance(current, bool) or isinstance(new, bool) or isinstance(current, Mapping) or isinstance(new, Mapping):
        raise TypeError(f"add cannot add {type(new).__name__} to {type(current).__name__}")
    return current + new
