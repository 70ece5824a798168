"""
The bad-input matrix: one row per kind of bad input, across schemas, values, handlers, tool definitions, the model's
tool calls, stored checkpoints and the command line.

Every row does one bad thing to a fresh world (a State, and a SQLite file holding two agent threads) and asserts
that the error names the culprit (the key, the tool, the parameter, the thread, the checkpoint, the argument) and
that nothing changed: the State's ``data`` and ``to_dict()``, and the storage (every thread's head, history and
values read through a fresh checkpointer, and the bytes of every file in the folder: the database, its write-ahead
log, and any other file a row points a command at).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state import (
    Agent,
    CheckpointError,
    CheckpointNotFoundError,
    CodecError,
    State,
    StateHandlerError,
    StateSchemaError,
    StateSerializationError,
    StateTypeError,
    ThreadConflictError,
    ThreadNotFoundError,
    ToolArgumentsError,
    ToolDefinitionError,
    ToolExecutionError,
    ToolInvoker,
    ToolMergeError,
    ToolNotFoundError,
    UnknownStateKeyError,
    add,
    merge_dicts,
    tool,
    unique,
)
from haystack_state.cli import main as cli_main
from haystack_state.persistence import SQLiteCheckpointer, replace
from haystack_state.testing import ScriptedChatGenerator

SCHEMA: dict[str, Any] = {
    "notes": {"type": list[str]},
    "doc_ids": {"type": list[str], "handler": unique},
    "count": {"type": int, "handler": add, "default": 0},
    "profile": {"type": dict[str, Any], "handler": merge_dicts, "default": dict},
    "user_id": {"type": str},
    "mode": {"type": Literal["fast", "deep"], "default": "fast"},
}


# --- the tools ---------------------------------------------------------------------------------------------------


@tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"doc_ids": {"source": "ids"}, "count": {"source": "n"}})
def search(query: Annotated[str, "what to look for"], user: str, kind: Literal["web", "docs"] = "docs") -> dict:
    """Search the user's documents."""
    return {"ids": [f"{user}:{kind}:{query}"], "n": 1}


@tool(outputs_to_state={"notes": {"source": "note"}, "count": {"source": "one"}})
def remember(text: str) -> dict:
    """Write a note."""
    return {"note": text, "one": 1}


@tool
def annotate(note: str, state: State) -> str:
    """Write a note through the State, then fail on 'boom'."""
    state.set("notes", note)
    state.set("count", 5)
    if note == "boom":
        raise RuntimeError("the annotation service is down")
    return "ok"


@tool(outputs_to_state={"notes": {"source": "note"}, "count": {"source": "n"}})
def bad_result(x: int) -> dict:
    """Return a count that is not a number."""
    return {"note": f"x={x}", "n": "many"}


@tool(outputs_to_state={"ghost": {"source": "value"}})
def haunt(x: int) -> dict:
    """Write to a key that no schema declares."""
    return {"value": x}


@tool(inputs_from_state={"user_id": "user"})
def whoami(user: str) -> str:
    """Say who the user is (the user comes from the state)."""
    return f"user={user}"


@tool
def peek(state: State) -> str:
    """Read the State."""
    return f"count={state.get('count')}"


TOOLS = [search, remember, annotate, bad_result, haunt, whoami, peek]
AGENT_TOOLS = [t for t in TOOLS if t is not haunt]  # an Agent refuses haunt at construction (its key is undeclared)


def _policy(messages: list[ChatMessage], tools: list[Any]) -> Any:
    """The thread agent's model: remember the user's text, then answer."""
    if messages[-1].is_from("user"):
        return [("remember", {"text": messages[-1].text or ""})]
    return "noted"


