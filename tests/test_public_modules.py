"""
Internal modules have a ``_private`` name (issue 26), and what users meet never leans on one: no guide, notebook or
example imports one, and every type that the package's ``to_dict`` writes into pipeline YAML names a public module
that imports back to the same class. The contributor pages (``docs/ARCHITECTURE.md``, ``docs/RELIABILITY.md``) are
maps of the code and name private modules on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.builders import PromptBuilder
from haystack.utils import deserialize_callable
from haystack.utils.type_serialization import thread_safe_import

from haystack_state import (
    Agent,
    ComponentTool,
    OffloadToolResults,
    RetryPolicy,
    SlidingWindow,
    SQLiteCheckpointer,
    SQLiteStore,
    Summarize,
    TokenBudget,
    ToolInvoker,
    add,
    tool,
)
from haystack_state.testing import ScriptedChatGenerator

ROOT = Path(__file__).resolve().parent.parent
#: Pages for contributors: they map the code, private modules included.
CONTRIBUTOR_PAGES = {"ARCHITECTURE.md", "RELIABILITY.md"}
PRIVATE = re.compile(r"haystack_state(?:[./]\w+)*[./]_(?!_)\w+")


def _user_facing() -> list[Path]:
    pages = [ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p.name not in CONTRIBUTOR_PAGES)]
    return pages + sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "examples").rglob("*.py"))


def test_the_public_modules_are_the_ones_without_an_underscore() -> None:
    package = ROOT / "haystack_state"
    private = [p for p in package.rglob("*.py") if any(part.startswith("_") for part in p.relative_to(package).parts)]
    public = [p.relative_to(package).as_posix() for p in package.rglob("*.py") if p not in private]
    # The private side holds most of the code; the public side is the packages and the modules users import from.
    assert len(private) > 2 * len(public)
    assert "agent/events.py" in public and "persistence/sqlite.py" in public and "agent/_loop.py" not in public


@pytest.mark.parametrize("page", _user_facing(), ids=lambda page: page.relative_to(ROOT).as_posix())
def test_no_guide_notebook_or_example_names_a_private_module(page: Path) -> None:
    text = page.read_text(encoding="utf-8").replace("__init__", "")
    assert PRIVATE.findall(text) == []


def _types(data: Any) -> list[str]:
    """Every ``type`` string in a serialized component, nested ones included."""
    if isinstance(data, dict):
        found = [data["type"]] if isinstance(data.get("type"), str) and "." in data["type"] else []
        return found + [name for value in data.values() for name in _types(value)]
    if isinstance(data, list):
        return [name for value in data for name in _types(value)]
    return []


@tool
def lookup(query: str) -> str:
    """Look a query up."""
    return query


def test_every_type_the_package_serializes_names_a_public_module(tmp_path: Path) -> None:
    agent = Agent(
        chat_generator=ScriptedChatGenerator(["done"]),
        tools=[
            lookup,
            ComponentTool(component=PromptBuilder(template="{{q}}"), name="prompt", description="A prompt."),
        ],
        state_schema={"count": {"type": int, "handler": add}},
        checkpointer=SQLiteCheckpointer(str(tmp_path / "threads.db")),
        store=SQLiteStore(str(tmp_path / "memory.db")),
        context_policy=Summarize(ScriptedChatGenerator(["a summary"]), trigger_tokens=1000)
        | SlidingWindow(max_turns=4)
        | TokenBudget(max_tokens=4000)
        | OffloadToolResults(max_chars=8000),
        retry_policy=RetryPolicy(max_attempts=2),
    )
    pipeline = Pipeline()
    pipeline.add_component("agent", agent)
    pipeline.add_component("invoker", ToolInvoker(tools=[lookup]))
    data = pipeline.to_dict()
    names = sorted({name for name in _types(data) if name.startswith("haystack_state")})
    ours = {"Agent", "FunctionTool", "ComponentTool", "SQLiteCheckpointer", "SQLiteStore", "ToolInvoker"}
    assert ours <= {name.rpartition(".")[2] for name in names}, names
    assert [name for name in names if PRIVATE.search(name)] == []
    for name in names:
        module, _, qualname = name.rpartition(".")
        found = thread_safe_import(module)
        assert getattr(found, qualname).__name__ == qualname
    # The handler is a callable named by its public path too, and the whole pipeline loads back.
    assert deserialize_callable("haystack_state.handlers.add") is add
    assert (
        Pipeline.loads(pipeline.dumps(), allowed_modules=[__name__]).get_component("agent").to_dict() == agent.to_dict()
    )
