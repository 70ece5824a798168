"""
The agent whose pipeline YAML and threads ``tests/compat/saved/`` keep, as written before the code was reshaped
(issue 26). ``python tests/compat/saved_agent.py`` writes them again: run it only when a format changes on purpose,
and say so in the commit.

The pipeline names its tools and handler by import path (``compat.saved_agent.*``), so they live here, unchanged.
The threads file holds:
- ``research``: two finished turns with tool calls that write typed state (a ``Document``, a ``datetime``, a set of
  tags through the ``unique`` handler, a counter through ``add``);
- ``payment``: a run stopped at ``interrupt()``, waiting for an answer;
- ``review``: a run held before the ``transfer`` tool (``interrupt_before``), waiting for a decision;
- a fork of ``research`` from its first turn's answer (``Found python.``), which is now that thread's head;
and the memory store's items under the namespace ``("users", "alice")``.
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
from pathlib import Path
from typing import Any

from haystack import Pipeline
from haystack.dataclasses import ChatMessage, Document

from haystack_state import Agent, InMemoryCheckpointer, SQLiteCheckpointer, SQLiteStore, add, interrupt, tool, unique
from haystack_state.persistence import Checkpointer
from haystack_state.testing import ScriptedChatGenerator

SAVED = Path(__file__).resolve().parent / "saved"
WHEN = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC)


@tool(outputs_to_state={"documents": {"source": "documents"}, "searched_at": {"source": "at"}})
def search(query: str) -> dict[str, Any]:
    """Search the library."""
    return {"documents": [Document(id=f"doc-{query}", content=f"All about {query}")], "at": WHEN}


@tool(outputs_to_state={"tags": {"source": "tags"}, "tag_calls": {"source": "one"}})
def tag(labels: list[str]) -> dict[str, Any]:
    """Tag the conversation."""
    return {"tags": labels, "one": 1}


@tool
def pay(amount: int) -> str:
    """Pay an amount, once a human says yes."""
    return "paid" if interrupt({"question": f"Pay {amount} EUR?"}) else "not paid"


@tool
def transfer(amount: int) -> str:
    """Transfer an amount (held for review)."""
    return f"transferred {amount}"


SCHEMA: dict[str, Any] = {
    "documents": {"type": list[Document]},
    "searched_at": {"type": dt.datetime},
    "tags": {"type": list[str], "handler": unique},
    "tag_calls": {"type": int, "handler": add},
}


def make_agent(script: list[Any], checkpointer: Checkpointer) -> Agent:
    return Agent(
        chat_generator=ScriptedChatGenerator(script=script),
        tools=[search, tag, pay, transfer],
        system_prompt="Use the tools.",
        state_schema=SCHEMA,
        interrupt_before=["transfer"],
        max_agent_steps=9,
        checkpointer=checkpointer,
    )


def write(folder: Path = SAVED) -> None:
    """Write ``agent_pipeline.yaml`` and ``threads.db`` into ``folder``."""
    folder.mkdir(exist_ok=True)
    pipeline = Pipeline()
    pipeline.add_component("agent", make_agent(["Done."], InMemoryCheckpointer()))
    (folder / "agent_pipeline.yaml").write_text(pipeline.dumps(), encoding="utf-8")

    database = folder / "threads.db"
    for path in folder.glob("threads.db*"):
        path.unlink()
    with SQLiteCheckpointer(database) as checkpointer:
        make_agent(
            [[("search", {"query": "python"}), ("tag", {"labels": ["code", "python"]})], "Found python."],
            checkpointer,
        ).run([ChatMessage.from_user("Find python")], thread_id="research")
        make_agent([[("tag", {"labels": ["python", "docs"]})], "Tagged."], checkpointer).run(
            [ChatMessage.from_user("Tag it")], thread_id="research"
        )
        make_agent([[("pay", {"amount": 30})], "Paid."], checkpointer).run(
            [ChatMessage.from_user("Pay 30")], thread_id="payment"
        )
        make_agent([[("transfer", {"amount": 99})], "Transferred."], checkpointer).run(
            [ChatMessage.from_user("Transfer 99")], thread_id="review"
        )
        agent = make_agent(["A fork."], checkpointer)
        first_turn = next(m for m in agent.get_history("research") if (m.step, m.source) == (2, "model"))
        agent.run(
            [ChatMessage.from_user("Fork")],
            thread_id="research",
            checkpoint_id=first_turn.checkpoint_id,
        )
    with SQLiteStore(database) as store:
        store.put(("users", "alice"), "likes", {"tea": "green", "since": 2024})
        store.put(("users", "alice"), "note", {"text": "prefers short answers"})


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else SAVED)
    shutil.rmtree(SAVED / "__pycache__", ignore_errors=True)