# --- the world each row starts from ------------------------------------------------------------------------------


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@dataclasses.dataclass
class World:
    """A State with values, and a SQLite file with two agent threads (``t1``: two runs, ``t2``: one run)."""

    folder: Path
    db: Path
    cp: SQLiteCheckpointer
    agent: Agent
    state: State
    t1: list[str]  # checkpoint ids, newest first
    t2: list[str]
    opened: list[SQLiteCheckpointer] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def fresh(self, **kwargs: Any) -> SQLiteCheckpointer:
        """Another checkpointer on the same file (no cached state), closed after the test."""
        checkpointer = SQLiteCheckpointer(self.db, **kwargs)
        self.opened.append(checkpointer)
        return checkpointer

    def invoke(self, *calls: ToolCall, **kwargs: Any) -> list[ChatMessage]:
        """Run tool calls against the State, failures raised."""
        invoker = ToolInvoker(tools=TOOLS, raise_on_failure=kwargs.pop("raise_on_failure", True), **kwargs)
        return invoker.run(messages=[ChatMessage.from_assistant(tool_calls=list(calls))], state=self.state)[
            "tool_messages"
        ]

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> None:
        """Write to the database behind the checkpointer's back (as damage or an attacker would)."""
        with contextlib.closing(sqlite3.connect(self.db, isolation_level=None)) as conn:
            conn.execute(query, params)

    def storage(self) -> dict[str, Any]:
        """What is stored, read through a fresh checkpointer (errors included), and the files' bytes."""
        read: dict[str, Any] = {}
        try:
            with SQLiteCheckpointer(self.db, cache_size=0) as checkpointer:
                threads = checkpointer.list_threads()
                read["threads"] = [(t.thread_id, t.head_id, t.checkpoint_count) for t in threads]
                for info in threads:
                    read[info.thread_id] = _read_thread(checkpointer, info.thread_id)
        except Exception as error:
            read["error"] = f"{type(error).__name__}: {error}"
        # Every file's bytes: the database, its write-ahead log, any other file a row touches (the shared-memory index
        # of the log is a cache that readers rewrite, not storage).
        files = {path.name: _digest(path) for path in sorted(self.folder.iterdir()) if not path.name.endswith("-shm")}
        return {"read": read, "files": files}

    def snapshot(self) -> dict[str, Any]:
        return {"data": self.state.data, "dict": self.state.to_dict(), **self.storage()}


def _read_thread(checkpointer: SQLiteCheckpointer, thread_id: str) -> Any:
    out: dict[str, Any] = {"head": checkpointer.head(thread_id)}
    for what, read in (("history", checkpointer.history), ("values", lambda t: checkpointer.get(t).values)):
        try:
            out[what] = read(thread_id)
        except Exception as error:
            out[what] = f"{type(error).__name__}: {error}"
    return out


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    db = tmp_path / "threads.db"
    cp = SQLiteCheckpointer(db)
    agent = Agent(
        ScriptedChatGenerator(policy=_policy),
        tools=AGENT_TOOLS,
        state_schema=SCHEMA,
        checkpointer=cp,
        max_agent_steps=5,
    )
    agent.run([ChatMessage.from_user("alpha")], thread_id="t1", user_id="alice")
    agent.run([ChatMessage.from_user("beta")], thread_id="t1")
    agent.run([ChatMessage.from_user("gamma")], thread_id="t2", user_id="bob")
    state = State(SCHEMA, {"user_id": "alice", "notes": ["n1"], "doc_ids": ["d1"], "profile": {"lang": {"ui": "en"}}})
    state.set("count", 2)
    made = World(
        folder=tmp_path,
        db=db,
        cp=cp,
        agent=agent,
        state=state,
        t1=[m.checkpoint_id for m in cp.history("t1")],
        t2=[m.checkpoint_id for m in cp.history("t2")],
    )
    yield made
    for checkpointer in [cp, *made.opened]:
        checkpointer.close()


# --- the command line --------------------------------------------------------------------------------------------


class CliFailed(Exception):
    """The command exited with a non-zero code; the message is the code and what it printed on stderr."""


def cli(*argv: str | Path) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main([str(arg) for arg in argv])
    if code != 0:
        raise CliFailed(f"exit {code}: {err.getvalue()}")
    return out.getvalue()


class Reported(Exception):
    """The error tool results a batch sent back to the model, joined."""


# --- rows --------------------------------------------------------------------------------------------------------

LOGGED = "logged"  # the row expects no exception: the culprit is named in a warning of the log


@dataclasses.dataclass(frozen=True)
class Case:
    """
    One row: ``act`` does the bad thing; it must raise ``raises`` (or, for ``LOGGED``, log a warning) whose text
    contains every string of ``names`` (formatted with ``w``, the world); ``prepare`` damages the world first.
    """

    id: str
    act: Callable[[World], Any]
    raises: type[BaseException] | str
    names: tuple[str, ...]
    prepare: Callable[[World], Any] | None = None


def call(name: str, arguments: Any, call_id: str = "c1") -> ToolCall:
    return ToolCall(tool_name=name, arguments=arguments, id=call_id)


def failing_factory() -> list[int]:
    raise OSError("the defaults service is down")


def explode(current: Any, new: Any) -> Any:
    raise ZeroDivisionError("no merging today")


def to_text(current: Any, new: Any) -> Any:
    return f"{current}{new}"


def _row(w: World, checkpoint_id: str, **columns: Any) -> None:
    sets = ", ".join(f"{column} = ?" for column in columns)
    w.sql(
        f"UPDATE haystack_state_checkpoints SET {sets} WHERE thread_id = 't1' AND checkpoint_id = ?",
        (*columns.values(), checkpoint_id),
    )


def _evil_delta(w: World) -> None:
    delta = {"notes": {"op": "extend", "items": [{"__type__": "os.system", "data": "echo pwned"}]}}
    _row(w, w.t1[0], delta=json.dumps(delta))


