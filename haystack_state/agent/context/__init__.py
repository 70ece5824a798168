"""
Context policies: what the model is sent, as a view of the stored messages. Trimming and summarizing change what is
sent, never what is stored: the State's ``messages`` key keeps every message, and the checkpointer the full history.

- :class:`SlidingWindow`: the last turns.
- :class:`TokenBudget`: the recent messages that fit a token budget (tool schemas included).
- :class:`Summarize`: older turns as a running summary (the ``context_summary`` key), written now and then.
- :class:`OffloadToolResults`: big tool results as previews, with a tool to read the rest.

Policies compose: ``SlidingWindow(max_turns=20) | TokenBudget(max_tokens=60_000)``.
"""

from haystack_state.agent.context._shape import CONTEXT_META_KEY
from haystack_state.agent.context._summary import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    ContextSummary,
    SummaryRequest,
    render_transcript,
    summary_note,
)
from haystack_state.agent.context._tokens import (
    APPROXIMATE_COUNTER,
    TokenMeter,
    default_token_counter,
    load_token_counter,
    token_meter,
)
from haystack_state.agent.context.base import (
    ComposePolicies,
    ContextPlan,
    ContextPolicy,
    ContextView,
    PolicyBase,
    policy_from_dict,
    policy_to_dict,
    policy_tools,
)
from haystack_state.agent.context.offload import (
    MAX_READ_CHARS,
    READ_TOOL_RESULT,
    OffloadedMessages,
    OffloadToolResults,
    read_tool_result,
)
from haystack_state.agent.context.summarize import Summarize
from haystack_state.agent.context.window import SlidingWindow, TokenBudget

__all__ = [
    "APPROXIMATE_COUNTER",
    "CONTEXT_META_KEY",
    "DEFAULT_SUMMARY_INSTRUCTIONS",
    "MAX_READ_CHARS",
    "READ_TOOL_RESULT",
    "ComposePolicies",
    "ContextPlan",
    "ContextPolicy",
    "ContextSummary",
    "ContextView",
    "OffloadToolResults",
    "OffloadedMessages",
    "PolicyBase",
    "SlidingWindow",
    "Summarize",
    "SummaryRequest",
    "TokenBudget",
    "TokenMeter",
    "default_token_counter",
    "load_token_counter",
    "policy_from_dict",
    "policy_to_dict",
    "policy_tools",
    "read_tool_result",
    "render_transcript",
    "summary_note",
    "token_meter",
]
