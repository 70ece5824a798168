"""
What an ``Agent`` derives from its ``__init__`` parameters, checked once at construction: the run's schema (with the
running summary's key when the context policy summarizes), the prompts, the tools, the loop's settings
(:class:`~haystack_state.agent._run_config.LoopConfig`, with the tool-run settings), and the component's input and
output sockets. Every check of the parameters is here, so that a bad agent fails when it is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from haystack import component, logging
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools.toolset import Toolset
from haystack.tools.utils import flatten_tools_or_toolsets

from haystack_state._schema import FieldSpec, build_schema
from haystack_state.agent._drive import accepts
from haystack_state.agent._prompts import PromptTemplates
from haystack_state.agent._run_config import RESERVED_INPUTS, RESERVED_OUTPUTS, LoopConfig
from haystack_state.agent._run_state import RUN_KEYS, resolved_schema
from haystack_state.agent._toolbox import Toolbox, check_names, unknown_names
from haystack_state.agent.context import ContextPolicy, ContextSummary, policy_tools
from haystack_state.invocation._settings import ToolRunSettings
from haystack_state.retry import RetryPolicy, retry_policies
from haystack_state.tools.spec import ToolsArg, ToolSpec

if TYPE_CHECKING:
    from haystack_state.agent._component import Agent

__all__ = ["SUMMARY_FIELD", "SUMMARY_KEY", "AgentSetup", "check_limits", "configure", "folds_summary"]

logger = logging.getLogger(__name__)

#: The state key holding the running summary of a ``Summarize`` context policy: thread-scoped, checkpointed.
SUMMARY_KEY = "context_summary"
SUMMARY_FIELD: dict[str, object] = {
    "type": ContextSummary | None,
    "description": "The running summary of the conversation's older turns (the Summarize context policy's).",
}


def folds_summary(policy: ContextPolicy) -> bool:
    """Whether a context policy (or one it composes) writes the running summary."""
    return any(getattr(p, "folds_summary", False) for p in [policy, *getattr(policy, "policies", [])])


def _given(tools: ToolsArg | None) -> bool:
    """Whether tools were given (a Toolset counts even if it has not loaded its tools yet)."""
    return tools is not None and (isinstance(tools, Toolset) or len(tools) > 0)


@dataclasses.dataclass
class AgentSetup:
    """
    What an Agent derived from its parameters.

    :param specs: The run's field specs (``messages`` and the summary's key included).
    :param resolved_schema: The state schema of a run, as haystack-ai's Agent exposes it.
    :param prompts: The system and user prompt templates.
    :param toolbox: The agent's tools.
    :param loop_config: What the loop needs.
    :param generator_takes_tools: Whether the chat generator's ``run`` takes ``tools``.
    :param names_checked: Whether the names of the exit conditions and interrupt tools were checked against the
        tools (a lazy toolset's are known after warm-up).
    :param warmed_up: Whether the Agent is warmed up (see :mod:`haystack_state.agent._lifecycle`).
    """

    specs: dict[str, FieldSpec]
    resolved_schema: dict[str, dict[str, Any]]
    prompts: PromptTemplates
    toolbox: Toolbox
    loop_config: LoopConfig
    generator_takes_tools: bool
    names_checked: bool = False
    warmed_up: bool = False

    def check_tools(self, agent: Agent) -> None:
        """After warm-up: check the tools the toolbox knows now against the agent's settings (see :func:`configure`)."""
        if not self.names_checked:
            specs = self.toolbox.known().specs
            _check_tool_names(agent, specs)
            self.names_checked = True
            _check_input_mappings(self.specs, specs)
        self.warmed_up = True


def check_limits(tool_concurrency_limit: int, max_agent_steps: int) -> None:
    """
    :raises ValueError: For a limit below 1.
    """
    if tool_concurrency_limit < 1:
        raise ValueError(f"tool_concurrency_limit must be greater than or equal to 1, got {tool_concurrency_limit}.")
    if max_agent_steps < 1:
        raise ValueError(f"max_agent_steps must be greater than or equal to 1, got {max_agent_steps}.")


def configure(agent: Agent, retry_policy: RetryPolicy | Mapping[str, RetryPolicy | None] | None) -> AgentSetup:
    """
    Check an Agent's parameters (its attributes, set from them) and derive its setup; declare its sockets.

    :param agent: The Agent, its attributes set.
    :param retry_policy: Its ``retry_policy`` parameter.
    :returns: The setup.
    :raises TypeError: See ``Agent``.
    :raises ValueError: See ``Agent``.
    """
    model_retry, tool_retry = retry_policies(retry_policy, "Agent")
    generator = agent.chat_generator
    generator_takes_tools = accepts(generator.run, "tools")
    context_policy, state_schema = agent.context_policy, agent.state_schema
    if context_policy is not None and not callable(getattr(context_policy, "plan", None)):
        raise TypeError(f"context_policy must have a plan(view) method, got {context_policy!r}.")
    summary_key = SUMMARY_KEY if context_policy is not None and folds_summary(context_policy) else None
    reserved = RESERVED_OUTPUTS | RESERVED_INPUTS | set(RUN_KEYS) | ({SUMMARY_KEY} if summary_key else set())
    clashes = sorted(set(state_schema) & reserved)
    if clashes:
        raise ValueError(
            f"state_schema keys {clashes} are reserved for Agent internal state and cannot be redefined: they "
            f"clash with Agent outputs, run parameters or run values; rename them. Reserved keys: "
            f"{', '.join(sorted(reserved))}."
        )
    specs = build_schema({**state_schema, SUMMARY_KEY: SUMMARY_FIELD} if summary_key else state_schema)
    schema = resolved_schema(state_schema, {SUMMARY_KEY: SUMMARY_FIELD} if summary_key else {})
    prompts = PromptTemplates(agent.system_prompt, agent.user_prompt, agent.required_variables)
    _check_prompts(prompts, specs, reserved, agent.required_variables)
    if _given(agent.tools) and not generator_takes_tools:
        names = [tool.name for tool in flatten_tools_or_toolsets(agent.tools)]
        raise TypeError(
            f"{type(generator).__name__} does not accept tools parameter in its run method, so it cannot be "
            f"given tools ({', '.join(names) or 'a toolset'}). The Agent component requires a chat generator "
            "that supports tools when tools are provided."
        )
    extra_tools = policy_tools(context_policy) if context_policy is not None else []
    toolbox = Toolbox(agent.tools, specs, extra=extra_tools)
    known = toolbox.known()  # checks the known tools' state mappings
    # Tools of a toolset that loads them in warm_up() are known only then: names they may provide are checked
    # after warm-up.
    names_checked = not toolbox.has_toolsets
    if names_checked:
        _check_tool_names(agent, known.specs)
    for option in ("interrupt_before", "interrupt_after"):
        if getattr(agent, option) and agent.checkpointer is None:
            raise ValueError(f"{option} needs a checkpointer: an interrupted run is resumed from its thread.")
    _check_input_mappings(specs, known.specs)
    _declare_sockets(agent, specs, prompts)
    token_counter = agent.token_counter
    loop_config = LoopConfig(
        schema=specs,
        toolbox=toolbox,
        exit_conditions=agent.exit_conditions,
        max_agent_steps=agent.max_agent_steps,
        hooks=agent.hooks,
        generator_streams=accepts(generator.run, "streaming_callback"),
        context_policy=context_policy,
        token_counter=(lambda: token_counter) if token_counter is not None else None,
        summary_key=summary_key,
        interrupt_before=frozenset(agent.interrupt_before),
        interrupt_after=frozenset(agent.interrupt_after),
        store=agent.store,
        on_unfinished_calls=agent.on_unfinished_calls,
        resolved_schema=schema,
        model_retry=model_retry,
        tool_settings=ToolRunSettings(
            raise_on_failure=agent.raise_on_tool_invocation_failure,
            max_workers=agent.tool_concurrency_limit,
            passthrough=agent.tool_streaming_callback_passthrough,
            max_tool_calls=agent.max_tool_calls,
            tool_timeout=agent.tool_timeout,
            retry_policy=tool_retry,
        ),
    )
    return AgentSetup(specs, schema, prompts, toolbox, loop_config, generator_takes_tools, names_checked)


def _check_prompts(
    prompts: PromptTemplates, specs: Mapping[str, FieldSpec], reserved: frozenset[str], required: object
) -> None:
    for name, sources in prompts.variables.items():
        where = " and ".join(sources)
        if name in specs:
            raise ValueError(
                f"Variable '{name}' from {where} is already defined in the state schema. Rename the variable or "
                "the key, since run() could not tell which one a value is for."
            )
        if name in reserved or name == "messages":
            raise ValueError(
                f"Variable '{name}' from {where} conflicts with input names in the run method. Rename the "
                "variable: the run's parameters and the Agent's outputs cannot be prompt variables."
            )
    if isinstance(required, list) and not prompts.variables:
        logger.warning(
            "The parameter required_variables is provided but neither user_prompt nor system_prompt contains "
            "template variables: it has no effect. Either provide a prompt with Jinja2 template variables or "
            "remove required_variables."
        )


def _check_input_mappings(fields: Mapping[str, FieldSpec], specs: Mapping[str, ToolSpec]) -> None:
    """A tool whose outputs_to_state writes an ``"input"`` key could never succeed: refuse it now."""
    for name, spec in specs.items():
        for key in spec.outputs_to_state:
            field = fields.get(key)
            if field is not None and field.scope == "input":
                raise ValueError(
                    f"Tool '{name}' maps an output to state key '{key}', which has \"scope\": \"input\": it is "
                    "set by the caller when a run starts and is read-only to tools. Map the output to another key."
                )


def _check_tool_names(agent: Agent, specs: Mapping[str, ToolSpec]) -> None:
    # As haystack-ai, an exit condition may name a tool that only a run's tools=... provides: a warning, not an
    # error. interrupt_before (ours) must name the agent's own tools.
    unknown = unknown_names(agent.exit_conditions, specs, allowed=("text",))
    if unknown:
        logger.warning(
            "exit_conditions {unknown} name no tool of this agent (its tools: {tools}): they can end only a run "
            "given such a tool with run(tools=...).",
            unknown=unknown,
            tools=", ".join(specs) or "none",
        )
    check_names("interrupt_before", agent.interrupt_before, specs)
    check_names("interrupt_after", agent.interrupt_after, specs)


def _declare_sockets(agent: Agent, specs: Mapping[str, FieldSpec], prompts: PromptTemplates) -> None:
    """The component's inputs (the input state keys, the prompts' variables) and outputs (every output key)."""
    for key, spec in specs.items():
        if key != "messages" and spec.is_input and spec.scope != "loaded":
            component.set_input_type(agent, name=key, type=spec.type, default=None)
    for name in prompts.variables:
        if name in prompts.required:
            component.set_input_type(agent, name=name, type=Any)
        else:
            component.set_input_type(agent, name=name, type=Any, default=None)
    outputs: dict[str, Any] = {key: spec.type for key, spec in specs.items() if spec.is_output}
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
    component.set_output_types(agent, **outputs)