def _future_schema(w: World) -> None:
    w.sql("INSERT INTO haystack_state_migrations (version, applied_at) VALUES (99, '2099-01-01')")


def _not_a_database(w: World) -> Path:
    path = w.folder / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 200)
    return path


def _other_schema_agent(w: World) -> Agent:
    schema = {**SCHEMA, "notes": {"type": list[int]}}
    return Agent(ScriptedChatGenerator(policy=_policy), tools=[remember], state_schema=schema, checkpointer=w.cp)


def _stale_commit(w: World) -> Any:
    return w.cp.commit(
        "t1", parent_id=w.t1[1], expected_head=w.t1[1], delta={"count": replace(0)}, step=9, source="update"
    )


SCHEMA_CASES = [
    Case("schema-missing-type", lambda w: State({"k": {"handler": add}}), StateSchemaError, ("'k'", "'type'")),
    Case("schema-type-is-a-string", lambda w: State({"k": {"type": "int"}}), StateSchemaError, ("'k'", "'int'")),
    Case(
        "schema-misspelt-field",
        lambda w: State({"k": {"type": int, "hanlder": add}}),
        StateSchemaError,
        ("'hanlder'", "did you mean 'handler'"),
    ),
    Case(
        "schema-handler-not-callable",
        lambda w: State({"k": {"type": int, "handler": "add"}}),
        StateSchemaError,
        ("'k'", "'handler' must be callable"),
    ),
    Case(
        "schema-default-of-the-wrong-type",
        lambda w: State({"k": {"type": int, "default": "zero"}}),
        StateSchemaError,
        ("'k'", "default", "'zero'"),
    ),
    Case(
        "schema-default-factory-raises",
        lambda w: State({"k": {"type": list[int], "default": failing_factory}}),
        StateSchemaError,
        ("'k'", "OSError", "defaults service is down"),
    ),
    Case(
        "schema-unknown-scope",
        lambda w: State({"k": {"type": int, "scope": "session"}}),
        StateSchemaError,
        ("'k'", "'scope'", "'session'"),
    ),
    Case(
        "schema-messages-of-the-wrong-type",
        lambda w: State({"messages": {"type": list[str]}}),
        StateSchemaError,
        ("'messages'", "list[ChatMessage]", "list[str]"),
    ),
    Case("schema-not-a-dict", lambda w: State(["notes"]), StateSchemaError, ("must be a dict", "list")),
    Case("schema-non-string-key", lambda w: State({7: {"type": int}}), StateSchemaError, ("Key 7", "string")),
    Case(
        "schema-every-problem-at-once",
        lambda w: State({"a": {"type": int, "default": "x"}, "b": {}, "c": {"type": int, "scope": "x"}}),
        StateSchemaError,
        ("3 problem(s)", "'a'", "'b'", "'c'"),
    ),
    Case(
        "schema-of-an-agent-on-a-checkpointer",
        lambda w: Agent(
            ScriptedChatGenerator(script=["x"]), state_schema={"n": {"type": int, "scope": "Run"}}, checkpointer=w.cp
        ),
        StateSchemaError,
        ("'n'", "'Run'"),
    ),
    Case(
        "schema-key-clashes-with-an-agent-output",
        lambda w: Agent(ScriptedChatGenerator(script=["x"]), state_schema={"exit_reason": {"type": str}}),
        ValueError,
        ("exit_reason", "clash"),
    ),
    Case(
        "serialized-state-of-the-wrong-type",
        lambda w: State.from_dict(
            {**w.state.to_dict(), "data": State({"count": {"type": str}}, {"count": "x"}).to_dict()["data"]}
        ),
        StateSerializationError,
        ("'count'", "int", "str"),
    ),
]

