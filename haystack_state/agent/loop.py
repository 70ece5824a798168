"""
The Agent's loop, written once as a generator of effects: it yields what it needs done (call the model, run the
tools, run hooks) and receives the results. ``Agent.run`` executes the effects synchronously and
``Agent.run_async`` awaits them, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

from haystack import logging
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.tools.tool import Tool

from haystack_state.agent.session import ThreadSession, in_call_order, plan_continuation, reset_run_scope
from haystack_state.errors import AgentRunError, ThreadConflictError, ToolInvocationError
from haystack_state.handlers import merge_lists
from haystack_state.persistence.delta import Source
from haystack_state.schema import FieldSpec
from haystack_state.state import State
from haystack_state.tools.spec import ToolSpec

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_MAX_STEPS",
    "EXIT_TEXT",
    "HOOK_POINTS",
    "RESERVED_INPUTS",
    "RESERVED_OUTPUTS",
    "CallModel",
    "Commit",
    "Effect",
    "HoldThread",
    "LoopConfig",
    "RunHooks",
    "RunTools",
    "add_usage",
    "agent_loop",
    "model_tools",
    "normalize_hooks",
]

logger = logging.getLogger(__name__)

HOOK_POINTS = ("before_run", "before_llm", "after_tool", "after_run", "on_exit")
RESERVED_OUTPUTS = frozenset(
    {"last_message", "step_count", "exit_reason", "token_usage", "pending_tool_calls", "checkpoint_id"}
)
#: ``run`` parameters other than ``messages`` (which is the state key itself): no state key may take their name.
RESERVED_INPUTS = frozenset({"streaming_callback", "thread_id", "checkpoint_id"})
EXIT_TEXT = "text"
EXIT_MAX_STEPS = "max_agent_steps"
EXIT_INTERRUPTED = "interrupted"

Hook = Callable[..., Any]


def normalize_hooks(hooks: Mapping[str, Hook | list[Hook]] | None) -> dict[str, list[Hook]]:
    """
    Check and normalise the hooks argument to ``{point: [callables]}``.

    :param hooks: ``{point: callable or list of callables}``.
    :returns: The hooks by point.
    :raises ValueError: For an unknown hook point or a hook that is not callable.
    """
    result: dict[str, list[Hook]] = {}
    for point, given in (hooks or {}).items():
        if point not in HOOK_POINTS:
            raise ValueError(f"Unknown hook point '{point}'. Hook points: {', '.join(HOOK_POINTS)}.")
        callables = list(given) if isinstance(given, list | tuple) else [given]
        for hook in callables:
            if not callable(hook):
                raise ValueError(f"Hook at '{point}' must be callable, got {hook!r}.")
        result[point] = callables
    return result


def add_usage(total: dict[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """
    Add a reply's ``usage`` meta to a running total: numbers are summed, nested dicts are summed key by key.

    :param total: The running total (not modified).
    :param usage: One reply's usage.
    :returns: The new total.
    """
    result = dict(total)
    for key, value in usage.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            current = result.get(key, 0)
            result[key] = (current if isinstance(current, int | float) else 0) + value
        elif isinstance(value, Mapping):
            current = result.get(key)
            result[key] = add_usage(current if isinstance(current, dict) else {}, value)
    return result


def model_tools(specs: Iterable[ToolSpec]) -> list[Tool]:
    """
    The tools as the model sees them: each tool's schema without its hidden parameters.

    A tool whose ``parameters`` already leave them out (this package's tools, haystack-ai's ``@tool`` and
    ``ComponentTool``) is passed as it is; a hand-built ``Tool`` whose schema lists a parameter filled from state
    (or the State itself) is replaced, for the model only, by a plain ``Tool`` with the reduced schema.

    :param specs: The tools' specs.
    :returns: One haystack ``Tool`` per spec, in order.
    """
    result = []
    for spec in specs:
        tool = spec.tool
        if spec.parameters != tool.parameters:
            tool = Tool(
                name=spec.name,
                description=spec.description,
                parameters=spec.parameters,
                function=tool.function,
                async_function=tool.async_function,
            )
        result.append(tool)
    return result


@dataclasses.dataclass(frozen=True)
class CallModel:
    """Effect: call the chat generator with these inputs; send back its result dict."""

    inputs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RunTools:
    """Effect: run the tool calls of these messages against the state; send back the tool messages."""

    messages: list[ChatMessage]
    state: State
    streaming_callback: StreamingCallbackT | None


@dataclasses.dataclass(frozen=True)
class RunHooks:
    """Effect: call each hook with the state; send back their return values."""

    point: str
    hooks: list[Hook]
    state: State


@dataclasses.dataclass(frozen=True)
class Commit:
    """Effect: commit what the state changed as a checkpoint of the session's thread; send back its record."""

    session: ThreadSession
    state: State
    source: Source
    tool_names: Sequence[str]
    metadata: dict[str, Any]
    step: int


