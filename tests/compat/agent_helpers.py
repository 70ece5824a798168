"""
Shared parts of the Agent parity tests: the two Agent classes side by side, tools and hooks written as a
haystack-ai user writes them (haystack's ``@tool`` and ``@hook``, annotated with haystack's ``State``), and a helper
that runs one configuration on both agents.
"""

from collections.abc import Callable
from typing import Annotated, Any

import pytest
from haystack.components.agents import Agent as HaystackAgent
from haystack.components.agents.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks import hook
from haystack.tools import tool

from haystack_state import Agent
from haystack_state.testing import ScriptedChatGenerator

#: The two classes every parity test runs against: the import line a user changes.
AGENT_CLASSES = [HaystackAgent, Agent]
AGENT_IDS = ["haystack", "ours"]

#: The outputs our Agent adds to haystack-ai's (the README lists them).
OUR_EXTRA_OUTPUTS = {"context_tokens", "pending_tool_calls", "pending_interrupts", "checkpoint_id"}
#: The inputs our Agent may add to haystack-ai's: durable threads, and a run's dependencies.
OUR_EXTRA_INPUTS = {
    "thread_id",
    "checkpoint_id",
    "context",
    "store",
    "on_unfinished_calls",
    "run_id",
    "enable_streaming_callback_passthrough",
}


@pytest.fixture(params=AGENT_CLASSES, ids=AGENT_IDS)
def agent_class(request: pytest.FixtureRequest) -> Any:
    """haystack-ai's Agent, then ours: the same test body runs against both."""
    return request.param


@pytest.fixture
def trusted_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets ``from_dict`` load the tools, hooks and classes of these tests (and of haystack_state)."""
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", "haystack_state,compat")


def run_both(build: Callable[[Any], Any], messages: list[ChatMessage], **run_kwargs: Any) -> list[dict[str, Any]]:
    """Build the agent with each class (``build(cls)``), run it with the same inputs; the results, haystack's first."""
    return [build(cls).run(messages=list(messages), **run_kwargs) for cls in AGENT_CLASSES]


def texts(messages: list[ChatMessage]) -> list[str | None]:
    """The text of each message (a tool message's result), to compare conversations."""
    return [m.tool_call_result.result if m.tool_call_result is not None else m.text for m in messages]


def common(result: dict[str, Any]) -> dict[str, Any]:
    """An output without the keys only our Agent has."""
    return {key: value for key, value in result.items() if key not in OUR_EXTRA_OUTPUTS}


def user(text: str = "hi") -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


def scripted(*replies: Any) -> ScriptedChatGenerator:
    return ScriptedChatGenerator(script=list(replies))


def call(name: str, **arguments: Any) -> list[tuple[str, dict[str, Any]]]:
    """A scripted reply calling one tool."""
    return [(name, arguments)]


# --- tools, as a haystack-ai user writes them ---------------------------------------------------------------------


@tool
def save(content: Annotated[str, "what to save"]) -> str:
    """Save content."""
    return "saved"


@tool
def final_answer(answer: Annotated[str, "the answer"]) -> str:
    """Provide the final answer."""
    return answer


@tool
def broken(reason: Annotated[str, "why"]) -> str:
    """Always fails."""
    raise RuntimeError(f"broken: {reason}")


# --- hooks, importable so that they serialize ----------------------------------------------------------------------


@hook
def record_a(state: State) -> None:
    state.set("trace", ["a"])


@hook
def record_b(state: State) -> None:
    state.set("trace", ["b"])


@hook
def record_on_exit(state: State) -> None:
    state.set("trace", ["on_exit"])


@hook
def record_after_run(state: State) -> None:
    state.set("trace", ["after_run"])


@hook
def restore_step_count(state: State) -> None:
    state.set("step_count", 5)


@hook
def rewrite_query_into_brief(state: State) -> None:
    state.set("messages", [ChatMessage.from_user("BRIEF")], handler_override=replace_values)


@hook
def write_report(state: State) -> None:
    state.set("messages", [ChatMessage.from_assistant("REPORT")])


@hook
def inject_once(state: State) -> None:
    if state.get("step_count") == 0:
        state.set("messages", [ChatMessage.from_system("INJECTED")])


@hook
def record_pending_tools(state: State) -> None:
    state.set("trace", [call.tool_name for call in state.data["messages"][-1].tool_calls])


@hook
def replace_pending_save_call(state: State) -> None:
    messages = state.data["messages"]
    replacement = ChatMessage.from_assistant(tool_calls=[ToolCall("save", {"content": "changed"})])
    state.set("messages", [*messages[:-1], replacement], handler_override=replace_values)


@hook
def drop_pending_calls(state: State) -> None:
    messages = state.data["messages"]
    state.set(
        "messages", [*messages[:-1], ChatMessage.from_assistant("Skipping tools.")], handler_override=replace_values
    )


@hook
def offload_tool_results(state: State) -> None:
    rewritten = [
        ChatMessage.from_tool(tool_result="OFFLOADED", origin=m.tool_call_result.origin, error=m.tool_call_result.error)
        if m.tool_call_result is not None
        else m
        for m in state.data["messages"]
    ]
    state.set("messages", rewritten, handler_override=replace_values)


@hook
def require_save(state: State) -> None:
    if state.get("tool_call_counts", {}).get("save", 0) == 0:
        state.set("messages", [ChatMessage.from_system("You must call save before finishing.")])
        state.set("continue_run", True)


@hook
def always_continue(state: State) -> None:
    state.set("messages", [ChatMessage.from_system("keep going")])
    state.set("continue_run", True)


@hook
def stop_for_budget(state: State) -> None:
    state.set("stop_run", "budget_exceeded")


@hook
def stop_after_first_tool_step(state: State) -> None:
    state.set("stop_run", "enough")


@hook
def critique(state: State) -> None:
    if state.get("tool_call_counts", {}).get("final_answer", 0) < 2:
        state.set("messages", [ChatMessage.from_user("Please expand.")])
        state.set("continue_run", True)


class Recorder:
    """A class-based hook recording, at each call, its point and the run values it sees."""

    def __init__(self, point: str, log: list[tuple[Any, ...]]) -> None:
        self.point = point
        self.log = log

    def run(self, state: State) -> None:
        data = state.data
        self.log.append(
            (
                self.point,
                data.get("step_count"),
                dict(data.get("token_usage") or {}),
                dict(data.get("tool_call_counts") or {}),
                data.get("context_tokens"),
                data.get("exit_reason"),
                [t.name for t in data.get("tools") or []],
                len(data.get("messages") or []),
            )
        )