VALUE_CASES = [
    Case("value-float-for-int", lambda w: w.state.set("count", 1.5), StateTypeError, ("'count'", "int", "float")),
    Case("value-int-for-str", lambda w: w.state.set("user_id", 42), StateTypeError, ("'user_id'", "str", "int")),
    Case("value-outside-a-literal", lambda w: w.state.set("mode", "slow"), StateTypeError, ("'mode'", "'slow'")),
    Case(
        "value-list-item-of-the-wrong-type",
        lambda w: w.state.set("notes", ["fine", 3]),
        StateTypeError,
        ("'notes'", "str", "int"),
    ),
    Case(
        "value-single-item-of-the-wrong-type",
        lambda w: w.state.set("notes", {"a": 1}),
        StateTypeError,
        ("'notes'", "dict"),
    ),
    Case(
        "value-unique-list-of-the-wrong-type",
        lambda w: w.state.set("doc_ids", ["d2", 7]),
        StateTypeError,
        ("'doc_ids'", "7"),
    ),
    Case(
        "value-text-for-the-messages",
        lambda w: w.state.set("messages", "hello"),
        StateTypeError,
        ("'messages'", "ChatMessage", "str"),
    ),
    Case("value-unknown-key", lambda w: w.state.set("nots", ["x"]), UnknownStateKeyError, ("'nots'", "notes")),
    Case("value-reset-of-an-unknown-key", lambda w: w.state.reset("ghost"), UnknownStateKeyError, ("'ghost'",)),
    Case(
        "value-update-is-all-or-nothing",
        lambda w: w.state.update({"user_id": "mallory", "notes": "n2", "count": 1.5}),
        StateTypeError,
        ("'count'",),
    ),
    Case(
        "value-initial-data-of-the-wrong-type",
        lambda w: State(SCHEMA, {"notes": "not a list"}),
        StateTypeError,
        ("'notes'", "list[str]"),
    ),
    Case(
        "value-human-edit-of-the-wrong-type",
        lambda w: w.agent.update_state("t1", {"user_id": 7}),
        StateTypeError,
        ("'user_id'", "str"),
    ),
    Case(
        "value-human-edit-of-an-unknown-key",
        lambda w: w.agent.update_state("t1", {"notes": "ok", "nickname": "al"}),
        UnknownStateKeyError,
        ("'nickname'",),
    ),
    Case(
        "value-run-input-of-the-wrong-type",
        lambda w: w.agent.run([ChatMessage.from_user("delta")], thread_id="t1", user_id=["eve"]),
        StateTypeError,
        ("'user_id'", "str", "list"),
    ),
    Case(
        "value-run-input-of-an-unknown-key",
        lambda w: w.agent.run([ChatMessage.from_user("delta")], thread_id="t1", nickname="al"),
        ValueError,
        ("'nickname'",),
    ),
]

HANDLER_CASES = [
    Case(
        "handler-merge-dicts-of-a-list",
        lambda w: w.state.set("profile", ["x"]),
        StateHandlerError,
        ("merge_dicts", "'profile'", "list"),
    ),
    Case(
        "handler-add-of-a-string", lambda w: w.state.set("count", "3"), StateHandlerError, ("'add'", "'count'", "str")
    ),
    Case(
        "handler-add-of-a-bool", lambda w: w.state.set("count", True), StateHandlerError, ("'add'", "'count'", "bool")
    ),
    Case(
        "handler-override-raises",
        lambda w: w.state.set("profile", {"x": 1}, handler_override=explode),
        StateHandlerError,
        ("'explode'", "'profile'", "ZeroDivisionError"),
    ),
    Case(
        "handler-result-of-the-wrong-type",
        lambda w: w.state.set("count", 1, handler_override=to_text),
        StateTypeError,
        ("'count'", "int", "str"),
    ),
    Case(
        "handler-override-not-callable",
        lambda w: w.state.set("count", 1, handler_override="add"),
        TypeError,
        ("handler_override", "'count'", "'add'"),
    ),
    Case(
        "handler-fails-inside-a-batch",
        lambda w: w.state.update({"notes": ["n2", "n3"], "profile": {"y": 1}, "count": "x"}),
        StateHandlerError,
        ("'add'", "'count'"),
    ),
    Case(
        "handler-of-a-human-edit-fails",
        lambda w: w.agent.update_state("t1", {"notes": "n", "profile": "not a dict"}),
        StateHandlerError,
        ("merge_dicts", "'profile'"),
    ),
]


def _tool(**kwargs: Any) -> Callable[[World], Any]:
    def make(w: World) -> Any:
        def lookup(query: str, user: str) -> dict:
            """Look something up."""
            return {}

        return tool(lookup, **kwargs)

    return make


def _unfillable(w: World) -> Any:
    def schedule(when: str, callback: Callable[[str], None]) -> str:
        """Schedule a callback."""
        return when

    return tool(schedule)


TOOL_DEFINITION_CASES = [
    Case(
        "tooldef-state-input-for-a-missing-parameter",
        _tool(inputs_from_state={"user_id": "usr"}),
        ToolDefinitionError,
        ("'lookup'", "'usr'"),
    ),
    Case(
        "tooldef-output-handler-not-callable",
        _tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"source": "x", "handler": "append"}}),
        ToolDefinitionError,
        ("'lookup'", "'notes'", "not callable"),
    ),
    Case(
        "tooldef-output-misspelt-field",
        _tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"sorce": "x"}}),
        ToolDefinitionError,
        ("'lookup'", "'notes'", "sorce"),
    ),
    Case(
        "tooldef-output-handler-of-the-wrong-arity",
        _tool(inputs_from_state={"user_id": "user"}, outputs_to_state={"notes": {"handler": len}}),
        ToolDefinitionError,
        ("'lookup'", "'notes'", "len"),
    ),
    Case(
        "tooldef-invalid-name",
        _tool(name="look up!", inputs_from_state={"user_id": "user"}),
        ToolDefinitionError,
        ("'look up!'",),
    ),
    Case("tooldef-required-parameter-nobody-can-fill", _unfillable, ToolDefinitionError, ("'schedule'", "callback")),
    Case(
        "tooldef-every-problem-at-once",
        _tool(name="bad name", inputs_from_state={"user_id": "usr"}, outputs_to_state={"notes": {"sorce": "x"}}),
        ToolDefinitionError,
        ("problem(s)", "'bad name'", "'usr'", "sorce"),
    ),
]

