"""
Field lifecycles and views on the Agent (issue 12): ``"scope": "input"`` keys that tools and hooks may only read,
``"scope": "loaded"`` keys computed by a loader at every run and never stored, ``"input": False`` / ``"output":
False`` views, and the run's ``context`` (its dependencies), which reaches hooks and context policies and is never
stored, returned or sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from haystack import Pipeline
from haystack.core.serialization import allow_deserialization_module
from haystack.dataclasses import ChatMessage
from workers import harness
from workers.harness import TESTS_DIR, Harness, PostgresHarness, SQLiteHarness

from haystack_state import Agent, AgentRunError, ReadOnlyStateKeyError, RunContext, State, ThreadNotFoundError, tool
from haystack_state.agent.context import ContextPlan, ContextView
from haystack_state.agent.events import CustomEvent
from haystack_state.persistence import InMemoryCheckpointer, SQLiteCheckpointer
from haystack_state.store import PostgresStore, SQLiteStore, Store
from haystack_state.testing import ScriptedChatGenerator

allow_deserialization_module(__name__)  # lets from_dict load the tools and loaders defined here

persistent_store = harness.persistent_store
postgres_dsn = harness.postgres_dsn
postgres_schema = harness.postgres_schema


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


# --- "input" keys: set by the caller, read-only to tools and hooks ---------------------------------------------


INPUT_SCHEMA: dict[str, Any] = {
    "user_id": {"type": str, "scope": "input"},
    "notes": {"type": list[str]},
}


@tool
def rename(new_id: str, state: State) -> str:
    """Write a note, then try to change who the user is."""
    state.set("notes", [f"renaming to {new_id}"])
    state.set("user_id", new_id)
    return "renamed"


@tool(inputs_from_state={"user_id": "who"}, outputs_to_state={"notes": {}})
def note(text: str, who: str) -> str:
    """Write a note for the current user."""
    return f"{who}: {text}"


def test_a_tool_writing_an_input_key_gets_an_error_result_and_the_state_is_unchanged() -> None:
    generator = ScriptedChatGenerator(script=[[("rename", {"new_id": "mallory"})], "ok"])
    agent = Agent(chat_generator=generator, tools=[rename, note], state_schema=INPUT_SCHEMA)
    result = agent.run(user("rename me"), user_id="alice")
    error = result["messages"][-2].tool_call_result
    assert error is not None and error.error
    assert "'user_id'" in error.result and "read-only" in error.result and "scope" in error.result
    assert result["user_id"] == "alice"
    assert "notes" not in result  # the failed call merged nothing: not even its first write


def test_tools_read_input_keys_and_the_value_is_checkpointed_with_the_run() -> None:
    cp = InMemoryCheckpointer()
    generator = ScriptedChatGenerator(script=[[("note", {"text": "hi"})], "done", "again"])
    agent = Agent(chat_generator=generator, tools=[note], state_schema=INPUT_SCHEMA, checkpointer=cp)
    assert agent.run(user("note"), thread_id="t", user_id="alice")["notes"] == ["alice: hi"]
    assert agent.get_state("t").values["user_id"] == "alice"
    # The next run that does not give it starts without it: an input belongs to its run.
    result = agent.run(user("again"), thread_id="t")
    assert "user_id" not in result
    assert "user_id" not in agent.get_state("t").values


def test_a_hook_writing_an_input_key_fails_the_run_naming_the_key() -> None:
    def hijack(state: Any) -> None:
        state.set("user_id", "mallory")

    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=["never"]),
        state_schema=INPUT_SCHEMA,
        hooks={"before_llm": hijack},
    )
    with pytest.raises(AgentRunError, match="'user_id' is read-only") as info:
        agent.run(user("hi"), user_id="alice")
    assert isinstance(info.value.__cause__, ReadOnlyStateKeyError)
    assert info.value.state.get("user_id") == "alice"


def test_a_tool_mapping_its_output_to_an_input_key_is_refused_at_construction() -> None:
    @tool(outputs_to_state={"user_id": {}})
    def whoami() -> str:
        """Say who the user is."""
        return "mallory"

    with pytest.raises(ValueError, match=r"Tool 'whoami' maps an output to state key 'user_id'.*scope.*input"):
        Agent(chat_generator=ScriptedChatGenerator(script=["x"]), tools=[whoami], state_schema=INPUT_SCHEMA)


# --- "loaded" keys: computed by their loader at every run, never stored ---------------------------------------


MARKER = "loaded-value-7f3c"


@pytest.mark.slow
def test_a_loaded_key_is_computed_at_every_run_and_never_stored(persistent_store: Harness) -> None:
    loads: list[tuple[str | None, int]] = []

    def load_profile(context: RunContext[Any], state: State) -> str:
        loads.append((context.thread_id, len(state.get("messages") or [])))
        return f"{MARKER}-{len(loads)}"

    schema = {"profile": {"type": str, "scope": "loaded", "loader": load_profile}, "notes": {"type": list[str]}}

    @tool(inputs_from_state={"profile": "profile"}, outputs_to_state={"notes": {}})
    def remember(profile: str) -> str:
        """Note the profile the run was given."""
        return profile.upper()

    cp = persistent_store.make()
    generator = ScriptedChatGenerator(script=[[("remember", {})], "ok", [("remember", {})], "ok"])
    agent = Agent(chat_generator=generator, tools=[remember], state_schema=schema, checkpointer=cp)
    first = agent.run(user("one"), thread_id="t")
    second = agent.run(user("two"), thread_id="t")
    assert first["profile"] == f"{MARKER}-1" and second["profile"] == f"{MARKER}-2"
    assert second["notes"] == [f"{MARKER}-1".upper(), f"{MARKER}-2".upper()]  # each run's tool saw its own value
    assert loads == [("t", 1), ("t", 5)]  # the loader saw the thread, with the run's new message already in it
    assert "profile" not in agent.get_state("t").values
    history = agent.get_history("t")
    assert [c.metadata.get("loaded") for c in history if c.metadata.get("loaded")] == [["profile"], ["profile"]]
    # The value itself is in no stored row; the notes the tool wrote (checkpointed state) are.
    text = stored_text(persistent_store, cp)
    assert f"{MARKER}-2".upper() in text  # the dump does see the state values
    assert MARKER not in text


def test_async_loaders_are_awaited_in_run_and_run_async() -> None:
    async def load(context: RunContext[Any], state: State) -> int:
        await asyncio.sleep(0)
        return 41 + int(context.deps)

    schema = {"answer": {"type": int, "scope": "loaded", "loader": load}}
    agent = Agent(chat_generator=ScriptedChatGenerator(script=["a", "b"]), state_schema=schema)
    assert agent.run(user("x"), context=1)["answer"] == 42
    assert asyncio.run(agent.run_async(user("x"), context=2))["answer"] == 43


def test_a_failing_loader_fails_the_run_before_the_model_is_called_and_writes_nothing() -> None:
    def broken(context: RunContext[Any], state: State) -> str:
        raise ConnectionError("profile service down")

    cp = InMemoryCheckpointer()
    generator = ScriptedChatGenerator(script=["never"])
    schema = {"profile": {"type": str, "scope": "loaded", "loader": broken}}
    agent = Agent(chat_generator=generator, state_schema=schema, checkpointer=cp)
    with pytest.raises(AgentRunError, match=r"loader of state key 'profile' failed.*ConnectionError") as info:
        agent.run(user("hi"), thread_id="t")
    assert isinstance(info.value.__cause__, ConnectionError)
    assert generator.call_count == 0
    with pytest.raises(ThreadNotFoundError):
        cp.history("t")
    # A loader returning the wrong type fails the same way, naming the key.
    wrong = Agent(
        chat_generator=generator,
        state_schema={"profile": {"type": str, "scope": "loaded", "loader": lambda context, state: 42}},
    )
    with pytest.raises(AgentRunError, match=r"loader of state key 'profile'.*expects str"):
        wrong.run(user("hi"))
    assert generator.call_count == 0


def test_loaded_and_private_keys_cannot_be_given_to_run() -> None:
    schema = {
        "profile": {"type": str, "scope": "loaded", "loader": lambda context, state: "p"},
        "scratch": {"type": str, "input": False},
    }
    agent = Agent(chat_generator=ScriptedChatGenerator(script=["a"]), state_schema=schema)
    with pytest.raises(ValueError, match=r"'profile' has \"scope\": \"loaded\""):
        agent.run(user("x"), profile="mine")
    with pytest.raises(ValueError, match=r"'scratch' is private to the agent"):
        agent.run(user("x"), scratch="mine")


@pytest.mark.slow
def test_a_loaded_key_is_loaded_again_when_a_run_is_resumed_in_a_new_process(tmp_path: Path) -> None:
    db = tmp_path / "threads.db"
    log = tmp_path / "loads.txt"
    script = textwrap.dedent(
        f"""
        import json, sys
        from haystack.dataclasses import ChatMessage
        from haystack_state import Agent, SQLiteCheckpointer, tool
        from haystack_state.testing import ScriptedChatGenerator

        def load(context, state):
            with open({str(log)!r}, "a") as f:
                f.write(f"{{context.deps}}\\n")
            return f"profile-from-{{context.deps}}"

        @tool(inputs_from_state={{"profile": "profile"}}, outputs_to_state={{"notes": {{}}}})
        def write(text: str, profile: str) -> str:
            '''Write a note.'''
            return f"{{text}} ({{profile}})"

        schema = {{
            "profile": {{"type": str, "scope": "loaded", "loader": load}},
            "notes": {{"type": list[str]}},
        }}
        agent = Agent(
            chat_generator=ScriptedChatGenerator(
                script=[[("write", {{"text": "n"}})]] if sys.argv[1] == "start" else ["done"]
            ),
            tools=[write],
            state_schema=schema,
            checkpointer=SQLiteCheckpointer({str(db)!r}),
            interrupt_before=["write"],
        )
        if sys.argv[1] == "start":
            result = agent.run([ChatMessage.from_user("go")], thread_id="t", context="first")
        else:
            result = agent.resume("t", {{"call_1": "approve"}}, context="second")
        print(json.dumps({{"exit_reason": result["exit_reason"], "notes": result.get("notes")}}))
        """
    )
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False", "PYTHONPATH": str(TESTS_DIR.parent)}
    outputs = []
    for step in ("start", "resume"):
        done = subprocess.run(
            [sys.executable, "-c", script, step], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert outputs[0] == {"exit_reason": "interrupted", "notes": None}
    # The resumed run, in a new process, loaded the value again (from its own context) before running the tool.
    assert outputs[1] == {"exit_reason": "text", "notes": ["n (profile-from-second)"]}
    assert log.read_text().split() == ["first", "second"]
    connection = sqlite3.connect(db)
    try:
        dumped = " ".join(
            str(row) for (table,) in tables(connection) for row in connection.execute(f"SELECT * FROM {table}")
        )
    finally:
        connection.close()
    assert "profile-from-first" not in dumped


# --- views: private inputs and outputs -------------------------------------------------------------------------


def test_private_keys_are_absent_from_sockets_and_outputs() -> None:
    schema = {
        "scratch": {"type": str, "input": False, "default": "empty"},
        "secret": {"type": str, "output": False},
        "answer": {"type": str},
    }

    @tool(outputs_to_state={"secret": {}})
    def think() -> str:
        """Think privately."""
        return "the secret"

    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=[[("think", {})], "done"]), tools=[think], state_schema=schema
    )
    pipeline = Pipeline()
    pipeline.add_component("agent", agent)
    inputs = pipeline.inputs(include_components_with_connected_inputs=True)["agent"]
    outputs = pipeline.outputs()["agent"]
    assert "scratch" not in inputs and "secret" in inputs and "answer" in inputs
    assert "secret" not in outputs and "scratch" in outputs and "answer" in outputs
    result = agent.run(user("think"), secret="given")
    assert "secret" not in result
    assert result["scratch"] == "empty"


def test_private_outputs_are_still_stored_on_the_thread() -> None:
    schema = {"secret": {"type": str, "output": False}}
    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=["ok"]), state_schema=schema, checkpointer=InMemoryCheckpointer()
    )
    assert "secret" not in agent.run(user("x"), thread_id="t", secret="kept")
    assert agent.get_state("t").values["secret"] == "kept"


# --- the run's context ----------------------------------------------------------------------------------------


class Connection:
    """Stands for a live dependency: it cannot be copied or stored, and its repr carries a marker."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("a connection cannot be copied")

    def __reduce__(self) -> Any:
        raise TypeError("a connection cannot be pickled")

    def __repr__(self) -> str:
        return "<Connection context-marker-91ab>"


