"""Checkpointers serialise their settings (never their data or secrets) and are rebuilt from a fixed list of types."""

import sys
from pathlib import Path

import pytest
from haystack import Pipeline
from haystack.core.errors import DeserializationError, SerializationError
from haystack.dataclasses import ChatMessage
from haystack.utils import Secret

from haystack_state import Agent, InMemoryCheckpointer, SQLiteCheckpointer, tool
from haystack_state.persistence import checkpointer_from_dict
from haystack_state.testing import ScriptedChatGenerator


def test_sqlite_checkpointer_round_trips_to_the_same_database(tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    with SQLiteCheckpointer(path, timeout=5.0) as first:
        first.commit(
            "t", parent_id=None, expected_head=None, delta={"x": {"op": "replace", "value": 1}}, step=0, source="input"
        )
        data = first.to_dict()
    assert data == {
        "type": "haystack_state.persistence.sqlite.SQLiteCheckpointer",
        "init_parameters": {"path": str(path), "timeout": 5.0},
    }
    with checkpointer_from_dict(data) as second:
        assert isinstance(second, SQLiteCheckpointer)
        assert second.get("t").values == {"x": 1}


def test_in_memory_checkpointer_round_trips_empty() -> None:
    with InMemoryCheckpointer() as first:
        first.commit("t", parent_id=None, expected_head=None, delta={}, step=0, source="input")
        with checkpointer_from_dict(first.to_dict()) as second:
            assert isinstance(second, InMemoryCheckpointer)
            assert second.list_threads() == []


@pytest.mark.parametrize(
    "data",
    [
        {"type": "os.system", "init_parameters": {}},
        {"type": "haystack_state.persistence.sqlite.Unknown", "init_parameters": {}},
        {"init_parameters": {}},
        {"type": "haystack_state.persistence.memory.InMemoryCheckpointer", "init_parameters": "x"},
        "not a dict",
    ],
)
def test_unknown_or_malformed_data_is_refused_without_importing_anything(data: object) -> None:
    before = set(sys.modules)
    with pytest.raises(DeserializationError):
        checkpointer_from_dict(data)  # type: ignore[arg-type]
    assert set(sys.modules) - before == set()


@pytest.mark.postgres
def test_postgres_conninfo_is_serialized_only_without_secrets(
    postgres_dsn: str, postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haystack_state.persistence.postgres import PostgresCheckpointer

    with PostgresCheckpointer(postgres_dsn, schema=postgres_schema) as plain:
        assert plain.to_dict()["init_parameters"]["conninfo"] == postgres_dsn
    monkeypatch.setenv("HAYSTACK_STATE_TEST_DSN", postgres_dsn)
    secret = Secret.from_env_var("HAYSTACK_STATE_TEST_DSN")
    with PostgresCheckpointer(secret, schema=postgres_schema) as by_env:
        data = by_env.to_dict()
        assert data["init_parameters"]["conninfo"] == {
            "type": "env_var",
            "env_vars": ["HAYSTACK_STATE_TEST_DSN"],
            "strict": True,
        }
        with checkpointer_from_dict(data) as rebuilt:
            assert isinstance(rebuilt, PostgresCheckpointer)
            assert rebuilt.list_threads() == []
    with (
        PostgresCheckpointer(postgres_dsn + "?password=hunter2", schema=postgres_schema) as with_password,
        pytest.raises(SerializationError, match="password"),
    ):
        with_password.to_dict()


@tool(outputs_to_state={"notes": {"source": "note"}})
def remember(text: str) -> dict:
    """Remember a note."""
    return {"note": text}


def test_an_agent_with_a_checkpointer_round_trips_through_pipeline_yaml(tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    with SQLiteCheckpointer(path) as checkpointer:
        agent = Agent(
            ScriptedChatGenerator(script=[[("remember", {"text": "tea"})], "ok"]),
            tools=[remember],
            state_schema={"notes": {"type": list[str]}},
            checkpointer=checkpointer,
            interrupt_before=["remember"],
        )
        pipeline = Pipeline()
        pipeline.add_component("agent", agent)
        loaded = Pipeline.loads(pipeline.dumps(), allowed_modules=[__name__])
    rebuilt = loaded.get_component("agent")
    assert isinstance(rebuilt, Agent)
    assert isinstance(rebuilt.checkpointer, SQLiteCheckpointer)
    assert rebuilt.interrupt_before == ["remember"]
    try:
        result = rebuilt.run([ChatMessage.from_user("remember tea")], thread_id="t")
        assert result["exit_reason"] == "interrupted"
        with SQLiteCheckpointer(path) as reader:
            assert reader.head("t") == result["checkpoint_id"]
    finally:
        rebuilt.checkpointer.close()