TOOL_CALL_CASES = [
    Case(
        "call-unknown-tool",
        lambda w: w.invoke(call("serach", {"query": "tax"})),
        ToolNotFoundError,
        ("'serach'", "search"),
    ),
    Case(
        "call-unknown-tool-in-a-batch-runs-nothing",
        lambda w: w.invoke(call("remember", {"text": "x"}, "c1"), call("forget", {}, "c2")),
        ToolNotFoundError,
        ("'forget'",),
    ),
    Case(
        "call-arguments-null",
        lambda w: w.invoke(call("remember", None)),
        ToolArgumentsError,
        ("'remember'", "'text'", "required"),
    ),
    Case(
        "call-state-input-without-a-value",
        lambda w: w.invoke(call("search", {"query": "tax"})),
        ToolArgumentsError,
        ("'search'", "'user'", "state key 'user_id'"),
        prepare=lambda w: w.state.reset("user_id"),
    ),
    Case(
        "call-argument-of-the-wrong-type",
        lambda w: w.invoke(call("search", {"query": 42})),
        ToolArgumentsError,
        ("'search'", "'query'", "42"),
    ),
    Case(
        "call-missing-argument",
        lambda w: w.invoke(call("search", {"kind": "web"})),
        ToolArgumentsError,
        ("'search'", "'query'", "required"),
    ),
    Case(
        "call-extra-argument",
        lambda w: w.invoke(call("search", {"query": "tax", "limit": 5})),
        ToolArgumentsError,
        ("'search'", "'limit'"),
    ),
    Case(
        "call-argument-outside-an-enum",
        lambda w: w.invoke(call("search", {"query": "tax", "kind": "images"})),
        ToolArgumentsError,
        ("'search'", "'kind'", "'images'"),
    ),
    Case(
        "call-malformed-json",
        lambda w: w.invoke(call("search", '{"query": "tax"')),
        ToolArgumentsError,
        ("'search'", "not valid JSON"),
    ),
    Case(
        "call-arguments-not-an-object",
        lambda w: w.invoke(call("search", '["tax"]')),
        ToolArgumentsError,
        ("'search'", "JSON object", "list"),
    ),
    Case(
        "call-overrides-a-state-input",
        lambda w: _check_result(w.invoke(call("whoami", {"user": "eve"})), "user=alice"),
        LOGGED,
        ("'whoami'", "hidden parameters user"),
    ),
    Case(
        "call-overrides-the-injected-state",
        lambda w: _check_result(w.invoke(call("peek", {"state": {"count": 999}})), "count=2"),
        LOGGED,
        ("'peek'", "hidden parameters state"),
    ),
    Case(
        "call-overrides-a-hidden-parameter-and-sends-a-bad-one",
        lambda w: w.invoke(call("search", {"query": 1, "user": "eve"})),
        ToolArgumentsError,
        ("'search'", "'query'"),
    ),
    Case(
        "call-tool-raises-after-writing-the-state",
        lambda w: w.invoke(call("annotate", {"note": "boom"})),
        ToolExecutionError,
        ("'annotate'", "RuntimeError", "annotation service is down"),
    ),
    Case(
        "call-result-does-not-fit-the-state",
        lambda w: w.invoke(call("bad_result", {"x": 1})),
        ToolMergeError,
        ("'bad_result'", "'count'"),
    ),
    Case(
        "tooldef-agent-tool-maps-to-an-undeclared-key",
        lambda w: Agent(ScriptedChatGenerator(script=["hi"]), tools=[haunt], state_schema=SCHEMA),
        ToolDefinitionError,
        ("'haunt'", "'ghost'", "outputs_to_state"),
    ),
    Case(
        "call-result-for-an-undeclared-key",
        lambda w: w.invoke(call("haunt", {"x": 1})),
        ToolMergeError,
        ("'haunt'", "'ghost'"),
    ),
    Case(
        "call-failures-reported-to-the-model-change-nothing",
        lambda w: _raise_errors(
            w.invoke(
                call("serach", {}, "c1"),
                call("search", {"query": 1}, "c2"),
                call("annotate", {"note": "boom"}, "c3"),
                call("bad_result", {"x": 2}, "c4"),
                raise_on_failure=False,
                max_workers=4,
            )
        ),
        Reported,
        ("'serach'", "'query'", "'annotate'", "'bad_result'"),
    ),
]


