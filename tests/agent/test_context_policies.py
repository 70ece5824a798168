"""Tests of haystack_state.agent.context: the context policies, their invariants, composition, summaries, offloading
and the reader tool, the token counter fallback, and what a plan costs."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, ChatRole, ImageContent, TextContent, ToolCall
from haystack.token_counters import ApproximateTokenCounter, TokenCounter
from haystack.tools import Tool
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from haystack_state import State, ToolInvoker
from haystack_state.agent.context import (
    CONTEXT_META_KEY,
    MAX_READ_CHARS,
    READ_TOOL_RESULT,
    ComposePolicies,
    ContextPlan,
    ContextSummary,
    ContextView,
    OffloadToolResults,
    SlidingWindow,
    Summarize,
    SummaryRequest,
    TokenBudget,
    default_token_counter,
    load_token_counter,
    policy_from_dict,
    policy_to_dict,
    policy_tools,
    read_tool_result,
    token_meter,
)
from haystack_state.persistence import codec
from haystack_state.testing import ScriptedChatGenerator

SYSTEM = "You are a careful research assistant."


# --- building conversations ---------------------------------------------------------------------------


class Builder:
    """Builds a stored conversation: turns of a question, tool-calling steps (several calls each) and an answer."""

    def __init__(self, system: bool = True) -> None:
        self.messages: list[ChatMessage] = [ChatMessage.from_system(SYSTEM)] if system else []
        self.turn_starts: list[int] = []
        self._ids = 0

    def user(self, text: str) -> Builder:
        self.turn_starts.append(len(self.messages))
        self.messages.append(ChatMessage.from_user(text))
        return self

    def step(self, *results: str, tool: str = "search", text: str | None = None, order: Sequence[int] = ()) -> Builder:
        calls = []
        for _ in results:
            self._ids += 1
            calls.append(ToolCall(tool_name=tool, arguments={"query": f"q{self._ids}"}, id=f"call_{self._ids}"))
        self.messages.append(ChatMessage.from_assistant(text=text, tool_calls=calls))
        for index in order or range(len(calls)):
            self.messages.append(ChatMessage.from_tool(results[index], origin=calls[index]))
        return self

    def answer(self, text: str) -> Builder:
        self.messages.append(ChatMessage.from_assistant(text))
        return self

    def turn(self, n: int, steps: int = 1, calls: int = 2, size: int = 60) -> Builder:
        self.user(f"Question {n}: tell me about topic {n}.")
        for s in range(steps):
            self.step(*[f"result {n}.{s}.{c} " + "x" * size for c in range(calls)])
        return self.answer(f"Answer {n}: topic {n} is covered.")


def conversation(turns: int, **kwargs: Any) -> Builder:
    builder = Builder()
    for n in range(turns):
        builder.turn(n, **kwargs)
    return builder


def texts(messages: Sequence[ChatMessage]) -> list[str]:
    out = []
    for m in messages:
        if m.tool_call_result is not None:
            out.append(f"<{m.tool_call_result.origin.id}>")
        elif m.tool_calls:
            out.append("call:" + ",".join(str(c.id) for c in m.tool_calls))
        else:
            out.append(m.text or "")
    return out


# --- the invariants -------------------------------------------------------------------------------------


def origin_index(stored: Sequence[ChatMessage], message: ChatMessage) -> int | None:
    """The stored index a sent message stands for (itself, or the result a preview shows); None for a note."""
    for index, candidate in enumerate(stored):
        if candidate is message:
            return index
    marker = message.meta.get(CONTEXT_META_KEY)
    if isinstance(marker, dict) and marker.get("kind") == "preview":
        for index, candidate in enumerate(stored):
            result = candidate.tool_call_result
            if result is not None and result.origin.id == marker["call_id"]:
                return index
        raise AssertionError(f"a preview of an unknown call: {message}")
    if isinstance(marker, dict) and marker.get("kind") == "summary":
        return None
    # a tool message rebuilt with only its paired results
    assert message.role is ChatRole.TOOL, f"a sent message that is not stored: {message}"
    ids = {r.origin.id for r in message.tool_call_results}
    for index, candidate in enumerate(stored):
        if candidate.role is ChatRole.TOOL and ids <= {r.origin.id for r in candidate.tool_call_results}:
            return index
    raise AssertionError(f"a sent message that is not stored: {message}")


def check_invariants(view: ContextView, sent: Sequence[ChatMessage]) -> list[int]:
    """Assert every invariant; return the stored indices that were sent, in order."""
    stored = view.messages
    indices = [origin_index(stored, m) for m in sent]
    real = [i for i in indices if i is not None]
    assert real == sorted(real) and len(set(real)) == len(real), "stored messages are sent once, in stored order"
    # the system prompt, first
    system = 0
    while system < len(stored) and stored[system].role is ChatRole.SYSTEM:
        system += 1
    assert [sent[i] for i in range(system)] == list(stored[:system])
    assert all(sent[i] is stored[i] for i in range(system))
    # the latest user message
    users = [i for i, m in enumerate(stored) if m.role is ChatRole.USER]
    if users:
        assert users[-1] in real, "the latest user message is sent"
    # the current run
    for index in range(view.run_start, len(stored)):
        assert index in real, f"message {index} of the current run is sent"
    # tool calls with all their results, results with their call
    sent_calls: set[str | None] = set()
    for message in sent:
        for result in message.tool_call_results:
            assert result.origin.id in sent_calls, f"the result of {result.origin.id} is sent after its call"
        sent_calls.update(call.id for call in message.tool_calls)
    sent_results = {r.origin.id for m in sent for r in m.tool_call_results}
    for message in stored:
        for result in message.tool_call_results:
            call_sent = any(result.origin.id in {c.id for c in stored[i].tool_calls} for i in real)
            if call_sent:
                assert result.origin.id in sent_results, f"every result of the sent call {result.origin.id} is sent"
    return real


def plan_and_check(policy: Any, view: ContextView) -> tuple[ContextPlan, list[int]]:
    before = list(view.messages)
    plan = policy.plan(view)
    sent = list(plan.messages)
    real = check_invariants(view, sent)
    assert len(view.messages) == len(before)
    assert all(a is b for a, b in zip(view.messages, before, strict=True)), "the stored messages are untouched"
    if plan.run_start is not None and view.run_start < len(view.messages):
        assert origin_index(view.messages, sent[plan.run_start]) == view.run_start or (
            view.messages[view.run_start].role is ChatRole.SYSTEM
        )
    return plan, real


# --- SlidingWindow ------------------------------------------------------------------------------------------


def test_sliding_window_keeps_the_last_turns_after_the_system_prompt() -> None:
    built = conversation(5)
    view = ContextView(built.messages, run_start=built.turn_starts[-1])

    plan, real = plan_and_check(SlidingWindow(max_turns=2), view)

    assert real == [0, *range(built.turn_starts[3], len(built.messages))]
    assert texts(plan.messages)[:2] == [SYSTEM, "Question 3: tell me about topic 3."]
    assert plan.run_start == 1 + (built.turn_starts[4] - built.turn_starts[3])


def test_sliding_window_sends_everything_when_there_are_fewer_turns() -> None:
    built = conversation(2)
    _plan, real = plan_and_check(SlidingWindow(max_turns=5), ContextView(built.messages, built.turn_starts[-1]))
    assert real == list(range(len(built.messages)))


def test_sliding_window_keeps_a_current_run_that_spans_turns() -> None:
    built = conversation(6)
    run_start = built.turn_starts[2]  # the run has gone on for four turns (the user spoke mid-run)
    _plan, real = plan_and_check(SlidingWindow(max_turns=1), ContextView(built.messages, run_start))
    assert real == [0, *range(run_start, len(built.messages))]


def test_sliding_window_never_parts_a_resumed_runs_results_from_their_call() -> None:
    built = Builder().turn(0).user("Go on.").step("r1", "r2", "r3", order=[2, 0, 1])
    run_start = len(built.messages) - 3  # the run resumed with the tool results (a crash came before them)
    _plan, real = plan_and_check(SlidingWindow(max_turns=1), ContextView(built.messages, run_start))
    assert real == [0, *range(built.turn_starts[-1], len(built.messages))]


def test_sliding_window_rejects_a_bad_max_turns() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_turns"):
            SlidingWindow(max_turns=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "policy",
    [
        SlidingWindow(max_turns=1),
        TokenBudget(max_tokens=10),
        Summarize(ScriptedChatGenerator.summarizer(), trigger_tokens=1),
        OffloadToolResults(),
    ],
)
def test_an_empty_conversation_is_sent_empty(policy: Any) -> None:
    plan = policy.plan(ContextView([], run_start=0))
    assert list(plan.messages) == [] and plan.summarize is None
    only_system = [ChatMessage.from_system(SYSTEM)]
    assert list(policy.plan(ContextView(only_system, run_start=1)).messages) == only_system


def test_a_view_rejects_a_run_start_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"run_start .* \(0 to 1\), got 2"):
        ContextView([ChatMessage.from_user("hi")], run_start=2)


# --- TokenBudget ---------------------------------------------------------------------------------------


def search_tool() -> Tool:
    schema = {"type": "object", "properties": {"query": {"type": "string", "description": "x" * 400}}}
    return Tool(name="search", description="Search the web. " * 20, parameters=schema, function=lambda query: query)


def test_token_budget_keeps_the_most_recent_turns_that_fit() -> None:
    built = conversation(8, size=200)
    counter = ApproximateTokenCounter()
    meter = token_meter(counter)
    view = ContextView(built.messages, built.turn_starts[-1], counter=counter)
    budget = meter.messages(built.messages[:1]) + meter.messages(built.messages[built.turn_starts[5] :]) + 5

    plan, real = plan_and_check(TokenBudget(max_tokens=budget), view)

    # the turns 5, 6 and 7 fit, with the system prompt; turn 4's answer would, but not the whole turn
    assert real == [0, *range(built.turn_starts[5], len(built.messages))]
    assert meter.messages(plan.messages) <= budget
    assert meter.messages(plan.messages) + meter.message(built.messages[built.turn_starts[5] - 1]) <= budget + 200
    assert meter.messages(plan.messages) + meter.messages(
        built.messages[built.turn_starts[4] : built.turn_starts[5]]
    ) > (budget)


def test_token_budget_counts_the_tools_schemas() -> None:
    built = conversation(8, size=200)
    tools = [search_tool()]
    meter = token_meter(ApproximateTokenCounter())
    budget = meter.messages(built.messages) + 50  # everything fits, but not with the tools' schemas
    policy = TokenBudget(max_tokens=budget, counter=meter.counter)
    without = policy.plan(ContextView(built.messages, built.turn_starts[-1]))
    with_tools = policy.plan(ContextView(built.messages, built.turn_starts[-1], tools=tools))
    assert meter.tools(tools) > 100
    assert len(without.messages) == len(built.messages)
    assert len(with_tools.messages) < len(without.messages)
    assert meter.messages(with_tools.messages) + meter.tools(tools) <= budget


def test_token_budget_takes_whole_turns_so_a_call_keeps_its_results() -> None:
    built = Builder().user("Find it.").step("a" * 400, "b" * 400, "c" * 400).answer("Found.").user("Thanks!")
    meter = token_meter(ApproximateTokenCounter())
    view = ContextView(built.messages, run_start=len(built.messages) - 1, counter=meter.counter)
    # room for the answer and two of the three results, not for the whole turn: none of it is sent
    budget = meter.messages([built.messages[0], *built.messages[-2:]]) + 2 * meter.message(built.messages[3]) + 1
    plan, _ = plan_and_check(TokenBudget(max_tokens=budget), view)
    assert texts(plan.messages) == [SYSTEM, "Thanks!"]
    # room for the whole turn: all of it is
    budget = meter.messages(built.messages) + 1
    plan, real = plan_and_check(TokenBudget(max_tokens=budget), view)
    assert real == list(range(len(built.messages)))


def test_token_budget_keeps_a_long_current_run_whole() -> None:
    built = conversation(3).user("Research this deeply.")
    run_start = built.turn_starts[-1]
    for _ in range(6):
        built.step("r" * 300, "s" * 300)
    meter = token_meter(ApproximateTokenCounter())
    budget = meter.messages(built.messages[run_start:]) // 2  # half the run: its older steps are still sent
    _, real = plan_and_check(TokenBudget(max_tokens=budget), ContextView(built.messages, run_start))
    assert real == [0, *range(run_start, len(built.messages))]


def test_token_budget_sends_the_invariants_over_budget_and_warns_once_per_run(caplog: pytest.LogCaptureFixture) -> None:
    built = conversation(3, size=300)
    policy = TokenBudget(max_tokens=50)
    run_start = built.turn_starts[-1]
    with caplog.at_level(logging.WARNING):
        _plan, real = plan_and_check(policy, ContextView(built.messages, run_start))
        built.messages.append(ChatMessage.from_assistant("One more thing."))
        plan_and_check(policy, ContextView(built.messages, run_start))
    assert real == [0, *range(run_start, len(built.messages) - 1)]
    warnings = [r for r in caplog.records if "TokenBudget" in r.getMessage()]
    assert len(warnings) == 1
    assert "more than the budget of 50; sending them anyway" in warnings[0].getMessage()

    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the next run warns again
        built.user("Next question: " + "q" * 400)
        plan_and_check(policy, ContextView(built.messages, built.turn_starts[-1]))
    assert len([r for r in caplog.records if "TokenBudget" in r.getMessage()]) == 1


def test_token_budget_rejects_a_bad_budget() -> None:
    for bad in (0, -5, 2.5, None):
        with pytest.raises(ValueError, match="max_tokens must be a positive int"):
            TokenBudget(max_tokens=bad)  # type: ignore[arg-type]


# --- Summarize -----------------------------------------------------------------------------------------


def fold(request: SummaryRequest, summarizer: ScriptedChatGenerator) -> ContextSummary:
    """What the loop does with a summary request."""
    assert request.chat_generator is summarizer
    replies = request.chat_generator.run(messages=request.prompt())["replies"]
    return request.result(replies)


def test_summarize_folds_twice_and_the_second_summary_folds_in_the_first() -> None:
    summarizer = ScriptedChatGenerator.summarizer()
    policy = Summarize(summarizer, trigger_tokens=200, keep_last_turns=1)
    built = conversation(4)
    counter = ApproximateTokenCounter()

    view = ContextView(built.messages, built.turn_starts[-1], counter=counter)
    first_plan, real = plan_and_check(policy, view)
    request = first_plan.summarize
    assert request is not None
    assert request.previous is None
    assert (request.start, request.end) == (1, built.turn_starts[-1])
    assert all(a is b for a, b in zip(request.to_fold, built.messages[1 : request.end], strict=True))
    assert real == list(range(len(built.messages)))  # until the summary is written, everything is sent

    prompt = request.prompt()
    assert prompt[0].role is ChatRole.SYSTEM and "running summary" in (prompt[0].text or "")
    assert "[user] Question 0: tell me about topic 0." in (prompt[1].text or "")
    assert "[assistant calls search id=call_1]" in (prompt[1].text or "")
    first = fold(request, summarizer)
    assert first.covers == (0, built.turn_starts[-1])
    assert first.text.splitlines() == [
        f"- Question {n}: tell me about topic {n}. (tools: search, search) -> Answer {n}: topic {n} is covered."
        for n in range(3)
    ]
    usage = summarizer.calls[-1].reply.meta["usage"]  # type: ignore[union-attr]
    assert usage["prompt_tokens"] == summarizer.calls[-1].tokens > 0

    # planned again with the new summary: no second request, and the summary stands for the folded turns
    view = ContextView(built.messages, built.turn_starts[-1], summary=first, counter=counter)
    plan, real = plan_and_check(policy, view)
    assert plan.summarize is None
    assert texts(plan.messages)[:2] == [
        SYSTEM,
        f"[Summary of the first {first.end} messages of this conversation, which are not shown]\n{first.text}",
    ]
    assert real == [0, *range(built.turn_starts[-1], len(built.messages))]
    assert first.tokens == counter.count([plan.messages[1]])

    # the conversation goes on; a second fold folds the first summary in, and covers more
    for n in range(4, 7):
        built.turn(n)
    view = ContextView(built.messages, built.turn_starts[-1], summary=first, counter=counter)
    plan, _ = plan_and_check(policy, view)
    request = plan.summarize
    assert request is not None
    assert request.previous == first
    assert (request.start, request.end) == (first.end, built.turn_starts[-1])
    assert first.text in (request.prompt()[1].text or "")
    second = fold(request, summarizer)
    assert second.covers == (0, built.turn_starts[-1])
    assert second.end > first.end
    assert second.text.startswith(first.text)
    assert "Question 5" in second.text and "Question 6" not in second.text
    plan, real = plan_and_check(policy, ContextView(built.messages, built.turn_starts[-1], summary=second))
    assert plan.summarize is None
    assert second.text in (plan.messages[1].text or "")


def test_summarize_waits_for_the_trigger() -> None:
    built = conversation(4)
    meter = token_meter(ApproximateTokenCounter())
    unsummarized = meter.messages(built.messages[1 : built.turn_starts[-2]])
    view = ContextView(built.messages, built.turn_starts[-1], counter=meter.counter)
    summarizer = ScriptedChatGenerator.summarizer()

    at_trigger = Summarize(summarizer, trigger_tokens=unsummarized, keep_last_turns=2).plan(view)
    past_trigger = Summarize(summarizer, trigger_tokens=unsummarized - 1, keep_last_turns=2).plan(view)

    assert at_trigger.summarize is None
    assert past_trigger.summarize is not None
    assert past_trigger.summarize.end == built.turn_starts[-2]


def test_summarize_never_folds_the_current_run() -> None:
    built = conversation(5)
    run_start = built.turn_starts[1]  # a long run: four turns so far
    plan, _ = plan_and_check(
        Summarize(ScriptedChatGenerator.summarizer(), trigger_tokens=1, keep_last_turns=0),
        ContextView(built.messages, run_start),
    )
    assert plan.summarize is not None
    assert (plan.summarize.start, plan.summarize.end) == (1, run_start)


def test_summarize_ignores_a_summary_that_covers_more_than_there_is(caplog: pytest.LogCaptureFixture) -> None:
    built = conversation(3)
    stale = ContextSummary("- gone", covers=(0, 500), tokens=3)
    with caplog.at_level(logging.WARNING):
        _plan, real = plan_and_check(
            Summarize(ScriptedChatGenerator.summarizer(), trigger_tokens=10_000),
            ContextView(built.messages, built.turn_starts[-1], summary=stale),
        )
    assert real == list(range(len(built.messages)))
    assert "covers 500 messages, but the conversation has only" in caplog.text


def test_a_summarizer_that_replies_without_text_writes_no_summary() -> None:
    request = SummaryRequest(previous=None, to_fold=[ChatMessage.from_user("hi")], start=1, end=2)
    with pytest.raises(ValueError, match=r"replied without text, so messages 1 to 1 were not folded"):
        request.result([ChatMessage.from_assistant(tool_calls=[ToolCall("x", {}, "1")])])


def test_summary_transcripts_cut_long_tool_results() -> None:
    built = Builder().user("Read it.").step("y" * 5000).answer("Done.").user("Next.")
    policy = Summarize(ScriptedChatGenerator.summarizer(), trigger_tokens=10, keep_last_turns=1, max_result_chars=100)
    request = policy.plan(ContextView(built.messages, built.turn_starts[-1])).summarize
    assert request is not None
    transcript = request.prompt()[1].text or ""
    assert "y" * 100 + " [... 4900 more characters]" in transcript
    assert "y" * 101 not in transcript


def test_context_summary_checks_its_fields_and_is_stored_by_the_codec() -> None:
    summary = ContextSummary("- a", covers=[0, 7], tokens=4)  # type: ignore[arg-type]
    assert summary.covers == (0, 7)
    assert codec.loads(codec.dumps(summary)) == summary
    state = State({"context_summary": {"type": ContextSummary | None}})
    state.set("context_summary", summary)
    assert state.get("context_summary") == summary
    with pytest.raises(ValueError, match="covers must be two indices"):
        ContextSummary("- a", covers=(5, 2), tokens=1)
    with pytest.raises(ValueError, match="tokens must be an int >= 0"):
        ContextSummary("- a", covers=(0, 2), tokens=-1)
    with pytest.raises(TypeError, match="text must be a str"):
        ContextSummary(None, covers=(0, 2), tokens=1)  # type: ignore[arg-type]


def test_summarize_rejects_bad_settings() -> None:
    summarizer = ScriptedChatGenerator.summarizer()
    with pytest.raises(ValueError, match="trigger_tokens"):
        Summarize(summarizer, trigger_tokens=0)
    with pytest.raises(ValueError, match="keep_last_turns"):
        Summarize(summarizer, trigger_tokens=10, keep_last_turns=-1)
    with pytest.raises(ValueError, match="must be a chat generator"):
        Summarize("gpt-4o", trigger_tokens=10)


# --- OffloadToolResults and the reader tool ----------------------------------------------------------------


BIG = "".join(f"line {i:05d}\n" for i in range(1000))  # 11,000 characters


def offload_thread() -> Builder:
    return Builder().user("Fetch the report.").step(BIG, "short", tool="fetch").answer("Here it is.").user("More?")


def test_offload_sends_previews_and_the_state_keeps_the_results_whole() -> None:
    built = offload_thread()
    stored = list(built.messages)
    policy = OffloadToolResults(max_chars=2000, preview_chars=300)
    plan, real = plan_and_check(policy, ContextView(built.messages, built.turn_starts[-1]))

    assert real == list(range(len(built.messages)))
    preview = plan.messages[3]
    assert preview is not built.messages[3]
    assert preview.tool_call_result is not None
    assert preview.tool_call_result.origin == built.messages[3].tool_call_result.origin  # type: ignore[union-attr]
    text = preview.tool_call_result.result
    assert isinstance(text, str)
    assert text.startswith(BIG[:300])
    assert f'the first 300 of {len(BIG)} characters are shown; call read_tool_result(call_id="call_1", offset=300)' in (
        text
    )
    assert plan.messages[4] is built.messages[4]  # the short result is sent as it is
    assert all(a is b for a, b in zip(built.messages, stored, strict=True))
    assert built.messages[3].tool_call_result.result == BIG  # type: ignore[union-attr]
    # the same preview object on every plan (so its tokens are counted once)
    assert policy.plan(ContextView(built.messages, 0)).messages[3] is preview


def test_reading_an_offloaded_result_back_through_a_tool_invoker() -> None:
    built = offload_thread()
    state = State({})
    state.set("messages", built.messages)
    policy = OffloadToolResults(max_chars=2000, preview_chars=300)
    invoker = ToolInvoker(tools=policy_tools(policy), raise_on_failure=False)

    def read(call_id: str, **arguments: Any) -> tuple[str, bool]:
        call = ToolCall(READ_TOOL_RESULT, {"call_id": call_id, **arguments}, id=f"read_{call_id}_{arguments}")
        [message] = invoker.run(messages=[ChatMessage.from_assistant(tool_calls=[call])], state=state)["tool_messages"]
        result = message.tool_call_result
        assert result is not None
        return str(result.result), result.error

    chunks, offset = [BIG[:300]], 300
    while True:
        text, error = read("call_1", offset=offset)
        assert not error
        header, chunk = text.split("\n", 1)
        assert header.startswith(f"[characters {offset} to {min(offset + MAX_READ_CHARS, len(BIG))} of {len(BIG)}")
        chunks.append(chunk)
        offset += len(chunk)
        if "that is the end" in header:
            break
        assert f"read on with offset={offset}" in header
    assert "".join(chunks) == BIG

    text, error = read("call_1", offset=10, length=20)
    assert not error and text.endswith("\n" + BIG[10:30])
    for arguments, expected in [
        ({"call_id": "call_9"}, "No tool result with call id 'call_9'"),
        ({"call_id": "call_1", "offset": 20_000}, "offset 20000 is past the end"),
        ({"call_id": "call_1", "length": MAX_READ_CHARS + 1}, f"between 1 and {MAX_READ_CHARS}"),
        ({"call_id": "call_1", "offset": -1}, "offset must be 0 or more"),
    ]:
        text, error = read(**arguments)  # type: ignore[arg-type]
        assert error, arguments
        assert expected in text
    assert state.get("messages") == built.messages  # reading changed nothing


def test_the_reader_tools_own_results_are_never_previewed() -> None:
    built = offload_thread()
    call = ToolCall(READ_TOOL_RESULT, {"call_id": "call_1"}, id="read_1")
    built.messages += [
        ChatMessage.from_assistant(tool_calls=[call]),
        ChatMessage.from_tool("z" * 4000, origin=call),
    ]
    plan = OffloadToolResults(max_chars=100, preview_chars=10).plan(ContextView(built.messages, 0))
    assert plan.messages[-1] is built.messages[-1]


def test_offload_limits_per_tool_and_results_that_are_not_text() -> None:
    image = ImageContent(base64_image=base64.b64encode(b"\x89PNG" + b"0" * 6000).decode(), mime_type="image/png")
    built = Builder().user("Go.").step("a" * 3000, tool="fetch").step("b" * 3000, tool="search")
    built.step("c" * 3000, tool="other")
    image_call = ToolCall("camera", {}, id="img")
    built.messages += [
        ChatMessage.from_assistant(tool_calls=[image_call]),
        ChatMessage.from_tool([TextContent("a photo"), image], origin=image_call),
    ]
    policy = OffloadToolResults(max_chars=500, preview_chars=100, tools={"fetch": 5000, "search": 1000})
    sent = list(policy.plan(ContextView(built.messages, 0)).messages)

    assert sent[3] is built.messages[3]  # fetch: under its own limit
    assert sent[5] is not built.messages[5]  # search: over its limit
    assert sent[7] is built.messages[7]  # other tools: not listed, no "*"
    assert sent[9] is built.messages[9]  # an image result is sent as it is
    wildcard = OffloadToolResults(max_chars=500, preview_chars=100, tools={"*": 1000})
    assert list(wildcard.plan(ContextView(built.messages, 0)).messages)[7] is not built.messages[7]


def test_offload_without_the_reader_tool() -> None:
    policy = OffloadToolResults(max_chars=500, preview_chars=100, reader_tool=False)
    built = offload_thread()
    preview = policy.plan(ContextView(built.messages, 0)).messages[3]
    assert policy_tools(policy) == []
    assert "the rest cannot be read back here" in str(preview.tool_call_result.result)  # type: ignore[union-attr]
    assert policy_tools(OffloadToolResults()) == [read_tool_result]


def test_offload_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="preview_chars \\(1000\\) must be below the limit of max_chars"):
        OffloadToolResults(max_chars=1000, preview_chars=1000)
    with pytest.raises(ValueError, match="tools\\['fetch'\\] must be a positive int"):
        OffloadToolResults(tools={"fetch": 0})
    with pytest.raises(ValueError, match="below the limit of fetch"):
        OffloadToolResults(max_chars=5000, preview_chars=1000, tools={"fetch": 500})


# --- composition ------------------------------------------------------------------------------------------


def test_composition_applies_each_policy_to_the_previous_ones_output() -> None:
    built = conversation(10, size=200)
    counter = ApproximateTokenCounter()
    view = ContextView(built.messages, built.turn_starts[-1], counter=counter)
    window = SlidingWindow(max_turns=6)
    budget = TokenBudget(max_tokens=600)

    composed = window | budget
    plan, real = plan_and_check(composed, view)

    first = window.plan(view)
    by_hand = budget.plan(ContextView(first.messages, first.run_start or 0, counter=counter))
    assert isinstance(composed, ComposePolicies)
    assert list(plan.messages) == list(by_hand.messages)
    assert origin_index(built.messages, first.messages[1]) == built.turn_starts[4]
    assert built.turn_starts[4] < real[1]  # the budget cut further than the window
    assert composed.policies == [window, budget]
    assert (composed | SlidingWindow(max_turns=3)).policies[:2] == [window, budget]  # flattened


def test_summarize_then_budget_keeps_the_summary_note() -> None:
    built = conversation(10, size=200)
    summary = ContextSummary("- the early turns", covers=(0, built.turn_starts[5]), tokens=10)
    view = ContextView(built.messages, built.turn_starts[-1], summary=summary)
    policy = Summarize(ScriptedChatGenerator.summarizer(), trigger_tokens=100_000) | TokenBudget(max_tokens=600)
    plan, real = plan_and_check(policy, view)
    assert plan.summarize is None
    assert "- the early turns" in (plan.messages[1].text or "")
    assert real[1] > built.turn_starts[5]  # the budget trimmed after the note, not the note


def test_a_summary_request_passes_through_a_composition() -> None:
    built = conversation(6)
    policy = OffloadToolResults(max_chars=50, preview_chars=10) | Summarize(
        ScriptedChatGenerator.summarizer(), trigger_tokens=50, keep_last_turns=1
    )
    plan, _ = plan_and_check(policy | SlidingWindow(max_turns=2), ContextView(built.messages, built.turn_starts[-1]))
    assert plan.summarize is not None
    assert "truncated: the first 10 of" in (plan.summarize.prompt()[1].text or "")  # the summarizer reads previews


def test_composition_mistakes_raise_at_construction() -> None:
    summarizer = ScriptedChatGenerator.summarizer()
    with pytest.raises(ValueError, match=r"comes after SlidingWindow, which moves them\. Put Summarize first"):
        SlidingWindow(max_turns=3) | Summarize(summarizer, trigger_tokens=10)
    with pytest.raises(ValueError, match="only one policy may fold"):
        Summarize(summarizer, trigger_tokens=10) | Summarize(summarizer, trigger_tokens=20)
    with pytest.raises(ValueError, match="at least one policy"):
        ComposePolicies([])
    with pytest.raises(ValueError, match=r"item 1 \('nope'\) is not a context policy"):
        ComposePolicies([SlidingWindow(max_turns=1), "nope"])  # type: ignore[list-item]


class KeepLastUser:
    """A custom policy (not a PolicyBase): the system prompt and the current run; says nothing of run_start."""

    def plan(self, view: ContextView) -> ContextPlan:
        return ContextPlan([view.messages[0], *view.messages[view.run_start :]])


def test_custom_policies_compose_on_either_side() -> None:
    built = conversation(5)
    view = ContextView(built.messages, built.turn_starts[-1])
    right = SlidingWindow(max_turns=3) | KeepLastUser()
    left = KeepLastUser() | SlidingWindow(max_turns=3)
    for policy in (right, left):
        _plan, real = plan_and_check(policy, view)
        assert real == [0, *range(built.turn_starts[-1], len(built.messages))]


# --- the invariants, on random conversations -----------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[ChatMessage], int]:
    builder = Builder(system=draw(st.booleans()))
    for n in range(draw(st.integers(0, 8))):
        builder.user(f"q{n} " + "u" * draw(st.integers(0, 200)))
        for _ in range(draw(st.integers(0, 3))):
            sizes = draw(st.lists(st.integers(0, 600), min_size=1, max_size=3))
            order = draw(st.permutations(range(len(sizes))))
            text = draw(st.none() | st.just("thinking"))
            builder.step(*["r" * size for size in sizes], order=order, text=text)
        if draw(st.booleans()):
            builder.answer(f"a{n} " + "a" * draw(st.integers(0, 200)))
    messages = builder.messages
    starts = [*builder.turn_starts, len(messages)]
    starts += [i for i, m in enumerate(messages) if m.role is ChatRole.TOOL and messages[i - 1].tool_calls]
    starts.sort()
    return messages, draw(st.sampled_from(starts[-3:]) | st.sampled_from(starts))  # mostly a recent run


def system_count(messages: Sequence[ChatMessage]) -> int:
    count = 0
    while count < len(messages) and messages[count].role is ChatRole.SYSTEM:
        count += 1
    return count


def expected_keep(messages: Sequence[ChatMessage], run_start: int) -> int:
    """Where what must be sent begins: the latest user message or the run's start, not parting results from calls."""
    head = system_count(messages)
    users = [i for i, m in enumerate(messages) if m.role is ChatRole.USER]
    start = max(min([run_start, *users[-1:]]), head)
    while head < start < len(messages) and messages[start].role is ChatRole.TOOL:
        start -= 1
    return start