@dataclasses.dataclass(frozen=True)
class HoldThread:
    """Effect: take the session's lease on its thread (before the run's first commit, model or tool call)."""

    session: ThreadSession


Effect = CallModel | RunTools | RunHooks | Commit | HoldThread


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """
    What the loop needs from the Agent.

    :param schema: The state schema, ``messages`` included.
    :param tools: The tools' specs (what runs them).
    :param model_tools: The tools as given to the model (see :func:`model_tools`); derived from ``tools`` if None.
    """

    schema: dict[str, FieldSpec]
    tools: list[ToolSpec]
    system_prompt: str | None
    exit_conditions: list[str]
    max_agent_steps: int
    streaming_callback: StreamingCallbackT | None
    generator_streams: bool
    hooks: dict[str, list[Hook]]
    model_tools: list[Tool] | None = None
    interrupt_before: frozenset[str] = frozenset()


def _prepare_state(
    config: LoopConfig,
    messages: list[ChatMessage],
    inputs: Mapping[str, Any],
    session: ThreadSession | None,
    continuing: bool,
) -> State:
    """
    The run's State: fresh, or the thread's with the run-scoped keys reset (unless the run continues an unfinished
    one); then the inputs and messages.
    """
    if session is None:
        state = State({key: spec.as_entry() for key, spec in config.schema.items()})
    else:
        state = session.load_state()
        if not session.is_new and not continuing:
            reset_run_scope(state)
    state.update({key: value for key, value in inputs.items() if value is not None})
    conversation = list(messages)
    is_new = session is None or session.is_new
    if is_new and config.system_prompt and not (conversation and conversation[0].is_from("system")):
        conversation.insert(0, ChatMessage.from_system(config.system_prompt))
    if conversation:
        state.set("messages", conversation)
    return state


def _exit_tool(config: LoopConfig, replies: list[ChatMessage], tool_messages: list[ChatMessage]) -> str | None:
    failed = {
        m.tool_call_result.origin.tool_name for m in tool_messages if m.tool_call_result and m.tool_call_result.error
    }
    for reply in replies:
        for call in reply.tool_calls:
            if call.tool_name in config.exit_conditions and call.tool_name not in failed:
                return call.tool_name
    return None


def _tools_may_write_messages(tools: Iterable[ToolSpec]) -> bool:
    """Whether a tool call can write the ``messages`` key: through the injected State, or an output mapping."""
    return any(spec.state_params or "messages" in spec.outputs_to_state for spec in tools)


