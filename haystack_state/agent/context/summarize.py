"""
``Summarize``: older turns reach the model as a running summary, written by a chat generator, now and then.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, ClassVar

from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage
from haystack.token_counters import TokenCounter
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.agent.context import _shape as shape
from haystack_state.agent.context._summary import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    ContextSummary,
    SummaryRequest,
    summary_note,
)
from haystack_state.agent.context._tokens import token_meter
from haystack_state.agent.context.base import ContextPlan, ContextView, PolicyBase, check_count

__all__ = ["Summarize"]

_NOTES_KEPT = 64


class Summarize(PolicyBase):
    """
    Send the system prompt, a note with the running summary, and the messages the summary does not cover.

    The summary (the ``context_summary`` state key, a :class:`ContextSummary`) covers the first stored messages.
    When the messages after it, leaving out the last ``keep_last_turns`` turns and the current run, pass
    ``trigger_tokens``, the plan asks the loop to fold them into the summary first: the loop sends the request's
    prompt (the previous summary and those messages) to ``chat_generator`` and stores the new summary, which covers
    them too; the next plan then sends ``[system prompt, summary note, the kept turns]``. A summary is written only
    when the trigger is passed, and it folds the previous one in: it never starts from scratch.

    The model sees what the summary leaves out: the messages after it, which grow from the kept turns back to
    ``trigger_tokens`` more before the next fold. Compose with ``TokenBudget`` for a hard cap
    (``Summarize(...) | TokenBudget(...)``; the note is kept like the system prompt).

    :param chat_generator: The chat generator that writes summaries (any haystack chat generator).
    :param trigger_tokens: Fold when the unsummarized messages outside the kept turns pass this many tokens.
    :param keep_last_turns: How many recent turns are never folded (the current run never is).
    :param instructions: The summarizer's system prompt; a default that asks for terse, exact bullet points if None.
    :param counter: The haystack ``TokenCounter`` to measure with; the view's (the Agent's) if None.
    :param max_result_chars: Tool results longer than this are cut in the summarizer's transcript; None keeps them.
    :raises ValueError: If ``trigger_tokens`` is not positive or ``keep_last_turns`` is negative.
    """

    folds_summary: ClassVar[bool] = True

    def __init__(
        self,
        chat_generator: Any,
        *,
        trigger_tokens: int,
        keep_last_turns: int = 2,
        instructions: str | None = None,
        counter: TokenCounter | None = None,
        max_result_chars: int | None = 2000,
    ) -> None:
        """
        Create the policy.

        :param chat_generator: The chat generator that writes summaries.
        :param trigger_tokens: Fold when the unsummarized messages outside the kept turns pass this many tokens.
        :param keep_last_turns: How many recent turns are never folded.
        :param instructions: The summarizer's system prompt, or None for the default.
        :param counter: The ``TokenCounter`` to measure with; the view's if None.
        :param max_result_chars: Tool results longer than this are cut in the summarizer's transcript.
        """
        if not callable(getattr(chat_generator, "run", None)):
            raise ValueError(
                f"Summarize: chat_generator must be a chat generator (with run()), got {chat_generator!r}."
            )
        self.chat_generator = chat_generator
        self.trigger_tokens = check_count(trigger_tokens, 1, "Summarize: trigger_tokens")
        self.keep_last_turns = check_count(keep_last_turns, 0, "Summarize: keep_last_turns")
        if max_result_chars is not None and max_result_chars < 1:
            raise ValueError(f"Summarize: max_result_chars must be positive or None, got {max_result_chars!r}.")
        self.instructions = instructions
        self.counter = counter
        self.max_result_chars = max_result_chars
        self._notes: OrderedDict[ContextSummary, ChatMessage] = OrderedDict()
        self._notes_lock = threading.Lock()
        self._warnings = shape.RunWarnings()

    def _note(self, summary: ContextSummary) -> ChatMessage:
        """The note carrying a summary: one message object per summary, so that its token count is cached."""
        with self._notes_lock:
            note = self._notes.get(summary)
            if note is None:
                note = self._notes[summary] = summary_note(summary.text, summary.end)
                if len(self._notes) > _NOTES_KEPT:
                    self._notes.popitem(last=False)
            return note

    def _summary(self, view: ContextView) -> ContextSummary | None:
        summary = view.summary
        if summary is not None and summary.end > len(view.messages):
            self._warnings.warn(
                view.messages,
                view.run_start,
                "stale summary",
                "Summarize: the context summary covers {covered} messages, but the conversation has only {length} (it "
                "was cut or replaced); the summary is ignored and the conversation summarized again.",
                covered=summary.end,
                length=len(view.messages),
            )
            return None
        return summary

    def plan(self, view: ContextView) -> ContextPlan:
        """
        Send the summary note and what it does not cover; ask for a new summary when the trigger is passed.

        :param view: The stored conversation (at stored positions: in a composition, ``Summarize`` comes first).
        :returns: The plan, with ``summarize`` set when a fold is due.
        """
        messages = view.messages
        head = shape.head_end(messages)
        summary = self._summary(view)
        covered = max(summary.end if summary is not None else head, head)
        keep = shape.must_keep_from(messages, view.run_start, head)
        turns, fold_end = 0, head
        if self.keep_last_turns == 0:
            fold_end = keep
        else:
            for index in range(len(messages) - 1, head - 1, -1):
                if shape.is_turn_start(messages[index]):
                    turns += 1
                    if turns == self.keep_last_turns:
                        fold_end = index
                        break
        fold_end = shape.step_back_to_cut(messages, min(fold_end, keep), head)
        request = None
        if fold_end > covered:
            meter = token_meter(self.counter or view.counter)
            unsummarized = meter.messages(messages[i] for i in range(covered, fold_end))
            if unsummarized > self.trigger_tokens:
                request = SummaryRequest(
                    previous=summary,
                    to_fold=list(messages[covered:fold_end]),
                    start=covered,
                    end=fold_end,
                    instructions=self.instructions or DEFAULT_SUMMARY_INSTRUCTIONS,
                    max_result_chars=self.max_result_chars,
                    counter=self.counter or view.counter,
                    chat_generator=self.chat_generator,
                )
        cut = shape.step_back_to_cut(messages, min(covered, keep), head)
        notes = [self._note(summary)] if summary is not None else []
        sent, run_start = shape.assemble(messages, head, cut, view.run_start, notes)
        return ContextPlan(sent, summarize=request, run_start=run_start)

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the policy, with its chat generator and counter.

        :returns: The serialized policy.
        """
        data = super().to_dict()
        params = data["init_parameters"]
        params["chat_generator"] = component_to_dict(self.chat_generator, "chat_generator")
        params["counter"] = self.counter.to_dict() if self.counter is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summarize:
        """
        Deserialize the policy, with its chat generator and counter.

        :param data: What ``to_dict`` returned.
        :returns: The policy.
        """
        params = dict(data.get("init_parameters", {}))
        deserialize_component_inplace(params, key="chat_generator")
        if params.get("counter") is not None:
            deserialize_component_inplace(params, key="counter")
        return cls(**params)
