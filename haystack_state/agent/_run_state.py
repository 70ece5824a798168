"""
``RunState``: the State of one Agent run, as hooks see it.

haystack-ai's Agent keeps its run counters and controls in the State, next to the schema's keys: ``step_count``,
``token_usage``, ``tool_call_counts``, ``context_tokens`` and ``exit_reason`` (what the run has done so far),
``stop_run`` and ``continue_run`` (set by hooks to stop the run, or to keep it going on exit), ``tools`` (the tools
of the current step) and ``hook_context`` (the caller's per-run resources). Hooks written for haystack-ai read them
with ``state.data.get(...)`` and write them with ``state.set(...)``. This package adds ``context``: the run's
``RunContext`` (its dependencies, see ``Agent.run(context=...)``).

Here they are *run values*: a ``RunState`` answers for them in ``get``, ``set``, ``has`` and ``data``, but they are
not schema keys. They are never journaled, so never checkpointed (``hook_context`` may hold a WebSocket, ``tools``
live objects), never frozen or copied, and never handed to tools through their staged State view.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from haystack.components.agents.state.state_utils import merge_lists, replace_values
from haystack.dataclasses import ChatMessage

from haystack_state.errors import StateTypeError
from haystack_state.runtime import RunContext
from haystack_state.state import State

__all__ = ["RUN_KEYS", "RUN_SCHEMA", "LiveData", "RunState", "resolved_schema"]

#: The run values and the types a hook may write to them.
RUN_KEYS: dict[str, tuple[type, ...]] = {
    "step_count": (int,),
    "token_usage": (dict,),
    "tool_call_counts": (dict,),
    "context_tokens": (int,),
    "exit_reason": (str, type(None)),
    "continue_run": (bool,),
    "stop_run": (str, type(None)),
    "tools": (list,),
    "hook_context": (dict,),
    "context": (RunContext,),
}


#: The run values as haystack-ai's Agent declares them in its resolved state schema, in its order and with its
#: handlers (``context``, this package's own, is not there: it is never state).
RUN_SCHEMA: dict[str, dict[str, Any]] = {
    "step_count": {"type": int, "handler": replace_values},
    "token_usage": {"type": dict[str, Any], "handler": replace_values},
    "tool_call_counts": {"type": dict[str, int], "handler": replace_values},
    "exit_reason": {"type": str, "handler": replace_values},
    "continue_run": {"type": bool, "handler": replace_values},
    "stop_run": {"type": str, "handler": replace_values},
    "tools": {"type": list, "handler": replace_values},
    "hook_context": {"type": dict[str, Any], "handler": replace_values},
    "context_tokens": {"type": int, "handler": replace_values},
}


def resolved_schema(
    state_schema: Mapping[str, Mapping[str, Any]], extra: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """
    The state schema of an Agent's runs, in the shape of haystack-ai's ``Agent.resolved_state_schema``: the
    ``state_schema`` entries as given, then ``extra`` (keys this package adds, such as the running summary),
    ``messages`` (``list[ChatMessage]``, merged with ``merge_lists``) unless declared, then the run values
    (:data:`RUN_SCHEMA`).

    :param state_schema: The schema given to the Agent.
    :param extra: Keys the Agent adds to it.
    :returns: A new dict of new entry dicts.
    """
    resolved = {key: dict(entry) for key, entry in state_schema.items()}
    resolved.update({key: dict(entry) for key, entry in (extra or {}).items()})
    if resolved.get("messages") is None:
        resolved["messages"] = {"type": list[ChatMessage], "handler": merge_lists}
    resolved.update({key: dict(entry) for key, entry in RUN_SCHEMA.items()})
    return resolved


#: The run values ``get`` hands out as copies.
_COPIED_ON_GET = frozenset({"token_usage", "tool_call_counts"})


def _run_value_defaults() -> dict[str, Any]:
    return {
        "step_count": 0,
        "token_usage": {},
        "tool_call_counts": {},
        "context_tokens": 0,
        "exit_reason": None,
        "continue_run": False,
        "stop_run": None,
        "tools": [],
        "hook_context": {},
        "context": None,
    }


class LiveData(Mapping[str, Any]):
    """
    ``RunState.data``: a read-only mapping over the live state, reading each key only when asked for it. A list
    comes back read-only and shares its items with the state (see :meth:`State.view`); run values come back as they
    are (``hook_context`` is the caller's own dict, never copied).
    """

    __slots__ = ("_state",)

    def __init__(self, state: RunState) -> None:
        self._state = state

    def __getitem__(self, key: str) -> Any:
        state = self._state
        if key in state.run_values:
            return state.run_values[key]
        missing = object()
        value = state.view(key, missing)
        if value is missing:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        state = self._state
        yield from (key for key in state.specs if state.has(key))
        yield from state.run_values

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self._state.run_values or self._state.has(key))

    def __repr__(self) -> str:
        return f"LiveData({dict(self)!r})"


class RunState(State):
    """
    The State of an Agent run: the schema's keys, plus the run values of haystack-ai's Agent (see the module
    docstring). Hooks receive it live.

    ``data`` is a live, read-only mapping (as ``state.data`` is in haystack-ai, and unlike a plain ``State``'s
    snapshot); everything else behaves as in :class:`State`.

    :param schema: The schema.
    :param data: Initial values.
    """

    def __init__(self, schema: Mapping[str, Any], data: Mapping[str, Any] | None = None) -> None:
        super().__init__(schema, data)
        self.run_values: dict[str, Any] = _run_value_defaults()

    @classmethod
    def adopt(cls, state: State) -> RunState:
        """
        Turn a State (loaded from a thread, say) into a RunState holding the same values, without copying them.

        :param state: The state; it must not be used afterwards.
        :returns: The RunState.
        """
        run_state = cls.__new__(cls)
        run_state.__dict__.update(state.__dict__)
        run_state.run_values = _run_value_defaults()
        return run_state

    @property
    def context(self) -> RunContext[Any] | None:
        """The run's :class:`RunContext` (its dependencies, thread, run id, step and store), or None outside a run."""
        context: RunContext[Any] | None = self.run_values["context"]
        return context

    def emit(self, name: str, data: object = None) -> None:
        """
        Send a ``CustomEvent`` to whoever streams the run (``Agent.stream``), from a hook; nothing happens if no one
        does.

        :param name: The event's name.
        :param data: Its data (JSON-encodable by the checkpoint codec).
        """
        context = self.context
        if context is not None:
            context.emit(name, data)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.run_values:
            value = self.run_values[key]
            # The counters are the run's own: a hook changing what it read must not change them (haystack-ai's get
            # deep-copies too). hook_context and tools are the caller's live objects, handed out as they are.
            return copy.deepcopy(value) if key in _COPIED_ON_GET else value
        return super().get(key, default)

    def has(self, key: str) -> bool:
        return key in self.run_values or super().has(key)

    @property
    def data(self) -> LiveData:  # type: ignore[override]  # a live mapping, as in haystack-ai
        """Every value, live and read-only: nothing is copied until a key is read (see :class:`LiveData`)."""
        return LiveData(self)

    def snapshot(self) -> dict[str, Any]:
        """A snapshot of the schema's values, as ``State.data`` gives it."""
        return super().data

    def set(self, key: str, value: object, handler_override: Callable[[Any, Any], Any] | None = None) -> None:
        expected = RUN_KEYS.get(key)
        if expected is None:
            super().set(key, value, handler_override)
            return
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
            names = " | ".join("None" if kind is type(None) else kind.__name__ for kind in expected)
            raise StateTypeError(key, names, value)
        self.run_values[key] = value
