"""
A safe JSON codec for state values.

:func:`encode` turns a value into JSON-compatible data and :func:`decode` turns it back; :func:`dumps` and
:func:`loads` add the JSON text step. JSON types are stored as themselves. Everything else is stored as a tagged
object ``{"__type__": "<name>", "data": ...}``: tuples, sets, frozensets, bytes, non-finite floats, dates and times,
decimals, UUIDs, ``Counter``, ``OrderedDict``, ``defaultdict`` (with a built-in factory), ``deque``, dicts whose keys
are not all strings (or that contain the tag key themselves), the haystack
dataclasses (``haystack.ChatMessage``, ``haystack.Document``, ...) and the classes registered with
:func:`~haystack_state.persistence._registry.register_type`.

Loading is safe: it rebuilds only built-in types and the classes in the registry, looked up by name in a dict.
It never imports a module, never unpickles, and never resolves a callable named by the data; any other stored type
name raises :class:`~haystack_state.errors.CodecError`.
"""

from __future__ import annotations

import base64
import collections
import contextvars
import datetime as dt
import decimal
import enum
import math
import uuid
from collections.abc import Callable
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_state.errors import CodecError
from haystack_state.persistence._json_text import from_json as from_json
from haystack_state.persistence._json_text import to_json as to_json
from haystack_state.persistence._message_codec import (
    decode_chat_message,
    encode_chat_message,
    encode_chat_message_compact,
)
from haystack_state.persistence._registry import BUILTIN_TAGS, adapter_for_class, adapter_for_name
from haystack_state.runtime import RunContext
from haystack_state.values import SCALARS, FrozenDict, freeze, frozen_dict, frozen_list

TYPE_KEY = "__type__"
DATA_KEY = "data"
_CHAT_MESSAGE = "haystack.ChatMessage"
# Whether this encoding stores messages in their compact form (checkpoints do; see message_codec).
_COMPACT: contextvars.ContextVar[bool] = contextvars.ContextVar("haystack_state_compact_messages", default=False)

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_REGISTER_HINT = "a dataclass, a pydantic model, an Enum, a NamedTuple or a class with to_dict()/from_dict()"


