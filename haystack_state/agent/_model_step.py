"""
The model call of a run's step: what the model is sent (the conversation, kept in step with the state without a copy
per step, and the context policy's plan, with a summary written first when it asks for one), the call itself with
its retries, and the usage accounting of the replies. :class:`ModelCalls` is composed into
:class:`~haystack_state.agent._loop.AgentRun`; its methods are parts of the loop's flow (they yield effects).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from haystack import logging
from haystack.dataclasses import ChatMessage
from haystack.token_counters import TokenCounter
from haystack.tracing.tracer import Span

from haystack_state._driver import Flow, perform
from haystack_state.agent._effects import Backoff, CallModel, ModelResult
from haystack_state.agent._message_ids import new_message_id, with_id
from haystack_state.agent._spans import span
from haystack_state.agent._usage import add_reply_usage, context_tokens, is_mapping
from haystack_state.agent.context import (
    ContextPlan,
    ContextSummary,
    ContextView,
    default_token_counter,
    token_meter,
)
from haystack_state.agent.context._summary import SummaryRequest
from haystack_state.agent.events import ModelReply, Retrying
from haystack_state.invocation.arguments import safe_tool_calls
from haystack_state.retry import RetryPolicy, error_text

if TYPE_CHECKING:
    from haystack_state.agent._loop import AgentRun

__all__ = ["ModelCalls"]

logger = logging.getLogger(__name__)


class ModelCalls:
    """
    The model calls of one run (see the module docstring).

    :param run: The run.
    """

    def __init__(self, run: AgentRun) -> None:
        self.run = run
        self.mirror: list[ChatMessage] | None = None  # see conversation
        self.mirror_mark: tuple[Any, int] | None = None
        self.counter: TokenCounter | None = None
        self.attempts = 1  # the attempts of the model call under way, for its error message

    def conversation(self) -> list[ChatMessage]:
        """
        The conversation to send the model: a list the run keeps in step with the state's ``messages``, extended by
        what was appended since the last call (so a step costs no copy of the whole history), and read again whole
        only when ``messages`` was replaced (a hook or handler rewrote it). As in haystack-ai, the chat generator is
        given a list it must not change.
        """
        state = self.run.state
        mirror, mark = self.mirror, self.mirror_mark
        added = state.appended_since("messages", mark) if mirror is not None and mark is not None else None
        if mirror is None or added is None or len(mirror) != mark[1]:  # type: ignore[index]
            mirror = self.mirror = list(state.view("messages") or [])
        else:
            mirror.extend(added)
        self.mirror_mark = state.watch("messages")
        return mirror

    def call(self, step_span: Span) -> Flow[list[ChatMessage]]:
        """Call the model for the step under way; its replies are appended to the state and returned."""
        run = self.run
        request, tools = run.request, run.tools
        conversation = self.conversation()
        sent: list[ChatMessage] = conversation
        if run.config.context_policy is not None:
            sent = yield from self.plan_context(conversation)
        inputs: dict[str, Any] = {"messages": sent}
        if tools.model_tools:
            inputs["tools"] = tools.model_tools
        reply_id = new_message_id()  # decided now, so the reply's streamed chunks carry it too
        sink = request.sink
        if sink is not None:
            sink.step = run.step + 1
            sink.message_id = reply_id
        callback = request.model_callback or request.streaming_callback
        if callback is not None and run.config.generator_streams:
            inputs["streaming_callback"] = callback
        if request.generation_kwargs is not None:
            inputs["generation_kwargs"] = request.generation_kwargs
        with span("haystack.agent.step.llm", parent=step_span) as llm_span:
            if run.traced:
                llm_span.set_content_tag("haystack.agent.step.llm.input", inputs)
            try:
                result = yield from self.attempt(inputs)
                replies: list[ChatMessage] = [
                    with_id(safe_tool_calls(reply), reply_id if i == 0 else None)
                    for i, reply in enumerate(result["replies"])
                ]
                run.state.set("messages", replies)
            except Exception as exc:
                raise run.fail("the chat generator", exc, self.attempts) from None
            if self.attempts > 1:
                llm_span.set_tag("haystack_state.retry.attempts", self.attempts)
            if run.traced:
                llm_span.set_content_tag("haystack.agent.step.llm.output", result)
        if sink is not None:
            for reply in replies:
                sink.emit(ModelReply, step=run.step + 1, message=reply)
        values = run.state.run_values
        add_reply_usage(values, replies)
        last_usage = replies[-1].meta.get("usage") if replies else None
        if is_mapping(last_usage) and (tokens := context_tokens(last_usage)):
            values["context_tokens"] = tokens
        elif run.config.context_policy is not None:  # no usage reported: what the policy had counted
            values["context_tokens"] = token_meter(self.token_counter()).total(sent, tools.model_tools)
        return replies

    def attempt(self, inputs: dict[str, Any]) -> Flow[ModelResult]:
        """
        Call the chat generator; while the model retry policy allows, call it again after a backoff. A retried call
        is recorded for the next checkpoint's ``retries`` metadata, whether it succeeded or not.
        """
        policy = self.run.config.model_retry
        failures: list[str] = []
        self.attempts = 1
        while True:
            try:
                result = yield from perform(CallModel(inputs))
            except Exception as exc:
                failures.append(error_text(exc))
                delay = policy.next_delay(len(failures), exc) if policy is not None else None
                if delay is None:
                    if len(failures) > 1:
                        self._record_retry(failures, succeeded=False)
                    raise
                assert policy is not None
                self._retrying(policy, len(failures), exc, failures[-1], delay)
                yield from perform(Backoff(delay))
                self.attempts += 1
                continue
            if failures:
                self._record_retry(failures, succeeded=True)
            return result

    def _record_retry(self, failures: list[str], *, succeeded: bool) -> None:
        attempts = len(failures) + (1 if succeeded else 0)
        self.run.commits.retries.append(
            {
                "kind": "model",
                "step": self.run.step + 1,
                "attempts": attempts,
                "succeeded": succeeded,
                "errors": failures,
            }
        )

    def _retrying(self, policy: RetryPolicy, attempt: int, exc: Exception, text: str, delay: float) -> None:
        step = self.run.step + 1
        logger.warning(
            "Agent: the chat generator failed at step {step} (attempt {attempt} of {attempts}): {error}; retrying in "
            "{delay:.3g} s.",
            step=step,
            attempt=attempt,
            attempts=policy.max_attempts,
            error=text,
            delay=delay,
        )
        sink = self.run.request.sink
        if sink is not None:
            sink.emit(
                Retrying,
                step=step,
                kind="model",
                attempt=attempt,
                max_attempts=policy.max_attempts,
                delay=delay,
                error=text,
                error_type=type(exc).__name__,
            )

    # --- the context the model sees ----------------------------------------------------------------------------

    def token_counter(self) -> TokenCounter:
        """The token counter the context policy measures with (made once per run)."""
        if self.counter is None:
            make = self.run.config.token_counter
            self.counter = make() if make is not None else default_token_counter()
        return self.counter

    def _view(self, conversation: list[ChatMessage], summary: ContextSummary | None) -> ContextView:
        run = self.run
        return ContextView(
            conversation,
            min(run.run_start, len(conversation)),
            summary=summary,
            counter=self.token_counter(),
            tools=run.tools.model_tools,
            context=run.run_context,
        )

    def plan_context(self, conversation: list[ChatMessage]) -> Flow[list[ChatMessage]]:
        """
        What the model is sent: the policy's plan. If it asks for a summary first, the summarizer writes one (the
        ``context_summary`` key, committed on its own checkpoint) and the policy plans again with it; if the
        summarizer fails, the first plan is sent (it is a valid context) and the next step asks again.
        """
        config = self.run.config
        policy = config.context_policy
        assert policy is not None
        key = config.summary_key
        summary = self.run.state.get(key) if key is not None else None
        plan: ContextPlan = policy.plan(self._view(conversation, summary))
        if plan.summarize is not None and key is not None:
            written = yield from self._summarize(plan.summarize, key)
            if written is not None:
                plan = policy.plan(self._view(conversation, written))
        return list(plan.messages)

    def _summarize(self, request: SummaryRequest, key: str) -> Flow[ContextSummary | None]:
        run = self.run
        try:
            result = yield from perform(CallModel({"messages": request.prompt()}, generator=request.chat_generator))
            replies: list[ChatMessage] = list(result["replies"])
            summary = request.result(replies)
        except Exception as exc:  # a summary is an optimization: the run goes on without it
            logger.warning(
                "Agent: the summarizer failed ({error_type}: {error}); sending the conversation without a new "
                "summary, and asking again at the next step.",
                error_type=type(exc).__name__,
                error=exc,
            )
            return None
        add_reply_usage(run.state.run_values, replies)
        run.state.set(key, summary)
        covers = {"covers": list(summary.covers), "tokens": summary.tokens}
        yield from run.commits.commit("update", continues=True, context_summary=covers)
        return summary