KINDS = ["window", "budget", "summarize", "offload", "window|budget", "summarize|budget", "offload|summarize|window"]


def policies(draw: st.DrawFn, kind: str) -> Any:
    window = SlidingWindow(max_turns=draw(st.integers(1, 4)))
    budget = TokenBudget(max_tokens=draw(st.integers(1, 3000)))
    summarize = Summarize(
        ScriptedChatGenerator.summarizer(),
        trigger_tokens=draw(st.integers(1, 1000)),
        keep_last_turns=draw(st.integers(0, 3)),
    )
    offload = OffloadToolResults(max_chars=draw(st.integers(2, 700)), preview_chars=1)
    return {
        "window": window,
        "budget": budget,
        "summarize": summarize,
        "offload": offload,
        "window|budget": window | budget,
        "summarize|budget": summarize | budget,
        "offload|summarize|window": offload | summarize | window,
    }[kind]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_policy_keeps_the_invariants(kind: str, data: st.DataObject) -> None:
    messages, run_start = data.draw(conversations())
    policy = policies(data.draw, kind)
    turn_starts = [i for i, m in enumerate(messages) if m.role is ChatRole.USER and i <= run_start]
    summary = None
    if turn_starts and data.draw(st.booleans()):
        end = data.draw(st.sampled_from(turn_starts))
        summary = ContextSummary("- so far", covers=(0, end), tokens=5)
    view = ContextView(messages, run_start, summary=summary)
    plan, real = plan_and_check(policy, view)

    if isinstance(policy, TokenBudget):
        meter = token_meter(view.counter)
        head = system_count(messages)
        keep = expected_keep(messages, run_start)
        if meter.messages(plan.messages) > policy.max_tokens:  # only what must be sent was sent
            event("over budget")
            assert real == [*range(head), *range(keep, len(messages))]
        elif len(real) > head and real[head] > head:  # and one turn more would not have fitted
            cut = previous = real[head]
            assert messages[cut].role is ChatRole.USER or cut == keep
            previous -= 1
            while previous > head and messages[previous].role is not ChatRole.USER:
                previous -= 1
            assert meter.messages(plan.messages) + meter.messages(messages[previous:cut]) > policy.max_tokens
    event(f"{type(policy).__name__}: " + ("trimmed" if len(real) < len(messages) else "all sent"))
    request = plan.summarize
    if request is not None:
        event("summary requested")
        assert request.start < request.end <= max(run_start, 1)
        assert request.end == len(messages) or messages[request.end].role is not ChatRole.TOOL
        assert [origin_index(messages, m) for m in request.to_fold] == list(range(request.start, request.end))
        if summary is not None:
            assert request.start == summary.end and request.previous == summary
        # the loop writes the summary and plans again: no second request
        folded = ContextSummary("- folded", covers=(0, request.end), tokens=3)
        again, _ = plan_and_check(policy, ContextView(messages, run_start, summary=folded))
        assert again.summarize is None


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(conversations(), st.integers(0, 50))
def test_results_without_their_call_are_never_sent(built: tuple[list[ChatMessage], int], position: int) -> None:
    messages, run_start = built
    orphan = ChatMessage.from_tool("lost", origin=ToolCall("search", {}, id="nowhere"))
    position = min(position, run_start)
    if run_start < len(messages) and messages[run_start].role is ChatRole.TOOL:
        position = min(position, run_start - 1)
    messages = [*messages[:position], orphan, *messages[position:]]
    run_start += 1
    for policy in (SlidingWindow(max_turns=2), TokenBudget(max_tokens=400), OffloadToolResults() | TokenBudget(300)):
        plan, _ = plan_and_check(policy, ContextView(messages, run_start))
        assert all(m is not orphan for m in plan.messages)