def _check_result(messages: list[ChatMessage], expected: str) -> None:
    assert [m.tool_call_result.result for m in messages if m.tool_call_result] == [expected]


def _raise_errors(messages: list[ChatMessage]) -> None:
    results = [m.tool_call_result for m in messages if m.tool_call_result]
    assert all(result.error for result in results)
    raise Reported(" | ".join(str(result.result) for result in results))


CHECKPOINT_CASES = [
    Case("checkpoint-unknown-thread", lambda w: w.cp.get("t3"), ThreadNotFoundError, ("'t3'",)),
    Case("checkpoint-history-of-an-unknown-thread", lambda w: w.cp.history("t3"), ThreadNotFoundError, ("'t3'",)),
    Case("checkpoint-delete-an-unknown-thread", lambda w: w.cp.delete_thread("t3"), ThreadNotFoundError, ("'t3'",)),
    Case(
        "checkpoint-unknown-id",
        lambda w: w.cp.get("t1", "0190aaaa-0000-7000-8000-000000000000"),
        CheckpointNotFoundError,
        ("'t1'", "'0190aaaa-0000-7000-8000-000000000000'"),
    ),
    Case(
        "checkpoint-of-another-thread",
        lambda w: w.cp.get("t2", w.t1[2]),
        CheckpointNotFoundError,
        ("'t2'", "'{w.t1[2]}'"),
    ),
    Case(
        "checkpoint-state-of-another-thread",
        lambda w: w.agent.get_state("t1", w.t2[0]),
        CheckpointNotFoundError,
        ("'t1'", "'{w.t2[0]}'"),
    ),
    Case(
        "checkpoint-fork-from-another-thread",
        lambda w: w.agent.run([ChatMessage.from_user("fork")], thread_id="t2", checkpoint_id=w.t1[3]),
        CheckpointNotFoundError,
        ("'t2'", "'{w.t1[3]}'"),
    ),
    Case(
        "checkpoint-commit-on-a-stale-head",
        _stale_commit,
        ThreadConflictError,
        ("'t1'", "'{w.t1[0]}'", "'{w.t1[1]}'"),
    ),
    Case(
        "checkpoint-commit-with-a-parent-of-another-thread",
        lambda w: w.cp.commit(
            "t1", parent_id=w.t2[0], expected_head=w.t1[0], delta={"count": replace(0)}, step=9, source="update"
        ),
        CheckpointNotFoundError,
        ("'t1'", "'{w.t2[0]}'"),
    ),
    Case(
        "checkpoint-commit-of-an-unencodable-value",
        lambda w: w.cp.commit(
            "t1",
            parent_id=w.t1[0],
            expected_head=w.t1[0],
            delta={"profile": replace({"lock": object()})},
            step=9,
            source="update",
        ),
        CodecError,
        ("'profile'", "profile['lock']", "object"),
    ),
    Case(
        "checkpoint-commit-with-an-unknown-source",
        lambda w: w.cp.commit("t1", parent_id=w.t1[0], expected_head=w.t1[0], delta={}, step=9, source="human"),
        ValueError,
        ("source", "'human'"),
    ),
    Case(
        "checkpoint-commit-to-an-empty-thread-id",
        lambda w: w.cp.commit("", parent_id=None, expected_head=None, delta={}, step=0, source="input"),
        ValueError,
        ("thread_id", "''"),
    ),
    Case(
        "checkpoint-commit-of-a-malformed-delta",
        lambda w: w.cp.commit(
            "t1", parent_id=w.t1[0], expected_head=w.t1[0], delta={"notes": {"op": "explode"}}, step=9, source="update"
        ),
        ValueError,
        ("'notes'", "'explode'"),
    ),
    Case(
        "checkpoint-commit-of-unencodable-metadata",
        lambda w: w.cp.commit(
            "t1", parent_id=w.t1[0], expected_head=w.t1[0], delta={}, step=9, source="update", metadata={"by": object()}
        ),
        CodecError,
        ("metadata['by']", "object"),
    ),
    Case(
        "checkpoint-delta-not-json",
        lambda w: w.fresh().get("t1"),
        CodecError,
        ("'t1'", "'{w.t1[0]}'", "not valid JSON"),
        prepare=lambda w: _row(w, w.t1[0], delta='{"notes": {"op": "extend", "items": ['),
    ),
    Case(
        "checkpoint-delta-of-an-unknown-operation",
        lambda w: w.fresh().get("t1"),
        CodecError,
        ("'t1'", "'{w.t1[0]}'", "'notes'"),
        prepare=lambda w: _row(w, w.t1[0], delta='{"notes": {"op": "prepend", "items": ["x"]}}'),
    ),
    Case(
        "checkpoint-delta-names-a-foreign-type",
        lambda w: w.fresh().get("t1"),
        CodecError,
        ("'t1'", "'{w.t1[0]}'", "'os.system'", "'notes'"),
        prepare=_evil_delta,
    ),
    Case(
        "checkpoint-metadata-corrupt",
        lambda w: w.fresh().history("t1"),
        CodecError,
        ("'t1'", "'{w.t1[1]}'"),
        prepare=lambda w: _row(w, w.t1[1], metadata="{broken"),
    ),
    Case(
        "checkpoint-metadata-not-a-mapping",
        lambda w: w.fresh().get("t1"),
        CodecError,
        ("'t1'", "'{w.t1[0]}'", "metadata is not a mapping"),
        prepare=lambda w: _row(w, w.t1[0], metadata="[1, 2]"),
    ),
    Case(
        "checkpoint-tool-names-corrupt",
        lambda w: w.fresh().history("t1"),
        CheckpointError,
        ("'t1'", "'{w.t1[2]}'", "corrupt", "'tool_names'"),
        prepare=lambda w: _row(w, w.t1[2], tool_names="[remember"),
    ),
    Case(
        "checkpoint-parent-missing",
        lambda w: w.fresh().get("t1"),
        CheckpointError,
        ("'t1'", "'{w.t1[0]}'"),
        prepare=lambda w: _row(w, w.t1[2], parent_id="0190aaaa-0000-7000-8000-000000000000"),
    ),
    Case(
        "checkpoint-parent-cycle",
        lambda w: w.fresh().get("t1"),
        CheckpointError,
        ("'t1'", "'{w.t1[0]}'", "cycle"),
        prepare=lambda w: _row(w, w.t1[-1], parent_id=w.t1[0]),
    ),
    Case(
        "checkpoint-database-schema-from-the-future",
        lambda w: w.fresh(),
        CheckpointError,
        ("version 99", "upgrade haystack-state"),
        prepare=_future_schema,
    ),
    Case(
        "checkpoint-file-is-not-a-database",
        lambda w: SQLiteCheckpointer(w.folder / "notes.txt").close(),
        CheckpointError,
        ("notes.txt", "cannot be used as a database"),
        prepare=_not_a_database,
    ),
    Case(
        "checkpoint-stored-state-does-not-fit-the-schema",
        lambda w: _other_schema_agent(w).run([ChatMessage.from_user("delta")], thread_id="t1"),
        CheckpointError,
        ("'t1'", "'notes'", "list[int]"),
    ),
    Case(
        "checkpoint-resume-of-a-thread-that-is-not-interrupted",
        lambda w: w.agent.resume("t1", {"c1": "approve"}),
        ValueError,
        ("'t1'", "not interrupted"),
    ),
]


