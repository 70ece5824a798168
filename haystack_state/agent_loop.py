"""
The Agent's loop, written once as a generator of effects: it yields what it needs done (call the model, run the
tools, run hooks) and receives the results. ``Agent.run`` executes the effects synchronously and
``Agent.run_async`` awaits them, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping
from typing import Any

from haystack.dataclasses import ChatMessage
from haystack.dataclasses.streaming_chunk import StreamingCallbackT

from haystack_state.errors import AgentRunError, ToolInvocationError
from haystack_state.schema import FieldSpec
from haystack_state.state import State
from haystack_state.tools.spec import ToolSpec

__all__ = [
    "EXIT_MAX_STEPS",
    "EXIT_TEXT",
    "HOOK_POINTS",
    "RESERVED_OUTPUTS",
    "CallModel",
    "Effect",
    "LoopConfig",
    "RunHooks",
    "RunTools",
    "add_usage",
    "agent_loop",
    "normalize_hooks",
]

HOOK_POINTS = ("before_run", "before_llm", "after_tool", "after_run", "on_exit")
RESERVED_OUTPUTS = frozenset({"last_message", "step_count", "exit_reason", "token_usage"})
EXIT_TEXT = "text"
EXIT_MAX_STEPS = "max_agent_steps"

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


Effect = CallModel | RunTools | RunHooks


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What the loop needs from the Agent."""

    schema: dict[str, FieldSpec]
    tools: list[ToolSpec]
    system_prompt: str | None
    exit_conditions: list[str]
    max_agent_steps: int
    streaming_callback: StreamingCallbackT | None
    generator_streams: bool
    hooks: dict[str, list[Hook]]


def _initial_state(config: LoopConfig, messages: list[ChatMessage], inputs: Mapping[str, Any]) -> State:
    state = State({key: spec.as_entry() for key, spec in config.schema.items()})
    state.update({key: value for key, value in inputs.items() if value is not None})
    conversation = list(messages)
    if config.system_prompt and not (conversation and conversation[0].is_from("system")):
        conversation.insert(0, ChatMessage.from_system(config.system_prompt))
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


def agent_loop(
    config: LoopConfig, messages: list[ChatMessage], inputs: Mapping[str, Any]
) -> Generator[Effect, Any, dict[str, Any]]:
    """
    The agent loop as a generator of effects (see the module docstring).

    :param config: The agent's settings.
    :param messages: The run's input messages.
    :param inputs: Initial values for state keys.
    :returns: The run's outputs (as the generator's return value).
    """
    unknown = sorted(set(inputs) - set(config.schema))
    if unknown:
        raise ValueError(f"Agent.run got unknown inputs {unknown}; the state keys are: {', '.join(config.schema)}.")
    state = _initial_state(config, messages, inputs)
    hooks = config.hooks
    step = 0
    exit_reason = EXIT_MAX_STEPS
    usage: dict[str, Any] = {}
    tool_schemas = [spec.tool for spec in config.tools]

    def failure(stage: str, exc: Exception) -> Exception:
        if isinstance(exc, ToolInvocationError):
            exc.state = state
            return exc
        return AgentRunError(f"Agent: {stage} failed at step {step + 1}: {type(exc).__name__}: {exc}", state)

    if hooks.get("before_run"):
        yield RunHooks("before_run", hooks["before_run"], state)
    while step < config.max_agent_steps:
        if hooks.get("before_llm"):
            yield RunHooks("before_llm", hooks["before_llm"], state)
        inputs_for_model: dict[str, Any] = {"messages": state.get("messages")}
        if tool_schemas:
            inputs_for_model["tools"] = tool_schemas
        if config.streaming_callback is not None and config.generator_streams:
            inputs_for_model["streaming_callback"] = config.streaming_callback
        try:
            result = yield CallModel(inputs_for_model)
        except Exception as exc:
            raise failure("the chat generator", exc) from exc
        replies: list[ChatMessage] = list(result["replies"])
        state.set("messages", replies)
        for reply in replies:
            if isinstance(reply.meta.get("usage"), Mapping):
                usage = add_usage(usage, reply.meta["usage"])
        step += 1
        exit_now: str | None = None
        if not any(reply.tool_calls for reply in replies):
            exit_now = EXIT_TEXT
        else:
            try:
                tool_messages = yield RunTools(replies, state, config.streaming_callback)
            except Exception as exc:
                raise failure("a tool call", exc) from exc
            state.set("messages", tool_messages)
            if hooks.get("after_tool"):
                yield RunHooks("after_tool", hooks["after_tool"], state)
            exit_now = _exit_tool(config, replies, tool_messages)
        if exit_now is not None:
            exit_reason = exit_now
            keep_going = False
            if hooks.get("on_exit"):
                keep_going = any((yield RunHooks("on_exit", hooks["on_exit"], state)))
            if not keep_going:
                break
            exit_reason = EXIT_MAX_STEPS
    if hooks.get("after_run"):
        yield RunHooks("after_run", hooks["after_run"], state)
    outputs = {key: None for key in config.schema} | state.data
    conversation = outputs.get("messages") or []
    outputs.update(
        messages=conversation,
        last_message=conversation[-1] if conversation else None,
        step_count=step,
        exit_reason=exit_reason,
        token_usage=usage,
    )
    return outputs
