"""
``Agent``: a Haystack component that loops model -> tools -> model over a typed State and exposes every state key
as an output. A drop-in for haystack-ai 3.4's ``Agent`` (its hooks, prompts, per-run options, lazy toolsets, errors
and tracing spans), with durable threads. The loop is written once (:mod:`haystack_state.agent._loop`); ``run`` and
``run_async`` only execute the model calls, tool calls, hooks and commits it asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from haystack import component
from haystack.dataclasses import ChatMessage
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.token_counters import TokenCounter
from haystack.tools.utils import warm_up_tools, warm_up_tools_async

from haystack_state.agent import _agent_serde as agent_serde
from haystack_state.agent import _lifecycle as lifecycle
from haystack_state.agent import _streaming as streaming
from haystack_state.agent import _thread_methods as thread_methods
from haystack_state.agent._agent_setup import AgentSetup, check_limits, configure
from haystack_state.agent._continuation import check_unfinished_calls
from haystack_state.agent._hooks import normalize_hooks
from haystack_state.agent._prompts import RequiredVariables
from haystack_state.agent._run_config import RunOptions
from haystack_state.agent._runner import execute, execute_async, runtime_tools
from haystack_state.agent.context import ContextPolicy
from haystack_state.agent.protocols import DecisionLike, UnfinishedCalls
from haystack_state.invocation._timeouts import check_max_tool_calls, check_timeout
from haystack_state.persistence.base import Checkpointer
from haystack_state.retry import RetryPolicy
from haystack_state.store import Store
from haystack_state.tools.spec import ToolsArg

__all__ = ["Agent"]


@component
class Agent:
    """
    A tool-calling agent over a typed State: it sends the messages and the tools to the chat generator, runs the
    tool calls the model makes (in parallel where they are independent, merging their outputs into the state), and
    repeats until the model answers in text, an exit-condition tool succeeds, a hook stops it, or ``max_agent_steps``
    is reached.

    Every state key is an output of the component, and an optional input: ``agent.run(messages, user_name="Alice")``
    fills the ``user_name`` key (through its handler) before the first step. The variables of ``system_prompt`` and
    ``user_prompt`` are inputs too.

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
        ``Toolset``s (including ones that load their tools in ``warm_up``, such as MCP toolsets), or a list mixing
        them.
    :param system_prompt: The system prompt: a Jinja2 template (plain text, or one ``{% message role="system" %}``
        block) rendered from ``run``'s keyword arguments, put first on a new conversation unless the messages
        already start with a system message.
    :param exit_conditions: What ends the run: ``"text"`` (a reply without tool calls) and/or tool names (a
        successful call of that tool). Defaults to ``["text"]``. A reply without tool calls always ends the run.
    :param state_schema: The State schema (see ``State``). A ``messages`` key is added automatically; as in
        haystack-ai, ``agent.resolved_state_schema`` is the schema with it and with the run values every run's state
        carries (``step_count``, ``token_usage``, ``tool_call_counts``, ``exit_reason``, ``continue_run``,
        ``stop_run``, ``tools``, ``hook_context``, ``context_tokens``).
    :param max_agent_steps: The most model calls a run makes.
    :param streaming_callback: Receives the model's streamed chunks and the tool results.
    :param raise_on_tool_invocation_failure: Raise on a failed tool call instead of reporting it to the model.
    :param tool_concurrency_limit: How many tool calls may run at once.
    :param hooks: What runs at the points of a run: ``before_run``, ``before_llm``, ``before_tool``,
        ``after_tool``, ``on_exit`` and ``after_run``; ``{"before_llm": hook}`` or ``{"before_llm": [hook, ...]}``. A
        hook is a haystack ``Hook`` (``@hook`` from ``haystack.hooks``, ``ConfirmationHook``, the budget and
        compaction hooks, any object with ``run(state)``) or a plain callable taking the state (sync or async). Hooks
        get the run's live state, which also carries ``step_count``, ``token_usage``, ``tool_call_counts``,
        ``context_tokens``, ``exit_reason``, ``tools`` and ``hook_context`` as in haystack-ai; a hook that sets
        ``stop_run`` ends the run before the next model call (its value is the exit reason), and an ``on_exit`` hook
        that sets ``continue_run`` (or returns ``True``) keeps it going.
    :param checkpointer: Where durable threads live (see ``haystack_state.persistence``): with it, ``run(...,
        thread_id=...)`` loads the thread's state and commits a checkpoint after every model reply and every step's
        tool results; ``get_state``, ``get_history``, ``update_state`` and ``resume`` read and edit threads. Keys
        with ``"scope": "run"`` in the schema are reset at the start of every run of a thread; the others
        (``messages`` always) are kept.
    :param interrupt_before: Tool names before which a run on a thread stops, with ``exit_reason="interrupted"``
        and the calls in ``pending_tool_calls``, until ``resume`` gets a decision for each. Needs a checkpointer.
    :param user_prompt: A user prompt template (plain text, or one ``{% message role="user" %}`` block) rendered
        from ``run``'s keyword arguments and appended to the run's messages.
    :param required_variables: The prompt variables ``run`` must be given: ``"*"`` (all, the default), a list, or
        None (none; missing ones render empty).
    :param tool_streaming_callback_passthrough: Pass the streaming callback to tools that take a
        ``streaming_callback`` parameter. ``run(..., enable_streaming_callback_passthrough=...)`` overrides it for a
        run.
    :param context_policy: Decides what the model is sent on each call (trimming, token budgets, summaries; see
        ``haystack_state.agent.context``); the stored conversation never loses a message.
    :param token_counter: The haystack ``TokenCounter`` the context policy measures with (a cheap estimate, or
        ``tiktoken`` when installed, by default).
    :param interrupt_after: Tool names after whose results a run on a thread stops for a human's review
        (``exit_reason="interrupted"``), until ``resume`` gets an answer for each. Needs a checkpointer.
    :param store: A long-term memory store (``haystack_state.store``), shared by every thread: tools, hooks, loaders
        and the context policy reach it as ``context.store`` (see ``RunContext``).
    :param tool_timeout: The most seconds a tool call may take, for tools without a ``timeout`` of their own; None
        (the default) for no timeout. A call over time is answered with a ``ToolTimeoutError`` and merges nothing.
    :param max_tool_calls: The most tool calls of one model reply that run; the others are answered with a
        ``ToolCallLimitError``. None for no limit.
    :param on_unfinished_calls: What a run with new messages does on a thread whose last run stopped between the
        model's tool calls and their results (a crash, a cancel): ``"finish"`` runs those calls first (a call that
        was in flight at a crash runs again), ``"close"`` answers them with error results saying the run stopped,
        ``"refuse"`` raises ``ThreadBusyError``; then the new messages are taken and the model answers. None (the
        default) is ``"close"`` after a cancel (the user did not want those calls made) and ``"finish"`` after a
        crash. ``run(on_unfinished_calls=...)`` overrides it per run.
    :param retry_policy: Retries of failed model and tool calls (see ``haystack_state.RetryPolicy``): one policy for
        both, or ``{"model": RetryPolicy(...), "tools": RetryPolicy(...)}`` for a budget of each (a kind left out, or
        None, is not retried). Every call gets the policy's ``max_attempts``; only errors its ``retry_on`` matches are
        retried (connection errors, timeouts of the model client, rate limits and 5xx replies by default). A model
        call that fails its last attempt fails the run as without retries (``AgentRunError``, its message saying how
        many attempts were made); a tool call's last failure goes to the model as an error result (or raises, with
        ``raise_on_tool_invocation_failure``). ``tool_timeout`` bounds each attempt; a ``ToolTimeoutError`` is
        retried only if ``retry_on`` names it. Retried calls are recorded in the ``retries`` metadata of the
        checkpoint that follows them. None (the default): nothing is retried.
    :raises TypeError: If tools are given and the chat generator's ``run`` does not accept ``tools``, or a hook is
        neither a ``Hook`` nor callable.
    :raises StateSchemaError: If the state schema is invalid.
    :raises ValueError: For a schema key or prompt variable that clashes with an output, a ``run`` parameter or a run
        value, an unknown hook point, a hook registered where it cannot run, an ``interrupt_before`` tool that names
        no tool, ``interrupt_before`` without a checkpointer, or a malformed prompt. (An exit condition naming no tool
        is logged as a warning, as a run's ``tools=...`` may provide it; with a toolset, once it is warmed up.)
    :raises ToolDefinitionError: If a tool maps to or from a state key the schema does not declare.
    """

    # Serialized (and registered with Pipelines) under its public path, whatever module it is defined in.
    __module__ = "haystack_state.agent"
    #: Inputs a ``ComponentTool`` wrapping the agent does not show the model: which thread a sub-agent runs on, and
    #: the run's live dependencies (``context``), are the application's choice, never the model's.
    hidden_from_tools: ClassVar[frozenset[str]] = frozenset(
        {
            "thread_id",
            "checkpoint_id",
            "context",
            "on_unfinished_calls",
            "run_id",
            "enable_streaming_callback_passthrough",
        }
    )

    def __init__(
        self,
        chat_generator: Any,
        *,
        tools: ToolsArg | None = None,
        system_prompt: str | None = None,
        exit_conditions: list[str] | None = None,
        state_schema: dict[str, Any] | None = None,
        max_agent_steps: int = 100,
        streaming_callback: StreamingCallbackT | None = None,
        raise_on_tool_invocation_failure: bool = False,
        tool_concurrency_limit: int = 4,
        hooks: dict[str, Any] | None = None,
        checkpointer: Checkpointer | None = None,
        interrupt_before: list[str] | None = None,
        user_prompt: str | None = None,
        required_variables: RequiredVariables = "*",
        tool_streaming_callback_passthrough: bool = False,
        context_policy: ContextPolicy | None = None,
        token_counter: TokenCounter | None = None,
        store: Store | None = None,
        interrupt_after: list[str] | None = None,
        tool_timeout: float | None = None,
        max_tool_calls: int | None = 64,
        on_unfinished_calls: UnfinishedCalls | None = None,
        retry_policy: RetryPolicy | dict[str, RetryPolicy | None] | None = None,
    ) -> None:
        self.chat_generator = chat_generator
        self.tools = tools if tools is not None else []
        self.system_prompt = system_prompt
        self.user_prompt = user_prompt
        self.required_variables = required_variables
        self.exit_conditions = list(exit_conditions) if exit_conditions is not None else ["text"]
        self.state_schema = dict(state_schema or {})
        self.max_agent_steps = max_agent_steps
        self.streaming_callback = streaming_callback
        self.raise_on_tool_invocation_failure = raise_on_tool_invocation_failure
        self.tool_concurrency_limit = tool_concurrency_limit
        self.tool_streaming_callback_passthrough = tool_streaming_callback_passthrough
        self.context_policy = context_policy
        self.token_counter = token_counter
        if store is not None and not isinstance(store, Store):
            raise TypeError(
                f"store must be a haystack_state.store.Store (InMemoryStore, SQLiteStore, PostgresStore), "
                f"got {store!r}."
            )
        self.store = store
        self.hooks = normalize_hooks(hooks)
        self.checkpointer = checkpointer
        self.interrupt_before = list(interrupt_before or [])
        self.interrupt_after = list(interrupt_after or [])
        check_limits(tool_concurrency_limit, max_agent_steps)
        self.tool_timeout = check_timeout(tool_timeout, "Agent tool_timeout")
        self.max_tool_calls = check_max_tool_calls(max_tool_calls, "Agent max_tool_calls")
        self.on_unfinished_calls = check_unfinished_calls(on_unfinished_calls, "Agent")
        self.retry_policy = retry_policy
        #: What the agent derived from its parameters (its run's schema, prompts, tools, loop settings), checked.
        self.setup: AgentSetup = configure(self, retry_policy)
        self.resolved_state_schema: dict[str, dict[str, Any]] = self.setup.resolved_schema  # (see state_schema)
        self._specs_fields, self._model_retry = self.setup.specs, self.setup.loop_config.model_retry
        self._tool_retry = self.setup.loop_config.tool_settings.retry_policy

    # --- lifecycle (haystack_state.agent._lifecycle) ---------------------------------------------------------------

    warm_up = lifecycle.warm_up
    warm_up_async = lifecycle.warm_up_async
    close = lifecycle.close
    close_async = lifecycle.close_async
    clone = lifecycle.clone

    def run(
        self,
        messages: list[ChatMessage],
        streaming_callback: StreamingCallbackT | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        *,
        generation_kwargs: dict[str, Any] | None = None,
        tools: ToolsArg | list[str] | None = None,
        hook_context: dict[str, Any] | None = None,
        context: Any = None,
        on_unfinished_calls: UnfinishedCalls | None = None,
        run_id: str | None = None,
        enable_streaming_callback_passthrough: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """
        Run the agent until the model answers in text, an exit-condition tool succeeds, a hook stops it, or the step
        limit is hit.

        :param messages: The conversation so far (typically one user message; may be empty with a ``user_prompt``).
        :param streaming_callback: Overrides the callback given at construction for this run.
        :param thread_id: Run on this durable thread (needs a ``checkpointer``): load its state, reset its
            run-scoped keys, append ``messages``, and commit a checkpoint after every model reply and every step's
            tool results. With no new messages on a run that stopped early (a crash, an error), continue that run:
            run the tool calls it left pending, keep its run-scoped keys, its step count and its token usage.
        :param checkpoint_id: With ``thread_id``, start from this earlier checkpoint: the run forks a new branch
            and leaves the old one as it was.
        :param generation_kwargs: Settings for the chat generator for this run, merged per key with the ones it was
            built with (the chat generator merges them).
        :param tools: The tools for this run: a list of names of the agent's tools, or tools and toolsets of its own
            (warmed up here; the caller closes them).
        :param hook_context: Per-run resources for hooks (a WebSocket, a queue, ...), read by them as
            ``state.data["hook_context"]``. Never stored, never copied.
        :param context: The run's dependencies (a database connection, an HTTP client, the current user): tools
            receive them through a parameter annotated ``RunContext[T]`` (hidden from the model), hooks as
            ``state.context``, loaders and context policies as their ``context``. The object is handed over as it
            is: never copied, stored, serialized, returned or shown to the model.
        :param on_unfinished_calls: With new messages on a thread whose last run stopped mid-tools: ``"finish"``,
            ``"close"`` or ``"refuse"`` (see the Agent's parameter, which applies if None).
        :param run_id: An id of your own for the run (a server's run id), recorded in its checkpoints' metadata as
            ``run_id``.
        :param enable_streaming_callback_passthrough: Overrides ``tool_streaming_callback_passthrough`` for this run:
            pass the streaming callback to tools that take a ``streaming_callback`` parameter. None keeps the
            Agent's setting.
        :param kwargs: Initial values for state keys (written through their handlers), and the prompts' variables.
        :returns: ``messages``, ``last_message``, every state key, ``step_count`` (the run's model calls; on a
            continued run, those before it stopped included), ``exit_reason`` ("text", "length" or
            "content_filter" for an incomplete reply, the name of the exit tool, "max_agent_steps", "interrupted",
            "cancelled", or the value a hook set as ``stop_run``), ``token_usage`` (summed from the replies'
            ``usage`` meta), ``tool_call_counts`` (calls per tool), ``context_tokens`` (the last call's input plus
            output tokens, as its usage reports them), ``pending_tool_calls`` (the calls waiting for ``resume``
            after an interrupt) and ``checkpoint_id`` (the thread's head after the run, or None without a thread).
        :raises AgentRunError: If the chat generator or a hook raises; the error carries the partial State.
        :raises ToolInvocationError: With ``raise_on_tool_invocation_failure``, when a tool call fails (an instance
            of haystack's ``ToolInvocationError`` too).
        :raises ValueError: For a missing required prompt variable (nothing is sent or stored), unknown inputs, a
            thread interrupted before a tool (use ``resume``), or new messages while tool calls of the thread are
            pending.
        :raises ThreadConflictError: If another run committed to the thread meanwhile (the failed commit wrote
            nothing).
        :raises CodecError: If a state value cannot be stored (the message names the key; nothing was written).
        :raises CheckpointNotFoundError: For an unknown ``checkpoint_id``.
        """
        self.warm_up()
        warm_up_tools(runtime_tools(tools))
        options = RunOptions(
            streaming_callback,
            thread_id,
            checkpoint_id,
            generation_kwargs,
            tools,
            hook_context,
            context=context,
            on_unfinished_calls=on_unfinished_calls,
            run_id=run_id,
            enable_streaming_callback_passthrough=enable_streaming_callback_passthrough,
        )
        return execute(self, messages, kwargs, options)

    async def run_async(
        self,
        messages: list[ChatMessage],
        streaming_callback: StreamingCallbackT | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        *,
        generation_kwargs: dict[str, Any] | None = None,
        tools: ToolsArg | list[str] | None = None,
        hook_context: dict[str, Any] | None = None,
        context: Any = None,
        on_unfinished_calls: UnfinishedCalls | None = None,
        run_id: str | None = None,
        enable_streaming_callback_passthrough: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """
        Run the agent asynchronously. Same parameters and outputs as :meth:`run`; the chat generator's
        ``run_async`` is used when it has one, async tools and hooks are awaited (a hook's ``run_async`` when it has
        one, its ``run`` in a worker thread otherwise).

        :param messages: The conversation so far.
        :param streaming_callback: Overrides the callback given at construction for this run (sync or async).
        :param thread_id: Run on this durable thread (see :meth:`run`).
        :param checkpoint_id: With ``thread_id``, fork from this earlier checkpoint.
        :param generation_kwargs: Settings for the chat generator for this run.
        :param tools: The tools for this run (see :meth:`run`).
        :param hook_context: Per-run resources for hooks.
        :param context: The run's dependencies (see :meth:`run`).
        :param on_unfinished_calls: See :meth:`run`.
        :param run_id: See :meth:`run`.
        :param enable_streaming_callback_passthrough: See :meth:`run`.
        :param kwargs: Initial values for state keys, and the prompts' variables.
        :returns: The same outputs as :meth:`run`.
        """
        await self.warm_up_async()
        await warm_up_tools_async(runtime_tools(tools))
        options = RunOptions(
            streaming_callback,
            thread_id,
            checkpoint_id,
            generation_kwargs,
            tools,
            hook_context,
            context=context,
            on_unfinished_calls=on_unfinished_calls,
            run_id=run_id,
            enable_streaming_callback_passthrough=enable_streaming_callback_passthrough,
        )
        return await execute_async(self, messages, kwargs, options)

    def resume(
        self,
        thread_id: str,
        decisions: Mapping[str, DecisionLike] | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        *,
        answers: Mapping[str, object] | None = None,
        generation_kwargs: dict[str, Any] | None = None,
        hook_context: dict[str, Any] | None = None,
        context: Any = None,
    ) -> dict[str, Any]:
        """
        Continue a run that stopped for a human (``interrupt_before``, ``interrupt_after``, or ``interrupt(value)`` in
        a tool or a ``before_tool`` hook), possibly in another process, days later. The requests it waits for are
        the run's ``pending_interrupts`` output (and ``get_state(thread_id).interrupts``); each needs a decision or
        an answer.

        :param thread_id: The interrupted thread.
        :param decisions: For each call held by ``interrupt_before``, by call id: ``"approve"`` (run it), ``"reject"``
            (the model is told a human rejected it) or ``{"arguments": {...}}`` (run it with these arguments instead;
            they are checked against the tool's parameters). A result under review (``interrupt_after``) takes any
            decision (``"approve"``) to go on.
        :param answers: For each ``interrupt()`` request, by its id: the answer. The tool call runs again from its
            start, and its ``interrupt()`` calls return the answers given so far, in order. A review
            (``interrupt_after``) may be answered here too.
        :param streaming_callback: Overrides the callback given at construction.
        :param generation_kwargs: Settings for the chat generator for the rest of the run.
        :param hook_context: Per-run resources for hooks.
        :param context: The run's dependencies (see :meth:`run`).
        :returns: The same outputs as :meth:`run`.
        :raises ThreadNotFoundError: If the thread has no checkpoint.
        :raises ValueError: If the thread is not interrupted, a request has no (valid) decision or answer, an edit
            does not fit the tool's parameters, or an id is unknown; nothing is written then, and the thread stays
            interrupted.
        """
        self.warm_up()
        options = RunOptions(
            streaming_callback, thread_id, None, generation_kwargs, None, hook_context, decisions, context, answers
        )
        return execute(self, [], {}, options)

    async def resume_async(
        self,
        thread_id: str,
        decisions: Mapping[str, DecisionLike] | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        *,
        answers: Mapping[str, object] | None = None,
        generation_kwargs: dict[str, Any] | None = None,
        hook_context: dict[str, Any] | None = None,
        context: Any = None,
    ) -> dict[str, Any]:
        """Continue an interrupted run asynchronously. Same parameters and outputs as :meth:`resume`."""
        await self.warm_up_async()
        options = RunOptions(
            streaming_callback, thread_id, None, generation_kwargs, None, hook_context, decisions, context, answers
        )
        return await execute_async(self, [], {}, options)

    # --- streaming (haystack_state.agent._streaming) ---------------------------------------------------------------

    stream = streaming.stream
    stream_async = streaming.stream_async

    # --- durable threads (haystack_state.agent._thread_methods) -------------------------------------------------

    cancel = thread_methods.cancel
    cancel_async = thread_methods.cancel_async
    get_state = thread_methods.get_state
    get_state_async = thread_methods.get_state_async
    get_history = thread_methods.get_history
    get_history_async = thread_methods.get_history_async
    update_state = thread_methods.update_state

    # --- serialisation (haystack_state.agent._agent_serde) ------------------------------------------------------

    to_dict = agent_serde.agent_to_dict
    from_dict = classmethod(agent_serde.agent_from_dict)