def agent_loop(
    config: LoopConfig,
    messages: list[ChatMessage],
    inputs: Mapping[str, Any],
    session: ThreadSession | None = None,
    decisions: Mapping[str, Any] | None = None,
) -> Generator[Effect, Any, dict[str, Any]]:
    """
    The agent loop as a generator of effects (see the module docstring).

    Every failure raised while the run is under way carries the State as it was: a ``ToolInvocationError`` (with
    ``raise_on_tool_invocation_failure``) gets it as ``state``; anything else (the chat generator, a hook) is raised
    as an ``AgentRunError`` chained to the cause.

    With a thread ``session``, the state is loaded from the thread and a checkpoint is committed after the inputs,
    after each model reply, after each step's tool results and, if hooks changed the state after that, at the end
    (``"update"``). Run without new messages on an unfinished run (a crash, an error or an interrupt came first, see
    :mod:`haystack_state.agent.session`), it continues that run: the run-scoped keys and the step count are kept,
    ``before_run`` hooks are not run again, and the tool calls whose results were never committed run first
    (``decisions``, from ``Agent.resume``, approve, reject or edit them).

    :param config: The agent's settings.
    :param messages: The run's input messages.
    :param inputs: Initial values for state keys.
    :param session: The thread to load and commit to, if any.
    :param decisions: Decisions on interrupted tool calls, by call id.
    :returns: The run's outputs (as the generator's return value).
    """
    unknown = sorted(set(inputs) - set(config.schema))
    if unknown:
        raise ValueError(f"Agent.run got unknown inputs {unknown}; the state keys are: {', '.join(config.schema)}.")
    if config.interrupt_before and session is None:
        raise ValueError(
            f"This agent stops before {', '.join(sorted(config.interrupt_before))} for a human's approval, which needs "
            "a durable thread to resume from: run it with thread_id=..."
        )
    planned: tuple[list[ChatMessage], dict[str, ChatMessage]] | None = None
    continuing = False
    pending: list[ToolCall] = []
    if session is not None:
        planned = plan_continuation(session, messages, decisions)  # raises before anything is committed
        continuing = session.continues and not messages
        pending = session.pending
    state = _prepare_state(config, messages, inputs, session, continuing)
    hooks = config.hooks
    # ``step`` counts the model calls of the run, those an unfinished run made before this call included.
    step = session.run_step if session is not None and continuing else 0
    base_step = session.step - step if session is not None else 0
    exit_reason = EXIT_MAX_STEPS
    # The token usage of the run, what an unfinished run spent before it stopped included.
    usage: dict[str, Any] = session.run_usage if session is not None and continuing else {}
    tools_for_model = config.model_tools if config.model_tools is not None else model_tools(config.tools)
    # The conversation as the model is sent it, kept in step with the state's ``messages`` by appending what the
    # loop itself writes there, so a step costs no read of the whole history.
    # It is re-read after anything else may have written ``messages``: a hook, or a tool that can write it.
    mirror = config.schema["messages"].handler is merge_lists
    tools_write_messages = _tools_may_write_messages(config.tools)
    conversation: list[ChatMessage] | None = None
    current = max(step, 1)  # the step under way, for error messages
    waiting: list[ToolCall] = []

    def failure(stage: str, exc: Exception) -> Generator[Effect, Any, Exception]:
        # The error to raise, carrying the state, with the cause it must be raised from (re-raising a
        # ToolInvocationError keeps its own cause: the tool's exception).
        if isinstance(exc, ToolInvocationError):
            exc.state = state
            return exc
        error = AgentRunError(f"Agent: {stage} failed at step {current}: {type(exc).__name__}: {exc}", state)
        error.__cause__ = exc
        yield from release(error)
        return error

    def release(error: AgentRunError) -> Generator[Effect, Any, None]:
        # The run ends here, in this process: record that on the thread, so that a new run may start on it. (A
        # crashed run cannot do this: its thread stays marked until agent.run([], thread_id=...) finishes it.)
        # Tool calls left pending by a failed tool stay pending; so does a thread another run has taken.
        if session is None or isinstance(error.__cause__, ThreadConflictError):
            return
        try:
            stopped = {"run_step": step, "usage": usage, "stopped": str(error)[:500]}
            yield Commit(session, state, "update", (), stopped, base_step + step)
        except Exception as exc:  # the original failure is what the caller must see
            logger.warning(
                "Agent: could not record on thread '{thread_id}' that the run stopped: {error}",
                thread_id=session.thread_id,
                error=exc,
            )

    def commit(
        source: Source, tool_names: Sequence[str] = (), *, continues: bool = False
    ) -> Generator[Effect, Any, None]:
        if session is None or (source in ("input", "update") and not state.has_changes()):
            return
        metadata: dict[str, Any] = {"run_step": step, "usage": usage}
        if continues:
            metadata["continues"] = True
        if waiting:
            metadata.update(interrupted=True, pending=[call.id for call in waiting])
        yield Commit(session, state, source, tool_names, metadata, base_step + step)

    def run_hooks(point: str) -> Generator[Effect, Any, list[Any]]:
        nonlocal conversation
        conversation = None
        try:
            returned: list[Any] = yield RunHooks(point, hooks[point], state)
        except Exception as exc:
            error = yield from failure(f"the '{point}' hook", exc)
            raise error from error.__cause__
        return returned

    def run_tools(
        replies: list[ChatMessage], rejected: dict[str, ChatMessage], order: list[str | None]
    ) -> Generator[Effect, Any, str | None]:
        nonlocal conversation
        executed: list[ChatMessage] = []
        try:
            if replies:
                executed = yield RunTools(replies, state, config.streaming_callback)
        except Exception as exc:
            error = yield from failure("a tool call", exc)
            raise error from error.__cause__
        tool_messages = in_call_order(order, executed, rejected)
        state.set("messages", tool_messages)
        if tools_write_messages or conversation is None:
            conversation = None
        else:
            conversation.extend(tool_messages)
        if hooks.get("after_tool"):
            yield from run_hooks("after_tool")
        names = [m.tool_call_result.origin.tool_name for m in tool_messages if m.tool_call_result is not None]
        exit_tool = _exit_tool(config, replies, tool_messages)
        yield from commit("tools", tool_names=names, continues=exit_tool is None and step < config.max_agent_steps)
        return exit_tool

    if session is not None:
        yield HoldThread(session)  # the run's inputs are checked: from here on, no other run may take the thread
    yield from commit("input", continues=True)
    if hooks.get("before_run") and not continuing:
        yield from run_hooks("before_run")
    exit_now: str | None = None
    if planned is not None:
        to_run, rejected = planned
        exit_now = yield from run_tools(to_run, rejected, [call.id for call in pending])
        if exit_now is not None:
            exit_reason = exit_now
    while exit_now is None and step < config.max_agent_steps:
        current = step + 1
        if hooks.get("before_llm"):
            yield from run_hooks("before_llm")
        if conversation is None or not mirror:
            conversation = state.get("messages") or []
        inputs_for_model: dict[str, Any] = {"messages": list(conversation)}
        if tools_for_model:
            inputs_for_model["tools"] = tools_for_model
        if config.streaming_callback is not None and config.generator_streams:
            inputs_for_model["streaming_callback"] = config.streaming_callback
        try:
            result = yield CallModel(inputs_for_model)
            replies: list[ChatMessage] = list(result["replies"])
            state.set("messages", replies)
        except Exception as exc:
            error = yield from failure("the chat generator", exc)
            raise error from error.__cause__
        conversation.extend(replies)
        for reply in replies:
            reply_usage = reply.meta.get("usage")
            if isinstance(reply_usage, Mapping):
                usage = add_usage(usage, reply_usage)
        step += 1
        calls = [call for reply in replies for call in reply.tool_calls]
        if session is not None and any(call.tool_name in config.interrupt_before for call in calls):
            waiting = calls
            yield from commit("model", continues=True)
            exit_reason = EXIT_INTERRUPTED
            break
        yield from commit("model", continues=bool(calls))
        exit_now = EXIT_TEXT if not calls else (yield from run_tools(replies, {}, []))
        if exit_now is not None:
            exit_reason = exit_now
            if hooks.get("on_exit") and any(r is True for r in (yield from run_hooks("on_exit"))):
                exit_now, exit_reason = None, EXIT_MAX_STEPS
    if hooks.get("after_run"):
        yield from run_hooks("after_run")
    # What on_exit and after_run hooks changed since the last checkpoint.
    yield from commit("update", continues=bool(waiting))
    if conversation is None or not mirror:
        conversation = state.get("messages") or []
    outputs: dict[str, Any] = {key: state.get(key) for key in config.schema if key != "messages"}
    outputs.update(
        messages=conversation,
        last_message=conversation[-1] if conversation else None,
        step_count=step,
        exit_reason=exit_reason,
        token_usage=usage,
        pending_tool_calls=waiting,
        checkpoint_id=session.head_id if session is not None else None,
    )
    return outputs
