"""
Agent hooks: what runs at the six points of a run, as in haystack-ai 3.4.

A hook is either haystack's ``Hook`` protocol object (``@hook`` from ``haystack.hooks``, ``ConfirmationHook``, the
budget and compaction hooks, or any class with ``run(state)``, optional ``run_async(state)``, ``warm_up``/``close``
and ``to_dict``/``from_dict``), or a plain callable ``fn(state)`` (sync or async), as this package has always
accepted. Either receives the run's live :class:`~haystack_state.agent._run_state.RunState`.

Running a hook: ``run(state)`` (or the callable) synchronously; an awaitable it returns is run to completion. In
async runs: ``run_async(state)`` when the hook has one, otherwise ``run`` in a worker thread (as haystack-ai does),
and a plain callable is called and awaited if it returns an awaitable. Each hook runs in a tracing span
``haystack.agent.hook`` tagged with its point, name and type.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from haystack.core.errors import SerializationError
from haystack.core.serialization import component_to_dict, generate_qualified_class_name
from haystack.tracing.tracer import Span
from haystack.utils import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.agent._spans import NO_SPAN, span, tracing_enabled
from haystack_state.agent.protocols import HookPoint
from haystack_state.state import State

__all__ = [
    "HOOK_POINTS",
    "call_hook",
    "call_hook_async",
    "call_lifecycle_async",
    "deserialize_hooks",
    "hook_name",
    "hook_span",
    "hooks_lifecycle",
    "hooks_lifecycle_async",
    "is_hook_object",
    "normalize_hooks",
    "serialize_hooks",
    "unique_hooks",
    "wait",
]

#: The points of a run where hooks run, in the order a step reaches them.
HOOK_POINTS: tuple[HookPoint, ...] = ("before_run", "before_llm", "before_tool", "after_tool", "on_exit", "after_run")

Hook = Any  # a Hook protocol object or a callable
T = TypeVar("T")


def is_hook_object(hook: object) -> bool:
    """
    Whether a hook is a haystack ``Hook`` object (it has a callable ``run``) rather than a plain callable.

    :param hook: The hook.
    :returns: True for a ``Hook`` object.
    """
    return callable(getattr(hook, "run", None))


def normalize_hooks(hooks: Mapping[str, Any] | None) -> dict[HookPoint, list[Hook]]:
    """
    Check the ``hooks`` argument and normalise it to ``{point: [hooks]}``.

    :param hooks: ``{point: hook or list of hooks}``.
    :returns: The hooks by point, in the order given.
    :raises ValueError: For an unknown hook point, or a hook registered at a point its ``allowed_hook_points``
        excludes (haystack's ``ConfirmationHook`` runs only at ``before_tool``).
    :raises TypeError: For a hook that is neither a ``Hook`` object (with a callable ``run``) nor callable.
    """
    result: dict[HookPoint, list[Hook]] = {}
    for point, given in (hooks or {}).items():
        if point not in HOOK_POINTS:
            raise ValueError(f"Invalid hook point '{point}'. Valid hook points are: {', '.join(HOOK_POINTS)}.")
        entries = list(given) if isinstance(given, list | tuple) else [given]
        for hook in entries:
            if not is_hook_object(hook) and not callable(hook):
                raise TypeError(
                    f"Hook registered for hook point '{point}' must have a callable 'run(state)' (a haystack Hook, "
                    f"such as one made with haystack.hooks.hook) or be a callable taking the state, got an object of "
                    f"type '{type(hook).__name__}' ({hook!r})."
                )
            allowed = getattr(hook, "allowed_hook_points", None)
            if allowed is not None and point not in allowed:
                raise ValueError(
                    f"Hook of type '{type(hook).__name__}' is registered under hook point '{point}' but only "
                    f"supports: {', '.join(allowed)} (hook {hook_name(hook)})."
                )
        result[point] = entries
    return result


def hook_name(hook: Hook) -> str:
    """
    A readable name for a hook: the wrapped function's import path for ``@hook`` functions and plain callables,
    the class name for other hook objects.

    :param hook: The hook.
    :returns: The name.
    """
    target = hook
    if is_hook_object(hook):
        target = getattr(hook, "function", None) or getattr(hook, "async_function", None)
        if target is None:
            return type(hook).__name__
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else type(target).__name__


def hook_span(hook: Hook, point: str) -> AbstractContextManager[Span]:
    """
    The tracing span of one hook call, as haystack-ai names and tags it.

    :param hook: The hook.
    :param point: Its hook point.
    :returns: A context manager yielding the span.
    """
    if not tracing_enabled():
        return NO_SPAN
    return span("haystack.agent.hook", dict(_hook_tags(hook, point)))


# A hook's span tags, by (hook, point): they are the same at every call. The hook is kept with them, so an id is
# never reused while its entry lives.
_HOOK_TAGS: dict[tuple[int, str], tuple[Hook, dict[str, str]]] = {}


def _hook_tags(hook: Hook, point: str) -> dict[str, str]:
    cached = _HOOK_TAGS.get((id(hook), point))
    if cached is not None and cached[0] is hook:
        return cached[1]
    tags = {
        "haystack.agent.hook.point": point,
        "haystack.agent.hook.name": hook_name(hook),
        "haystack.agent.hook.type": generate_qualified_class_name(type(hook)),
    }
    if len(_HOOK_TAGS) >= 1024:  # hooks made on the fly (one agent per request) must not pile up
        _HOOK_TAGS.clear()
    _HOOK_TAGS[(id(hook), point)] = (hook, tags)
    return tags


def wait(awaitable: Awaitable[T]) -> T:
    """
    Run an awaitable (an async hook's) to completion from synchronous code.

    :param awaitable: The awaitable.
    :returns: Its result.
    """

    async def waiter() -> T:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: run it on a fresh one
        return asyncio.run(waiter())
    # An event loop runs in this thread (``run`` called from a notebook cell or a coroutine): it cannot be
    # re-entered, so the awaitable runs on a loop of its own in a helper thread.
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="haystack-state-hook") as helper:
        return helper.submit(context.run, asyncio.run, waiter()).result()


def call_hook(hook: Hook, point: str, state: State) -> object:
    """
    Run one hook synchronously, in its span.

    :param hook: The hook.
    :param point: Its hook point (for the span).
    :param state: The run's live state.
    :returns: What the hook returned (an awaitable it returned is run to completion first).
    """
    with hook_span(hook, point):
        returned = hook.run(state) if is_hook_object(hook) else hook(state)
        if returned is None or type(returned) is bool:  # what hooks return, and never awaitable
            return returned
        return wait(returned) if inspect.isawaitable(returned) else returned


async def call_hook_async(hook: Hook, point: str, state: State) -> object:
    """
    Run one hook in an async run, in its span: ``run_async`` if the hook has one, otherwise its sync ``run`` in a
    worker thread; a plain callable is called and awaited if it returns an awaitable.

    :param hook: The hook.
    :param point: Its hook point (for the span).
    :param state: The run's live state.
    :returns: What the hook returned.
    """
    with hook_span(hook, point):
        if is_hook_object(hook):
            run_async = getattr(hook, "run_async", None)
            if callable(run_async):
                return await run_async(state)
            return await asyncio.to_thread(hook.run, state)
        returned = hook(state)
        return await returned if inspect.isawaitable(returned) else returned


def unique_hooks(hooks: Mapping[HookPoint, list[Hook]]) -> list[Hook]:
    """
    Each distinct hook once (a hook may be registered at several points), in the order first seen.

    :param hooks: The hooks by point.
    :returns: The hooks.
    """
    seen: dict[int, Hook] = {}
    for entries in hooks.values():
        for hook in entries:
            seen.setdefault(id(hook), hook)
    return list(seen.values())


async def call_lifecycle_async(target: object, name: str) -> None:
    """
    Await ``target``'s ``<name>_async()`` where it has one, or call its ``<name>()`` (``warm_up``, ``close``); nothing
    if it has neither.
    """
    if callable(method := getattr(target, f"{name}_async", None)):
        await method()
    elif callable(method := getattr(target, name, None)):
        method()


def hooks_lifecycle(hooks: Mapping[HookPoint, list[Hook]], name: str) -> None:
    """Call ``<name>()`` (``warm_up``, ``close``) on every hook object that has one, once per hook."""
    for hook in unique_hooks(hooks):
        if callable(method := getattr(hook, name, None)):
            method()


async def hooks_lifecycle_async(hooks: Mapping[HookPoint, list[Hook]], name: str) -> None:
    """Await ``<name>_async()`` on every hook that has one, call ``<name>()`` on the others; once per hook."""
    for hook in unique_hooks(hooks):
        await call_lifecycle_async(hook, name)


def serialize_hooks(hooks: Mapping[HookPoint, list[Hook]]) -> dict[str, list[Any]] | None:
    """
    Serialise the hooks: a ``Hook`` object as haystack-ai does (``{"type": ..., "init_parameters": ...}``), a plain
    callable as its import path.

    :param hooks: The hooks by point.
    :returns: The serialised hooks, or None if there are none.
    :raises SerializationError: For a hook that cannot be serialised (a lambda, a nested function, an object
        without ``to_dict``).
    """
    result: dict[str, list[Any]] = {}
    for point, entries in hooks.items():
        if not entries:
            continue
        result[point] = []
        for hook in entries:
            if is_hook_object(hook):
                if not callable(getattr(hook, "to_dict", None)):
                    raise SerializationError(
                        f"Hook {hook_name(hook)} at '{point}' has no to_dict(), so the Agent cannot be serialized."
                    )
                result[point].append(component_to_dict(obj=hook, name="hook"))
            else:
                result[point].append(serialize_callable(hook))
    return result or None


def deserialize_hooks(data: Mapping[str, list[Any]]) -> dict[str, list[Hook]]:
    """
    Rebuild hooks serialised by :func:`serialize_hooks` (or by haystack-ai's Agent).

    :param data: The serialised hooks by point.
    :returns: The hooks by point.
    """
    result: dict[str, list[Hook]] = {}
    for point, entries in data.items():
        hooks: list[Hook] = []
        for entry in entries:
            if isinstance(entry, str):
                hooks.append(deserialize_callable(entry))
            else:
                holder = {"hook": dict(entry)}
                deserialize_component_inplace(holder, key="hook")
                hooks.append(holder["hook"])
        result[point] = hooks
    return result