# --- token counters --------------------------------------------------------------------------------------


@contextlib.contextmanager
def proxy(stalled: bool) -> Iterator[str]:
    """A proxy address that refuses connections, or one that accepts them and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if stalled:
        server.listen(8)
    else:
        server.close()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


@pytest.fixture
def offline_tiktoken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No cached tiktoken encoding, and downloads go through a proxy set by the test."""
    pytest.importorskip("tiktoken")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.slow
@pytest.mark.parametrize("stalled", [False, True], ids=["refused", "no answer"])
def test_the_counter_falls_back_to_approximate_when_tiktoken_cannot_load(
    offline_tiktoken: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, stalled: bool
) -> None:
    with proxy(stalled) as address, caplog.at_level(logging.WARNING):
        for name in ("HTTPS_PROXY", "https_proxy"):
            offline_tiktoken.setenv(name, address)
        counter = load_token_counter("o200k_base", timeout=1.0)
    assert isinstance(counter, ApproximateTokenCounter)
    assert "Could not load the tiktoken encoding 'o200k_base'" in caplog.text
    assert ("did not load within 1 seconds" in caplog.text) is stalled
    assert counter.count([ChatMessage.from_user("x" * 40)]) == ApproximateTokenCounter().count(
        [ChatMessage.from_user("x" * 40)]
    )


