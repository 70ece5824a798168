"""
How the State keeps its values isolated without deep copies.

A value enters the state once, through :func:`freeze`, which takes a private, read-only copy of it:

- built-in containers become read-only ones: ``dict`` -> :class:`FrozenDict`, ``list`` -> :class:`FrozenList`
  (subclasses of ``dict`` and ``list``, so ``isinstance``, ``==``, ``json.dumps`` and pydantic accept them),
  ``set`` -> :class:`FrozenSet`; tuples are frozen item by item;
- dataclass instances (``Document``, ``ChatMessage``, your own) are copied field by field with their fields
  frozen; immutable scalars (str, int, float, bool, bytes, None, enums, dates, ...) are kept as they are;
- other objects (pydantic models, arbitrary classes) are deep-copied.

Reading goes through :func:`read`, which is cheap: the top-level container comes back as a fresh, ordinary
``list``/``dict``/``set`` (a shallow copy, one C-level pass) that the caller may change at will; everything
nested inside it is read-only and shared with the state; dataclass instances come back as shallow copies (a
caller may reassign their attributes, not reach into the state's copy); other mutable objects come back as deep
copies. Nothing a caller does to a value it read can change the state.

To get a fully mutable copy of a read value, call :func:`thaw` (or ``copy.deepcopy``, which thaws too).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import enum
import pathlib
import uuid
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NoReturn

__all__ = ["SCALARS", "FrozenDict", "FrozenList", "FrozenSet", "freeze", "read", "thaw"]

_IMMUTABLE_TYPES: tuple[type, ...] = (
    str,
    int,
    float,
    complex,
    bool,
    bytes,
    type(None),
    enum.Enum,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    datetime.tzinfo,
    decimal.Decimal,
    uuid.UUID,
    pathlib.PurePath,
    range,
    type,
)


SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def _read_only(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        f"This {type(self).__mro__[1].__name__} was read from a State and is read-only; "
        "write changes with state.set(), or work on a mutable copy from haystack_state.thaw(value)."
    )


class FrozenDict(dict[Any, Any]):
    """A read-only ``dict``. Equal to, and JSON-encoded like, a plain dict. ``copy()`` returns a mutable dict."""

    __slots__ = ()
    has_objects: ClassVar[bool] = False  # True when some value inside is a mutable object, copied on read
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def copy(self) -> dict[Any, Any]:  # type: ignore[override]
        """A shallow, mutable copy."""
        return dict(self)

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return {thaw(k): thaw(v) for k, v in self.items()}

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (freeze, (dict(self),))

    def __repr__(self) -> str:
        return dict.__repr__(self)


class FrozenList(list[Any]):
    """A read-only ``list``. Equal to, and JSON-encoded like, a plain list. ``copy()`` returns a mutable list."""

    __slots__ = ()
    has_objects: ClassVar[bool] = False  # True when some item inside is a mutable object, copied on read
    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = _read_only
    __iadd__ = __imul__ = _read_only

    def copy(self) -> list[Any]:
        """A shallow, mutable copy."""
        return list(self)

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [thaw(v) for v in self]

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (freeze, (list(self),))

    def __repr__(self) -> str:
        return list.__repr__(self)


class FrozenDictWithObjects(FrozenDict):
    """A :class:`FrozenDict` holding mutable objects (dataclass instances, ...), which are copied on read."""

    __slots__ = ()
    has_objects: ClassVar[bool] = True


class FrozenListWithObjects(FrozenList):
    """A :class:`FrozenList` holding mutable objects (dataclass instances, ...), which are copied on read."""

    __slots__ = ()
    has_objects: ClassVar[bool] = True


class FrozenSet(frozenset[Any]):
    """A ``frozenset`` that remembers it stands for a ``set``: reading it gives back a mutable ``set``."""

    __slots__ = ()


_FROZEN = frozenset({FrozenDict, FrozenList, FrozenDictWithObjects, FrozenListWithObjects})


def frozen_dict(items: dict[Any, Any]) -> FrozenDict:
    """
    Wrap a dict of already-frozen values as a :class:`FrozenDict`.

    :param items: A dict whose values are frozen.
    :returns: The read-only dict.
    """
    if any(map(needs_copy_on_read, items.values())):
        return FrozenDictWithObjects(items)
    return FrozenDict(items)


def frozen_list(items: list[Any]) -> FrozenList:
    """
    Wrap a list of already-frozen items as a :class:`FrozenList`.

    :param items: A list whose items are frozen.
    :returns: The read-only list.
    """
    if any(map(needs_copy_on_read, items)):
        return FrozenListWithObjects(items)
    return FrozenList(items)


def _is_frozen_dataclass(value: Any) -> bool:
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


def _fields_set(value: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(value) if hasattr(value, f.name)]


def _freeze_dataclass(value: Any) -> Any:
    clone = copy.copy(value)
    for name in _fields_set(value):
        object.__setattr__(clone, name, freeze(getattr(value, name)))
    return clone


def freeze(value: Any) -> Any:
    """
    Return a private, read-only copy of ``value`` for storing in a State (see the module docstring).

    Values that are already frozen are returned as they are, so freezing twice costs one pass over the value.

    :param value: Any value.
    :returns: The frozen value, equal to ``value``.
    """
    kind = type(value)
    if kind in SCALARS or kind in _FROZEN:
        return value
    if kind is dict and SCALARS.issuperset(map(type, value.values())):
        return FrozenDict(value)
    if isinstance(value, _IMMUTABLE_TYPES) or isinstance(value, FrozenDict | FrozenList | FrozenSet):
        return value
    if isinstance(value, dict):
        return frozen_dict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return frozen_list([freeze(v) for v in value])
    if isinstance(value, tuple):
        if hasattr(value, "_fields"):  # namedtuple
            return kind(*(freeze(v) for v in value))
        return tuple(freeze(v) for v in value)
    if isinstance(value, set):
        return FrozenSet(value)
    if isinstance(value, frozenset):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _freeze_dataclass(value)
    return copy.deepcopy(value)


def needs_copy_on_read(value: Any) -> bool:
    """
    Whether :func:`read` must copy this frozen value (rather than share it) to protect the state.

    :param value: A value returned by :func:`freeze`.
    :returns: True for mutable objects: dataclass instances that are not frozen and non-container objects.
    """
    kind = type(value)
    if kind in _FROZEN:
        return kind.has_objects  # type: ignore[no-any-return]
    if kind in SCALARS:
        return False
    if isinstance(value, _IMMUTABLE_TYPES) or isinstance(value, FrozenSet | frozenset):
        return False
    if isinstance(value, FrozenDict | FrozenList):
        return bool(value.has_objects)
    if isinstance(value, tuple):
        return any(needs_copy_on_read(v) for v in value)
    if dataclasses.is_dataclass(value):
        return not _is_frozen_dataclass(value) or any(needs_copy_on_read(getattr(value, n)) for n in _fields_set(value))
    return True


def read_item(value: Any) -> Any:
    """
    Hand out a nested frozen value: share it if nothing can mutate it, otherwise copy just enough.

    :param value: A value returned by :func:`freeze`.
    :returns: A value equal to ``value`` that cannot be used to change the state.
    """
    if not needs_copy_on_read(value):
        return value
    if isinstance(value, FrozenList):
        return frozen_list([read_item(v) for v in value])
    if isinstance(value, FrozenDict):
        return frozen_dict({k: read_item(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return type(value)(*(read_item(v) for v in value)) if hasattr(value, "_fields") else tuple(map(read_item, value))
    if dataclasses.is_dataclass(value):
        clone = copy.copy(value)
        for name in _fields_set(value):
            inner = getattr(value, name)
            if needs_copy_on_read(inner):
                object.__setattr__(clone, name, read_item(inner))
        return clone
    return copy.deepcopy(value)


def read(value: Any, items_need_copy: bool | None = None) -> Any:
    """
    Hand out a stored value: a fresh top-level container (shallow copy) whose contents are read-only.

    :param value: A value returned by :func:`freeze`.
    :param items_need_copy: For lists, whether any item needs :func:`read_item` (None: find out).
    :returns: A value equal to ``value`` that cannot be used to change the state.
    """
    if isinstance(value, FrozenList) or type(value) is list:
        if items_need_copy is None:
            items_need_copy = value.has_objects if isinstance(value, FrozenList) else any(map(needs_copy_on_read, value))
        return [read_item(v) for v in value] if items_need_copy else list(value)
    if isinstance(value, FrozenDict):
        return {k: read_item(v) for k, v in value.items()}
    if isinstance(value, FrozenSet):
        return set(value)
    return read_item(value)


def thaw(value: Any) -> Any:
    """
    Return a fully mutable deep copy of a value read from a State (read-only containers become plain ones).

    ```python
    docs = thaw(state.get("documents"))
    docs[0]["title"] = "edited"   # a private copy; write it back with state.set(...)
    ```

    :param value: Any value.
    :returns: A deep copy with plain ``dict``/``list``/``set`` containers.
    """
    if isinstance(value, dict):
        return {thaw(k): thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    if isinstance(value, FrozenSet):
        return set(value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(thaw(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        clone = copy.copy(value)
        for name in _fields_set(value):
            object.__setattr__(clone, name, thaw(getattr(value, name)))
        return clone
    if isinstance(value, _IMMUTABLE_TYPES):
        return value
    return copy.deepcopy(value)


def freeze_all(values: Iterable[Any]) -> list[Any]:
    """
    Freeze each item of ``values``.

    :param values: Items to store.
    :returns: A plain list of frozen items.
    """
    return [freeze(v) for v in values]
