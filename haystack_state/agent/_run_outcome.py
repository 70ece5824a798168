"""
How a run ends and what it returns: the exit reason of a reply without tool calls (:func:`model_exit_reason`), the
exit-condition tool a step fired (:func:`exit_tool`), and the run's outputs (:func:`run_outputs`): every output
state key plus the run values haystack-ai's Agent returns. Pure functions of the run's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from haystack.dataclasses import ChatMessage

from haystack_state.agent._run_config import EXIT_FINISH_REASONS, EXIT_TEXT

if TYPE_CHECKING:
    from haystack_state.agent._loop import AgentRun

__all__ = ["exit_tool", "model_exit_reason", "run_outputs"]


def model_exit_reason(replies: list[ChatMessage], *, has_tools: bool) -> str | None:
    """
    Why a reply without tool calls ends the run: its finish reason if incomplete (``length``, ``content_filter``),
    else ``text``; None for an empty reply in a run with tools (the model is asked again), as in haystack-ai.
    """
    last = replies[-1] if replies else None
    if last is None or not last.is_from("assistant"):
        return EXIT_TEXT if not has_tools else None
    finish = last.meta.get("finish_reason")
    if finish in EXIT_FINISH_REASONS:
        return str(finish)
    if last.text or not has_tools:
        return EXIT_TEXT
    return None


def exit_tool(
    exit_conditions: Sequence[str], calling: list[ChatMessage], tool_messages: list[ChatMessage]
) -> str | None:
    """The exit-condition tool that a step called successfully, if any (an errored one cancels the exit)."""
    if exit_conditions == [EXIT_TEXT]:
        return None
    failed = {
        m.tool_call_result.origin.tool_name for m in tool_messages if m.tool_call_result and m.tool_call_result.error
    }
    first: str | None = None
    for message in calling:
        for call in message.tool_calls:
            if call.tool_name not in exit_conditions:
                continue
            if call.tool_name in failed:
                return None
            first = first or call.tool_name
    return first


def run_outputs(run: AgentRun) -> dict[str, Any]:
    """The run's outputs (see ``Agent.run``)."""
    state, values = run.state, run.state.run_values
    messages = list(state.view("messages") or [])
    # As in haystack-ai, a key nothing set (and without a default) is left out; so are private outputs.
    outputs: dict[str, Any] = {
        key: state.get(key)
        for key, spec in run.config.schema.items()
        if key != "messages" and spec.is_output and state.has(key)
    }
    outputs.update(
        messages=messages,
        last_message=messages[-1] if messages else None,
        step_count=run.step,
        exit_reason=run.exit_reason,
        token_usage=dict(values["token_usage"]),
        tool_call_counts=dict(values["tool_call_counts"]),
        context_tokens=values["context_tokens"],
        pending_tool_calls=run.waiting,
        pending_interrupts=run.pending_requests(),
        checkpoint_id=run.session.head_id if run.session is not None else None,
    )
    return outputs
