"""
Serialising an ``Agent`` (``to_dict``/``from_dict``, and so a Pipeline's YAML): its init parameters, each by its
own serialiser (chat generator, tools, schema, hooks, checkpointer, context policy, token counter, store, retry
policy), symmetric to its ``__init__``. ``from_dict`` also reads haystack-ai's Agent's dicts. Functions of the Agent
that its methods are.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from haystack import default_from_dict, default_to_dict
from haystack.core.serialization import component_to_dict
from haystack.tools.serde_utils import deserialize_tools_or_toolset_inplace, serialize_tools_or_toolset
from haystack.utils import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state._schema import build_schema, schema_from_dict, schema_to_dict
from haystack_state.agent._hooks import deserialize_hooks, serialize_hooks
from haystack_state.agent.context import policy_from_dict, policy_to_dict
from haystack_state.persistence._serde import checkpointer_from_dict
from haystack_state.retry import retry_policy_from_dict, retry_policy_to_dict
from haystack_state.store import store_from_dict

if TYPE_CHECKING:
    from haystack_state.agent._component import Agent

__all__ = ["agent_from_dict", "agent_to_dict"]


def agent_to_dict(agent: Agent) -> dict[str, Any]:
    """Serialise the agent: its chat generator, tools, schema, prompts, hooks, checkpointer and settings."""
    return default_to_dict(
        agent,
        chat_generator=component_to_dict(obj=agent.chat_generator, name="chat_generator"),
        tools=serialize_tools_or_toolset(agent.tools),
        system_prompt=agent.system_prompt,
        user_prompt=agent.user_prompt,
        required_variables=agent.required_variables,
        exit_conditions=agent.exit_conditions,
        state_schema=schema_to_dict(build_schema(agent.state_schema)) if agent.state_schema else None,
        max_agent_steps=agent.max_agent_steps,
        streaming_callback=serialize_callable(agent.streaming_callback) if agent.streaming_callback else None,
        raise_on_tool_invocation_failure=agent.raise_on_tool_invocation_failure,
        tool_concurrency_limit=agent.tool_concurrency_limit,
        tool_streaming_callback_passthrough=agent.tool_streaming_callback_passthrough,
        hooks=serialize_hooks(agent.hooks),
        checkpointer=agent.checkpointer.to_dict() if agent.checkpointer is not None else None,
        interrupt_before=agent.interrupt_before or None,
        interrupt_after=agent.interrupt_after or None,
        context_policy=policy_to_dict(agent.context_policy) if agent.context_policy is not None else None,
        token_counter=component_to_dict(agent.token_counter, "token_counter") if agent.token_counter else None,
        store=agent.store.to_dict() if agent.store is not None else None,
        tool_timeout=agent.tool_timeout,
        max_tool_calls=agent.max_tool_calls,
        on_unfinished_calls=agent.on_unfinished_calls,
        retry_policy=retry_policy_to_dict(agent.retry_policy),
    )


def agent_from_dict(cls: type[Agent], data: dict[str, Any]) -> Agent:
    """Rebuild an agent from ``to_dict`` output, or from haystack-ai's Agent's (``data`` is left as it is)."""
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