def test_hooks_and_context_policies_get_the_run_context_with_the_live_object() -> None:
    connection = Connection()
    seen: list[tuple[Any, str | None, int]] = []

    def before_llm(state: Any) -> None:
        context = state.context
        assert context is state.data["context"]
        seen.append((context.deps, context.thread_id, context.step))
        context.deps.queries.append(f"step {context.step}")

    class Recording:
        def __init__(self) -> None:
            self.views: list[ContextView] = []

        def plan(self, view: ContextView) -> ContextPlan:
            self.views.append(view)
            return ContextPlan(list(view.messages))

    policy = Recording()
    cp = InMemoryCheckpointer()
    generator = ScriptedChatGenerator(script=[[("note", {"text": "x"})], "done"])
    agent = Agent(
        chat_generator=generator,
        tools=[note],
        state_schema=INPUT_SCHEMA,
        hooks={"before_llm": before_llm},
        context_policy=policy,
        checkpointer=cp,
    )
    result = agent.run(user("go"), thread_id="t", user_id="u", context=connection)
    assert [(deps is connection, thread, step) for deps, thread, step in seen] == [(True, "t", 1), (True, "t", 2)]
    assert connection.queries == ["step 1", "step 2"]
    assert all(view.context.deps is connection for view in policy.views)
    assert len({view.context.run_id for view in policy.views}) == 1
    assert connection not in result.values() and "context" not in result


