"""
The effects of the agent loop: what the loop (:mod:`haystack_state.agent._loop`) asks its driver to do (call the model,
run the tool calls, run hooks, commit a checkpoint, ...). Each is an :class:`~haystack_state._driver.Op` whose type
parameter is its result's type, so ``reply = yield from perform(CallModel(...))`` is typed; the driver
(:mod:`haystack_state.agent._drive`) executes them synchronously or awaiting them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from haystack.dataclasses import ChatMessage
from haystack.dataclasses.streaming_chunk import StreamingCallbackT

from haystack_state._driver import Op
from haystack_state.agent.protocols import HookPoint
from haystack_state.invocation._outcome import BatchOutcome
from haystack_state.persistence.delta import Source
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.runtime import RunContext
from haystack_state.state import State
from haystack_state.tools.spec import ToolSpec

if TYPE_CHECKING:
    from haystack_state.agent._session import ThreadSession

__all__ = [
    "AskHooks",
    "Backoff",
    "CallModel",
    "Commit",
    "Effect",
    "HookInterrupt",
    "LoadField",
    "RunHooks",
    "RunTools",
    "TakeLease",
]

#: A chat generator's result (``{"replies": [...], ...}``).
ModelResult: TypeAlias = dict[str, Any]


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class CallModel(Op[ModelResult]):
    """Effect: call the chat generator (or ``generator``, such as a summarizer) with these inputs; send back its
    result dict."""

    inputs: dict[str, Any]
    generator: Any = None


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class RunTools(Op[BatchOutcome]):
    """Effect: run the tool calls of these messages against the state (``hold`` ones not at all, ``answers`` for their
    ``interrupt()`` calls); send back the ``BatchOutcome``."""

    messages: list[ChatMessage]
    state: State
    specs: dict[str, ToolSpec]
    streaming_callback: StreamingCallbackT | None
    context: RunContext[object] | None = None
    answers: Mapping[str, Sequence[object]] | None = None
    hold: frozenset[str] = frozenset()
    on_call: Callable[[str, dict[str, Any]], None] | None = None


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class RunHooks(Op[list[object]]):
    """Effect: run each hook with the state; send back their return values."""

    point: HookPoint
    hooks: list[object]
    state: State


@dataclasses.dataclass(frozen=True)
class HookInterrupt:
    """A ``before_tool`` hook called ``interrupt(value)`` without an answer: the step waits for a human."""

    value: object
    index: int


@dataclasses.dataclass(slots=True)
class AskHooks(Op["list[object] | HookInterrupt"]):
    """Effect: run the ``before_tool`` hooks, where ``interrupt()`` works, with the answers given so far; send back
    their return values, or a :class:`HookInterrupt` if one asked without an answer."""

    point: HookPoint
    hooks: list[object]
    state: State
    answers: Sequence[object]


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class Commit(Op[CheckpointMeta]):
    """Effect: commit what the state changed as a checkpoint of the thread; send back the checkpoint's record."""

    session: ThreadSession
    state: State
    source: Source
    tool_names: tuple[str, ...]
    metadata: dict[str, Any]
    step: int


@dataclasses.dataclass(frozen=True)
class Backoff(Op[None]):
    """Effect: wait this many seconds before the next attempt of a failed model call (``time.sleep`` or
    ``asyncio.sleep``; a cancelled run stops waiting)."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class TakeLease(Op[None]):
    """Effect: take the session's lease on its thread (before the run's first commit, model or tool call)."""

    session: ThreadSession


@dataclasses.dataclass(frozen=True)
class LoadField(Op[object]):
    """Effect: compute a ``"scope": "loaded"`` key with its loader, ``loader(context, state)`` (sync or async); send
    back the value."""

    key: str
    loader: Callable[..., object]
    context: RunContext[object]
    state: State


Effect: TypeAlias = CallModel | RunTools | RunHooks | AskHooks | Commit | TakeLease | LoadField | Backoff