def _interrupted(w: World) -> None:
    """Thread ``t3``: a run stopped before ``remember``, waiting for a human's decision."""
    agent = Agent(
        ScriptedChatGenerator(policy=_policy),
        tools=AGENT_TOOLS,
        state_schema=SCHEMA,
        checkpointer=w.cp,
        interrupt_before=["remember"],
    )
    result = agent.run([ChatMessage.from_user("delta")], thread_id="t3")
    w.extra.update(agent=agent, pending=result["pending_tool_calls"][0].id)


INTERRUPT_CASES = [
    Case(
        "interrupt-decision-for-an-unknown-call",
        lambda w: w.extra["agent"].resume("t3", {"call_99": "approve"}),
        ValueError,
        ("'call_99'", "'{w.extra[pending]}'"),
        prepare=_interrupted,
    ),
    Case(
        "interrupt-malformed-decision",
        lambda w: w.extra["agent"].resume("t3", {w.extra["pending"]: "maybe"}),
        ValueError,
        ("'{w.extra[pending]}'", "'maybe'"),
        prepare=_interrupted,
    ),
    Case(
        "interrupt-new-messages-instead-of-a-decision",
        lambda w: w.extra["agent"].run([ChatMessage.from_user("and also")], thread_id="t3"),
        ValueError,
        ("'t3'", "interrupted", "remember"),
        prepare=_interrupted,
    ),
]


def _ambiguous_prefix(w: World) -> str:
    """The longest prefix that every checkpoint id of ``t1`` starts with (ids begin with their time)."""
    first, last = min(w.t1), max(w.t1)
    size = next((i for i, (a, b) in enumerate(zip(first, last, strict=True)) if a != b), len(first))
    return first[:size]