def test_the_context_is_in_no_checkpoint_row_output_or_request_body(
    persistent_store: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fake_openai import FakeOpenAIServer
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.utils import Secret

    monkeypatch.setenv("HAYSTACK_STATE_TEST_OPENAI_KEY", "test")
    connection = Connection()
    cp = persistent_store.make()
    with FakeOpenAIServer(script=[[("note", {"text": "x"})], "done"]) as server:
        generator = OpenAIChatGenerator(
            api_key=Secret.from_env_var("HAYSTACK_STATE_TEST_OPENAI_KEY"),
            api_base_url=server.base_url,
            model="gpt-4o-mini",
            timeout=10,
        )
        agent = Agent(chat_generator=generator, tools=[note], state_schema=INPUT_SCHEMA, checkpointer=cp)

        result = agent.run(user("go"), thread_id="t", user_id="u", context=connection)
        bodies = json.dumps(server.bodies)
        agent.close()
    assert result["exit_reason"] == "text" and len(server.bodies) == 2
    assert "context-marker-91ab" not in bodies and "Connection" not in bodies
    assert all(value is not connection for value in result.values())
    assert "context-marker-91ab" not in repr(result)
    text = stored_text(persistent_store, cp)
    assert "u: x" in text  # the dump sees the state the run stored
    assert "context-marker-91ab" not in text and "Connection" not in text
    assert "context-marker-91ab" not in json.dumps(agent.to_dict(), default=str)


def test_a_hook_emits_custom_events_to_the_stream() -> None:
    def progress(state: Any) -> None:
        state.emit("progress", {"step": state.context.step})

    agent = Agent(
        chat_generator=ScriptedChatGenerator(script=["done", "done"]),
        hooks={"before_llm": progress, "after_run": lambda state: state.emit("finished")},
    )
    events = [e for e in agent.stream(user("go")) if isinstance(e, CustomEvent)]
    assert [(e.name, e.data) for e in events] == [("progress", {"step": 1}), ("finished", None)]
    assert events[0].to_dict()["type"] == "custom" and events[0].to_dict()["data"] == {"step": 1}
    # Without a listener, emitting is a no-op.
    assert agent.run(user("go"))["exit_reason"] == "text"


# --- helpers ---------------------------------------------------------------------------------------------------


def tables(connection: sqlite3.Connection) -> list[tuple[str]]:
    return connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()


def stored_text(store: Harness, cp: Any) -> str:
    """Every row of every table the checkpointer keeps, as text."""
    if isinstance(cp, SQLiteCheckpointer):
        path = store.path
        connection = sqlite3.connect(path)
        try:
            return " ".join(
                str(row) for (table,) in tables(connection) for row in connection.execute(f'SELECT * FROM "{table}"')
            )
        finally:
            connection.close()
    import psycopg

    schema = store.schema
    with psycopg.connect(store.dsn) as connection:
        names = [
            row[0]
            for row in connection.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
            )
        ]
        rows = [
            str(row) for name in names for row in connection.execute(f'SELECT t::text FROM "{schema}"."{name}" AS t')
        ]
    return " ".join(rows)