def test_the_default_counter_is_made_once_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("tiktoken")
    with caplog.at_level(logging.WARNING):
        first = default_token_counter("no_such_encoding")
        second = default_token_counter("no_such_encoding")
    assert first is second
    assert isinstance(first, ApproximateTokenCounter)
    assert caplog.text.count("Could not load the tiktoken encoding 'no_such_encoding'") == 1
    assert "Unknown encoding no_such_encoding" in caplog.text


class CountingCounter(ApproximateTokenCounter):
    """The approximate counter, counting how many messages it was asked to measure."""

    def __init__(self) -> None:
        super().__init__()
        self.measured = 0

    def count(self, messages: list[ChatMessage], tools: Any = None) -> int:
        self.measured += len(messages)
        return super().count(messages, tools=tools)


class Watched(Sequence[ChatMessage]):
    """A conversation that records which positions were read."""

    def __init__(self, items: list[ChatMessage]) -> None:
        self.items = items
        self.read: set[int] = set()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            self.read.update(range(*index.indices(len(self.items))))
        else:
            self.read.add(index % len(self.items))
        return self.items[index]


@pytest.mark.slow
@pytest.mark.parametrize(
    "make",
    [
        lambda: SlidingWindow(max_turns=3),
        lambda: TokenBudget(max_tokens=2000),
        lambda: Summarize(ScriptedChatGenerator.summarizer(), trigger_tokens=1500, keep_last_turns=2),
        lambda: OffloadToolResults(max_chars=100, preview_chars=10) | TokenBudget(max_tokens=2000),
    ],
    ids=["window", "budget", "summarize", "offload+budget"],
)
def test_a_plan_reads_and_counts_what_it_sends_not_the_whole_history(make: Any) -> None:
    built = conversation(5000, steps=1, calls=1, size=40)  # 20,001 messages
    counter = CountingCounter()
    summary = ContextSummary("- old", covers=(0, built.turn_starts[-6]), tokens=3)
    watched = Watched(built.messages)
    policy = make()
    plan = policy.plan(ContextView(watched, built.turn_starts[-1], summary=summary, counter=counter))
    sent = len(list(plan.messages))
    assert len(built.messages) > 20_000
    assert sent < 300
    assert len(watched.read) <= 2 * sent + 10
    assert counter.measured <= 2 * sent + 10

    # the run goes on: the next plan counts only the new messages
    before = counter.measured
    call = ToolCall("search", {"query": "more"}, id="more")
    built.messages += [ChatMessage.from_assistant(tool_calls=[call]), ChatMessage.from_tool("more", origin=call)]
    policy.plan(ContextView(built.messages, built.turn_starts[-1], summary=summary, counter=counter))
    assert counter.measured - before <= 2


