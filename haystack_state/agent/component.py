"""
``Agent``: a Haystack component that loops model -> tools -> model over a typed State and exposes every state key
as an output. The loop is written once (:mod:`haystack_state.agent.loop`); ``run`` and ``run_async`` only execute
the model calls, tool calls and hooks it asks for.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from haystack import component, default_from_dict, default_to_dict, logging
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.dataclasses.streaming_chunk import StreamingCallbackT, select_streaming_callback
from haystack.tools.serde_utils import deserialize_tools_or_toolset_inplace, serialize_tools_or_toolset
from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset
from haystack.tools.utils import warm_up_tools, warm_up_tools_async
from haystack.utils import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.agent.drive import Effects, accepts, drive, drive_async
from haystack_state.agent.loop import (
    RESERVED_INPUTS,
    RESERVED_OUTPUTS,
    LoopConfig,
    agent_loop,
    model_tools,
    normalize_hooks,
)
from haystack_state.agent.thread_methods import ThreadMethods
from haystack_state.errors import ToolDefinitionError
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.serde import checkpointer_from_dict
from haystack_state.schema import build_schema, schema_from_dict, schema_to_dict
from haystack_state.tools.spec import tool_specs

__all__ = ["Agent"]

logger = logging.getLogger(__name__)

Hook = Callable[..., Any]


@component
class Agent(ThreadMethods):
    """
    A tool-calling agent over a typed State: it sends the messages and the tools to the chat generator, runs the
    tool calls the model makes (in parallel where they are independent, merging their outputs into the state), and
    repeats until the model answers in text, an exit-condition tool succeeds, or ``max_agent_steps`` is reached.

    Every state key is an output of the component, and an optional input: ``agent.run(messages, user_name="Alice")``
    fills the ``user_name`` key (through its handler) before the first step.

    ### Usage example
    ```python
    from haystack.dataclasses import ChatMessage
    from haystack_state import Agent, tool
    from haystack_state.testing import ScriptedChatGenerator

    @tool(outputs_to_state={"documents": {"source": "documents"}})
    def search(query: str) -> dict:
        '''Search the knowledge base.'''
        return {"documents": [f"result for {query}"]}

    generator = ScriptedChatGenerator(script=[[("search", {"query": "python"})], "Found it."])
    agent = Agent(chat_generator=generator, tools=[search], state_schema={"documents": {"type": list[str]}})
    result = agent.run([ChatMessage.from_user("Find Python docs")])
    assert result["documents"] == ["result for python"]
    assert result["exit_reason"] == "text"
    ```

    :param chat_generator: Any Haystack chat generator whose ``run`` accepts ``tools``.
    :param tools: The tools the model may call: ``Tool``s (this package's or haystack-ai's), ``ComponentTool``s,
        ``Toolset``s, or a list mixing them.
    :param system_prompt: A system message put first, once, unless the messages already start with one.
    :param exit_conditions: What ends the run: ``"text"`` (a reply without tool calls) and/or tool names (a
        successful call of that tool). Defaults to ``["text"]``. A reply without tool calls always ends the run.
    :param state_schema: The State schema (see ``State``). A ``messages`` key is added automatically.
    :param max_agent_steps: The most model calls a run makes.
    :param streaming_callback: Receives the model's streamed chunks and the tool results.
    :param raise_on_tool_invocation_failure: Raise on a failed tool call instead of reporting it to the model.
    :param tool_concurrency_limit: How many tool calls may run at once.
    :param hooks: Callables run at ``before_run``, ``before_llm``, ``after_tool``, ``after_run`` and ``on_exit``,
        each given the live State; ``{"before_llm": fn}`` or ``{"before_llm": [fn, ...]}``. They may be ``async``
        (awaited by ``run_async``, run to completion by ``run``). An ``on_exit`` hook that returns ``True`` (exactly)
        keeps the agent running (after, typically, adding a message to the state).
    :param checkpointer: Where durable threads live (see ``haystack_state.persistence``): with it, ``run(...,
        thread_id=...)`` loads the thread's state and commits a checkpoint after every model reply and every step's
        tool results; ``get_state``, ``get_history``, ``update_state`` and ``resume`` read and edit threads. Keys
        with ``"scope": "run"`` in the schema are reset at the start of every run of a thread; the others
        (``messages`` always) are kept.
    :param interrupt_before: Tool names before which a run on a thread stops, with ``exit_reason="interrupted"``
        and the calls in ``pending_tool_calls``, until ``resume`` gets a decision for each. Needs a checkpointer.
    :raises TypeError: If tools are given and the chat generator's ``run`` does not accept ``tools``.
    :raises StateSchemaError: If the state schema is invalid.
    :raises ValueError: For a schema key that clashes with an output or a ``run`` parameter, an unknown hook point,
        exit condition or ``interrupt_before`` tool, or ``interrupt_before`` without a checkpointer.
    """

    # Serialized (and registered with Pipelines) under its public path, whatever module it is defined in.
    __module__ = "haystack_state.agent"

    def __init__(
        self,
        chat_generator: Any,
        tools: list[Tool | Toolset] | Toolset | None = None,
        system_prompt: str | None = None,
        exit_conditions: list[str] | None = None,
        state_schema: dict[str, Any] | None = None,
        max_agent_steps: int = 100,
        streaming_callback: StreamingCallbackT | None = None,
        raise_on_tool_invocation_failure: bool = False,
        tool_concurrency_limit: int = 4,
        hooks: dict[str, Hook | list[Hook]] | None = None,
        checkpointer: Checkpointer | None = None,
        interrupt_before: list[str] | None = None,
    ) -> None:
        self.chat_generator = chat_generator
        self.tools = tools if tools is not None else []
        self.system_prompt = system_prompt
        self.exit_conditions = list(exit_conditions) if exit_conditions is not None else ["text"]
        self.state_schema = dict(state_schema or {})
        self.max_agent_steps = max_agent_steps
        self.streaming_callback = streaming_callback
        self.raise_on_tool_invocation_failure = raise_on_tool_invocation_failure
        self.tool_concurrency_limit = tool_concurrency_limit
        self.hooks = normalize_hooks(hooks)
        self.checkpointer = checkpointer
        self.interrupt_before = list(interrupt_before or [])

        self._specs = tool_specs(self.tools)
        if self._specs and not accepts(chat_generator.run, "tools"):
            raise TypeError(
                f"{type(chat_generator).__name__}.run does not accept a 'tools' parameter, so it cannot be given "
                f"tools ({', '.join(self._specs)}). Use a chat generator with tool support."
            )
        self._specs_fields = build_schema(self.state_schema)
        clashes = sorted(set(self._specs_fields) & (RESERVED_OUTPUTS | RESERVED_INPUTS))
        if clashes:
            raise ValueError(
                f"state_schema keys {clashes} clash with Agent outputs or run parameters; rename them. "
                f"Reserved: {', '.join(sorted(RESERVED_OUTPUTS | RESERVED_INPUTS))}."
            )
        mapping_problems = [
            (
                spec.name,
                f"Tool '{spec.name}': {field} names state key '{key}', which state_schema does not declare "
                f"(keys: {', '.join(self._specs_fields)}).",
            )
            for spec in self._specs.values()
            for field, keys in (
                ("inputs_from_state", spec.inputs_from_state),
                ("outputs_to_state", spec.outputs_to_state),
            )
            for key in keys
            if key not in self._specs_fields
        ]
        if mapping_problems:
            raise ToolDefinitionError(mapping_problems[0][0], [problem for _, problem in mapping_problems])
        unknown = [c for c in self.exit_conditions if c != "text" and c not in self._specs]
        if unknown:
            raise ValueError(
                f"exit_conditions {unknown} name no tool of this agent. Use 'text' or one of: "
                f"{', '.join(self._specs) or 'no tools'}."
            )
        unknown = [name for name in self.interrupt_before if name not in self._specs]
        if unknown:
            raise ValueError(
                f"interrupt_before {unknown} name no tool of this agent. Tools: {', '.join(self._specs) or 'none'}."
            )
        if self.interrupt_before and checkpointer is None:
            raise ValueError("interrupt_before needs a checkpointer: an interrupted run is resumed from its thread.")
        if max_agent_steps < 1 or tool_concurrency_limit < 1:
            raise ValueError("max_agent_steps and tool_concurrency_limit must be at least 1.")

        for key, spec in self._specs_fields.items():
            if key != "messages":
                component.set_input_type(self, name=key, type=spec.type, default=None)
        outputs: dict[str, Any] = {key: spec.type for key, spec in self._specs_fields.items()}
        outputs.update(
            last_message=ChatMessage,
            step_count=int,
            exit_reason=str,
            token_usage=dict[str, Any],
            pending_tool_calls=list[ToolCall],
            checkpoint_id=str | None,
        )
        component.set_output_types(self, **outputs)
        self._loop_config = LoopConfig(
            schema=self._specs_fields,
            tools=list(self._specs.values()),
            system_prompt=self.system_prompt,
            exit_conditions=self.exit_conditions,
            max_agent_steps=self.max_agent_steps,
            streaming_callback=None,
            generator_streams=accepts(chat_generator.run, "streaming_callback"),
            hooks=self.hooks,
            model_tools=model_tools(self._specs.values()),
            interrupt_before=frozenset(self.interrupt_before),
        )
        self._is_warmed_up = False

    def _effects(self) -> Effects:
        return Effects(
            chat_generator=self.chat_generator,
            specs=self._specs,
            raise_on_failure=self.raise_on_tool_invocation_failure,
            max_workers=self.tool_concurrency_limit,
        )

    def _config(self, streaming_callback: StreamingCallbackT | None) -> LoopConfig:
        if streaming_callback is None:
            return self._loop_config
        return dataclasses.replace(self._loop_config, streaming_callback=streaming_callback)

    def warm_up(self) -> None:
        """Warm up the tools and the chat generator (load models, open clients). ``run`` does it on first use."""
        if self._is_warmed_up:
            return
        warm_up_tools(self.tools)
        if hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()
        self._is_warmed_up = True

    async def warm_up_async(self) -> None:
        """Warm up the tools and the chat generator, awaiting their ``warm_up_async`` if they have one."""
        if self._is_warmed_up:
            return
        await warm_up_tools_async(self.tools)
        if hasattr(self.chat_generator, "warm_up_async"):
            await self.chat_generator.warm_up_async()
        elif hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()
        self._is_warmed_up = True

    def close(self) -> None:
        """Release what the chat generator and the tools hold (HTTP clients, models). A later run warms up again."""
        for item in [self.chat_generator, *self._specs_tools()]:
            if hasattr(item, "close"):
                item.close()
        self._is_warmed_up = False

    async def close_async(self) -> None:
        """Release what the chat generator and the tools hold, awaiting their async ``close_async`` if they have one."""
        for item in [self.chat_generator, *self._specs_tools()]:
            if hasattr(item, "close_async"):
                await item.close_async()
            elif hasattr(item, "close"):
                item.close()
        self._is_warmed_up = False

    def _specs_tools(self) -> list[Tool]:
        return [spec.tool for spec in self._specs.values()]

    def run(
        self,
        messages: list[ChatMessage],
        streaming_callback: StreamingCallbackT | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        **state_inputs: Any,
    ) -> dict[str, Any]:
        """
        Run the agent until the model answers in text, an exit-condition tool succeeds, or the step limit is hit.

        :param messages: The conversation so far (typically one user message).
        :param streaming_callback: Overrides the callback given at construction for this run.
        :param thread_id: Run on this durable thread (needs a ``checkpointer``): load its state, reset its
            run-scoped keys, append ``messages``, and commit a checkpoint after every model reply and every step's
            tool results. With no new messages on a run that stopped early (a crash, an error), continue that run:
            run the tool calls it left pending, keep its run-scoped keys and its step count.
        :param checkpoint_id: With ``thread_id``, start from this earlier checkpoint: the run forks a new branch
            and leaves the old one as it was.
        :param state_inputs: Initial values for state keys, written through their handlers.
        :returns: ``messages``, ``last_message``, every state key, ``step_count`` (the run's model calls; on a
            continued run, those before it stopped included), ``exit_reason`` ("text", the name of the exit tool,
            "max_agent_steps" or "interrupted"), ``token_usage`` (summed from this call's replies' ``usage`` meta),
            ``pending_tool_calls`` (the calls waiting for ``resume`` after an interrupt) and ``checkpoint_id`` (the
            thread's head after the run, or None without a thread).
        :raises AgentRunError: If the chat generator raises; the error carries the partial State.
        :raises ToolInvocationError: With ``raise_on_tool_invocation_failure``, when a tool call fails.
        :raises ValueError: For a thread interrupted before a tool (use ``resume``), or new messages while tool
            calls of the thread are pending.
        :raises ThreadConflictError: If another run committed to the thread meanwhile (the failed commit wrote
            nothing).
        :raises CodecError: If a state value cannot be stored (the message names the key; nothing was written).
        :raises CheckpointNotFoundError: For an unknown ``checkpoint_id``.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        self.warm_up()
        session = self._session(thread_id, checkpoint_id)
        try:
            flow = agent_loop(self._config(callback), messages, state_inputs, session)
            return drive(flow, self._effects())
        finally:
            if session is not None:
                session.close()

    async def run_async(
        self,
        messages: list[ChatMessage],
        streaming_callback: StreamingCallbackT | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        **state_inputs: Any,
    ) -> dict[str, Any]:
        """
        Run the agent asynchronously. Same parameters and outputs as :meth:`run`; the chat generator's
        ``run_async`` is used when it has one, async tools and hooks are awaited.

        :param messages: The conversation so far.
        :param streaming_callback: Overrides the callback given at construction for this run (sync or async).
        :param thread_id: Run on this durable thread (see :meth:`run`).
        :param checkpoint_id: With ``thread_id``, fork from this earlier checkpoint.
        :param state_inputs: Initial values for state keys.
        :returns: The same outputs as :meth:`run`.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        await self.warm_up_async()
        session = await self._session_async(thread_id, checkpoint_id)
        try:
            flow = agent_loop(self._config(callback), messages, state_inputs, session)
            return await drive_async(flow, self._effects())
        finally:
            if session is not None:
                await session.aclose()

    # --- durable threads ---------------------------------------------------------------------------------------

    def resume(
        self,
        thread_id: str,
        decisions: dict[str, Any],
        streaming_callback: StreamingCallbackT | None = None,
    ) -> dict[str, Any]:
        """
        Continue a run that stopped at an ``interrupt_before`` tool, possibly in another process, days later.

        :param thread_id: The interrupted thread.
        :param decisions: For each pending call id: ``"approve"`` (run it), ``"reject"`` (the model is told a human
            rejected it) or ``{"arguments": {...}}`` (run it with these arguments instead).
        :param streaming_callback: Overrides the callback given at construction.
        :returns: The same outputs as :meth:`run`.
        :raises ThreadNotFoundError: If the thread has no checkpoint.
        :raises ValueError: If the thread is not interrupted, or a pending call has no (valid) decision; nothing
            is written then, and the thread stays interrupted.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        self.warm_up()
        session = self._existing(thread_id, lease=True)
        try:
            flow = agent_loop(self._config(callback), [], {}, session, decisions)
            return drive(flow, self._effects())
        finally:
            session.close()

    async def resume_async(
        self,
        thread_id: str,
        decisions: dict[str, Any],
        streaming_callback: StreamingCallbackT | None = None,
    ) -> dict[str, Any]:
        """Continue an interrupted run asynchronously. Same parameters and outputs as :meth:`resume`."""
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        await self.warm_up_async()
        session = await self._existing_async(thread_id, lease=True)
        try:
            flow = agent_loop(self._config(callback), [], {}, session, decisions)
            return await drive_async(flow, self._effects())
        finally:
            await session.aclose()

    # --- serialisation ---------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Serialise the agent: its chat generator, tools, schema, hooks and settings."""
        hooks = {point: [serialize_callable(h) for h in hooks] for point, hooks in self.hooks.items() if hooks}
        return default_to_dict(
            self,
            chat_generator=component_to_dict(obj=self.chat_generator, name="chat_generator"),
            tools=serialize_tools_or_toolset(self.tools),
            system_prompt=self.system_prompt,
            exit_conditions=self.exit_conditions,
            state_schema=schema_to_dict(build_schema(self.state_schema)) if self.state_schema else None,
            max_agent_steps=self.max_agent_steps,
            streaming_callback=serialize_callable(self.streaming_callback) if self.streaming_callback else None,
            raise_on_tool_invocation_failure=self.raise_on_tool_invocation_failure,
            tool_concurrency_limit=self.tool_concurrency_limit,
            hooks=hooks or None,
            checkpointer=self.checkpointer.to_dict() if self.checkpointer is not None else None,
            interrupt_before=self.interrupt_before or None,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Agent:
        """Rebuild an agent from :meth:`to_dict` output (which is left as it is)."""
        data = copy.deepcopy(data)  # the deserialisers below work in place, haystack's Tool.from_dict too
        params = data.setdefault("init_parameters", {})
        deserialize_component_inplace(params, key="chat_generator")
        deserialize_tools_or_toolset_inplace(params, key="tools")
        if params.get("state_schema"):
            params["state_schema"] = schema_from_dict(params["state_schema"])
        if params.get("streaming_callback"):
            params["streaming_callback"] = deserialize_callable(params["streaming_callback"])
        if params.get("checkpointer"):
            params["checkpointer"] = checkpointer_from_dict(params["checkpointer"])
        if params.get("hooks"):
            params["hooks"] = {
                point: [deserialize_callable(h) for h in hooks] for point, hooks in params["hooks"].items()
            }
        return default_from_dict(cls, data)