# --- memory across threads: a tool saves a fact in the store, a loader reads it back -------------------------


@dataclass
class User:
    user_id: str


@tool
def remember(fact: str, ctx: RunContext[User]) -> str:
    """Remember a fact about the user, for every later conversation."""
    ctx.store.put((ctx.deps.user_id, "facts"), f"fact-{len(fact)}", {"text": fact})
    return "saved"


def load_facts(context: RunContext[User], state: State) -> list[str]:
    """The facts the user's earlier conversations saved."""
    items = context.store.search((context.deps.user_id, "facts"), limit=50)
    return sorted(item.value["text"] for item in items)


def test_a_fact_saved_in_one_thread_is_loaded_in_the_users_next_thread_and_not_in_anothers(
    persistent_store: Harness,
) -> None:
    store: Store
    if isinstance(persistent_store, SQLiteHarness):
        store = SQLiteStore(persistent_store.path.parent / "memory.db")
    else:
        assert isinstance(persistent_store, PostgresHarness)
        store = PostgresStore(persistent_store.dsn, schema=persistent_store.schema)
    cp = persistent_store.make()
    schema = {"facts": {"type": list[str], "scope": "loaded", "loader": load_facts}}

    def agent(script: list[Any]) -> Agent:
        return Agent(
            ScriptedChatGenerator(script=script), tools=[remember], state_schema=schema, checkpointer=cp, store=store
        )

    first = agent([[("remember", {"fact": "likes green tea"})], "noted"]).run(
        user("I like green tea"), thread_id="A", context=User("u1")
    )
    assert first["facts"] == []  # loaded at the start of the run, before the tool saved the fact
    later = agent(["hi"]).run(user("hello"), thread_id="B", context=User("u1"))
    assert later["facts"] == ["likes green tea"]
    other = agent(["hi"]).run(user("hello"), thread_id="C", context=User("u2"))
    assert other["facts"] == []
    # The fact lives in the store, not in any thread's checkpoints.
    assert "likes green tea" not in repr(agent([]).get_state("B").values)
    with pytest.raises(TypeError, match=r"Tool 'remember', parameter 'ctx' expects RunContext\[.*User\]"):
        agent(["x"]).run(user("x"), thread_id="D", context="u1")
    store.close()


