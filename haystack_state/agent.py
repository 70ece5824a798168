"""
``Agent``: a Haystack component that loops model -> tools -> model over a typed State and exposes every state key
as an output. The loop is written once (:mod:`haystack_state.agent_loop`); ``run`` and ``run_async`` only execute
the model calls, tool calls and hooks it asks for.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
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

from haystack_state.agent_loop import (
    RESERVED_INPUTS,
    RESERVED_OUTPUTS,
    CallModel,
    Effect,
    LoopConfig,
    RunHooks,
    RunTools,
    agent_loop,
    model_tools,
    normalize_hooks,
)
from haystack_state.errors import ThreadNotFoundError
from haystack_state.history import CheckpointHistory
from haystack_state.invoker import run_tool_calls, run_tool_calls_async
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.schema import build_schema, schema_from_dict, schema_to_dict
from haystack_state.threads import ThreadSession, ThreadSnapshot
from haystack_state.tools.spec import tool_specs

__all__ = ["Agent"]

logger = logging.getLogger(__name__)

Hook = Callable[..., Any]


def _accepts(method: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _wait(awaitable: Awaitable[Any]) -> Any:
    """Run an awaitable (an async hook's) to completion from synchronous code."""

    async def waiter() -> Any:
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


def _call_hook_sync(hook: Hook, state: Any) -> Any:
    returned = hook(state)
    return _wait(returned) if inspect.isawaitable(returned) else returned


@component
class Agent:
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
    :raises TypeError: If tools are given and the chat generator's ``run`` does not accept ``tools``.
    :raises StateSchemaError: If the state schema is invalid.
    :raises ValueError: For a schema key that clashes with an output or a ``run`` parameter, an unknown hook point
        or exit condition.
    """

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
        if self._specs and not _accepts(chat_generator.run, "tools"):
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
            generator_streams=_accepts(chat_generator.run, "streaming_callback"),
            hooks=self.hooks,
            model_tools=model_tools(self._specs.values()),
            interrupt_before=frozenset(self.interrupt_before),
        )
        self._is_warmed_up = False

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
        :param thread_id: Run on this durable thread (needs a ``checkpointer``): load its state, append
            ``messages``, and commit a checkpoint after every model reply and every step's tool results. With no
            new messages, finishes tool calls a crashed run left pending.
        :param checkpoint_id: With ``thread_id``, start from this earlier checkpoint: the run forks a new branch
            and leaves the old one as it was.
        :param state_inputs: Initial values for state keys, written through their handlers.
        :returns: ``messages``, ``last_message``, every state key, ``step_count``, ``exit_reason`` ("text", the name
            of the exit tool, "max_agent_steps" or "interrupted"), ``token_usage`` (summed from the replies'
            ``usage`` meta), ``pending_tool_calls`` (the calls waiting for ``resume`` after an interrupt) and
            ``checkpoint_id`` (the thread's head after the run, or None without a thread).
        :raises AgentRunError: If the chat generator raises; the error carries the partial State.
        :raises ToolInvocationError: With ``raise_on_tool_invocation_failure``, when a tool call fails.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        self.warm_up()
        session = self._session(thread_id, checkpoint_id)
        flow = agent_loop(self._config(callback), messages, state_inputs, session)
        return self._drive(flow)

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
        session = self._session(thread_id, checkpoint_id)
        flow = agent_loop(self._config(callback), messages, state_inputs, session)
        return await self._drive_async(flow)

    # --- durable threads ---------------------------------------------------------------------------------------

    def _session(self, thread_id: str | None, checkpoint_id: str | None) -> ThreadSession | None:
        if thread_id is None:
            if checkpoint_id is not None:
                raise ValueError("checkpoint_id needs a thread_id.")
            return None
        if self.checkpointer is None:
            raise ValueError(f"thread_id='{thread_id}' needs an Agent created with a checkpointer.")
        return ThreadSession(self.checkpointer, thread_id, self._specs_fields, checkpoint_id)

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
        :raises ValueError: If the thread is not interrupted, or a pending call has no (valid) decision.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        self.warm_up()
        flow = agent_loop(self._config(callback), [], {}, self._session(thread_id, None), decisions)
        return self._drive(flow)

    async def resume_async(
        self,
        thread_id: str,
        decisions: dict[str, Any],
        streaming_callback: StreamingCallbackT | None = None,
    ) -> dict[str, Any]:
        """Continue an interrupted run asynchronously. Same parameters and outputs as :meth:`resume`."""
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        await self.warm_up_async()
        flow = agent_loop(self._config(callback), [], {}, self._session(thread_id, None), decisions)
        return await self._drive_async(flow)

    def get_state(self, thread_id: str, checkpoint_id: str | None = None) -> ThreadSnapshot:
        """
        A thread's state at its head, or at an earlier checkpoint.

        :param thread_id: The thread.
        :param checkpoint_id: An earlier checkpoint of the thread; the head if None.
        :returns: The values, the checkpoint's record and any pending tool calls.
        :raises ThreadNotFoundError: If the thread has no checkpoint.
        :raises CheckpointNotFoundError: If the thread has no such checkpoint.
        """
        session = self._session(thread_id, checkpoint_id)
        assert session is not None
        if session.is_new:
            raise ThreadNotFoundError(thread_id)
        return session.snapshot()

    def get_history(self, thread_id: str) -> CheckpointHistory:
        """
        A thread's checkpoints, newest first, each with its id, parent id, step, source (input, model, tools or
        update), tool names, creation time and changed keys. Renders as a table in notebooks.

        :param thread_id: The thread.
        :returns: The checkpoints.
        """
        if self.checkpointer is None:
            raise ValueError("get_history needs an Agent created with a checkpointer.")
        history = self.checkpointer.history(thread_id)
        if not history:
            raise ThreadNotFoundError(thread_id)
        return CheckpointHistory(history)

    def update_state(self, thread_id: str, values: dict[str, Any]) -> CheckpointMeta:
        """
        A human edit of a thread's state: the values are written through their keys' handlers, all or nothing, and
        recorded as a checkpoint of its own (source ``"update"``).

        :param thread_id: The thread.
        :param values: key -> value.
        :returns: The new checkpoint's record.
        :raises StateTypeError: If a value does not fit its key (nothing is written).
        :raises ThreadConflictError: If a run committed to the thread meanwhile.
        """
        session = self._session(thread_id, None)
        assert session is not None
        state = session.load_state()
        state.update(values)
        return session.commit(state, "update")

    # --- executing the loop's effects ------------------------------------------------------------------

    def _drive(self, flow: Generator[Effect, Any, dict[str, Any]]) -> dict[str, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                if isinstance(effect, CallModel):
                    value = self.chat_generator.run(**effect.inputs)
                elif isinstance(effect, RunTools):
                    value = run_tool_calls(
                        effect.messages,
                        effect.state,
                        self._specs,
                        raise_on_failure=self.raise_on_tool_invocation_failure,
                        max_workers=self.tool_concurrency_limit,
                        streaming_callback=effect.streaming_callback,  # type: ignore[arg-type]  # sync-selected
                    )
                elif isinstance(effect, RunHooks):
                    value = [_call_hook_sync(hook, effect.state) for hook in effect.hooks]
            except Exception as exc:
                error = exc

    async def _drive_async(self, flow: Generator[Effect, Any, dict[str, Any]]) -> dict[str, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                if isinstance(effect, CallModel):
                    run_async = getattr(self.chat_generator, "run_async", None)
                    if run_async is not None:
                        value = await run_async(**effect.inputs)
                    else:
                        value = await asyncio.to_thread(self.chat_generator.run, **effect.inputs)
                elif isinstance(effect, RunTools):
                    value = await run_tool_calls_async(
                        effect.messages,
                        effect.state,
                        self._specs,
                        raise_on_failure=self.raise_on_tool_invocation_failure,
                        max_workers=self.tool_concurrency_limit,
                        streaming_callback=effect.streaming_callback,
                    )
                elif isinstance(effect, RunHooks):
                    value = []
                    for hook in effect.hooks:
                        returned = hook(effect.state)
                        value.append(await returned if inspect.isawaitable(returned) else returned)
            except Exception as exc:
                error = exc

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
        if params.get("hooks"):
            params["hooks"] = {
                point: [deserialize_callable(h) for h in hooks] for point, hooks in params["hooks"].items()
            }
        return default_from_dict(cls, data)
