"""
What was written before stays readable: a pipeline YAML and a SQLite file of threads and memory, kept in
``tests/compat/saved/`` as ``saved_agent.py`` wrote them before the code was reshaped (issue 26), load and go on
with today's code. The saved files are copied first, never changed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from haystack import Pipeline
from haystack.dataclasses import ChatMessage, Document

from compat import saved_agent
from haystack_state import Agent, InMemoryCheckpointer, SQLiteCheckpointer, SQLiteStore
from haystack_state.testing import ScriptedChatGenerator

SAVED = Path(__file__).resolve().parent / "saved"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def threads(tmp_path: Path) -> Path:
    """A copy of the saved threads file (the saved one must not change: its digest is checked after the test)."""
    before = digest(SAVED / "threads.db")
    copy = tmp_path / "threads.db"
    shutil.copyfile(SAVED / "threads.db", copy)
    yield copy
    assert digest(SAVED / "threads.db") == before


def test_the_saved_pipeline_yaml_loads_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", "haystack_state,compat,datetime")
    pipeline = Pipeline.loads((SAVED / "agent_pipeline.yaml").read_text(encoding="utf-8"))
    agent = pipeline.get_component("agent")
    assert type(agent) is Agent
    assert isinstance(agent.checkpointer, InMemoryCheckpointer)
    assert [t.name for t in agent.tools] == ["search", "tag", "pay", "transfer"]
    assert (agent.system_prompt, agent.max_agent_steps, agent.interrupt_before) == ("Use the tools.", 9, ["transfer"])
    assert agent.state_schema["tags"]["handler"] is saved_agent.unique
    result = pipeline.run({"agent": {"messages": [ChatMessage.from_user("Hi")], "thread_id": "t"}})
    assert result["agent"]["last_message"].text == "Done."


def test_a_saved_finished_thread_reads_and_continues(threads: Path) -> None:
    with SQLiteCheckpointer(threads) as checkpointer:
        agent = saved_agent.make_agent([[("tag", {"labels": ["more"]})], "Tagged more."], checkpointer)
        state = agent.get_state("research")
        # the head is the fork from the first turn's answer: the second turn's tags are on the other branch
        assert state.values["documents"] == [Document(id="doc-python", content="All about python")]
        assert state.values["searched_at"] == dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC)
        assert state.values["tags"] == ["code", "python"]
        assert state.values["tag_calls"] == 1
        assert [m.text for m in state.values["messages"] if m.text] == [
            "Use the tools.",
            "Find python",
            "Found python.",
            "Fork",
            "A fork.",
        ]
        history = agent.get_history("research")  # both branches: the fork's input has the first answer as parent
        answer = next(m for m in history if (m.step, m.source) == (2, "model"))
        assert sorted(m.source for m in history if m.parent_id == answer.checkpoint_id) == ["input", "input"]
        result = agent.run([ChatMessage.from_user("Tag more")], thread_id="research")
    assert result["tags"] == ["code", "python", "more"] and result["tag_calls"] == 2
    assert result["last_message"].text == "Tagged more."


def test_a_saved_interrupt_is_answered_and_a_held_call_approved(threads: Path) -> None:
    with SQLiteCheckpointer(threads) as checkpointer:
        agent = saved_agent.make_agent(["Paid."], checkpointer)
        (request,) = agent.get_state("payment").interrupts
        assert (request["kind"], request["tool_name"], request["value"]) == (
            "interrupt",
            "pay",
            {"question": "Pay 30 EUR?"},
        )
        paid = agent.resume("payment", answers={request["id"]: True})
        assert [m.tool_call_result.result for m in paid["messages"] if m.tool_call_result] == ["paid"]

        agent = saved_agent.make_agent(["Transferred."], checkpointer)
        (held,) = agent.get_state("review").interrupts
        assert (held["kind"], held["arguments"]) == ("before", {"amount": 99})
        done = agent.resume("review", decisions={held["call_id"]: "approve"})
        assert [m.tool_call_result.result for m in done["messages"] if m.tool_call_result] == ["transferred 99"]
        assert done["last_message"].text == "Transferred."


def test_the_saved_memory_store_reads(threads: Path) -> None:
    with SQLiteStore(threads) as store:
        likes = store.get(("users", "alice"), "likes")
        assert likes is not None and likes.value == {"tea": "green", "since": 2024}
        assert sorted(item.key for item in store.search(("users", "alice"))) == ["likes", "note"]


def test_the_command_line_reads_the_saved_file_without_writing(tmp_path: Path) -> None:
    copy = tmp_path / "threads.db"
    shutil.copyfile(SAVED / "threads.db", copy)
    copy.chmod(0o444)
    before = digest(copy)
    listed = subprocess.run(
        [sys.executable, "-m", "haystack_state_cli", "threads", str(copy), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    for thread_id in ("research", "payment", "review"):
        assert f'"{thread_id}"' in listed.stdout
    assert digest(copy) == before


def test_the_saved_agent_is_what_scripted_agents_are() -> None:
    """The saved files' agent is built from public names only (so a reshaping cannot quietly keep old paths)."""
    agent = saved_agent.make_agent([], InMemoryCheckpointer())
    assert isinstance(agent.chat_generator, ScriptedChatGenerator)
    assert agent.to_dict()["type"] == "haystack_state.agent.Agent"
