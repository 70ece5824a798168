"""
Reading the type annotations of a tool's parameters: which ones receive the State or the run's ``RunContext``,
which ones hold callables, and the descriptions written into ``Annotated[...]``.

Both State classes are recognised: haystack-state's :class:`haystack_state.state.State` and haystack-ai's
:class:`haystack.components.agents.state.State` (and their subclasses), written as ``State``, ``State | None``,
``Optional[State]`` or ``Annotated[State, ...]``.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Optional, Union, get_args, get_origin

from haystack.components.agents.state import State as HaystackState

from haystack_state.runtime import STORE_PARAM, deps_type
from haystack_state.state import State

__all__ = [
    "STATE_CLASSES",
    "annotation_description",
    "contains_callable",
    "context_deps_type",
    "is_state_annotation",
    "resolve_annotations",
    "unwrap_optional",
]

#: The classes whose instances a tool can receive as "the State": haystack-state's and haystack-ai's.
STATE_CLASSES: tuple[type, ...] = (State, HaystackState)


def unwrap_optional(annotation: object) -> Any:
    """
    Strip ``Annotated[...]`` and a single ``| None`` from an annotation.

    :param annotation: A type annotation.
    :returns: ``T`` for ``T``, ``T | None``, ``Optional[T]``, ``Annotated[T, ...]`` (and nestings of these);
        the annotation unchanged when it is a union of several non-None types.
    """
    if get_origin(annotation) is Annotated:
        return unwrap_optional(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return unwrap_optional(members[0])
    return annotation


def is_state_annotation(annotation: object) -> bool:
    """
    Tell whether a parameter annotated this way receives the live State object.

    Usage example:

    .. code-block:: python

        from typing import Annotated
        from haystack_state.state import State

        assert is_state_annotation(State | None)
        assert is_state_annotation(Annotated[State, "the agent's state"])
        assert not is_state_annotation(dict)

    :param annotation: A type annotation (already resolved, not a string).
    :returns: ``True`` for ``State``, ``State | None``, ``Optional[State]`` and ``Annotated[State, ...]`` of either
        State class or a subclass of one.
    """
    inner = unwrap_optional(annotation)
    return isinstance(inner, type) and issubclass(inner, STATE_CLASSES)


def context_deps_type(annotation: object) -> Any:
    """
    Tell whether a parameter annotated this way receives the run's ``RunContext``, and what it expects as deps.

    Usage example:

    .. code-block:: python

        from typing import Any, Optional
        from haystack_state import RunContext

        assert context_deps_type(RunContext[Deps]) is Deps
        assert context_deps_type(RunContext[Deps] | None) == Optional[Deps]
        assert context_deps_type(Optional[RunContext]) is Any
        assert context_deps_type(str) is None

    :param annotation: A type annotation (already resolved, not a string).
    :returns: ``T`` for ``RunContext[T]`` (and ``Annotated[...]``); ``T | None`` for ``RunContext[T] | None`` and
        ``Optional[RunContext[T]]``, since a tool that accepts no context accepts a run without dependencies;
        ``Any`` for a bare ``RunContext``; ``STORE_PARAM`` for ``Store`` (or a subclass, optional or not): such a
        parameter receives the run's long-term memory store; None for any other annotation.
    """
    inner = unwrap_optional(annotation)
    from haystack_state.store.base import Store  # (the store imports the codec, which reads tool types)

    if isinstance(inner, type) and issubclass(inner, Store):
        return STORE_PARAM
    expects = deps_type(inner)
    if expects is None or expects is Any or not _accepts_none(annotation):
        return expects
    return Optional[expects]  # noqa: UP045  # T may be a string or a TypeVar, which `| None` does not take


def _accepts_none(annotation: object) -> bool:
    """Whether an annotation is ``X | None`` (or ``Optional[X]``), possibly inside ``Annotated``."""
    if get_origin(annotation) is Annotated:
        return _accepts_none(get_args(annotation)[0])
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def contains_callable(annotation: object) -> bool:
    """
    Tell whether an annotation is a callable type, or a union (or ``Annotated``) containing one.

    :param annotation: A type annotation.
    :returns: ``True`` for ``Callable``, ``Callable[..., T]``, ``Callable[..., T] | None`` and the like.
    """
    origin = get_origin(annotation)
    if origin is Annotated:
        return contains_callable(get_args(annotation)[0])
    if annotation in (Callable, collections.abc.Callable, typing.Callable) or origin in (
        Callable,
        collections.abc.Callable,
    ):
        return True
    if origin in (Union, types.UnionType):
        return any(contains_callable(arg) for arg in get_args(annotation))
    return False


def annotation_description(annotation: object) -> str | None:
    """
    Return the description written in ``Annotated[T, "description", ...]``.

    As in haystack-ai, it is the first metadata of the ``Annotated``, as written. When the first metadata is not a
    string (``Annotated[int, Field(ge=1), "text"]``, which haystack-ai turns into a schema it then rejects), the first
    string metadata is used instead.

    :param annotation: A type annotation.
    :returns: The description; ``None`` when the annotation is not ``Annotated`` or carries no string.
    """
    if get_origin(annotation) is not Annotated:
        return None
    for metadata in getattr(annotation, "__metadata__", ()):
        if isinstance(metadata, str):
            return metadata
    return None


def resolve_annotations(function: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """
    Resolve the parameter annotations of a callable, including postponed (string) ones, keeping ``Annotated``.

    :param function: The callable to inspect.
    :returns: A pair: the resolved annotation of each named parameter (``inspect.Parameter.empty`` when it has
        none), and for each parameter whose string annotation could not be resolved, the reason.
    """
    parameters = inspect.signature(function).parameters
    if not any(isinstance(param.annotation, str) for param in parameters.values()):
        return {name: param.annotation for name, param in parameters.items()}, {}
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception:  # fall back to resolving parameter by parameter below
        hints = {}
    namespace = dict(getattr(inspect.unwrap(function), "__globals__", {}))
    resolved: dict[str, Any] = {}
    failures: dict[str, str] = {}
    for name, param in parameters.items():
        annotation = param.annotation
        if not isinstance(annotation, str):
            resolved[name] = annotation
        elif name in hints:
            resolved[name] = hints[name]
        else:
            try:
                resolved[name] = eval(annotation, namespace)  # annotations are code by definition
            except Exception as error:  # reported to the caller as a problem
                resolved[name] = annotation
                failures[name] = f"{type(error).__name__}: {error}"
    return resolved, failures
