"""
How ``Agent.run``, ``run_async``, ``resume`` and ``stream`` run: prepare the run's request before anything is read,
sent or stored (:func:`prepare`), open its thread (:func:`open_thread`), drive the loop (:func:`execute`, or
:func:`execute_async` awaiting the effects) and release the thread. Functions of the Agent, which its methods call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT, select_streaming_callback
from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset

from haystack_state.agent._continuation import check_unfinished_calls
from haystack_state.agent._drive import EffectRunner, drive, drive_async
from haystack_state.agent._loop import agent_loop
from haystack_state.agent._run_config import RunControl, RunOptions, RunRequest
from haystack_state.agent._session import ThreadSession
from haystack_state.agent._thread_methods import (
    existing_session,
    existing_session_async,
    open_session,
    open_session_async,
)
from haystack_state.agent.events import EventSink, ModelChunk
from haystack_state.agent.protocols import DecisionLike
from haystack_state.tools.spec import ToolsArg

if TYPE_CHECKING:
    from haystack_state.agent._component import Agent

__all__ = [
    "effect_runner",
    "execute",
    "execute_async",
    "model_callback",
    "open_thread",
    "open_thread_async",
    "prepare",
    "runtime_tools",
]


def runtime_tools(tools: ToolsArg | list[str] | None) -> list[Tool | Toolset]:
    """The tool objects given to a run (not names), which the run warms up."""
    if isinstance(tools, Toolset):
        return [tools]
    return [tool for tool in tools or [] if not isinstance(tool, str)]


def model_callback(
    callback: StreamingCallbackT | None, sink: EventSink | None, *, is_async: bool
) -> StreamingCallbackT | None:
    """
    The streaming callback given to the chat generator when someone listens: it emits each chunk as a
    ``ModelChunk`` event, then passes it on to the run's own callback (if any).

    :param callback: The run's streaming callback.
    :param sink: The run's event sink; None if no one listens (then no wrapper is made).
    :param is_async: Whether the run is async (the wrapper must then be a coroutine function).
    :returns: The wrapper, or None.
    """
    if sink is None:
        return None
    if is_async:

        async def on_chunk_async(chunk: StreamingChunk) -> None:
            sink.emit(ModelChunk, step=sink.step, chunk=chunk, message_id=sink.message_id)
            if callback is not None:
                await callback(chunk)  # type: ignore[misc]

        return on_chunk_async

    def on_chunk(chunk: StreamingChunk) -> None:
        sink.emit(ModelChunk, step=sink.step, chunk=chunk, message_id=sink.message_id)
        if callback is not None:
            callback(chunk)

    return on_chunk


def prepare(
    agent: Agent,
    messages: list[ChatMessage],
    kwargs: dict[str, Any],
    options: RunOptions,
    *,
    is_async: bool,
    sink: EventSink | None = None,
    control: RunControl | None = None,
) -> RunRequest:
    """
    Prepare a run, before anything is read, sent or stored: select the streaming callback, render the prompts (a
    missing variable raises here), select the tools. The agent is warmed up already.

    :returns: The run's request.
    """
    setup = agent.setup
    callback: StreamingCallbackT | None = select_streaming_callback(  # type: ignore[call-overload]
        agent.streaming_callback, options.streaming_callback, requires_async=is_async
    )
    variables = setup.prompts.variables
    prompt_values = {name: value for name, value in kwargs.items() if name in variables}
    inputs = {key: value for key, value in kwargs.items() if key not in variables}
    system, user = setup.prompts.render(prompt_values)
    run_tools = setup.toolbox.for_run(options.tools)
    if options.tools is not None and not setup.generator_takes_tools and setup.toolbox.resolve(run_tools).specs:
        raise TypeError(
            f"{type(agent.chat_generator).__name__} does not accept tools parameter in its run method, so it "
            "cannot be given this run's tools. The Agent component requires a chat generator that supports "
            "tools when tools are provided."
        )
    return RunRequest(
        messages=list(messages or []),
        inputs=inputs,
        tools=run_tools,
        system_message=system,
        user_message=user,
        streaming_callback=callback,
        generation_kwargs=options.generation_kwargs,
        hook_context=options.hook_context,
        decisions=_resuming(options.decisions, options.answers),
        answers=options.answers,
        context=options.context,
        on_unfinished_calls=check_unfinished_calls(options.on_unfinished_calls, "run()"),
        run_id=options.run_id,
        traced_inputs={"messages": messages, "streaming_callback": callback, **kwargs},
        model_callback=model_callback(callback, sink, is_async=is_async),
        sink=sink,
        control=control,
    )


def _resuming(
    decisions: Mapping[str, DecisionLike] | None, answers: Mapping[str, object] | None
) -> Mapping[str, DecisionLike] | None:
    """``resume``'s decisions (``{}`` when only answers are given: the run resumes either way)."""
    if decisions is None and answers is not None:
        return {}
    return decisions


def effect_runner(agent: Agent, control: RunControl | None = None, options: RunOptions | None = None) -> EffectRunner:
    """What executes a run's effects: the Agent's chat generator and tool-run settings (with the run's passthrough)."""
    settings = agent.setup.loop_config.tool_settings
    passthrough = options.enable_streaming_callback_passthrough if options is not None else None
    if passthrough is not None and passthrough != settings.passthrough:
        settings = dataclasses.replace(settings, passthrough=passthrough)
    return EffectRunner(agent.chat_generator, settings, control)


def open_thread(agent: Agent, options: RunOptions) -> ThreadSession | None:
    """Open the run's thread (under its lease), or None without one; the caller closes it."""
    if options.decisions is not None or options.answers is not None:
        return existing_session(agent, str(options.thread_id), lease=True)
    return open_session(agent, options.thread_id, options.checkpoint_id)


async def open_thread_async(agent: Agent, options: RunOptions) -> ThreadSession | None:
    """:func:`open_thread`, awaiting the checkpointer."""
    if options.decisions is not None or options.answers is not None:
        return await existing_session_async(agent, str(options.thread_id), lease=True)
    return await open_session_async(agent, options.thread_id, options.checkpoint_id)


def execute(agent: Agent, messages: list[ChatMessage], kwargs: dict[str, Any], options: RunOptions) -> dict[str, Any]:
    """Prepare, open the thread, run the loop synchronously, release the thread."""
    request = prepare(agent, messages, kwargs, options, is_async=False)
    session = open_thread(agent, options)
    try:
        return drive(agent_loop(agent.setup.loop_config, request, session), effect_runner(agent, None, options))
    finally:
        if session is not None:
            session.close()


async def execute_async(
    agent: Agent, messages: list[ChatMessage], kwargs: dict[str, Any], options: RunOptions
) -> dict[str, Any]:
    """:func:`execute`, awaiting the effects."""
    request = prepare(agent, messages, kwargs, options, is_async=True)
    session = await open_thread_async(agent, options)
    try:
        return await drive_async(
            agent_loop(agent.setup.loop_config, request, session), effect_runner(agent, None, options)
        )
    finally:
        if session is not None:
            await session.aclose()