class _Failure(Exception):
    """Raised inside the codec; collects the path segments on its way up and becomes a CodecError at the top."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.segments: list[str] = []

    def at(self, segment: str) -> _Failure:
        self.segments.append(segment)
        return self

    def path(self, root: str) -> str:
        return root + "".join(reversed(self.segments))


def _key_segment(key: object) -> str:
    return f"[{key!r}]"


def _field_segment(key: object) -> str:
    return f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"


def _unencodable(value: object) -> _Failure:
    cls = type(value)
    if isinstance(value, RunContext):
        return _Failure(
            "cannot encode the RunContext at {path}: it carries the run's live dependencies, which are never stored; "
            "pass them to each run as run(..., context=obj)."
        )
    if isinstance(value, enum.Enum):
        hint = f"register the enum with register_type({cls.__name__})"
    else:
        hint = f"register it with register_type({cls.__name__}) ({_REGISTER_HINT}), or store a JSON-compatible value"
    return _Failure(f"cannot encode value of type {cls.__qualname__} at {{path}}: {hint}.")


def _tag(name: str, data: Any) -> dict[str, Any]:
    return {TYPE_KEY: name, DATA_KEY: data}


def _text(data: object) -> str:
    if type(data) is not str:
        raise ValueError(f"expected a string, got {type(data).__name__}")
    return data


def _b64(value: bytes | bytearray) -> str:
    return base64.b64encode(value).decode("ascii")


def _unb64(data: object) -> bytes:
    return base64.b64decode(_text(data), validate=True)


# Scalars stored as tagged strings or lists: (class, tag, to data, from data). Checked in order: datetime before date.
_SCALARS: tuple[tuple[type, str, Callable[[Any], Any], Callable[[Any], Any]], ...] = (
    (bytearray, "bytearray", _b64, lambda data: bytearray(_unb64(data))),
    (bytes, "bytes", _b64, _unb64),
    (dt.datetime, "datetime", dt.datetime.isoformat, lambda data: dt.datetime.fromisoformat(_text(data))),
    (dt.date, "date", dt.date.isoformat, lambda data: dt.date.fromisoformat(_text(data))),
    (dt.time, "time", dt.time.isoformat, lambda data: dt.time.fromisoformat(_text(data))),
    (dt.timedelta, "timedelta", lambda v: [v.days, v.seconds, v.microseconds], lambda data: dt.timedelta(*data)),
    (decimal.Decimal, "decimal", str, lambda data: decimal.Decimal(_text(data))),
    (uuid.UUID, "uuid", str, lambda data: uuid.UUID(_text(data))),
)
_SCALAR_DECODERS = {name: from_data for _, name, _, from_data in _SCALARS}


# --- encoding ----------------------------------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    cls = type(value)
    if value is None or cls is str or cls is int or cls is bool:
        return value
    if cls is float:
        return value if math.isfinite(value) else _tag("float", repr(value))
    if cls is list:
        return _each_item(_encode, value)
    if cls is dict:
        return _encode_dict(value, _key_segment)
    if cls is ChatMessage:
        try:
            data = (encode_chat_message_compact if _COMPACT.get() else encode_chat_message)(value, _encode)
        except _Failure:
            data = None  # the general path reports it, with the path inside the message
        if data is not None:
            return _tag(_CHAT_MESSAGE, data)
    adapter = adapter_for_class(cls)
    if adapter is not None:
        return _encode_object(value, adapter.name, adapter.to_data)
    if isinstance(value, enum.Enum):
        raise _unencodable(value)
    if isinstance(value, dict | list | collections.deque):
        return _encode_container(value, cls)
    if isinstance(value, tuple):
        if hasattr(value, "_fields"):  # an unregistered NamedTuple would come back as a plain tuple
            raise _unencodable(value)
        return _tag("tuple", _each_item(_encode, value))
    if isinstance(value, set | frozenset):
        return _tag("frozenset" if isinstance(value, frozenset) else "set", _encode_set(value))
    for scalar, name, to_data, _ in _SCALARS:
        if isinstance(value, scalar):
            return _tag(name, to_data(value))
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _encode(float(value))
    raise _unencodable(value)


#: The factories a stored ``defaultdict`` may have, by name (loading looks them up here; nothing else is called).
_FACTORIES: dict[str, Any] = {
    "list": list,
    "dict": dict,
    "set": set,
    "int": int,
    "float": float,
    "str": str,
    "tuple": tuple,
    "Counter": collections.Counter,
    "OrderedDict": collections.OrderedDict,
    "none": None,
}
_FACTORY_NAMES = {id(factory): name for name, factory in _FACTORIES.items()}


def _encode_container(value: Any, cls: type) -> Any:
    """Dict and list subclasses: read-only state views as plain ones, the collections types tagged, others refused."""
    if cls.__module__ == "haystack_state.values":  # FrozenDict, FrozenList: read-only views of plain ones
        return _encode_dict(value, _key_segment) if isinstance(value, dict) else _each_item(_encode, value)
    if cls is collections.Counter or cls is collections.OrderedDict:
        return _tag(cls.__name__, _encode_dict(dict(value), _key_segment))
    if cls is collections.defaultdict:
        factory = _FACTORY_NAMES.get(id(value.default_factory))
        if factory is None:
            raise _Failure(
                f"cannot encode the defaultdict at {{path}}: its default_factory {value.default_factory!r} is not one "
                f"of {', '.join(_FACTORIES)}; use one of those, or store a plain dict."
            )
        return _tag("defaultdict", {"factory": factory, "items": _encode_dict(dict(value), _key_segment)})
    if cls is collections.deque:
        return _tag("deque", {"items": _each_item(_encode, list(value)), "maxlen": value.maxlen})
    kind = "dict" if isinstance(value, dict) else "list"
    raise _Failure(
        f"cannot encode value of type {cls.__qualname__} at {{path}}: it is a {kind} subclass, which would come back "
        f"as a plain {kind}; store a plain {kind} (or a Counter, OrderedDict, defaultdict or deque), or a registered "
        "class (register_type)."
    )


def _each_item(convert: Callable[[Any], Any], items: list[Any] | tuple[Any, ...]) -> list[Any]:
    """``convert`` (:func:`_encode` or :func:`_decode`) of each item of a list or tuple, a failure naming its index."""
    out = []
    for index, item in enumerate(items):
        try:
            out.append(convert(item))
        except _Failure as failure:
            raise failure.at(f"[{index}]") from None
    return out


def _encode_set(items: set[Any] | frozenset[Any]) -> list[Any]:
    out = []
    for item in items:
        try:
            out.append(_encode(item))
        except _Failure as failure:
            raise failure.at(f"{{{item!r}}}") from None
    # Sets have no order: sort the encoded elements so that equal sets give identical JSON.
    return sorted(out, key=to_json)


def _encode_dict(mapping: dict[Any, Any], segment: Any) -> Any:
    if TYPE_KEY not in mapping:
        out = {}
        for key, item in mapping.items():
            if type(key) is not str:  # keys that JSON cannot hold: the tagged form below
                break
            kind = type(item)
            if kind is str or item is None or kind is int or kind is bool:
                out[key] = item
                continue
            try:
                out[key] = _encode(item)
            except _Failure as failure:
                raise failure.at(segment(key)) from None
        else:
            return out
    pairs = []
    for key, item in mapping.items():
        try:
            encoded_key = _encode(key)
        except _Failure as failure:
            raise failure.at(f"<key {key!r}>") from None
        try:
            pairs.append([encoded_key, _encode(item)])
        except _Failure as failure:
            raise failure.at(segment(key)) from None
    return _tag("dict", pairs)


def _encode_object(value: Any, name: str, to_data: Any) -> dict[str, Any]:
    try:
        data = to_data(value)
    except Exception as error:
        raise _Failure(
            f"cannot encode value of type {type(value).__qualname__} at {{path}}: "
            f"converting it failed with {type(error).__name__}: {error}"
        ) from None
    if type(data) is dict:
        return _tag(name, _encode_dict(data, _field_segment))
    return _tag(name, _encode(data))


def _root(key: str | None, where: str | None) -> tuple[str, str]:
    if key is not None:
        return f"State key '{key}': ", key
    return "", where or "value"


def encode(value: object, *, key: str | None = None, where: str | None = None, compact: bool = False) -> Any:
    """
    Turn a value into JSON-compatible data (dicts with string keys, lists, strings, numbers, booleans, None).

    The read-only containers of a State (``FrozenDict``, ``FrozenList``) are encoded as plain dicts and lists;
    ``Counter``, ``OrderedDict``, ``defaultdict`` (with a built-in factory) and ``deque`` keep their type; any other
    dict or list subclass is refused (it would come back as a plain dict or list).

    :param value: The value to encode.
    :param key: The state key the value belongs to; named in error messages and used as the root of the path.
    :param where: The root of the path in error messages when there is no state key (default ``"value"``).
    :param compact: Store chat messages in their compact form (an array; see
        :mod:`~haystack_state.persistence._message_codec`), as checkpoints do, instead of ``to_dict``'s shape. Both
        decode alike.
    :returns: JSON-compatible data; :func:`decode` turns it back into an equal value.
    :raises CodecError: If some part of the value cannot be encoded. The message names the state key, the path to
        the part (such as ``documents[3].meta['x']``) and its type.
    """
    prefix, root = _root(key, where)
    token = _COMPACT.set(True) if compact else None
    try:
        return _encode(value)
    except _Failure as failure:
        message = failure.reason.replace("{path}", failure.path(root), 1)
        raise CodecError(prefix + message if prefix else message[:1].upper() + message[1:]) from None
    except RecursionError:
        raise CodecError(f"{prefix}cannot encode {root}: it is nested too deeply or contains itself.") from None
    finally:
        if token is not None:
            _COMPACT.reset(token)


# --- decoding ----------------------------------------------------------------------------------------------------


def _decode(data: Any) -> Any:
    cls = type(data)
    if data is None or cls is str or cls is int or cls is bool or cls is float:
        return data
    if cls is list:
        return _each_item(_decode, data)
    if cls is dict:
        if TYPE_KEY in data:
            return _decode_tagged(data)
        return _decode_values(data, _key_segment)
    raise _Failure(f"found a {cls.__qualname__} at {{path}}, which is not JSON data.")


_JSON_SCALARS = frozenset({str, int, bool, float, type(None)})


def _decode_owned(data: Any) -> Any:
    """
    :func:`_decode` for freshly parsed data that no one else holds: its dicts and lists are decoded in place and
    become parts of the value (only tagged objects are replaced), so plain data costs one walk and no copy.
    """
    cls = type(data)
    if cls is list:
        for index, item in enumerate(data):
            if type(item) in _JSON_SCALARS:
                continue
            try:
                decoded = _decode_owned(item)
            except _Failure as failure:
                raise failure.at(f"[{index}]") from None
            if decoded is not item:
                data[index] = decoded
        return data
    if cls is dict:
        if TYPE_KEY in data:
            return _decode_tagged(data)
        for key, item in data.items():
            if type(item) in _JSON_SCALARS:
                continue
            try:
                decoded = _decode_owned(item)
            except _Failure as failure:
                raise failure.at(_key_segment(key)) from None
            if decoded is not item:
                data[key] = decoded  # (a value replaced while iterating: the dict does not change size)
        return data
    if cls in _JSON_SCALARS:
        return data
    raise _Failure(f"found a {cls.__qualname__} at {{path}}, which is not JSON data.")


def _short(text: object) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _decode_tagged(tagged: dict[str, Any]) -> Any:
    name = tagged[TYPE_KEY]
    if set(tagged) != {TYPE_KEY, DATA_KEY} or not isinstance(name, str):
        raise _Failure(f"malformed tagged object at {{path}}: expected keys '{TYPE_KEY}' and '{DATA_KEY}'.")
    data = tagged[DATA_KEY]
    if name in BUILTIN_TAGS:
        try:
            return _decode_builtin(name, data)
        except _Failure:
            raise
        except Exception as error:
            raise _Failure(f"invalid stored {name} at {{path}}: {type(error).__name__}: {error}") from None
    if name == _CHAT_MESSAGE:
        try:
            # (copying, even for owned data: a message the fast path gives up on halfway goes to the general path,
            # which must find the data as it was)
            message = decode_chat_message(data, _decode, False)
        except _Failure:
            message = None  # the general path reports it
        if message is not None:
            return message
    adapter = adapter_for_name(name)
    if adapter is None:
        raise _Failure(
            f"unknown stored type {_short(name)} at {{path}}. Only built-in types, the haystack dataclasses and "
            "types registered with register_type() can be loaded; register the class under this name to load it."
        )
    decoded = _decode_object_data(data)
    try:
        return adapter.from_data(decoded)
    except Exception as error:
        raise _Failure(
            f"cannot rebuild stored type '{name}' at {{path}}: {type(error).__name__}: {_short(str(error))}"
        ) from None


def _decode_object_data(data: object) -> Any:
    if type(data) is dict and TYPE_KEY not in data:
        return _decode_values(data, _field_segment)
    return _decode(data)


def _decode_values(data: dict[str, Any], segment: Callable[[str], str]) -> dict[str, Any]:
    """:func:`_decode` of each value of a plain dict, a failure naming its key as ``segment`` writes it."""
    out = {}
    for key, item in data.items():
        try:
            out[key] = _decode(item)
        except _Failure as failure:
            raise failure.at(segment(key)) from None
    return out


def _decode_builtin(name: str, data: Any) -> Any:
    if name == "dict":
        return _decode_pairs(data)
    if name in ("tuple", "set", "frozenset"):
        if type(data) is not list:
            raise ValueError("expected a list")
        items = _each_item(_decode, data)
        return tuple(items) if name == "tuple" else set(items) if name == "set" else frozenset(items)
    if name == "float":
        return _NON_FINITE[data]
    if name in ("Counter", "OrderedDict"):
        items = _decode(data)
        if type(items) is not dict:
            raise ValueError("expected a mapping")
        return collections.Counter(items) if name == "Counter" else collections.OrderedDict(items)
    if name == "defaultdict":
        if type(data) is not dict or set(data) != {"factory", "items"} or data["factory"] not in _FACTORIES:
            raise ValueError(f"expected {{'factory': one of {', '.join(_FACTORIES)}, 'items': ...}}")
        items = _decode(data["items"])
        if type(items) is not dict:
            raise ValueError("expected a mapping of items")
        return collections.defaultdict(_FACTORIES[data["factory"]], items)
    if name == "deque":
        if type(data) is not dict or set(data) != {"items", "maxlen"} or type(data["items"]) is not list:
            raise ValueError("expected {'items': [...], 'maxlen': ...}")
        maxlen = data["maxlen"]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise ValueError("maxlen must be null or an int of at least 0")
        return collections.deque(_each_item(_decode, data["items"]), maxlen)
    return _SCALAR_DECODERS[name](data)


def _decode_pairs(data: object) -> dict[Any, Any]:
    if type(data) is not list:
        raise ValueError("expected a list of [key, value] pairs")
    out = {}
    for index, pair in enumerate(data):
        if type(pair) is not list or len(pair) != 2:
            raise _Failure("malformed dict entry at {path}: expected a [key, value] pair.").at(f"<entry {index}>")
        try:
            key = _decode(pair[0])
        except _Failure as failure:
            raise failure.at(f"<key {index}>") from None
        try:
            out[key] = _decode(pair[1])
        except _Failure as failure:
            raise failure.at(_key_segment(key)) from None
        except TypeError as error:
            raise _Failure(f"unhashable dict key at {{path}}: {error}").at(f"<key {index}>") from None
    return out


def _decode_frozen(data: Any) -> Any:
    """Decode straight into the shape :func:`haystack_state.values.freeze` gives (no decode-then-copy)."""
    cls = type(data)
    if data is None or cls is str or cls is int or cls is bool or cls is float:
        return data
    if cls is list:
        return frozen_list([item if type(item) in SCALARS else _decode_frozen(item) for item in data])
    if cls is dict:
        if TYPE_KEY in data:
            if data[TYPE_KEY] == _CHAT_MESSAGE and len(data) == 2 and DATA_KEY in data:
                message = decode_chat_message(data[DATA_KEY], _decode_frozen, True)
                if message is not None:
                    return message
            return freeze(_decode_tagged(data))
        if SCALARS.issuperset(map(type, data.values())):
            return FrozenDict(data)
        return frozen_dict({key: _decode_frozen(item) for key, item in data.items()})
    raise _Failure("not JSON data")


def decode(
    data: object, *, key: str | None = None, where: str | None = None, frozen: bool = False, owned: bool = False
) -> Any:
    """
    Turn data produced by :func:`encode` (or parsed from stored JSON) back into a value.

    :param data: JSON-compatible data.
    :param key: The state key the data belongs to; named in error messages.
    :param where: The root of the path in error messages when there is no state key (default ``"value"``).
    :param frozen: Build the value read-only, as :func:`haystack_state.values.freeze` gives it (for a State or the
        head cache), instead of decoding it and then freezing a copy. ``data`` must then be owned by no one else
        (freshly parsed): its dicts and lists may become parts of the value.
    :param owned: ``data`` is owned by no one else (freshly parsed): it is decoded in place, its dicts and lists
        becoming parts of the value, instead of copied. Implied by ``frozen``.
    :returns: The value.
    :raises CodecError: If the data names a type outside the allowlist, or is malformed. The message names the state
        key, the path and the stored type name. Nothing is imported, whatever the data says.
    """
    if frozen:
        try:
            return _decode_frozen(data)
        except Exception:  # the plain path below reports it exactly (or gives the value)
            pass
    prefix, root = _root(key, where)
    try:
        value = _decode_owned(data) if owned and not frozen else _decode(data)
    except _Failure as failure:
        message = failure.reason.replace("{path}", failure.path(root), 1)
        raise CodecError(f"{prefix}cannot decode stored value: {message}") from None
    except RecursionError:
        raise CodecError(f"{prefix}cannot decode {root}: it is nested too deeply.") from None
    return freeze(value) if frozen else value


def dumps(value: object, *, key: str | None = None) -> str:
    """
    Encode a value and serialize it to JSON text.

    :param value: The value.
    :param key: The state key the value belongs to; named in error messages.
    :returns: The JSON text.
    :raises CodecError: If the value cannot be encoded.
    """
    return to_json(encode(value, key=key))


def loads(text: str | bytes, *, key: str | None = None) -> Any:
    """
    Parse JSON text written by :func:`dumps` and decode it.

    :param text: The JSON text.
    :param key: The state key the value belongs to; named in error messages.
    :returns: The value.
    :raises CodecError: If the text is not valid JSON or names a type outside the allowlist.
    """
    return decode(from_json(text), key=key)