# --- serialization --------------------------------------------------------------------------------------


def test_policies_round_trip_through_to_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    counter: TokenCounter = ApproximateTokenCounter(chars_per_token=3.0)
    policy = (
        OffloadToolResults(max_chars=900, preview_chars=100, tools={"fetch": 2000, "*": 900}, reader_tool=False)
        | Summarize(ScriptedChatGenerator.summarizer(), trigger_tokens=300, keep_last_turns=1, instructions="Be terse.")
        | SlidingWindow(max_turns=4)
        | TokenBudget(max_tokens=5000, counter=counter)
    )
    data = policy_to_dict(policy)
    assert data["type"] == "haystack_state.agent.context.base.ComposePolicies"
    restored = policy_from_dict(data)
    assert isinstance(restored, ComposePolicies)
    assert policy_to_dict(restored) == data
    _, summarize, window, budget = restored.policies
    assert isinstance(summarize, Summarize) and summarize.instructions == "Be terse."
    assert isinstance(summarize.chat_generator, ScriptedChatGenerator)
    assert isinstance(budget, TokenBudget) and isinstance(budget.counter, ApproximateTokenCounter)
    assert budget.counter.chars_per_token == 3.0
    built = conversation(6)
    view = ContextView(built.messages, built.turn_starts[-1])
    assert texts(restored.plan(view).messages) == texts(policy.plan(view).messages)
    assert repr(window) == "SlidingWindow(max_turns=4)"
