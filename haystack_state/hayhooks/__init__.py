"""
Deploy our Agent on Hayhooks (deepset's server for Haystack pipelines), each conversation a durable thread: OpenAI
chat completions and Responses, ``/{name}/run`` and Hayhooks' MCP server. See ``docs/hayhooks.md``.

Needs the ``hayhooks`` extra: ``pip install -e ".[hayhooks]"`` in a clone of haystack-state.
"""

try:
    import hayhooks.events
    import hayhooks.server.utils.base_pipeline_wrapper  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "haystack_state.hayhooks needs Hayhooks, which the 'hayhooks' extra installs: "
        'pip install -e ".[hayhooks]" (in a clone of haystack-state).',
        name=error.name,
    ) from error

from haystack_state.hayhooks._conversation import chat_thread_id, parse_response_id, plan_chat_turn, response_id
from haystack_state.hayhooks._wrapper import AgentWrapper, RunPlan, SyncAgentWrapper, agent_wrapper

__all__ = [
    "AgentWrapper",
    "RunPlan",
    "SyncAgentWrapper",
    "agent_wrapper",
    "chat_thread_id",
    "parse_response_id",
    "plan_chat_turn",
    "response_id",
]
