"""
How the State keeps its values isolated without deep copies.

A value enters the state once, through :func:`freeze`, which takes a private, read-only copy of it:

- built-in containers become read-only ones: ``dict`` -> :class:`FrozenDict`, ``list`` -> :class:`FrozenList`
  (subclasses of ``dict`` and ``list``, so ``isinstance``, ``==``, ``json.dumps`` and pydantic accept them),
  ``set`` -> :class:`FrozenSet` (a subclass of ``set``); tuples and frozensets are frozen item by item;
- dataclass instances (``Document``, ``ChatMessage``, your own) are copied field by field with their fields
  frozen; immutable scalars (str, int, float, bool, bytes, None, enums, dates, ...) are kept as they are;
- other objects (pydantic models, arbitrary classes, and subclasses of ``dict`` and ``list`` such as
  ``collections.Counter``, whose type must survive) are deep-copied. An object that cannot be copied (a database
  connection, a lock, a socket, a generator), and the run's ``RunContext``, are refused with an
  :class:`~haystack_state.errors.UnstorableValueError`: live objects belong in ``run(..., context=obj)``;
- text is checked on the way: a string that no backend can store (a lone surrogate, see :mod:`haystack_state._text`),
  as a value, a dict key or a dataclass field, is refused with an :class:`~haystack_state.errors.UnstorableTextError`.
  ASCII text costs one flag test; text inside other objects is checked when a checkpointer stores it.

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
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, NoReturn, TypeVar

from haystack_state._text import shown, text_problem
from haystack_state.errors import UnstorableTextError, UnstorableValueError
from haystack_state.runtime import RunContext

__all__ = [
    "SCALARS",
    "SHAREABLE",
    "FrozenDict",
    "FrozenList",
    "FrozenSet",
    "freeze",
    "read",
    "shallow_copy",
    "thaw",
    "to_jsonable",
]

T = TypeVar("T")
TupleT = TypeVar("TupleT", bound=tuple[Any, ...])

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


def _read_only(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        f"This {type(self).__mro__[1].__name__} was read from a State and is read-only; "
        "write changes with state.set(), or work on a mutable copy from haystack_state.thaw(value)."
    )


class FrozenDict(dict[Any, Any]):
    """A read-only ``dict``. Equal to, and JSON-encoded like, a plain dict. ``copy()`` returns a mutable dict."""

    __slots__ = ()
    has_objects: ClassVar[bool] = False  # True when some value inside is a mutable object, copied on read
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def copy(self) -> dict[Any, Any]:
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


class FrozenSet(set[Any]):
    """A read-only ``set``. Equal to a plain set. ``copy()`` returns a mutable set."""

    __slots__ = ()
    add = discard = remove = pop = clear = update = _read_only
    intersection_update = difference_update = symmetric_difference_update = _read_only
    __ior__ = __iand__ = __isub__ = __ixor__ = _read_only

    def copy(self) -> set[Any]:
        """A shallow, mutable copy."""
        return set(self)

    def __copy__(self) -> set[Any]:
        return set(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> set[Any]:
        return {thaw(v) for v in self}

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (freeze, (set(self),))

    def __repr__(self) -> str:
        return repr(set(self))


_FROZEN = frozenset({FrozenDict, FrozenList, FrozenDictWithObjects, FrozenListWithObjects})
_AS_IS = SCALARS | _FROZEN  # stored as they are: immutable scalars and values frozen already
# Frozen values that read() may share: immutable scalars and read-only containers with nothing mutable inside.
SHAREABLE = SCALARS | {FrozenDict, FrozenList}  # FrozenSet is not: a set may hold hashable mutable objects
_KEPT_AS_IS = (*_IMMUTABLE_TYPES, FrozenDict, FrozenList, FrozenSet)  # what freeze() keeps, subclasses included


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


# --- per-type decisions, made once per class -------------------------------------------------------------------

_UNSET: Any = object()


class _DataclassInfo:
    """What freeze/read/thaw need to know about a dataclass, computed once per class."""

    __slots__ = ("fast_copy", "fields", "frozen")

    def __init__(self, kind: type) -> None:
        self.fields = tuple(f.name for f in dataclasses.fields(kind))
        params = getattr(kind, "__dataclass_params__", None)
        self.frozen = bool(params is not None and params.frozen)
        # Whether a shallow copy is just a new instance with the same __dict__ (what copy.copy does for a plain
        # class, only much faster); classes that customise copying or pickling, or use __slots__, go through
        # copy.copy.
        self.fast_copy = all(
            getattr(kind, name) is getattr(object, name)
            for name in ("__new__", "__reduce_ex__", "__reduce__", "__getstate__")
        ) and (
            not hasattr(kind, "__setstate__")
            and not hasattr(kind, "__copy__")
            and all("__slots__" not in vars(ancestor) for ancestor in kind.__mro__[:-1])
        )


_DATACLASSES: dict[type, _DataclassInfo] = {}


def _dataclass_info(kind: type) -> _DataclassInfo:
    info = _DATACLASSES.get(kind)
    if info is None:
        info = _DATACLASSES[kind] = _DataclassInfo(kind)
    return info


def _shallow_copy(value: T, info: _DataclassInfo) -> T:
    if info.fast_copy:
        clone = object.__new__(type(value))
        clone.__dict__.update(value.__dict__)
        return clone
    return copy.copy(value)


def shallow_copy(value: T) -> T:
    """
    A shallow copy of a dataclass instance: a new instance sharing the field values. Plain classes (no
    ``__slots__``, no custom copying or pickling) are copied by hand, much faster than ``copy.copy``.

    :param value: A dataclass instance.
    :returns: The copy.
    """
    return _shallow_copy(value, _dataclass_info(type(value)))


def copies_by_dict(kind: type) -> bool:
    """
    Whether a shallow copy of an instance of the dataclass ``kind`` is a new instance given the same ``__dict__``
    (a plain class: no ``__slots__``, no custom copying or pickling), as :func:`shallow_copy` makes it.
    """
    return _dataclass_info(kind).fast_copy


def _fields_set(value: object) -> list[tuple[str, object]]:
    """The dataclass fields of ``value`` that hold a value, with it."""
    fields = []
    for name in _dataclass_info(type(value)).fields:
        inner = getattr(value, name, _UNSET)
        if inner is not _UNSET:
            fields.append((name, inner))
    return fields


# How read() treats a frozen value of a type (see needs_copy_on_read).
_NEVER = 0  # immutable: always shared
_FLAG = 1  # FrozenDict/FrozenList: copied when they hold mutable objects (their has_objects flag)
_ITEMS = 2  # tuple, frozenset, FrozenSet: copied when an item needs it
_FROZEN_DATACLASS = 3  # copied when a field needs it
_DATACLASS = 4  # always copied: a shallow copy, with the fields that need it copied
_OBJECT = 5  # always deep-copied
_CATEGORIES: dict[type, int] = {}


def _category(kind: type) -> int:
    category = _CATEGORIES.get(kind)
    if category is None:
        if issubclass(kind, FrozenDict | FrozenList):
            category = _FLAG
        elif issubclass(kind, _IMMUTABLE_TYPES):
            category = _NEVER
        elif issubclass(kind, tuple | FrozenSet | frozenset):
            category = _ITEMS
        elif dataclasses.is_dataclass(kind):
            category = _FROZEN_DATACLASS if _dataclass_info(kind).frozen else _DATACLASS
        else:
            category = _OBJECT
        _CATEGORIES[kind] = category
    return category


def _freeze_dataclass(value: T) -> T:
    info = _dataclass_info(type(value))
    if info.fast_copy:  # a plain class: rebuilt from a copy of its __dict__ (every message of a run comes this way)
        attributes = value.__dict__.copy()
        fields = None
    else:  # other classes are copied, then given the fields that freezing changed
        fields = {name: inner for name in info.fields if (inner := getattr(value, name, _UNSET)) is not _UNSET}
        attributes = fields.copy()
    for name in info.fields:
        inner = attributes.get(name, _UNSET)
        if inner is _UNSET:
            continue
        kind = type(inner)
        if kind in _AS_IS:
            if kind is str and not inner.isascii():
                _check_text(inner)
            continue
        frozen = freeze(inner)
        if frozen is not inner:
            attributes[name] = frozen
    if fields is None:
        clone = object.__new__(type(value))
        object.__setattr__(clone, "__dict__", attributes)
        return clone
    clone = _shallow_copy(value, info)
    for name, frozen in attributes.items():
        if frozen is not fields[name]:
            object.__setattr__(clone, name, frozen)
    return clone


def _freeze_tuple(value: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(map(freeze, value))


def _freeze_namedtuple(value: TupleT) -> TupleT:
    return type(value)(*map(freeze, value))


def _freeze_set(value: set[Any]) -> FrozenSet:
    return FrozenSet(map(freeze, value))


def _freeze_frozenset(value: frozenset[Any]) -> frozenset[Any]:
    return frozenset(map(freeze, value))


def _kept(value: T) -> T:
    return value


def _deep_copy(value: T) -> T:
    try:
        return copy.deepcopy(value)
    except Exception as error:
        raise UnstorableValueError(
            None, value, f"the State keeps a private copy of every value, and this one cannot be copied ({error})."
        ) from error


def _refuse_context(value: object) -> NoReturn:
    raise UnstorableValueError(
        None, value, "a RunContext carries the run's live dependencies and is never stored, copied or checkpointed."
    )


_FREEZERS: dict[type, Callable[[Any], Any]] = {}


def _freezer(kind: type) -> Callable[[Any], Any]:
    how = _FREEZERS.get(kind)
    if how is None:
        if issubclass(kind, _KEPT_AS_IS):
            how = _kept
        elif issubclass(kind, RunContext):
            how = _refuse_context
        elif issubclass(kind, tuple):
            how = _freeze_namedtuple if hasattr(kind, "_fields") else _freeze_tuple
        elif issubclass(kind, set):
            how = _freeze_set
        elif issubclass(kind, frozenset):
            how = _freeze_frozenset
        elif dataclasses.is_dataclass(kind):
            how = _freeze_dataclass
        else:
            how = _deep_copy
        _FREEZERS[kind] = how
    return how


def freeze(value: Any) -> Any:
    """
    Return a private, read-only copy of ``value`` for storing in a State (see the module docstring).

    Values that are already frozen are returned as they are, so freezing twice costs one pass over the value.

    :param value: Any value.
    :returns: The frozen value, equal to ``value``.
    :raises UnstorableValueError: If the value (or a part of it) cannot be copied, or is a ``RunContext``. The
        State's methods name the key in it.
    """
    kind = type(value)
    if kind in _AS_IS:
        if kind is str and not value.isascii():
            _check_text(value)
        return value
    if kind is dict:
        for key, item in value.items():  # its text (the rest is checked as it is frozen): a flag test for ASCII
            if (type(key) is str and not key.isascii()) or (type(item) is str and not item.isascii()):
                _check_dict_text(value)
                break
        if SCALARS.issuperset(map(type, value.values())):
            return FrozenDict(value)
        return frozen_dict({k: freeze(v) for k, v in value.items()})
    if kind is list:
        return frozen_list([freeze(v) for v in value])
    return _freezer(kind)(value)


def _check_text(text: str) -> None:
    """Refuse a (non-ASCII) string that cannot be stored."""
    problem = text_problem(text)
    if problem is not None:
        raise UnstorableTextError(None, problem, value=text)


def _check_dict_text(value: dict[Any, Any]) -> None:
    """Refuse a dict whose keys or string values cannot be stored (its other values are checked as they are frozen)."""
    for key, item in value.items():
        if type(key) is str and not key.isascii():
            problem = text_problem(key)
            if problem is not None:
                raise UnstorableTextError(None, f"key {shown(key)}: {problem}", value=key)
        if type(item) is str and not item.isascii():
            _check_text(item)


def needs_copy_on_read(value: Any) -> bool:
    """
    Whether :func:`read` must copy this frozen value (rather than share it) to protect the state.

    :param value: A value returned by :func:`freeze`.
    :returns: True for mutable objects: dataclass instances that are not frozen and non-container objects, and
        read-only containers that hold some.
    """
    kind = type(value)
    if kind in SHAREABLE:
        return False
    category = _category(kind)
    if category == _NEVER:
        return False
    if category == _FLAG:
        return bool(value.has_objects)
    if category == _ITEMS:
        return any(map(needs_copy_on_read, value))
    if category == _FROZEN_DATACLASS:
        return any(needs_copy_on_read(inner) for _, inner in _fields_set(value))
    return True


def _read_dataclass(value: T) -> T:
    info = _dataclass_info(type(value))
    clone = _shallow_copy(value, info)
    for name in info.fields:
        inner = getattr(value, name, _UNSET)
        if inner is _UNSET or type(inner) in SHAREABLE:
            continue
        if needs_copy_on_read(inner):
            object.__setattr__(clone, name, read_item(inner))
    return clone


def read_item(value: Any) -> Any:
    """
    Hand out a nested frozen value: share it if nothing can mutate it, otherwise copy just enough.

    :param value: A value returned by :func:`freeze`.
    :returns: A value equal to ``value`` that cannot be used to change the state.
    """
    if not needs_copy_on_read(value):
        return value
    category = _category(type(value))
    if category in (_DATACLASS, _FROZEN_DATACLASS):
        return _read_dataclass(value)
    if isinstance(value, FrozenList):
        return frozen_list([read_item(v) for v in value])
    if isinstance(value, FrozenDict):
        return frozen_dict({k: read_item(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return type(value)(*map(read_item, value)) if hasattr(value, "_fields") else tuple(map(read_item, value))
    if isinstance(value, FrozenSet):
        return FrozenSet(map(read_item, value))
    if isinstance(value, frozenset):
        return frozenset(map(read_item, value))
    return copy.deepcopy(value)


def read(value: Any, items_need_copy: bool | None = None) -> Any:
    """
    Hand out a stored value: a fresh top-level container (shallow copy) whose contents are read-only.

    :param value: A value returned by :func:`freeze`.
    :param items_need_copy: For lists, whether any item needs :func:`read_item` (None: find out).
    :returns: A value equal to ``value`` that cannot be used to change the state.
    """
    if type(value) is list or isinstance(value, FrozenList):
        if items_need_copy is None:
            items_need_copy = (
                value.has_objects if isinstance(value, FrozenList) else any(map(needs_copy_on_read, value))
            )
        return [read_item(v) for v in value] if items_need_copy else list(value)
    if isinstance(value, FrozenDict):
        return {k: read_item(v) for k, v in value.items()} if value.has_objects else dict(value)
    if isinstance(value, FrozenSet):
        return set(map(read_item, value)) if needs_copy_on_read(value) else set(value)
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
    kind = type(value)
    if kind is dict or isinstance(value, FrozenDict):
        return {thaw(k): thaw(v) for k, v in value.items()}
    if kind is list or isinstance(value, FrozenList):
        return [thaw(v) for v in value]
    if kind in SCALARS:
        return value
    if kind is set or isinstance(value, FrozenSet):
        return {thaw(v) for v in value}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(thaw(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        clone = _shallow_copy(value, _dataclass_info(kind))
        for name, inner in _fields_set(value):
            object.__setattr__(clone, name, thaw(inner))
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


def to_jsonable(value: Any) -> Any:
    """
    A JSON-compatible rendering of a value, for showing it to a model or measuring it: objects with ``to_dict``
    (haystack's dataclasses) and pydantic models are dumped, other dataclasses turned into dicts, sets and tuples
    into lists. Anything else is returned as it is (``json.dumps`` may still refuse it).

    :param value: Any value.
    :returns: The JSON-compatible rendering.
    :raises TypeError: For a ``RunContext``, whose dependencies are never rendered (``str()`` shows their type only).
    """
    if isinstance(value, RunContext):
        raise TypeError("A RunContext is never rendered as data: its dependencies stay out of what a model sees.")
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return to_jsonable(value.to_dict())
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return value
