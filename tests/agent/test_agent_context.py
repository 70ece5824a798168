"""
Context policies on the Agent: what the model is sent is a view of the stored messages, which never lose one. A
long thread stays within a token budget, summaries fold in rarely and are checkpointed with the range they cover,
a crash mid-summary loses nothing and writes no duplicate, a fork rebuilds its own context, and the same run on
``OpenAIChatGenerator`` sends exactly the planned messages over HTTP.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.token_counters import ApproximateTokenCounter
from haystack.utils import Secret

from haystack_state import Agent, InMemoryCheckpointer, SQLiteCheckpointer, tool
from haystack_state.agent.context import (
    ContextSummary,
    ContextView,
    OffloadToolResults,
    SlidingWindow,
    Summarize,
    TokenBudget,
    token_meter,
)
from haystack_state.cli import main
from haystack_state.testing import ScriptedChatGenerator

COUNTER = ApproximateTokenCounter()
BUDGET = 2000
SYSTEM = "You answer questions about the archive. Use lookup before answering."


@tool
def lookup(query: str) -> str:
    """Look a query up in the archive."""
    return f"Archive entry for {query}: " + "details " * 45


def model(messages: list[ChatMessage], tools: list[Any]) -> Any:
    """Call lookup once per question, then answer."""
    last = messages[-1]
    if last.is_from("user"):
        return [("lookup", {"query": (last.text or "")[:40]})]
    return f"Answer about {messages[-2].tool_calls[0].arguments['query'] if messages[-2].tool_calls else 'it'}."


def question(i: int) -> list[ChatMessage]:
    return [ChatMessage.from_user(f"Question {i}: what does the archive say about topic number {i}? " * 2)]


def make(checkpointer: Any, generator: Any, summarizer: Any, *, trigger: int = 2200) -> Agent:
    policy = Summarize(summarizer, trigger_tokens=trigger, keep_last_turns=2) | TokenBudget(max_tokens=BUDGET)
    return Agent(
        generator,
        tools=[lookup],
        system_prompt=SYSTEM,
        checkpointer=checkpointer,
        context_policy=policy,
        token_counter=COUNTER,
    )


def check_pairs(messages: list[ChatMessage]) -> None:
    """No tool call without all its results, no result without its call."""
    calls = {call.id for m in messages for call in m.tool_calls}
    results = {r.origin.id for m in messages for r in m.tool_call_results}
    assert calls == results


def checkpoint_bytes(path: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(path)) as conn:  # (a connection's own `with` does not close it)
        rows = conn.execute("SELECT length(delta) + length(metadata) FROM haystack_state_checkpoints ORDER BY seq")
        return [row[0] for row in rows]


@pytest.mark.slow
def test_a_300_turn_thread_stays_within_its_budget_and_keeps_every_message(tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    generator = ScriptedChatGenerator(policy=model, token_counter=COUNTER, record=5)
    summarizer = ScriptedChatGenerator.summarizer(token_counter=COUNTER, record=False)
    agent = make(SQLiteCheckpointer(path), generator, summarizer)
    sizes: list[int] = []
    summaries: list[ContextSummary] = []
    for i in range(300):
        result = agent.run(question(i), thread_id="t")
        for call in generator.calls[-2:]:
            sizes.append(call.tokens)
            check_pairs(call.messages)
            assert call.messages[0].text == SYSTEM
            assert any(m.is_from("user") and f"Question {i}:" in (m.text or "") for m in call.messages)
        summary = result.get("context_summary")  # left out until a summary is written
        if summary is not None and (not summaries or summary.covers != summaries[-1].covers):
            summaries.append(summary)

    assert max(sizes) <= BUDGET  # measured by the model's own recording of every call
    stored = agent.get_state("t").values["messages"]
    assert sum(1 for m in stored if m.is_from("user")) == 300  # every turn is stored
    assert len(stored) == 1 + 300 * 4
    # the summary exists, grows by folding (each covers more, and carries the earlier one's lines), and is rare
    assert len(summaries) >= 3
    assert all(a.covers[1] < b.covers[1] for a, b in itertools.pairwise(summaries))
    first_line = summaries[0].text.splitlines()[0]
    assert first_line in summaries[1].text
    assert summarizer.call_count <= 300 // 10
    # the history shows which checkpoints carry a new summary, with the range it covers
    marked = [meta for meta in agent.get_history("t") if "context_summary" in meta.metadata]
    assert len(marked) == summarizer.call_count
    assert sorted(tuple(m.metadata["context_summary"]["covers"]) for m in marked) == sorted(
        {s.covers for s in summaries} | {tuple(m.metadata["context_summary"]["covers"]) for m in marked}
    )
    found = agent.get_history("t").summaries()
    assert [meta.checkpoint_id for meta, _ in found] == [meta.checkpoint_id for meta in marked]
    assert found[0][1] == tuple(summaries[-1].covers)
    assert "new summary of messages" in agent.get_history("t")._repr_html_()
    # the CLI shows the summary with its range, and marks the checkpoints that wrote one
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["show", str(path), "t"]) == 0
        assert main(["history", str(path), "t", "--limit", "400"]) == 0
    shown = buffer.getvalue()
    start, end = summaries[-1].covers
    assert f"context summary: covers messages {start}-{end - 1} of {len(stored)}" in shown
    assert summaries[-1].text.split()[0] in shown
    assert shown.count("context_summary (") - 1 == sum(1 for meta, _ in found if meta in agent.get_history("t")[:400])
    # checkpoint bytes per step stay flat: the late turns write no more than the early ones
    per_checkpoint = checkpoint_bytes(path)
    early, late = per_checkpoint[40:400], per_checkpoint[-360:]
    assert sum(late) / len(late) <= 1.5 * sum(early) / len(early)


class Crash(BaseException):
    """Stands for the process dying while the summarizer is working."""


def test_a_crash_mid_summary_loses_nothing_and_writes_no_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    crashes = {"left": 1}
    fold = ScriptedChatGenerator.summarizer(token_counter=COUNTER)

    def summarizer_policy(messages: list[ChatMessage], tools: list[Any]) -> Any:
        if crashes["left"]:
            crashes["left"] -= 1
            raise Crash()
        return fold.policy(messages, tools)  # type: ignore[misc]

    summarizer = ScriptedChatGenerator(policy=summarizer_policy, token_counter=COUNTER)
    generator = ScriptedChatGenerator(policy=model, token_counter=COUNTER)
    agent = make(SQLiteCheckpointer(path), generator, summarizer, trigger=600)
    crashed_at = None
    for i in range(12):
        try:
            agent.run(question(i), thread_id="t")
        except Crash:
            crashed_at = i
            break
    assert crashed_at is not None
    before = agent.get_state("t")
    assert before.values.get("context_summary") is None  # nothing of the summary was committed
    # another process picks the thread up: the run continues where its last checkpoint left it
    fresh = make(SQLiteCheckpointer(path), generator, summarizer, trigger=600)
    result = fresh.run([], thread_id="t")
    assert result["exit_reason"] == "text"
    summary = result["context_summary"]
    assert summary is not None
    marked = [meta for meta in fresh.get_history("t") if "context_summary" in meta.metadata]
    assert len(marked) == 1 and tuple(marked[0].metadata["context_summary"]["covers"]) == summary.covers
    stored = fresh.get_state("t").values["messages"]
    assert sum(1 for m in stored if m.is_from("user")) == crashed_at + 1


def test_a_fork_from_before_a_summary_rebuilds_its_own_context(tmp_path: Path) -> None:
    generator = ScriptedChatGenerator(policy=model, token_counter=COUNTER)
    summarizer = ScriptedChatGenerator.summarizer(token_counter=COUNTER)
    agent = make(SQLiteCheckpointer(tmp_path / "threads.db"), generator, summarizer, trigger=600)
    for i in range(10):
        agent.run(question(i), thread_id="t")
    history = list(agent.get_history("t"))
    first_summary = min((m for m in history if "context_summary" in m.metadata), key=lambda m: m.created_at)
    by_id = {m.checkpoint_id: m for m in history}
    before = by_id[str(first_summary.parent_id)]
    while before.metadata.get("continues"):  # back to where the previous run ended: a fork point
        before = by_id[str(before.parent_id)]
    assert agent.get_state("t", before.checkpoint_id).values.get("context_summary") is None

    branch = [ChatMessage.from_user("A new branch question")]
    calls_before = generator.call_count
    result = agent.run(branch, thread_id="t", checkpoint_id=before.checkpoint_id)
    stored_before = agent.get_state("t", before.checkpoint_id).values["messages"]
    asked = sum(1 for m in stored_before if m.is_from("user"))
    # nothing of the other branch reaches the fork's model: no later question, in a message or a summary note
    for call in generator.calls[calls_before - generator.call_count :]:
        text = " ".join(m.text or "" for m in call.messages)
        assert not any(f"Question {k}:" in text for k in range(asked, 10))
        assert "A new branch question" in text
    summary = result["context_summary"]
    assert summary is None or summary.covers[1] <= len(stored_before)
    assert result["messages"][: len(stored_before)] == stored_before


def test_the_model_sees_a_window_while_the_state_keeps_everything() -> None:
    generator = ScriptedChatGenerator(policy=model)
    agent = Agent(generator, tools=[lookup], system_prompt=SYSTEM, context_policy=SlidingWindow(max_turns=1))
    first = agent.run(question(0))
    result = agent.run([*first["messages"], *question(1)])
    sent = generator.calls[-1].messages
    assert sent[0].text == SYSTEM
    assert [m.text for m in sent if m.is_from("user")] == [question(1)[0].text]
    assert len(result["messages"]) == len(first["messages"]) + 4  # stored: everything


def test_offloaded_results_reach_the_model_as_previews_and_can_be_read_back() -> None:
    seen: list[list[ChatMessage]] = []

    def reading_model(messages: list[ChatMessage], tools: list[Any]) -> Any:
        seen.append(list(messages))
        last = messages[-1]
        if last.is_from("user"):
            return [("lookup", {"query": "big"})]
        if last.tool_call_result and last.tool_call_result.origin.tool_name == "lookup":
            return [("read_tool_result", {"call_id": last.tool_call_result.origin.id, "offset": 0, "length": 60})]
        return "done"

    agent = Agent(
        ScriptedChatGenerator(policy=reading_model),
        tools=[lookup],
        context_policy=OffloadToolResults(max_chars=100, preview_chars=20),
    )
    result = agent.run(question(0))
    preview = seen[1][-1].tool_call_result
    assert preview is not None and len(preview.result) < 300 and "read_tool_result" in preview.result
    stored = [m for m in result["messages"] if m.tool_call_result and m.tool_call_result.origin.tool_name == "lookup"]
    assert stored[0].tool_call_result.result == lookup.invoke(query="big")  # the state keeps the whole result
    read = result["messages"][-2].tool_call_result
    assert read is not None and not read.error and "Archive entry for big" in read.result


def test_summaries_count_in_token_usage() -> None:
    generator = ScriptedChatGenerator(policy=model, token_counter=COUNTER)
    summarizer = ScriptedChatGenerator.summarizer(token_counter=COUNTER)
    agent = make(InMemoryCheckpointer(), generator, summarizer, trigger=300)
    summarized_runs = 0
    for i in range(6):
        model_calls, summaries = generator.call_count, summarizer.call_count
        result = agent.run(question(i), thread_id="t")
        spent = sum(
            c.reply.meta["usage"]["total_tokens"] for c in generator.calls[model_calls - generator.call_count :]
        )
        new = summarizer.call_count - summaries
        spent += sum(c.reply.meta["usage"]["total_tokens"] for c in summarizer.calls[len(summarizer.calls) - new :])
        assert result["token_usage"]["total_tokens"] == spent
        summarized_runs += bool(new)
    assert summarized_runs >= 1


@pytest.mark.slow
def test_the_run_on_openai_sends_exactly_the_planned_messages() -> None:
    turns = 14
    with FakeOpenAIServer(policy=lambda body: openai_model(body)) as server:
        generator = OpenAIChatGenerator(api_key=Secret.from_token("test"), api_base_url=server.base_url)
        summarizer = ScriptedChatGenerator.summarizer(token_counter=COUNTER)
        agent = make(None, generator, summarizer, trigger=600)
        messages: list[ChatMessage] = []
        for i in range(turns):
            result = agent.run([*messages, *question(i)])
            messages = result["messages"]
        bodies = [request.body for request in server.requests]
    assert len(bodies) == 2 * turns
    for body in bodies:
        assert body["messages"][0] == {"role": "system", "content": SYSTEM}
        ids_called = {c["id"] for m in body["messages"] for c in m.get("tool_calls") or []}
        ids_answered = {m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"}
        assert ids_called == ids_answered
    assert token_meter(COUNTER).messages(messages) > BUDGET  # the stored conversation outgrew the budget...
    # ...and the last request is exactly the policy's plan for it: system, summary note, the window
    assert agent.context_policy is not None
    stored = messages[:-1]  # before the final answer
    start = max(i for i, m in enumerate(stored) if m.is_from("user"))
    view = ContextView(stored, start, summary=result["context_summary"], counter=COUNTER, tools=[lookup])
    plan = agent.context_policy.plan(view)
    assert plan.summarize is None
    assert bodies[-1]["messages"] == [m.to_openai_dict_format() for m in plan.messages]
    assert len(bodies[-1]["messages"]) < len(stored)
    assert result["context_summary"] is not None
    assert result["context_summary"].text in bodies[-1]["messages"][1]["content"]


def openai_model(body: dict[str, Any]) -> Any:
    last = body["messages"][-1]
    if last["role"] == "user":
        return [("lookup", {"query": last["content"][:40]})]
    return "Answered."


@pytest.mark.parametrize("policy", [SlidingWindow(max_turns=2), TokenBudget(max_tokens=500)])
def test_policies_serialize_with_the_agent(policy: Any) -> None:
    agent = Agent(ScriptedChatGenerator(script=["hi"]), context_policy=policy, token_counter=COUNTER)
    restored = Agent.from_dict(agent.to_dict())
    assert type(restored.context_policy) is type(policy)
    assert restored.to_dict() == agent.to_dict()
