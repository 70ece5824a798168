"""
What a run is given: the Agent's fixed settings (:class:`LoopConfig`), one call's request (:class:`RunRequest`, from
the per-run :class:`RunOptions` of ``run``, ``resume`` and ``stream``), the handle that stops a run from outside
(:class:`RunControl`), and the names no state key may take (:data:`RESERVED_INPUTS`, :data:`RESERVED_OUTPUTS`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from haystack.dataclasses import ChatMessage
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.token_counters import TokenCounter
from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset

from haystack_state._schema import FieldSpec
from haystack_state.agent._hooks import Hook
from haystack_state.agent._toolbox import Toolbox
from haystack_state.agent.context import ContextPolicy
from haystack_state.agent.events import EventSink
from haystack_state.agent.protocols import DecisionLike, ExitReason, HookPoint, UnfinishedCalls
from haystack_state.invocation._settings import DEFAULT_TOOL_RUN_SETTINGS, ToolRunSettings
from haystack_state.retry import RetryPolicy
from haystack_state.store import Store

if TYPE_CHECKING:
    from haystack_state.tools.spec import ToolsArg

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_FINISH_REASONS",
    "EXIT_INTERRUPTED",
    "EXIT_MAX_STEPS",
    "EXIT_TEXT",
    "RESERVED_INPUTS",
    "RESERVED_OUTPUTS",
    "LoopConfig",
    "RunControl",
    "RunOptions",
    "RunRequest",
]


#: Outputs of every run, besides the state keys.
RESERVED_OUTPUTS = frozenset(
    {
        "last_message",
        "step_count",
        "exit_reason",
        "token_usage",
        "tool_call_counts",
        "context_tokens",
        "pending_tool_calls",
        "pending_interrupts",
        "checkpoint_id",
    }
)
#: ``run`` parameters other than ``messages`` (which is the state key itself), and the run values hooks see besides
#: the state keys (``stop_run``, ``continue_run``, ``tools``): no state key or prompt variable may take their names.
RESERVED_INPUTS = frozenset(
    {
        "streaming_callback",
        "thread_id",
        "checkpoint_id",
        "generation_kwargs",
        "tools",
        "hook_context",
        "context",
        "on_unfinished_calls",
        "run_id",
        "enable_streaming_callback_passthrough",
        "stop_run",
        "continue_run",
    }
)
EXIT_TEXT: ExitReason = "text"
EXIT_MAX_STEPS: ExitReason = "max_agent_steps"
EXIT_INTERRUPTED: ExitReason = "interrupted"
EXIT_CANCELLED: ExitReason = "cancelled"
#: Finish reasons that end a run on a reply without tool calls, as its exit reason (an incomplete reply).
EXIT_FINISH_REASONS = frozenset({"length", "content_filter"})


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """
    What the loop needs from the Agent.

    :param schema: The state schema, ``messages`` included.
    :param toolbox: The agent's tools.
    :param exit_conditions: ``"text"`` and/or tool names.
    :param max_agent_steps: The most model calls a run makes.
    :param hooks: The hooks by point.
    :param generator_streams: Whether the chat generator takes a ``streaming_callback``.
    :param interrupt_before: Tools before which a run on a thread stops.
    :param interrupt_after: Tools after whose results a run on a thread stops, for review.
    :param context_policy: Decides what the model is sent (see :mod:`haystack_state.agent.context`); everything if
        None.
    :param token_counter: Gives the token counter the policy measures with.
    :param summary_key: The state key holding the running summary, if the policy summarizes.
    :param store: The agent's long-term memory store, given to tools, hooks and loaders through ``RunContext``.
    :param on_unfinished_calls: What new messages do on a thread whose last run stopped mid-tools (see
        :data:`~haystack_state.agent.protocols.UnfinishedCalls`); by how it stopped if None.
    :param resolved_schema: The run's state keys as haystack-ai lists them (``Agent.resolved_state_schema``), for the
        run span's ``haystack.agent.state_schema`` tag.
    :param model_retry: How a failed chat generator call is retried (see :mod:`haystack_state.retry`); never if None.
    :param tool_settings: How the tool calls run (fixed by the Agent at construction; a run may override
        ``passthrough``).
    """

    schema: dict[str, FieldSpec]
    toolbox: Toolbox
    exit_conditions: list[str]
    max_agent_steps: int
    hooks: Mapping[HookPoint, list[Hook]]
    generator_streams: bool
    interrupt_before: frozenset[str] = frozenset()
    interrupt_after: frozenset[str] = frozenset()
    context_policy: ContextPolicy | None = None
    token_counter: Callable[[], TokenCounter] | None = None
    summary_key: str | None = None
    store: Store | None = None
    on_unfinished_calls: UnfinishedCalls | None = None
    resolved_schema: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    model_retry: RetryPolicy | None = None
    tool_settings: ToolRunSettings = DEFAULT_TOOL_RUN_SETTINGS


@dataclasses.dataclass
class RunRequest:
    """
    What one call of ``run`` (or ``resume``) asks for.

    :param messages: The run's input messages.
    :param inputs: Initial values for state keys.
    :param system_message: The rendered system prompt, if any (put first on a new conversation).
    :param user_message: The rendered user prompt, if any (appended to the messages).
    :param tools: The run's tools and toolsets (see :meth:`Toolbox.for_run`).
    :param streaming_callback: The streaming callback, selected for the driver.
    :param generation_kwargs: Per-run generation settings for the chat generator.
    :param hook_context: The caller's per-run resources for hooks (never stored).
    :param decisions: ``Agent.resume``'s decisions on interrupted tool calls, by call id.
    :param answers: ``Agent.resume``'s answers to ``interrupt()`` requests, by request id.
    :param traced_inputs: What the run span records as its input.
    :param model_callback: The callback given to the chat generator (the streaming callback, wrapped to emit
        ``ModelChunk`` events when someone listens); ``streaming_callback`` if None.
    :param sink: Where the run's events go, if someone listens (see :mod:`haystack_state.agent.events`).
    :param control: Lets another thread or process stop the run (see :class:`RunControl`).
    :param context: The run's dependencies (``run(context=...)``), handed to tools, hooks, loaders and the context
        policy in a :class:`RunContext`; never stored.
    :param on_unfinished_calls: This run's policy for an unfinished thread (the Agent's if None).
    :param run_id: The run's id, recorded in its checkpoints' metadata (``run_id``) when given; a fresh one that is
        not recorded if None.
    """

    messages: list[ChatMessage]
    inputs: Mapping[str, Any]
    tools: list[Tool | Toolset]
    system_message: ChatMessage | None = None
    user_message: ChatMessage | None = None
    streaming_callback: StreamingCallbackT | None = None
    generation_kwargs: dict[str, Any] | None = None
    hook_context: dict[str, Any] | None = None
    decisions: Mapping[str, DecisionLike] | None = None
    answers: Mapping[str, object] | None = None
    traced_inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_callback: StreamingCallbackT | None = None
    sink: EventSink | None = None
    control: RunControl | None = None
    context: object = None
    on_unfinished_calls: UnfinishedCalls | None = None
    run_id: str | None = None


class RunControl:
    """
    Stops a run from outside it: :meth:`request_stop` ends it at its next step boundary (``exit_reason="cancelled"``,
    its last checkpoint committed); :meth:`cancel` stops it before its next effect (a consumer stopped listening:
    what was committed stands, nothing more is).
    """

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._cancel = threading.Event()

    def request_stop(self) -> None:
        """End the run at its next step boundary."""
        self._stop.set()

    def cancel(self) -> None:
        """Stop the run before its next effect."""
        self._cancel.set()
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        """Whether the run should end at its next step boundary."""
        return self._stop.is_set()

    @property
    def cancelled(self) -> bool:
        """Whether the run should stop before its next effect."""
        return self._cancel.is_set()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a retry's backoff), or less if the run is cancelled meanwhile."""
        self._cancel.wait(seconds)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The per-run options of ``run``, ``resume`` and ``stream``, besides the messages and the state inputs."""

    streaming_callback: StreamingCallbackT | None = None
    thread_id: str | None = None
    checkpoint_id: str | None = None
    generation_kwargs: dict[str, Any] | None = None
    tools: ToolsArg | list[str] | None = None
    hook_context: dict[str, Any] | None = None
    decisions: Mapping[str, DecisionLike] | None = None
    context: object = None
    answers: Mapping[str, object] | None = None
    on_unfinished_calls: object = None
    run_id: str | None = None
    enable_streaming_callback_passthrough: bool | None = None
