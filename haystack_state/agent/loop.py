"""
The Agent's loop, written once as a generator of effects: it yields what it needs done (call the model, run the
tools, run hooks, commit a checkpoint) and receives the results. ``Agent.run`` executes the effects synchronously and
``Agent.run_async`` awaits them (:mod:`haystack_state.agent.drive`), so the two cannot drift apart.

A run follows haystack-ai 3.4's Agent step by step: ``before_run`` hooks; then each step runs ``before_llm`` hooks
(a hook that sets ``stop_run`` ends the run there), calls the model, and either exits (a reply without tool calls,
or a run without tools: exit reason ``text``, or ``length``/``content_filter`` from the reply's finish reason), or
runs ``before_tool`` hooks, the tool calls of the conversation's last message, and ``after_tool`` hooks; a
successful call of an exit-condition tool exits too. ``on_exit`` hooks may keep the run going (``continue_run``);
``after_run`` hooks run last. An empty reply (no text, no tool calls) does not end a run that has tools: the model
is asked again.

With a durable thread, a checkpoint is committed after the inputs, after each model reply, after each step's tool
results and, if hooks changed the state after that, at the end.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from haystack import logging
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.token_counters import TokenCounter
from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset

from haystack_state.agent.context import (
    ContextPlan,
    ContextPolicy,
    ContextSummary,
    ContextView,
    default_token_counter,
    token_meter,
)
from haystack_state.agent.context.summary import SummaryRequest
from haystack_state.agent.events import (
    CheckpointCommitted,
    CustomEvent,
    EventSink,
    Interrupted,
    ModelReply,
    Retrying,
    RunStarted,
    StateChanged,
    ToolCallFinished,
    ToolCallStarted,
)
from haystack_state.agent.hooks import is_hook_object
from haystack_state.agent.message_ids import SYSTEM_PROMPT_ID_PREFIX, new_message_id, with_id, with_ids
from haystack_state.agent.run_state import RunState
from haystack_state.agent.session import (
    HOOK_ANSWERS,
    Continuation,
    ThreadSession,
    UnfinishedCalls,
    before_request,
    in_call_order,
    plan_continuation,
    reset_run_scope,
)
from haystack_state.agent.spans import current_span, schema_tag, span, tracing_enabled
from haystack_state.agent.toolbox import Toolbox
from haystack_state.errors import AgentRunError, ThreadConflictError, ToolInvocationError
from haystack_state.invocation.arguments import safe_tool_calls
from haystack_state.invocation.calls import check_arguments
from haystack_state.invocation.outcome import BatchOutcome, PendingCall
from haystack_state.persistence.delta import Source
from haystack_state.retry import RetryPolicy, error_text
from haystack_state.runtime import RunContext, check_tool_deps
from haystack_state.schema import FieldSpec
from haystack_state.state import State
from haystack_state.tools.spec import ToolSpec

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_INTERRUPTED",
    "EXIT_MAX_STEPS",
    "EXIT_TEXT",
    "RESERVED_INPUTS",
    "RESERVED_OUTPUTS",
    "Backoff",
    "CallModel",
    "Commit",
    "Effect",
    "HoldThread",
    "HookInterrupt",
    "LoadField",
    "LoopConfig",
    "RunHooks",
    "RunControl",
    "RunRequest",
    "RunTools",
    "add_usage",
    "agent_loop",
]

logger = logging.getLogger(__name__)

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
EXIT_TEXT = "text"
_INPUT_READ_ONLY = (
    'it has "scope": "input", so it is set by the caller when a run starts (agent.run(..., {key}=...)) and '
    "tools and hooks may only read it."
)
EXIT_MAX_STEPS = "max_agent_steps"
EXIT_INTERRUPTED = "interrupted"
EXIT_CANCELLED = "cancelled"
#: Finish reasons that end a run on a reply without tool calls, as its exit reason (an incomplete reply).
EXIT_FINISH_REASONS = frozenset({"length", "content_filter"})


def add_usage(total: Any, usage: Any) -> Any:
    """
    Add a reply's ``usage`` meta to a running total, as haystack-ai does: numbers are summed, dicts are merged key by
    key, and any other value (a model name, a tier) is replaced by the newer one.

    :param total: The running total (not modified).
    :param usage: One reply's usage.
    :returns: The new total.
    """
    if type(total) in _NUMBERS and type(usage) in _NUMBERS:
        return total + usage
    if _is_mapping(total) and _is_mapping(usage):
        result = dict(total)
        for key, value in usage.items():
            result[key] = add_usage(result[key], value) if key in result else copy.deepcopy(value)
        return result
    if isinstance(total, int | float) and isinstance(usage, int | float):
        return total + usage
    return copy.deepcopy(usage)


_NUMBERS = frozenset({int, float})


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, dicts first: they skip the ABC check (usage is read at every step)."""
    return isinstance(value, (dict, Mapping))  # (the tuple checks dict first)


def _first_number(usage: Mapping[str, Any], keys: Sequence[str]) -> int:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return 0


def context_tokens(usage: Mapping[str, Any]) -> int:
    """
    The size of the context window a call used, from its reply's usage: input plus output tokens (OpenAI's
    ``prompt_tokens``/``completion_tokens``, or ``input_tokens``/``output_tokens``), as haystack-ai counts it.

    :param usage: One reply's usage.
    :returns: The token count (0 if the usage reports neither).
    """
    return _first_number(usage, ("prompt_tokens", "input_tokens")) + _first_number(
        usage, ("completion_tokens", "output_tokens")
    )


# --- effects ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class CallModel:
    """Effect: call the chat generator (or ``generator``, such as a summarizer) with these inputs; send back its
    result dict."""

    inputs: dict[str, Any]
    generator: Any = None


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class RunTools:
    """Effect: run the tool calls of these messages against the state (``hold`` ones not at all, ``answers`` for their
    ``interrupt()`` calls); send back the ``BatchOutcome``."""

    messages: list[ChatMessage]
    state: State
    specs: dict[str, ToolSpec]
    streaming_callback: StreamingCallbackT | None
    context: RunContext[Any] | None = None
    answers: Mapping[str, Sequence[Any]] | None = None
    hold: frozenset[str] = frozenset()
    on_call: Callable[[str, dict[str, Any]], None] | None = None


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class RunHooks:
    """Effect: run each hook with the state; send back their return values."""

    point: str
    hooks: list[Any]
    state: State
    #: For ``before_tool`` hooks: the answers to their ``interrupt()`` calls, which work in them; a hook that asks
    #: without an answer makes the effect send back a :class:`HookInterrupt` instead of the hooks' return values.
    answers: Sequence[Any] | None = None


