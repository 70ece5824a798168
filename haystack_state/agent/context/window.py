"""
Trimming policies: ``SlidingWindow`` (the last turns) and ``TokenBudget`` (the recent messages that fit a budget).

Both send ``head + messages[cut:]`` (see :mod:`._shape`) and choose the cut walking back from the end, so their cost
is that of what they send.
"""

from __future__ import annotations

from typing import Any

from haystack.token_counters import TokenCounter
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.agent.context._shape import (
    RunWarnings,
    assemble,
    head_end,
    is_turn_start,
    must_keep_from,
    step_back_to_cut,
)
from haystack_state.agent.context._tokens import token_meter
from haystack_state.agent.context.base import ContextPlan, ContextView, PolicyBase, check_count

__all__ = ["SlidingWindow", "TokenBudget"]


class SlidingWindow(PolicyBase):
    """
    Send the last ``max_turns`` turns (a turn starts at a user message), after the system prompt.

    The current run is always sent whole, even when it spans more turns. With fewer turns than ``max_turns``, the
    whole conversation is sent.

    ```python
    from haystack.dataclasses import ChatMessage
    from haystack_state.agent.context import ContextView, SlidingWindow

    messages = [ChatMessage.from_system("Be brief.")]
    for i in range(5):
        messages += [ChatMessage.from_user(f"question {i}"), ChatMessage.from_assistant(f"answer {i}")]
    plan = SlidingWindow(max_turns=2).plan(ContextView(messages, run_start=len(messages) - 1))
    assert [m.text for m in plan.messages] == ["Be brief.", "question 3", "answer 3", "question 4", "answer 4"]
    ```

    :param max_turns: How many recent turns to send (at least 1).
    :raises ValueError: If ``max_turns`` is less than 1.
    """

    def __init__(self, max_turns: int) -> None:
        """
        Create the policy.

        :param max_turns: How many recent turns to send (at least 1).
        """
        self.max_turns = check_count(max_turns, 1, "SlidingWindow: max_turns")

    def plan(self, view: ContextView) -> ContextPlan:
        """
        Keep the last ``max_turns`` turns.

        :param view: The conversation.
        :returns: The plan.
        """
        messages = view.messages
        head = head_end(messages)
        start, turns = head, 0
        for index in range(len(messages) - 1, head - 1, -1):
            if is_turn_start(messages[index]):
                turns += 1
                if turns == self.max_turns:
                    start = index
                    break
        cut = step_back_to_cut(messages, min(start, must_keep_from(messages, view.run_start, head)), head)
        sent, run_start = assemble(messages, head, cut, view.run_start)
        return ContextPlan(sent, run_start=run_start)


class TokenBudget(PolicyBase):
    """
    Send as many recent turns as fit ``max_tokens``, counting the system prompt and the tools' schemas too.

    The system prompt, the latest user message and the current run are always sent: if they alone pass the budget,
    they are sent anyway and a warning is logged once per run. Before them, whole turns are added from the newest
    back (so what is sent begins with a user message, which every provider accepts, and a tool call is never parted
    from its results), until the next one does not fit. Leave room in ``max_tokens`` for the model's reply: it is the
    budget of what is sent.

    :param max_tokens: The budget, in tokens.
    :param counter: The haystack ``TokenCounter`` to measure with; the view's (the Agent's) if None.
    :raises ValueError: If ``max_tokens`` is not a positive int.
    """

    def __init__(self, max_tokens: int, counter: TokenCounter | None = None) -> None:
        """
        Create the policy.

        :param max_tokens: The budget, in tokens.
        :param counter: The haystack ``TokenCounter`` to measure with; the view's if None.
        """
        self.max_tokens = check_count(max_tokens, 1, "TokenBudget: max_tokens")
        self.counter = counter
        self._warnings = RunWarnings()

    def plan(self, view: ContextView) -> ContextPlan:
        """
        Keep the recent messages that fit the budget.

        :param view: The conversation.
        :returns: The plan.
        """
        messages = view.messages
        meter = token_meter(self.counter or view.counter)
        head = head_end(messages)
        keep = must_keep_from(messages, view.run_start, head)
        used = meter.tools(view.tools) + meter.messages(messages[i] for i in range(head))
        used += meter.messages(messages[i] for i in range(keep, len(messages)))
        cut = keep
        if used > self.max_tokens:
            self._warnings.warn(
                messages,
                view.run_start,
                "over budget",
                "TokenBudget: the system prompt, the latest user message and the current run take {used} tokens, "
                "more than the budget of {budget}; sending them anyway.",
                used=used,
                budget=self.max_tokens,
            )
        else:
            for index in range(keep - 1, head - 1, -1):
                message = messages[index]
                used += meter.message(message)
                if used > self.max_tokens:
                    break
                if index == head or is_turn_start(message):
                    cut = index
        sent, run_start = assemble(messages, head, cut, view.run_start)
        return ContextPlan(sent, run_start=run_start)

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the policy, with its counter.

        :returns: The serialized policy.
        """
        data = super().to_dict()
        if self.counter is not None:
            data["init_parameters"]["counter"] = self.counter.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenBudget:
        """
        Deserialize the policy, with its counter.

        :param data: What ``to_dict`` returned.
        :returns: The policy.
        """
        params = dict(data.get("init_parameters", {}))
        if params.get("counter") is not None:
            deserialize_component_inplace(params, key="counter")
        return cls(**params)
