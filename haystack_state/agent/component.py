"""
``Agent``: a Haystack component that loops model -> tools -> model over a typed State and exposes every state key
as an output. A drop-in for haystack-ai 3.4's ``Agent`` (its hooks, prompts, per-run options, lazy toolsets, errors
and tracing spans), with durable threads. The loop is written once (:mod:`haystack_state.agent.loop`); ``run`` and
``run_async`` only execute the model calls, tool calls, hooks and commits it asks for.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, ClassVar

from haystack import component, default_from_dict, default_to_dict, logging
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.dataclasses.streaming_chunk import StreamingCallbackT, select_streaming_callback
from haystack.token_counters import TokenCounter
from haystack.tools.serde_utils import deserialize_tools_or_toolset_inplace, serialize_tools_or_toolset
from haystack.tools.toolset import Toolset
from haystack.tools.utils import (
    close_tools,
    close_tools_async,
    flatten_tools_or_toolsets,
    warm_up_tools,
    warm_up_tools_async,
)
from haystack.utils import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.agent.context import (
    ContextPolicy,
    ContextSummary,
    policy_from_dict,
    policy_to_dict,
    policy_tools,
)
from haystack_state.agent.drive import Effects, accepts, drive, drive_async
from haystack_state.agent.events import EventSink
from haystack_state.agent.hooks import (
    close_hooks,
    close_hooks_async,
    deserialize_hooks,
    normalize_hooks,
    serialize_hooks,
    warm_up_hooks,
    warm_up_hooks_async,
)
from haystack_state.agent.loop import (
    RESERVED_INPUTS,
    RESERVED_OUTPUTS,
    LoopConfig,
    RunControl,
    RunRequest,
    agent_loop,
)
from haystack_state.agent.prompts import PromptTemplates, RequiredVariables
from haystack_state.agent.run_state import RUN_KEYS, resolved_schema
from haystack_state.agent.session import ThreadSession, UnfinishedCalls, check_unfinished_calls
from haystack_state.agent.streaming import RunOptions, StreamMethods, model_callback, runtime_tools
from haystack_state.agent.thread_methods import ThreadMethods
from haystack_state.agent.toolbox import Toolbox, ToolsArg, check_names, unknown_names
from haystack_state.invocation.timeouts import check_max_tool_calls, check_timeout
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.serde import checkpointer_from_dict
from haystack_state.retry import RetryPolicy, retry_policies, retry_policy_from_dict, retry_policy_to_dict
from haystack_state.schema import build_schema, schema_from_dict, schema_to_dict
from haystack_state.store import Store, store_from_dict

__all__ = ["Agent"]

logger = logging.getLogger(__name__)


#: The state key holding the running summary of a ``Summarize`` context policy: thread-scoped, checkpointed.
SUMMARY_KEY = "context_summary"
SUMMARY_FIELD: dict[str, Any] = {
    "type": ContextSummary | None,
    "description": "The running summary of the conversation's older turns (the Summarize context policy's).",
}


def folds_summary(policy: Any) -> bool:
    """Whether a context policy (or one it composes) writes the running summary."""
    return any(getattr(p, "folds_summary", False) for p in [policy, *getattr(policy, "policies", [])])


def _given(tools: ToolsArg | None) -> bool:
    """Whether tools were given (a Toolset counts even if it has not loaded its tools yet)."""
    return tools is not None and (isinstance(tools, Toolset) or len(tools) > 0)


@component
class Agent(ThreadMethods, StreamMethods):
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

        if tool_concurrency_limit < 1:
            raise ValueError(
                f"tool_concurrency_limit must be greater than or equal to 1, got {tool_concurrency_limit}."
            )
        if max_agent_steps < 1:
            raise ValueError(f"max_agent_steps must be greater than or equal to 1, got {max_agent_steps}.")
        self.tool_timeout = check_timeout(tool_timeout, "Agent tool_timeout")
        self.max_tool_calls = check_max_tool_calls(max_tool_calls, "Agent max_tool_calls")
        self.on_unfinished_calls = check_unfinished_calls(on_unfinished_calls, "Agent")
        self._model_retry, self._tool_retry = retry_policies(retry_policy, "Agent")
        self.retry_policy = retry_policy
        self._generator_takes_tools = accepts(chat_generator.run, "tools")
        if context_policy is not None and not callable(getattr(context_policy, "plan", None)):
            raise TypeError(f"context_policy must have a plan(view) method, got {context_policy!r}.")
        summary_key = SUMMARY_KEY if context_policy is not None and folds_summary(context_policy) else None
        reserved = RESERVED_OUTPUTS | RESERVED_INPUTS | set(RUN_KEYS) | ({SUMMARY_KEY} if summary_key else set())
        clashes = sorted(set(self.state_schema) & reserved)
        if clashes:
            raise ValueError(
                f"state_schema keys {clashes} are reserved for Agent internal state and cannot be redefined: they "
                f"clash with Agent outputs, run parameters or run values; rename them. Reserved keys: "
                f"{', '.join(sorted(reserved))}."
            )
        self._specs_fields = build_schema(
            {**self.state_schema, SUMMARY_KEY: SUMMARY_FIELD} if summary_key else self.state_schema
        )
        #: The state schema of a run, as haystack-ai's Agent exposes it: the ``state_schema`` entries as given (and
        #: the running summary's, with a summarizing context policy), ``messages`` unless declared, then the run
        #: values every run's state carries (``step_count``, ``token_usage``, ..., ``context_tokens``).
        self.resolved_state_schema: dict[str, dict[str, Any]] = resolved_schema(
            self.state_schema, {SUMMARY_KEY: SUMMARY_FIELD} if summary_key else {}
        )
        self._prompts = PromptTemplates(system_prompt, user_prompt, required_variables)
        for name, sources in self._prompts.variables.items():
            where = " and ".join(sources)
            if name in self._specs_fields:
                raise ValueError(
                    f"Variable '{name}' from {where} is already defined in the state schema. Rename the variable or "
                    "the key, since run() could not tell which one a value is for."
                )
            if name in reserved or name == "messages":
                raise ValueError(
                    f"Variable '{name}' from {where} conflicts with input names in the run method. Rename the "
                    "variable: the run's parameters and the Agent's outputs cannot be prompt variables."
                )
        if isinstance(required_variables, list) and not self._prompts.variables:
            logger.warning(
                "The parameter required_variables is provided but neither user_prompt nor system_prompt contains "
                "template variables: it has no effect. Either provide a prompt with Jinja2 template variables or "
                "remove required_variables."
            )
        if _given(tools) and not self._generator_takes_tools:
            names = [tool.name for tool in flatten_tools_or_toolsets(tools)]
            raise TypeError(
                f"{type(chat_generator).__name__} does not accept tools parameter in its run method, so it cannot be "
                f"given tools ({', '.join(names) or 'a toolset'}). The Agent component requires a chat generator "
                "that supports tools when tools are provided."
            )
        extra_tools = policy_tools(context_policy) if context_policy is not None else []
        self._toolbox = Toolbox(self.tools, self._specs_fields, extra=extra_tools)
        known = self._toolbox.known()  # checks the known tools' state mappings
        # Tools of a toolset that loads them in warm_up() are known only then: names they may provide are checked
        # after warm-up.
        self._names_checked = False
        if not self._toolbox.has_toolsets:
            self._check_tool_names(known.specs)
        if self.interrupt_before and checkpointer is None:
            raise ValueError("interrupt_before needs a checkpointer: an interrupted run is resumed from its thread.")
        if self.interrupt_after and checkpointer is None:
            raise ValueError("interrupt_after needs a checkpointer: an interrupted run is resumed from its thread.")

        self._check_input_mappings(known.specs)
        for key, spec in self._specs_fields.items():
            if key != "messages" and spec.is_input and spec.scope != "loaded":
                component.set_input_type(self, name=key, type=spec.type, default=None)
        for name in self._prompts.variables:
            if name in self._prompts.required:
                component.set_input_type(self, name=name, type=Any)
            else:
                component.set_input_type(self, name=name, type=Any, default=None)
        outputs: dict[str, Any] = {key: spec.type for key, spec in self._specs_fields.items() if spec.is_output}
        outputs.update(
            last_message=ChatMessage,
            step_count=int,
            exit_reason=str,
            token_usage=dict[str, Any],
            tool_call_counts=dict[str, int],
            context_tokens=int,
            pending_tool_calls=list[ToolCall],
            pending_interrupts=list[dict[str, Any]],
            checkpoint_id=str | None,
        )
        component.set_output_types(self, **outputs)
        self._loop_config = LoopConfig(
            schema=self._specs_fields,
            toolbox=self._toolbox,
            exit_conditions=self.exit_conditions,
            max_agent_steps=self.max_agent_steps,
            hooks=self.hooks,
            generator_streams=accepts(chat_generator.run, "streaming_callback"),
            context_policy=context_policy,
            token_counter=(lambda: token_counter) if token_counter is not None else None,
            summary_key=summary_key,
            interrupt_before=frozenset(self.interrupt_before),
            interrupt_after=frozenset(self.interrupt_after),
            store=store,
            on_unfinished_calls=self.on_unfinished_calls,
            resolved_schema=self.resolved_state_schema,
            model_retry=self._model_retry,
        )
        self._is_warmed_up = False

    def _check_input_mappings(self, specs: dict[str, Any]) -> None:
        """A tool whose outputs_to_state writes an ``"input"`` key could never succeed: refuse it now."""
        for name, spec in specs.items():
            for key in spec.outputs_to_state:
                field = self._specs_fields.get(key)
                if field is not None and field.scope == "input":
                    raise ValueError(
                        f"Tool '{name}' maps an output to state key '{key}', which has \"scope\": \"input\": it is "
                        "set by the caller when a run starts and is read-only to tools. Map the output to another key."
                    )

    def _check_tool_names(self, specs: dict[str, Any]) -> None:
        # As haystack-ai, an exit condition may name a tool that only a run's tools=... provides: a warning, not an
        # error. interrupt_before (ours) must name the agent's own tools.
        unknown = unknown_names(self.exit_conditions, specs, allowed=("text",))
        if unknown:
            logger.warning(
                "exit_conditions {unknown} name no tool of this agent (its tools: {tools}): they can end only a run "
                "given such a tool with run(tools=...).",
                unknown=unknown,
                tools=", ".join(specs) or "none",
            )
        check_names("interrupt_before", self.interrupt_before, specs)
        check_names("interrupt_after", self.interrupt_after, specs)
        self._names_checked = True

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def warm_up(self) -> None:
        """
        Warm up the tools (a lazy toolset loads its tools now), the hooks and the chat generator. ``run`` does it on
        first use.

        :raises ValueError: If ``interrupt_before`` names a tool that no tool provides.
        """
        if self._is_warmed_up:
            return
        warm_up_tools(self.tools)
        warm_up_hooks(self.hooks)
        if hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()
        self._after_warm_up()

    async def warm_up_async(self) -> None:
        """Warm up the tools, hooks and chat generator, awaiting their ``warm_up_async`` where they have one."""
        if self._is_warmed_up:
            return
        await warm_up_tools_async(self.tools)
        await warm_up_hooks_async(self.hooks)
        if hasattr(self.chat_generator, "warm_up_async"):
            await self.chat_generator.warm_up_async()
        elif hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()
        self._after_warm_up()

    def _after_warm_up(self) -> None:
        if not self._names_checked:
            specs = self._toolbox.known().specs
            self._check_tool_names(specs)
            self._check_input_mappings(specs)
        self._is_warmed_up = True

    def close(self) -> None:
        """Release what the tools, hooks and chat generator hold (clients, models). A later run warms up again."""
        close_tools(self.tools)
        close_hooks(self.hooks)
        if hasattr(self.chat_generator, "close"):
            self.chat_generator.close()
        self._is_warmed_up = False

    async def close_async(self) -> None:
        """Release what the tools, hooks and chat generator hold, awaiting their ``close_async`` where they have one."""
        await close_tools_async(self.tools)
        await close_hooks_async(self.hooks)
        if hasattr(self.chat_generator, "close_async"):
            await self.chat_generator.close_async()
        elif hasattr(self.chat_generator, "close"):
            self.chat_generator.close()
        self._is_warmed_up = False

    def clone(self, **overrides: Any) -> Agent:
        """
        A new Agent configured like this one, with the given ``__init__`` parameters replaced.

        :param overrides: Parameters to replace, e.g. ``agent.clone(system_prompt="...")``.
        :returns: The new Agent.
        """
        names = [name for name in inspect.signature(type(self).__init__).parameters if name != "self"]
        params = {name: getattr(self, name) for name in names}
        return type(self)(**{**params, **overrides})

    # --- running -----------------------------------------------------------------------------------------------

    def _prepare(
        self,
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
        callback: StreamingCallbackT | None = select_streaming_callback(  # type: ignore[call-overload]
            self.streaming_callback, options.streaming_callback, requires_async=is_async
        )
        variables = self._prompts.variables
        prompt_values = {name: value for name, value in kwargs.items() if name in variables}
        inputs = {key: value for key, value in kwargs.items() if key not in variables}
        system, user = self._prompts.render(prompt_values)
        run_tools = self._toolbox.for_run(options.tools)
        if options.tools is not None and not self._generator_takes_tools and self._toolbox.resolve(run_tools).specs:
            raise TypeError(
                f"{type(self.chat_generator).__name__} does not accept tools parameter in its run method, so it "
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

    def _effects(self, control: RunControl | None = None, options: RunOptions | None = None) -> Effects:
        passthrough = options.enable_streaming_callback_passthrough if options is not None else None
        return Effects(
            chat_generator=self.chat_generator,
            raise_on_failure=self.raise_on_tool_invocation_failure,
            max_workers=self.tool_concurrency_limit,
            passthrough=self.tool_streaming_callback_passthrough if passthrough is None else passthrough,
            control=control,
            tool_timeout=self.tool_timeout,
            max_tool_calls=self.max_tool_calls,
            tool_retry=self._tool_retry,
        )

    def _open(self, options: RunOptions) -> ThreadSession | None:
        """Open the run's thread (under its lease), or None without one; the caller closes it."""
        if options.decisions is not None or options.answers is not None:
            return self._existing(str(options.thread_id), lease=True)
        return self._session(options.thread_id, options.checkpoint_id)

    async def _open_async(self, options: RunOptions) -> ThreadSession | None:
        """:meth:`_open`, awaiting the checkpointer."""
        if options.decisions is not None or options.answers is not None:
            return await self._existing_async(str(options.thread_id), lease=True)
        return await self._session_async(options.thread_id, options.checkpoint_id)

    def _execute(self, messages: list[ChatMessage], kwargs: dict[str, Any], options: RunOptions) -> dict[str, Any]:
        """Prepare, open the thread, run the loop synchronously, release the thread."""
        request = self._prepare(messages, kwargs, options, is_async=False)
        session = self._open(options)
        try:
            return drive(agent_loop(self._loop_config, request, session), self._effects(None, options))
        finally:
            if session is not None:
                session.close()

    async def _execute_async(
        self, messages: list[ChatMessage], kwargs: dict[str, Any], options: RunOptions
    ) -> dict[str, Any]:
        """:meth:`_execute`, awaiting the effects."""
        request = self._prepare(messages, kwargs, options, is_async=True)
        session = await self._open_async(options)
        try:
            return await drive_async(agent_loop(self._loop_config, request, session), self._effects(None, options))
        finally:
            if session is not None:
                await session.aclose()

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
        return self._execute(messages, kwargs, options)

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
        return await self._execute_async(messages, kwargs, options)

    # --- durable threads ---------------------------------------------------------------------------------------

    def resume(
        self,
        thread_id: str,
        decisions: dict[str, Any] | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        *,
        answers: dict[str, Any] | None = None,
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
        return self._execute([], {}, options)

    async def resume_async(
        self,
        thread_id: str,
        decisions: dict[str, Any] | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        *,
        answers: dict[str, Any] | None = None,
        generation_kwargs: dict[str, Any] | None = None,
        hook_context: dict[str, Any] | None = None,
        context: Any = None,
    ) -> dict[str, Any]:
        """Continue an interrupted run asynchronously. Same parameters and outputs as :meth:`resume`."""
        await self.warm_up_async()
        options = RunOptions(
            streaming_callback, thread_id, None, generation_kwargs, None, hook_context, decisions, context, answers
        )
        return await self._execute_async([], {}, options)

    # --- serialisation ---------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Serialise the agent: its chat generator, tools, schema, prompts, hooks, checkpointer and settings."""
        return default_to_dict(
            self,
            chat_generator=component_to_dict(obj=self.chat_generator, name="chat_generator"),
            tools=serialize_tools_or_toolset(self.tools),
            system_prompt=self.system_prompt,
            user_prompt=self.user_prompt,
            required_variables=self.required_variables,
            exit_conditions=self.exit_conditions,
            state_schema=schema_to_dict(build_schema(self.state_schema)) if self.state_schema else None,
            max_agent_steps=self.max_agent_steps,
            streaming_callback=serialize_callable(self.streaming_callback) if self.streaming_callback else None,
            raise_on_tool_invocation_failure=self.raise_on_tool_invocation_failure,
            tool_concurrency_limit=self.tool_concurrency_limit,
            tool_streaming_callback_passthrough=self.tool_streaming_callback_passthrough,
            hooks=serialize_hooks(self.hooks),
            checkpointer=self.checkpointer.to_dict() if self.checkpointer is not None else None,
            interrupt_before=self.interrupt_before or None,
            interrupt_after=self.interrupt_after or None,
            context_policy=policy_to_dict(self.context_policy) if self.context_policy is not None else None,
            token_counter=component_to_dict(self.token_counter, "token_counter") if self.token_counter else None,
            store=self.store.to_dict() if self.store is not None else None,
            tool_timeout=self.tool_timeout,
            max_tool_calls=self.max_tool_calls,
            on_unfinished_calls=self.on_unfinished_calls,
            retry_policy=retry_policy_to_dict(self.retry_policy),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Agent:
        """Rebuild an agent from :meth:`to_dict` output, or from haystack-ai's Agent's (``data`` is left as it is)."""
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
            params["hooks"] = deserialize_hooks(params["hooks"])
        if params.get("context_policy"):
            params["context_policy"] = policy_from_dict(params["context_policy"])
        if params.get("token_counter"):
            deserialize_component_inplace(params, key="token_counter")
        if params.get("store"):
            params["store"] = store_from_dict(params["store"])
        if params.get("retry_policy"):
            params["retry_policy"] = retry_policy_from_dict(params["retry_policy"])
        return default_from_dict(cls, data)


def _resuming(decisions: dict[str, Any] | None, answers: dict[str, Any] | None) -> dict[str, Any] | None:
    """``resume``'s decisions (``{}`` when only answers are given: the run resumes either way)."""
    if decisions is None and answers is not None:
        return {}
    return decisions