@dataclasses.dataclass(frozen=True)
class HookInterrupt:
    """A ``before_tool`` hook called ``interrupt(value)`` without an answer: the step waits for a human."""

    value: Any
    index: int


@dataclasses.dataclass(slots=True)  # (not frozen: made at every step, and a frozen init costs more)
class Commit:
    """Effect: commit what the state changed as a checkpoint of the thread; send back the checkpoint's record."""

    session: ThreadSession
    state: State
    source: Source
    tool_names: tuple[str, ...]
    metadata: dict[str, Any]
    step: int


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Effect: wait this many seconds before the next attempt of a failed model call (``time.sleep`` or
    ``asyncio.sleep``; a cancelled run stops waiting)."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class HoldThread:
    """Effect: take the session's lease on its thread (before the run's first commit, model or tool call)."""

    session: ThreadSession


@dataclasses.dataclass(frozen=True)
class LoadField:
    """Effect: compute a ``"scope": "loaded"`` key with its loader, ``loader(context, state)`` (sync or async); send
    back the value."""

    key: str
    loader: Callable[..., Any]
    context: RunContext[Any]
    state: State


Effect = CallModel | RunTools | RunHooks | Commit | HoldThread | LoadField | Backoff


# --- configuration -----------------------------------------------------------------------------------------------


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
        :data:`~haystack_state.agent.session.UnfinishedCalls`); by how it stopped if None.
    :param resolved_schema: The run's state keys as haystack-ai lists them (``Agent.resolved_state_schema``), for the
        run span's ``haystack.agent.state_schema`` tag.
    :param model_retry: How a failed chat generator call is retried (see :mod:`haystack_state.retry`); never if None.
    """

    schema: dict[str, FieldSpec]
    toolbox: Toolbox
    exit_conditions: list[str]
    max_agent_steps: int
    hooks: dict[str, list[Any]]
    generator_streams: bool
    interrupt_before: frozenset[str] = frozenset()
    interrupt_after: frozenset[str] = frozenset()
    context_policy: ContextPolicy | None = None
    token_counter: Callable[[], TokenCounter] | None = None
    summary_key: str | None = None
    store: Any = None
    on_unfinished_calls: UnfinishedCalls | None = None
    resolved_schema: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    model_retry: RetryPolicy | None = None


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
    decisions: Mapping[str, Any] | None = None
    answers: Mapping[str, Any] | None = None
    traced_inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_callback: StreamingCallbackT | None = None
    sink: EventSink | None = None
    control: RunControl | None = None
    context: Any = None
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
        #: Called before each effect (a streaming consumer's back-pressure: the run waits until the events it
        #: emitted so far were taken, so that a consumer that stops listening stops the run where it saw it).
        self.gate: Callable[[], None] | None = None

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


class _Stopped(Exception):
    """
    The run failed: ``error`` is what the caller gets, raised after the thread records that the run stopped (unless
    ``record`` is false: a failed tool's calls stay pending, for a run without messages to finish them).
    """

    def __init__(self, error: Exception, *, record: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.record = record


# --- the loop --------------------------------------------------------------------------------------------------------


def agent_loop(
    config: LoopConfig, request: RunRequest, session: ThreadSession | None = None
) -> Generator[Effect, Any, dict[str, Any]]:
    """
    The agent loop as a generator of effects (see the module docstring).

    Every failure raised while the run is under way carries the State as it was: a ``ToolInvocationError`` (with
    ``raise_on_tool_invocation_failure``) gets it as ``state``; anything else (the chat generator, a hook) is raised
    as an ``AgentRunError`` chained to the cause. On a thread, the run records that it stopped before raising.

    Run without new messages on an unfinished run (a crash, an error or an interrupt came first, see
    :mod:`haystack_state.agent.session`), it continues that run: the run-scoped keys, the step count and the token
    usage are kept, ``before_run`` hooks are not run again, and the tool calls whose results were never committed run
    first (``request.decisions``, from ``Agent.resume``, approve, reject or edit them).

    :param config: The agent's settings.
    :param request: The run's inputs.
    :param session: The thread to load and commit to, if any.
    :returns: The run, as a generator of effects that returns the run's outputs.
    :raises ValueError: For unknown inputs, or a run that does not fit the thread's pending calls (nothing is
        committed).
    """
    return AgentRun(config, request, session).execute()


class AgentRun:
    """One run of the loop: its state, counters and steps. Built before anything is committed; raises if invalid."""

    def __init__(self, config: LoopConfig, request: RunRequest, session: ThreadSession | None) -> None:
        unknown = sorted(set(request.inputs) - set(config.schema))
        if unknown:
            raise ValueError(f"Agent.run got unknown inputs {unknown}; the state keys are: {', '.join(config.schema)}.")
        for key in request.inputs:
            spec = config.schema[key]
            if spec.scope == "loaded":
                raise ValueError(
                    f'State key \'{key}\' has "scope": "loaded": its loader computes it at the start of every run, '
                    "so it cannot be given to run()."
                )
            if not spec.is_input:
                raise ValueError(
                    f"State key '{key}' is private to the agent (\"input\": False in the schema): it cannot be given "
                    "to run()."
                )
        if config.interrupt_before and session is None:
            raise ValueError(
                f"This agent stops before {', '.join(sorted(config.interrupt_before))} for a human's approval, which "
                "needs a durable thread to resume from: run it with thread_id=..."
            )
        self.config = config
        self.request = request
        self.session = session
        self.hooks = config.hooks
        self.hook_points = frozenset(point for point, hooks in config.hooks.items() if hooks)
        self.traced = tracing_enabled()
        self.planned: Continuation | None = None
        #: The run's new messages, held back until the thread's unfinished step is finished or closed.
        self.then_input = False
        self.held: list[ChatMessage] = []
        self.continuing = False
        self.pending: list[ToolCall] = []
        if session is not None:
            # raises before anything is committed
            policy = request.on_unfinished_calls or config.on_unfinished_calls
            self.planned = plan_continuation(session, request.messages, request.decisions, request.answers, policy)
            self.then_input = self.planned is not None and self.planned.then_input
            self.continuing = session.continues and (not request.messages or self.then_input)
            self.pending = session.pending
        self.state = self._prepare_state()
        inputs = {key: _INPUT_READ_ONLY.format(key=key) for key, spec in config.schema.items() if spec.scope == "input"}
        if inputs:
            self.state.protect(inputs)
        self.step = session.run_step if session is not None and self.continuing else 0
        self.base_step = session.step - self.step if session is not None else 0
        self.current = max(self.step, 1)  # the step under way, for error messages
        self.exit_reason: str | None = None
        self.waiting: list[ToolCall] = []  # the calls without results that an interrupt left
        self.requests: list[dict[str, Any]] = []  # what the interrupted run waits for (see ThreadSnapshot.interrupts)
        self.answers: dict[str, list[Any]] = dict(self.planned.answers) if self.planned is not None else {}
        self.mirror: list[ChatMessage] | None = None  # see _conversation
        self.counter: TokenCounter | None = None
        self.mirror_mark: tuple[Any, int] | None = None
        self.tools = config.toolbox.resolve(request.tools)
        check_tool_deps(self.tools.specs, request.context)  # a mismatch fails the run before anything is written
        if self.planned is not None and request.decisions:
            self._check_edits(request.decisions)
        # Toolsets are read again at every step: one may discover tools during the run.
        self.dynamic_tools = any(isinstance(item, Toolset) for item in request.tools)
        values = self.state.run_values
        if request.run_id is not None:
            self.run_id = request.run_id
        else:
            self.run_id = request.sink.run_id if request.sink is not None else str(uuid.uuid4())
        self.run_context: RunContext[Any] = RunContext(
            request.context,
            thread_id=session.thread_id if session is not None else None,
            run_id=self.run_id,
            step=self.step,
            store=config.store,
            emitter=self._emit_custom if request.sink is not None else None,
        )
        values["context"] = self.run_context
        self.loaded: list[str] = []  # the "loaded" keys computed for this run, until a checkpoint records them
        #: The retried model and tool calls (a retry policy's), until a checkpoint records them (``retries``).
        self.retries: list[dict[str, Any]] = []
        self.model_attempts = 1  # the attempts of the model call under way, for its error message
        values["hook_context"] = request.hook_context if request.hook_context is not None else {}
        values["tools"] = self.tools.tools
        values["step_count"] = self.step
        previous = session.run_metadata() if session is not None and self.continuing else {}
        if session is not None and self.continuing:
            values["token_usage"] = session.run_usage
        counts = previous.get("tool_call_counts")
        values["tool_call_counts"] = {name: 0 for name in self.tools.specs} | (
            dict(counts) if isinstance(counts, dict) else {}
        )

    # --- setting up ------------------------------------------------------------------------------------------------

    def _check_edits(self, decisions: Mapping[str, Any]) -> None:
        """Edited arguments (``resume``'s ``{"arguments": {...}}``) must fit the tool's parameters; else ValueError."""
        assert self.planned is not None
        calls = {call.id: call for message in self.planned.calling for call in message.tool_calls}
        for call_id, decision in decisions.items():
            call = calls.get(call_id)
            if call is None or not isinstance(decision, Mapping):
                continue
            spec = self.tools.specs.get(call.tool_name)
            if spec is None:
                continue
            try:
                check_arguments(spec, dict(call.arguments))
            except ToolInvocationError as error:
                raise ValueError(
                    f"resume: the edited arguments of call '{call_id}' do not fit tool '{call.tool_name}': {error} "
                    "Nothing was written; the thread is still interrupted."
                ) from error

    def _prepare_state(self) -> RunState:
        """
        The run's State: fresh, or the thread's with the run-scoped keys reset (unless the run continues an
        unfinished one); then the inputs and messages (the system prompt first on a new conversation, the rendered
        user prompt after the messages).
        """
        config, request, session = self.config, self.request, self.session
        if session is None:
            state = RunState({key: spec.as_entry() for key, spec in config.schema.items()})
        else:
            state = RunState.adopt(session.load_state())
            if not session.is_new and not self.continuing:
                reset_run_scope(state)
        state.update({key: value for key, value in request.inputs.items() if value is not None})
        conversation = with_ids(request.messages)  # a message keeps the id it came with
        if request.user_message is not None:
            conversation.append(with_id(request.user_message))
        is_new = session is None or session.is_new
        system = request.system_message
        if is_new and system is not None and not (conversation and conversation[0].is_from("system")):
            conversation.insert(0, with_id(system, SYSTEM_PROMPT_ID_PREFIX + new_message_id()))
        stored = len(state.view("messages") or [])
        # Where this run's own messages start: its latest user message (what came before it in the input is history
        # the caller passed along), or, without one, the end of the stored conversation. A continued run keeps the
        # start of the run it continues.
        users = [i for i, message in enumerate(conversation) if message.is_from("user")]
        self.run_start = stored + users[-1] if users else stored + len(conversation)
        previous = session.run_metadata().get("run_start") if session is not None and self.continuing else None
        if isinstance(previous, int) and 0 <= previous <= stored:
            self.run_start = previous
        if self.then_input:  # taken once the unfinished step is finished or closed (see _take_held_input)
            self.held = conversation
        elif conversation:
            state.set("messages", conversation)
        if all(message.is_from("system") for message in itertools.chain(state.view("messages") or [], self.held)):
            # As haystack-ai's Agent: the model is about to get nothing but instructions (or nothing at all).
            logger.warning("All messages provided to the Agent component are system messages. This is not recommended.")
        return state

    def _take_held_input(self) -> Iterable[Effect]:
        """Append the new messages held back while the thread's unfinished step was finished or closed."""
        held, self.held = self.held, []
        stored = len(self.state.view("messages") or [])
        users = [i for i, message in enumerate(held) if message.is_from("user")]
        self.run_start = stored + users[-1] if users else stored
        self.state.run_values["exit_reason"] = None
        if held:
            self.state.set("messages", held)
        return self._commit("input", continues=True)

    def _emit_custom(self, name: str, data: Any = None) -> None:
        """Deliver a ``CustomEvent`` (``RunContext.emit``, ``RunState.emit``) to the run's listener."""
        sink = self.request.sink
        if sink is not None:
            sink.emit(CustomEvent, name=str(name), data=data)

    def _at_step(self, step: int) -> None:
        """The step under way changed: the run context follows it."""
        context = self.run_context.at_step(step)
        if context is not self.run_context:
            self.run_context = context
            self.state.run_values["context"] = context

    def _load_fields(self) -> Generator[Effect, Any, None]:
        """
        Compute the ``"scope": "loaded"`` keys with their loaders, in schema order, before anything is sent to the
        model. Their values are never stored: a checkpoint records only which keys were loaded. A loader that fails
        (or returns a value of the wrong type) fails the run, naming the key.
        """
        for key, spec in self.config.schema.items():
            if spec.scope != "loaded" or spec.loader is None:
                continue
            try:
                value = yield LoadField(key, spec.loader, self.run_context, self.state)
                self.state.set(key, value)
            except Exception as exc:
                error = AgentRunError(
                    f"Agent: the loader of state key '{key}' failed before the model was called: "
                    f"{type(exc).__name__}: {exc}",
                    self.state,
                )
                error.__cause__ = exc
                raise _Stopped(error, record=False) from None
            self.loaded.append(key)

    # --- effects the loop yields -----------------------------------------------------------------------------------

    def _fail(self, stage: str, exc: Exception, attempts: int = 1) -> _Stopped:
        """The failure to raise for an effect that raised (on its last of ``attempts``): the error carries the state."""
        if isinstance(exc, ToolInvocationError):
            exc.state = self.state
            return _Stopped(exc, record=False)
        after = f" after {attempts} attempts" if attempts > 1 else ""
        error = AgentRunError(
            f"Agent: {stage} failed at step {self.current}{after}: {type(exc).__name__}: {exc}", self.state
        )
        error.__cause__ = exc
        return _Stopped(error)

    def _commit(
        self,
        source: Source,
        tool_names: Sequence[str] = (),
        *,
        continues: bool = False,
        force: bool = False,
        **extra: Any,
    ) -> Iterable[Effect]:
        """Commit a checkpoint (an ``input`` or ``update`` one only if the state changed, unless ``force``)."""
        session, state, sink = self.session, self.state, self.request.sink
        if session is None:
            if sink is not None:  # no checkpoint: the changes are streamed where one would be committed
                self._stream_changes(state.peek_changes(transient=True))
                state.drain_changes()
            return ()
        if source in ("input", "update") and not force and not state.has_changes():
            return ()  # nothing to do: no generator to make
        return self._commit_effect(session, source, tool_names, continues=continues, extra=extra)

    def _stream_changes(self, delta: Mapping[str, Mapping[str, Any]]) -> None:
        """Emit a ``StateChanged`` event per key of a journal delta (see :meth:`State.peek_changes`)."""
        sink = self.request.sink
        if sink is None:
            return
        for key, op in delta.items():
            if op["op"] == "extend":
                sink.emit(StateChanged, key=key, op="append", items=list(op["items"]))
            elif op["op"] == "replace":
                sink.emit(StateChanged, key=key, op="replace", value=op["value"])
            else:
                sink.emit(StateChanged, key=key, op="reset")

    def _commit_effect(
        self,
        session: ThreadSession,
        source: Source,
        tool_names: Sequence[str],
        *,
        continues: bool,
        extra: dict[str, Any],
    ) -> Generator[Effect, Any, None]:
        state = self.state
        values = state.run_values
        metadata: dict[str, Any] = {"run_step": self.step, "run_start": self.run_start, **extra}
        if self.request.run_id is not None:
            metadata["run_id"] = self.request.run_id
        if values["token_usage"]:
            metadata["usage"] = values["token_usage"]
        if any(values["tool_call_counts"].values()):
            metadata["tool_call_counts"] = {k: v for k, v in values["tool_call_counts"].items() if v}
        if continues:
            metadata["continues"] = True
        if self.requests:
            metadata.update(interrupted=True, pending=[call.id for call in self.waiting], interrupts=self.requests)
            if self.answers:
                metadata["answers"] = self.answers
        if self.loaded:
            metadata["loaded"] = self.loaded
            self.loaded = []
        if self.retries:
            metadata["retries"] = self.retries
            self.retries = []
        tags = {"haystack_state.thread_id": session.thread_id, "haystack_state.checkpoint.source": source}
        sink = self.request.sink
        delta = state.peek_changes(transient=True) if sink is not None else None
        with span("haystack_state.checkpoint.commit", tags) as commit_span:
            meta = yield Commit(session, state, source, tuple(tool_names), metadata, self.base_step + self.step)
            commit_span.set_tag("haystack_state.checkpoint.id", meta.checkpoint_id)
        if sink is not None and delta is not None:
            self._stream_changes(delta)
            sink.emit(CheckpointCommitted, checkpoint_id=meta.checkpoint_id, step=meta.step, source=meta.source)

    def _hooks(self, point: str) -> Generator[Effect, Any, list[Any]]:
        hooks = self.hooks.get(point)
        if not hooks:
            return []
        try:
            returned: list[Any] = yield RunHooks(point, hooks, self.state)
        except Exception as exc:
            raise self._fail(f"the '{point}' hook", exc) from None
        return returned

    def _conversation(self) -> list[ChatMessage]:
        """
        The conversation to send the model: a list the run keeps in step with the state's ``messages``, extended by
        what was appended since the last call (so a step costs no copy of the whole history), and read again whole
        only when ``messages`` was replaced (a hook or handler rewrote it). As in haystack-ai, the chat generator is
        given a list it must not change.
        """
        mirror, mark = self.mirror, self.mirror_mark
        added = self.state.appended_since("messages", mark) if mirror is not None and mark is not None else None
        if mirror is None or added is None or len(mirror) != mark[1]:  # type: ignore[index]
            mirror = self.mirror = list(self.state.view("messages") or [])
        else:
            mirror.extend(added)
        self.mirror_mark = self.state.watch("messages")
        return mirror

    def _call_model(self, step_span: Any) -> Generator[Effect, Any, list[ChatMessage]]:
        request = self.request
        conversation = self._conversation()
        sent: list[ChatMessage] = conversation
        if self.config.context_policy is not None:
            sent = yield from self._plan_context(conversation)
        inputs: dict[str, Any] = {"messages": sent}
        if self.tools.model_tools:
            inputs["tools"] = self.tools.model_tools
        reply_id = new_message_id()  # decided now, so the reply's streamed chunks carry it too
        if request.sink is not None:
            request.sink.step = self.step + 1
            request.sink.message_id = reply_id
        callback = request.model_callback or request.streaming_callback
        if callback is not None and self.config.generator_streams:
            inputs["streaming_callback"] = callback
        if request.generation_kwargs is not None:
            inputs["generation_kwargs"] = request.generation_kwargs
        with span("haystack.agent.step.llm", parent=step_span) as llm_span:
            if self.traced:
                llm_span.set_content_tag("haystack.agent.step.llm.input", inputs)
            try:
                result = yield from self._model_attempts(inputs)
                replies: list[ChatMessage] = [
                    with_id(safe_tool_calls(reply), reply_id if i == 0 else None)
                    for i, reply in enumerate(result["replies"])
                ]
                self.state.set("messages", replies)
            except Exception as exc:
                raise self._fail("the chat generator", exc, self.model_attempts) from None
            if self.model_attempts > 1:
                llm_span.set_tag("haystack_state.retry.attempts", self.model_attempts)
            if self.traced:
                llm_span.set_content_tag("haystack.agent.step.llm.output", result)
        if self.request.sink is not None:
            for reply in replies:
                self.request.sink.emit(ModelReply, step=self.step + 1, message=reply)
        values = self.state.run_values
        for reply in replies:
            usage = reply.meta.get("usage")
            if _is_mapping(usage):
                values["token_usage"] = add_usage(values["token_usage"], usage)
        last_usage = replies[-1].meta.get("usage") if replies else None
        if _is_mapping(last_usage) and (tokens := context_tokens(last_usage)):
            values["context_tokens"] = tokens
        elif self.config.context_policy is not None:  # no usage reported: what the policy had counted
            values["context_tokens"] = token_meter(self._counter()).total(sent, self.tools.model_tools)
        return replies

    def _model_attempts(self, inputs: dict[str, Any]) -> Generator[Effect, Any, Any]:
        """
        Call the chat generator; while the model retry policy allows, call it again after a backoff. A retried call
        is recorded for the next checkpoint's ``retries`` metadata, whether it succeeded or not.
        """
        policy = self.config.model_retry
        failures: list[str] = []
        self.model_attempts = 1
        while True:
            try:
                result = yield CallModel(inputs)
            except Exception as exc:
                failures.append(error_text(exc))
                delay = policy.next_delay(len(failures), exc) if policy is not None else None
                if delay is None:
                    if len(failures) > 1:
                        self._record_retry(failures, succeeded=False)
                    raise
                assert policy is not None
                self._retrying_model(policy, len(failures), exc, failures[-1], delay)
                yield Backoff(delay)
                self.model_attempts += 1
                continue
            if failures:
                self._record_retry(failures, succeeded=True)
            return result

    def _record_retry(self, failures: list[str], *, succeeded: bool) -> None:
        attempts = len(failures) + (1 if succeeded else 0)
        self.retries.append(
            {"kind": "model", "step": self.step + 1, "attempts": attempts, "succeeded": succeeded, "errors": failures}
        )

    def _retrying_model(self, policy: RetryPolicy, attempt: int, exc: Exception, text: str, delay: float) -> None:
        logger.warning(
            "Agent: the chat generator failed at step {step} (attempt {attempt} of {attempts}): {error}; retrying in "
            "{delay:.3g} s.",
            step=self.step + 1,
            attempt=attempt,
            attempts=policy.max_attempts,
            error=text,
            delay=delay,
        )
        sink = self.request.sink
        if sink is not None:
            sink.emit(
                Retrying,
                step=self.step + 1,
                kind="model",
                attempt=attempt,
                max_attempts=policy.max_attempts,
                delay=delay,
                error=text,
                error_type=type(exc).__name__,
            )

    # --- the context the model sees ----------------------------------------------------------------------------

    def _counter(self) -> TokenCounter:
        if self.counter is None:
            make = self.config.token_counter
            self.counter = make() if make is not None else default_token_counter()
        return self.counter

    def _view(self, conversation: list[ChatMessage], summary: ContextSummary | None) -> ContextView:
        return ContextView(
            conversation,
            min(self.run_start, len(conversation)),
            summary=summary,
            counter=self._counter(),
            tools=self.tools.model_tools,
            context=self.run_context,
        )

    def _plan_context(self, conversation: list[ChatMessage]) -> Generator[Effect, Any, list[ChatMessage]]:
        """
        What the model is sent: the policy's plan. If it asks for a summary first, the summarizer writes one (the
        ``context_summary`` key, committed on its own checkpoint) and the policy plans again with it; if the
        summarizer fails, the first plan is sent (it is a valid context) and the next step asks again.
        """
        policy = self.config.context_policy
        assert policy is not None
        key = self.config.summary_key
        summary = self.state.get(key) if key is not None else None
        plan: ContextPlan = policy.plan(self._view(conversation, summary))
        if plan.summarize is not None and key is not None:
            written = yield from self._summarize(plan.summarize, key)
            if written is not None:
                plan = policy.plan(self._view(conversation, written))
        return list(plan.messages)

    def _summarize(self, request: SummaryRequest, key: str) -> Generator[Effect, Any, ContextSummary | None]:
        try:
            result = yield CallModel({"messages": request.prompt()}, generator=request.chat_generator)
            replies: list[ChatMessage] = list(result["replies"])
            summary = request.result(replies)
        except Exception as exc:  # a summary is an optimization: the run goes on without it
            logger.warning(
                "Agent: the summarizer failed ({error_type}: {error}); sending the conversation without a new "
                "summary, and asking again at the next step.",
                error_type=type(exc).__name__,
                error=exc,
            )
            return None
        values = self.state.run_values
        for reply in replies:
            usage = reply.meta.get("usage")
            if isinstance(usage, Mapping):
                values["token_usage"] = add_usage(values["token_usage"], usage)
        self.state.set(key, summary)
        covers = {"covers": list(summary.covers), "tokens": summary.tokens}
        yield from self._commit("update", continues=True, context_summary=covers)
        return summary

    def _run_tools(
        self,
        calling: list[ChatMessage],
        rejected: Mapping[str, ChatMessage],
        order: list[str | None],
        hold: frozenset[str] = frozenset(),
    ) -> Generator[Effect, Any, tuple[list[ChatMessage], list[PendingCall]]]:
        """
        Run the tool calls of ``calling`` (the ``hold`` ones not at all); put their results (and the rejected calls')
        in order in the state. Returns the results and the calls left waiting for a human.
        """
        outcome: BatchOutcome | None = None
        if calling:
            sink = self.request.sink
            try:
                outcome = yield RunTools(
                    calling,
                    self.state,
                    self.tools.specs,
                    self.request.streaming_callback,
                    self.run_context,
                    self.answers or None,
                    hold,
                    self._on_call if sink is not None else None,
                )
            except Exception as exc:
                raise self._fail("a tool call", exc) from None
        executed = outcome.messages if outcome is not None else []
        if outcome is not None and outcome.retries:
            self.retries.extend({**retry, "step": self.step} for retry in outcome.retries)
        tool_messages = with_ids(in_call_order(order, executed, rejected))
        self.state.set("messages", tool_messages)
        counts = self.state.run_values["tool_call_counts"]
        for message in tool_messages:
            if message.tool_call_result is not None:
                name = message.tool_call_result.origin.tool_name
                counts[name] = counts.get(name, 0) + 1
        if "after_tool" in self.hook_points and tool_messages:
            yield from self._hooks("after_tool")
        return tool_messages, (outcome.interrupts if outcome is not None else [])

    def _on_call(self, kind: str, data: dict[str, Any]) -> None:
        """The tool runner's per-call events, as ``ToolCallStarted``/``ToolCallFinished`` events."""
        sink = self.request.sink
        if sink is None:
            return
        step = self.step
        if kind == "started":
            sink.emit(
                ToolCallStarted,
                step=step,
                tool_name=data["tool_name"],
                call_id=data["call_id"],
                arguments=dict(data.get("arguments") or {}),
            )
        elif kind == "retrying":
            sink.emit(
                Retrying,
                step=step,
                kind="tool",
                attempt=int(data["attempt"]),
                max_attempts=int(data["max_attempts"]),
                delay=float(data["delay"]),
                error=str(data["error"]),
                error_type=str(data["error_type"]),
                tool_name=data["tool_name"],
                call_id=data["call_id"],
            )
        elif kind == "finished":
            message = data.get("message")
            result = message.tool_call_result if message is not None else None
            sink.emit(
                ToolCallFinished,
                step=step,
                tool_name=data["tool_name"],
                call_id=data["call_id"],
                result=result.result if result is not None else str(data.get("result")),
                error=bool(data.get("error")),
                duration=float(data.get("duration_s") or 0.0),
            )

    def _wait_for(self, pending: list[PendingCall], calls: list[ToolCall]) -> None:
        """The step stops for a human: record what it waits for (committed with the step's checkpoint)."""
        self.waiting = [call for call in calls if call.id in {p.call_id for p in pending}]
        requests = []
        for waiting in pending:
            if waiting.reason == "held":
                requests.append(before_request(waiting.tool_call))
            elif waiting.reason == "interrupt":
                requests.append(
                    {
                        "id": f"int-{uuid.uuid4().hex[:12]}",
                        "kind": "interrupt",
                        "tool_name": waiting.tool_name,
                        "call_id": waiting.call_id,
                        "arguments": dict(waiting.arguments),
                        "value": waiting.value,
                        "index": waiting.index,
                    }
                )
        self.requests = requests

    def _exit_tool(self, calling: list[ChatMessage], tool_messages: list[ChatMessage]) -> str | None:
        """The exit-condition tool that a step called successfully, if any (an errored one cancels the exit)."""
        if self.config.exit_conditions == [EXIT_TEXT]:
            return None
        failed = {
            m.tool_call_result.origin.tool_name
            for m in tool_messages
            if m.tool_call_result and m.tool_call_result.error
        }
        first: str | None = None
        for message in calling:
            for call in message.tool_calls:
                if call.tool_name not in self.config.exit_conditions:
                    continue
                if call.tool_name in failed:
                    return None
                first = first or call.tool_name
        return first

    def _keep_going_on_exit(self) -> Generator[Effect, Any, bool]:
        """
        Run the ``on_exit`` hooks; whether one asked to keep going: set ``continue_run``, or, for a plain callable (not
        a ``Hook`` object, whose return value haystack-ai ignores), returned True.
        """
        if "on_exit" not in self.hook_points:
            return False
        values = self.state.run_values
        values["continue_run"] = False
        returned = yield from self._hooks("on_exit")
        hooks = self.hooks["on_exit"]
        keep_going = bool(values["continue_run"]) or any(
            r is True and not is_hook_object(h) for h, r in zip(hooks, returned, strict=True)
        )
        values["continue_run"] = False
        return keep_going

    def _tool_step(
        self,
        calling: list[ChatMessage],
        rejected: Mapping[str, ChatMessage],
        order: list[str | None],
        hold: frozenset[str] = frozenset(),
    ) -> Generator[Effect, Any, str | None]:
        """
        Run a step's tool calls and commit their results; the exit-condition tool that fired, if any, or
        ``EXIT_INTERRUPTED`` if the step stopped for a human (a held call, an ``interrupt()``, ``interrupt_after``).
        """
        tool_messages, pending = yield from self._run_tools(calling, rejected, order, hold)
        names = [m.tool_call_result.origin.tool_name for m in tool_messages if m.tool_call_result is not None]
        self.state.run_values["step_count"] = self.step
        if pending:
            self._wait_for(pending, [call for message in calling for call in message.tool_calls])
            yield from self._commit("tools", names, continues=True)
            return EXIT_INTERRUPTED
        reviews = self._reviews(tool_messages)
        if reviews:
            self.requests = reviews
            yield from self._commit("tools", names, continues=True)
            return EXIT_INTERRUPTED
        exit_tool = self._exit_tool(calling, tool_messages)
        continues = exit_tool is None and self.step < self.config.max_agent_steps
        yield from self._commit("tools", names, continues=continues)
        return exit_tool

    def _reviews(self, tool_messages: list[ChatMessage]) -> list[dict[str, Any]]:
        """The ``interrupt_after`` requests of a step's results: a human reviews them before the run goes on."""
        if self.session is None or not self.config.interrupt_after:
            return []
        return [
            {
                "id": f"review-{message.tool_call_result.origin.id}",
                "kind": "after",
                "tool_name": message.tool_call_result.origin.tool_name,
                "call_id": message.tool_call_result.origin.id,
                "arguments": dict(message.tool_call_result.origin.arguments),
                "value": message.tool_call_result.result,
            }
            for message in tool_messages
            if message.tool_call_result is not None
            and message.tool_call_result.origin.tool_name in self.config.interrupt_after
        ]

    def _before_tool(self, answers: Sequence[Any] = ()) -> Generator[Effect, Any, bool]:
        """
        Run the ``before_tool`` hooks, where ``interrupt()`` works; whether one asked a human (the step then waits,
        its calls pending, and the thread is committed interrupted).
        """
        if "before_tool" not in self.hook_points:
            return False
        try:
            returned = yield RunHooks("before_tool", self.hooks["before_tool"], self.state, list(answers))
        except Exception as exc:
            raise self._fail("the 'before_tool' hook", exc) from None
        if not isinstance(returned, HookInterrupt):
            return False
        last = self.state.last("messages")
        self.waiting = list(last.tool_calls) if last is not None and last.is_from("assistant") else []
        self.answers[HOOK_ANSWERS] = list(answers)[: returned.index]
        self.requests = [
            {
                "id": f"int-{uuid.uuid4().hex[:12]}",
                "kind": "hook",
                "tool_name": ", ".join(call.tool_name for call in self.waiting),
                "call_id": None,
                "arguments": {},
                "value": returned.value,
                "index": returned.index,
            }
        ]
        yield from self._commit("update", force=True, continues=True)
        return True

    def _calling_after_hooks(self, replies: list[ChatMessage]) -> list[ChatMessage]:
        """
        The message whose tool calls run: after ``before_tool`` hooks (which may rewrite it, or answer its calls),
        the conversation's last message.
        """
        if "before_tool" not in self.hook_points:
            return [reply for reply in replies if reply.tool_calls]
        last = self.state.last("messages")
        return [last] if last is not None and last.tool_calls else []

    def _step(self, run_span: Any) -> Generator[Effect, Any, str | None]:
        """One step: hooks, the model call, its tool calls. Returns the exit reason, or None to go on."""
        config = self.config
        step_tags = {"haystack.agent.step": self.step}
        with span("haystack.agent.step", step_tags, run_span) as step_span:
            if self.dynamic_tools:
                self.tools = config.toolbox.resolve(self.request.tools)
                self.state.run_values["tools"] = self.tools.tools
            control = self.request.control
            if control is not None and control.stop_requested:
                return EXIT_CANCELLED
            if self.session is not None and self.session.stop_requested:  # Agent.cancel, from any process
                return EXIT_CANCELLED
            self._at_step(self.step + 1)
            if "before_llm" in self.hook_points:
                yield from self._hooks("before_llm")
            stop = self.state.run_values["stop_run"]
            if stop is not None:
                return str(stop)
            replies = yield from self._call_model(step_span)
            self.step += 1
            calls = [call for reply in replies for call in reply.tool_calls]
            hold = frozenset(
                call.id
                for call in calls
                if self.session is not None and call.tool_name in config.interrupt_before and call.id is not None
            )
            if hold and len(hold) == len(calls):  # every call waits: stop before the tools (and their hooks)
                self.waiting = calls
                self.requests = [before_request(call) for call in calls]
                self.state.run_values["step_count"] = self.step
                yield from self._commit("model", continues=True)
                return EXIT_INTERRUPTED
            yield from self._commit("model", continues=bool(calls))
            if not self.tools.specs or not calls:
                reason = _model_exit_reason(replies, has_tools=bool(self.tools.specs))
                self.state.run_values["step_count"] = self.step
                if reason is None:  # an empty reply: ask again
                    return None
                return None if (yield from self._exit(reason)) else reason
            if (yield from self._before_tool()):
                return EXIT_INTERRUPTED
            calling = self._calling_after_hooks(replies)
            hold = hold & {call.id for message in calling for call in message.tool_calls}
            exit_tool = yield from self._tool_step(calling, {}, [], hold)
            if exit_tool == EXIT_INTERRUPTED:
                return exit_tool
            if exit_tool is not None and not (yield from self._exit(exit_tool)):
                return exit_tool
            return None

    def _continue(self, plan: Continuation) -> Generator[Effect, Any, str | None]:
        """Finish the thread's unfinished step (see :func:`plan_continuation`); the exit reason, or None to go on."""
        calling = plan.calling
        resuming = self.request.decisions is not None or self.request.answers is not None
        if plan.hooks or (not resuming and calling):
            before = self.state.last("messages")
            if (yield from self._before_tool(plan.answers.get(HOOK_ANSWERS, ()))):
                return EXIT_INTERRUPTED
            # Some of the step's calls may have results already (an interrupt held the others): then the calls to
            # run are the planned ones, unless a hook added messages.
            if before is None or before.is_from("assistant") or self.state.last("messages") is not before:
                calling = self._calling_after_hooks(calling)
        if not calling and not plan.rejected:  # a review (interrupt_after) was answered: the run goes on
            return None
        reason = yield from self._tool_step(calling, plan.rejected, plan.order)
        if reason not in (None, EXIT_INTERRUPTED) and (yield from self._exit(str(reason))):
            return None
        return reason

    def _exit(self, reason: str) -> Generator[Effect, Any, bool]:
        """The run is about to stop for ``reason``: whether ``on_exit`` hooks keep it going."""
        self.state.run_values["exit_reason"] = reason
        keep_going = yield from self._keep_going_on_exit()
        if keep_going:
            self.state.run_values["exit_reason"] = None
        return keep_going

    def execute(self) -> Generator[Effect, Any, dict[str, Any]]:
        """The run (see the module docstring)."""
        with span("haystack.agent.run", self._run_tags(), current_span()) as run_span:
            run_span.set_content_tag("haystack.agent.input", self.request.traced_inputs)
            if self.request.sink is not None:
                head = self.session.head_id if self.session is not None else None
                self.request.sink.emit(RunStarted, checkpoint_id=head, continuing=self.continuing)
            try:
                if self.session is not None:
                    # The run's inputs are checked: from here on, no other run may take the thread.
                    yield HoldThread(self.session)
                yield from self._load_fields()
                yield from self._commit("input", continues=True)
                if not self.continuing:
                    if "before_run" in self.hook_points:
                        yield from self._hooks("before_run")
                    # A before_run hook can restore a saved state: the step counter follows its step_count.
                    self.step = int(self.state.run_values["step_count"])
                reason: str | None = None
                if self.planned is not None:
                    reason = yield from self._continue(self.planned)
                    if self.then_input and reason != EXIT_INTERRUPTED:  # the new messages come now, and the run goes on
                        yield from self._take_held_input()
                        reason = None
                while reason is None and self.step < self.config.max_agent_steps:
                    self.current = self.step + 1
                    reason = yield from self._step(run_span)
                if reason == EXIT_INTERRUPTED and self.request.sink is not None:
                    self.request.sink.emit(Interrupted, requests=self.pending_requests())
                if reason is None:
                    logger.warning(
                        "Agent reached maximum agent steps of {max_agent_steps}, stopping.",
                        max_agent_steps=self.config.max_agent_steps,
                    )
                    reason = EXIT_MAX_STEPS
                self.exit_reason = reason
                self.state.run_values["exit_reason"] = reason
                self.state.run_values["step_count"] = self.step
                if "after_run" in self.hook_points:
                    yield from self._hooks("after_run")
                yield from self._commit("update", continues=bool(self.requests))
                outputs = self._outputs()
            except _Stopped as stopped:
                if stopped.record:
                    yield from self._record_stop(stopped.error)
                raise stopped.error from stopped.error.__cause__
            run_span.set_content_tag("haystack.agent.output", outputs)
            run_span.set_tag("haystack.agent.steps_taken", self.step)
        return outputs

    def _run_tags(self) -> dict[str, Any]:
        config = self.config
        tags: dict[str, Any] = {
            "haystack.agent.max_steps": config.max_agent_steps,
            "haystack.agent.tools": self.tools.tools,
            "haystack.agent.exit_conditions": config.exit_conditions,
        }
        if tracing_enabled():
            tags["haystack.agent.state_schema"] = schema_tag(config.resolved_schema)
        if self.session is not None:
            tags["haystack_state.thread_id"] = self.session.thread_id
        return tags

    def _record_stop(self, error: Exception) -> Generator[Effect, Any, None]:
        """
        The run ends here, in this process: record that on the thread, so that a new run may start on it. (A crashed
        run cannot do this: its thread stays marked until agent.run([], thread_id=...) finishes it.) Tool calls left
        pending by a failed tool stay pending; so does a thread another run has taken.
        """
        if (
            self.session is None
            or isinstance(error, ThreadConflictError)
            or isinstance(error.__cause__, ThreadConflictError)
        ):
            return
        try:
            yield from self._commit("update", force=True, stopped=str(error)[:500])
        except Exception as exc:  # the original failure is what the caller must see
            logger.warning(
                "Agent: could not record on thread '{thread_id}' that the run stopped: {error}",
                thread_id=self.session.thread_id,
                error=exc,
            )

    def pending_requests(self) -> list[dict[str, Any]]:
        """The requests a human must answer before the run goes on (JSON-ready; see ``ThreadSnapshot.interrupts``)."""
        return [dict(request) for request in self.requests]

    def _outputs(self) -> dict[str, Any]:
        state, values = self.state, self.state.run_values
        messages = list(state.view("messages") or [])
        # As in haystack-ai, a key nothing set (and without a default) is left out; so are private outputs.
        outputs: dict[str, Any] = {
            key: state.get(key)
            for key, spec in self.config.schema.items()
            if key != "messages" and spec.is_output and state.has(key)
        }
        outputs.update(
            messages=messages,
            last_message=messages[-1] if messages else None,
            step_count=self.step,
            exit_reason=self.exit_reason,
            token_usage=dict(values["token_usage"]),
            tool_call_counts=dict(values["tool_call_counts"]),
            context_tokens=values["context_tokens"],
            pending_tool_calls=self.waiting,
            pending_interrupts=self.pending_requests(),
            checkpoint_id=self.session.head_id if self.session is not None else None,
        )
        return outputs


def _model_exit_reason(replies: list[ChatMessage], *, has_tools: bool) -> str | None:
    """
    Why a reply without tool calls ends the run: its finish reason if incomplete (``length``, ``content_filter``),
    else ``text``; None for an empty reply in a run with tools (the model is asked again), as in haystack-ai.
    """
    last = replies[-1] if replies else None
    if last is None or not last.is_from("assistant"):
        return EXIT_TEXT if not has_tools else None
    finish = last.meta.get("finish_reason")
    if finish in EXIT_FINISH_REASONS:
        return str(finish)
    if last.text or not has_tools:
        return EXIT_TEXT
    return None
