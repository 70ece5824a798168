"""
The allowlist of classes that the codec may rebuild when it loads stored data.

Loading stored data never imports anything: a stored type name is looked up in a dict from names to classes, filled
at import time with the haystack dataclasses below and, later, by the application through :func:`register_type`.
A name that is not in the dict is an error.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

import pydantic
from haystack.dataclasses import (
    ByteStream,
    ChatMessage,
    ChatRole,
    Document,
    FileContent,
    ImageContent,
    ReasoningContent,
    SparseEmbedding,
    TextContent,
    ToolCall,
    ToolCallResult,
)

from haystack_state.errors import CodecError
from haystack_state.runtime import RunContext

T = TypeVar("T", bound=type)

#: Tag names of the built-in types the codec handles itself; no registered class may take them.
BUILTIN_TAGS = frozenset(
    {"dict", "tuple", "set", "frozenset", "bytes", "bytearray", "float", "datetime", "date", "time", "timedelta"}
    | {"decimal", "uuid", "Counter", "OrderedDict", "defaultdict", "deque"}
)
_HAYSTACK_PREFIX = "haystack."


@dataclasses.dataclass(frozen=True)
class TypeAdapter:
    """
    How one allowlisted class is turned into encodable data and back.

    :param name: The short type name stored in the ``__type__`` tag.
    :param cls: The class.
    :param to_data: Turns an instance into data the codec can encode (usually a dict of fields).
    :param from_data: Rebuilds an instance from the decoded data.
    """

    name: str
    cls: type
    to_data: Callable[[Any], Any]
    from_data: Callable[[Any], Any]


_lock = threading.Lock()
_BY_NAME: dict[str, TypeAdapter] = {}
_BY_CLASS: dict[type, TypeAdapter] = {}


def adapter_for_class(cls: type) -> TypeAdapter | None:
    """
    Return the adapter of exactly this class (subclasses are not matched), or None.

    :param cls: The class of a value being encoded.
    """
    return _BY_CLASS.get(cls)


def adapter_for_name(name: str) -> TypeAdapter | None:
    """
    Return the adapter stored under a type name, or None. Never imports anything.

    :param name: The type name read from stored data.
    """
    return _BY_NAME.get(name)


def registered_names() -> list[str]:
    """Return the sorted names of every class the codec can rebuild (haystack dataclasses and registered types)."""
    return sorted(_BY_NAME)


def _add(adapter: TypeAdapter) -> None:
    with _lock:
        existing = _BY_NAME.get(adapter.name)
        if existing is not None and existing.cls is not adapter.cls:
            raise CodecError(
                f"Type name '{adapter.name}' is already registered for {existing.cls.__module__}."
                f"{existing.cls.__qualname__}; pass another name: register_type({adapter.cls.__name__}, name=...)."
            )
        previous = _BY_CLASS.get(adapter.cls)
        if previous is not None and previous.name != adapter.name:
            raise CodecError(
                f"{adapter.cls.__qualname__} is already registered under the name '{previous.name}'; "
                f"it cannot also be registered as '{adapter.name}'."
            )
        _BY_NAME[adapter.name] = adapter
        _BY_CLASS[adapter.cls] = adapter


def _enum_adapter(name: str, cls: type[enum.Enum]) -> TypeAdapter:
    return TypeAdapter(name, cls, lambda member: member.value, cls)


def _make_adapter(cls: type, name: str) -> TypeAdapter:
    if issubclass(cls, enum.Enum):
        return _enum_adapter(name, cls)
    to_dict = getattr(cls, "to_dict", None)
    from_dict = getattr(cls, "from_dict", None)
    if callable(to_dict) and callable(from_dict):
        return TypeAdapter(name, cls, lambda obj: obj.to_dict(), from_dict)
    if issubclass(cls, pydantic.BaseModel):
        model = cls

        def dump_model(obj: Any) -> Any:
            return obj.model_dump(by_alias=True, round_trip=True)

        return TypeAdapter(name, cls, dump_model, model.model_validate)
    if dataclasses.is_dataclass(cls):
        init_fields = [f.name for f in dataclasses.fields(cls) if f.init]

        def dataclass_fields(obj: object) -> dict[str, Any]:
            return {field: getattr(obj, field) for field in init_fields}

        return TypeAdapter(name, cls, dataclass_fields, lambda data: cls(**data))
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return TypeAdapter(name, cls, lambda obj: obj._asdict(), lambda data: cls(**data))
    raise TypeError(
        f"register_type() cannot register {cls.__qualname__}: it must be a dataclass, a pydantic model, an Enum, "
        "a NamedTuple, or a class with to_dict() and a from_dict() classmethod."
    )


@overload
def register_type(cls: T, *, name: str | None = None) -> T: ...


@overload
def register_type(cls: None = None, *, name: str | None = None) -> Callable[[T], T]: ...


def register_type(cls: T | None = None, *, name: str | None = None) -> T | Callable[[T], T]:
    """
    Allow the codec to store and load instances of an application class.

    Dataclasses are stored field by field (the fields with ``init=True``), pydantic models through
    ``model_dump``/``model_validate``, Enum members by value, NamedTuples by field, and a class that defines
    ``to_dict()`` and a ``from_dict()`` classmethod through those (they take precedence). Field values are encoded
    recursively, so nested values must be encodable too. Registering the same class twice with the same name is a
    no-op. Usable as a decorator, with or without arguments.

    :param cls: The class to register.
    :param name: The short name stored with each value; defaults to the class's ``__qualname__``. It is only a
        label: loading looks it up in the registry and never imports it. Give a stable name if the class may move.
    :returns: The class itself (so it works as a decorator).
    :raises TypeError: If the class is not of a supported kind.
    :raises CodecError: If the name is taken by another class, is reserved, or the class has another name.
    """

    def register(target: T) -> T:
        if not isinstance(target, type):
            raise TypeError(f"register_type() expects a class, got {type(target).__name__}.")
        if issubclass(target, RunContext):
            raise TypeError(
                "register_type() cannot register RunContext: it carries the run's live dependencies, which are never "
                "stored; pass them to each run as run(..., context=obj)."
            )
        type_name = target.__qualname__ if name is None else name
        if not isinstance(type_name, str) or not type_name:
            raise CodecError("register_type(): name must be a non-empty string.")
        if type_name in BUILTIN_TAGS or type_name.startswith(_HAYSTACK_PREFIX):
            raise CodecError(
                f"Type name '{type_name}' is reserved by the codec; pass another name: "
                f"register_type({target.__name__}, name=...)."
            )
        _add(_make_adapter(target, type_name))
        return target

    if cls is None:
        return register
    return register(cls)


def _haystack(name: str, cls: type, to_data: Callable[[Any], Any], from_data: Callable[[Any], Any]) -> None:
    _add(TypeAdapter(_HAYSTACK_PREFIX + name, cls, to_data, from_data))


def _bytestream_to_data(stream: ByteStream) -> dict[str, Any]:
    # ByteStream.to_dict() stores bytes as a list of ints; keep them as bytes (base64 in JSON) instead.
    return {"data": stream.data, "meta": stream.meta, "mime_type": stream.mime_type}


def _document_to_data(document: Document) -> dict[str, Any]:
    data = document.to_dict(flatten=False)
    if document.blob is not None:
        data["blob"] = _bytestream_to_data(document.blob)
    return data


def _register_haystack_types() -> None:
    simple: list[tuple[str, Any]] = [
        ("ChatMessage", ChatMessage),
        ("TextContent", TextContent),
        ("ToolCall", ToolCall),
        ("ToolCallResult", ToolCallResult),
        ("ReasoningContent", ReasoningContent),
        ("ImageContent", ImageContent),
        ("FileContent", FileContent),
        ("SparseEmbedding", SparseEmbedding),
    ]
    for type_name, cls in simple:
        _haystack(type_name, cls, lambda obj: obj.to_dict(), cls.from_dict)
    _haystack("ByteStream", ByteStream, _bytestream_to_data, ByteStream.from_dict)
    _haystack("Document", Document, _document_to_data, Document.from_dict)
    _add(_enum_adapter(_HAYSTACK_PREFIX + "ChatRole", ChatRole))


_register_haystack_types()