CLI_CASES = [
    Case("cli-unknown-command", lambda w: cli("frobnicate", w.db), CliFailed, ("exit 2", "'frobnicate'")),
    Case("cli-missing-argument", lambda w: cli("show", w.db), CliFailed, ("exit 2", "THREAD")),
    Case("cli-unknown-option", lambda w: cli("history", w.db, "t1", "--since", "x"), CliFailed, ("exit 2", "--since")),
    Case(
        "cli-turns-out-of-range",
        lambda w: cli("demo", "--db", w.db, "--turns", "0"),
        CliFailed,
        ("exit 2", "--turns", "0"),
    ),
    Case(
        "cli-turns-not-a-number", lambda w: cli("demo", "--db", w.db, "--turns", "two"), CliFailed, ("exit 2", "'two'")
    ),
    Case("cli-missing-file", lambda w: cli("threads", w.folder / "nope.db"), CliFailed, ("exit 1", "nope.db")),
    Case(
        "cli-file-is-not-a-database",
        lambda w: cli("threads", w.folder / "notes.txt"),
        CliFailed,
        ("exit 1", "notes.txt", "not a haystack-state database"),
        prepare=_not_a_database,
    ),
    Case(
        "cli-demo-on-a-file-that-is-not-a-database",
        lambda w: cli("demo", "--db", w.folder / "notes.txt", "--turns", "1"),
        CliFailed,
        ("exit 1", "notes.txt", "not a haystack-state database"),
        prepare=_not_a_database,
    ),
    Case("cli-unknown-thread", lambda w: cli("show", w.db, "t9"), CliFailed, ("exit 1", "'t9'")),
    Case(
        "cli-unknown-checkpoint",
        lambda w: cli("show", w.db, "t1", "--at", "zz9"),
        CliFailed,
        ("exit 1", "'zz9'", "'t1'"),
    ),
    Case(
        "cli-diff-with-a-checkpoint-of-another-thread",
        lambda w: cli("diff", w.db, "t1", w.t1[-1], w.t2[0]),
        CliFailed,
        ("exit 1", "'t1'", "'{w.t2[0]}'"),
    ),
    Case(
        "cli-ambiguous-checkpoint-prefix",
        lambda w: cli("show", w.db, "t1", "--at", _ambiguous_prefix(w)),
        CliFailed,
        ("exit 1", "ambiguous", "'t1'"),
    ),
    Case(
        "cli-show-of-a-corrupt-checkpoint",
        lambda w: cli("show", w.db, "t1"),
        CliFailed,
        ("exit 1", "'t1'", "'{w.t1[0]}'", "'os.system'"),
        prepare=_evil_delta,
    ),
    Case(
        "cli-database-schema-from-the-future",
        lambda w: cli("threads", w.db),
        CliFailed,
        ("exit 1", "version 99"),
        prepare=_future_schema,
    ),
]

KNOWN_BUGS: dict[str, str] = {}  # case id -> why it fails (run as a strict xfail); none at present

CASES = [
    *SCHEMA_CASES,
    *VALUE_CASES,
    *HANDLER_CASES,
    *TOOL_DEFINITION_CASES,
    *TOOL_CALL_CASES,
    *CHECKPOINT_CASES,
    *INTERRUPT_CASES,
    *CLI_CASES,
]


def _params() -> list[Any]:
    params = []
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[case.id])] if case.id in KNOWN_BUGS else []
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def test_the_matrix_is_large_and_its_ids_are_distinct(report: Callable[[str], None]) -> None:
    ids = [case.id for case in CASES]
    assert len(set(ids)) == len(ids)
    assert len(CASES) - len(KNOWN_BUGS) >= 40
    groups = {
        "schema": len(SCHEMA_CASES),
        "values": len(VALUE_CASES),
        "handlers": len(HANDLER_CASES),
        "tool definitions": len(TOOL_DEFINITION_CASES),
        "model tool calls": len(TOOL_CALL_CASES),
        "checkpoints": len(CHECKPOINT_CASES),
        "interrupts": len(INTERRUPT_CASES),
        "cli": len(CLI_CASES),
    }
    report(
        f"bad-input matrix: cases={len(CASES)} ({', '.join(f'{k}={v}' for k, v in groups.items())}) "
        f"known bugs (strict xfail)={len(KNOWN_BUGS)}"
    )


@pytest.mark.parametrize("case", _params())
def test_bad_input_names_the_culprit_and_changes_nothing(
    case: Case, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    if case.prepare is not None:
        case.prepare(world)
    before = world.snapshot()
    if case.raises == LOGGED:
        with caplog.at_level(logging.WARNING):
            case.act(world)
        text = caplog.text
    else:
        assert isinstance(case.raises, type)
        with pytest.raises(case.raises) as raised:
            case.act(world)
        text = str(raised.value)
    for name in case.names:
        assert name.format(w=world) in text, f"{name.format(w=world)!r} is not named in: {text}"
    after = world.snapshot()
    assert after == before