# --- a Store parameter, and serialization of lifecycles, views and the store ------------------------------------


@tool
def note_for(user_id: str, text: str, store: Store) -> str:
    """Keep a note for a user, for every later conversation."""
    store.put((user_id, "notes"), "last", {"text": text})
    return "kept"


def load_nothing(context: RunContext[Any], state: State) -> str:
    """A loader that serializes by its import path."""
    return "loaded"


def test_a_store_parameter_is_hidden_and_receives_the_agents_or_invokers_store() -> None:
    from haystack.dataclasses import ToolCall

    from haystack_state import ToolInvoker
    from haystack_state.store import InMemoryStore
    from haystack_state.tools import tool_spec

    assert set(tool_spec(note_for).parameters["properties"]) == {"user_id", "text"}
    store = InMemoryStore()
    agent = Agent(
        ScriptedChatGenerator(script=[[("note_for", {"user_id": "u1", "text": "tea"})], "ok"]),
        tools=[note_for],
        store=store,
    )
    assert agent.run(user("note"))["messages"][-2].tool_call_result.result == "kept"
    assert store.get(("u1", "notes"), "last").value == {"text": "tea"}
    other = InMemoryStore()
    invoker = ToolInvoker(tools=[note_for], store=other)
    call = ChatMessage.from_assistant(tool_calls=[ToolCall("note_for", {"user_id": "u2", "text": "x"}, id="c")])
    invoker.run(messages=[call])
    assert other.get(("u2", "notes"), "last").value == {"text": "x"}
    assert ToolInvoker.from_dict(invoker.to_dict()).store is not None


def test_lifecycles_views_loaders_and_the_store_round_trip_through_to_dict(tmp_path: Path) -> None:
    schema = {
        "user_id": {"type": str, "scope": "input"},
        "profile": {"type": str, "scope": "loaded", "loader": load_nothing},
        "scratch": {"type": list[str], "input": False, "output": False},
    }
    agent = Agent(
        ScriptedChatGenerator(script=["a"]),
        state_schema=schema,
        store=SQLiteStore(tmp_path / "memory.db"),
    )
    again = Agent.from_dict(agent.to_dict())
    specs = again._specs_fields
    assert specs["user_id"].scope == "input" and specs["profile"].loader is load_nothing
    assert not specs["scratch"].is_input and not specs["scratch"].is_output
    assert isinstance(again.store, SQLiteStore)
    assert again.run(user("x"), user_id="u")["profile"] == "loaded"
