"""
haystack-ai 3.4's documented Agent hook behaviours (``test/components/agents/test_agent_hooks.py``,
``test/hooks/``), re-expressed so that each test body runs against haystack-ai's ``Agent`` and ours: the ``@hook``
decorator and ``Hook`` classes at all six points, the run values hooks see (``step_count``, ``token_usage``,
``tool_call_counts``, ``context_tokens``, ``stop_run``, ``continue_run``, ``tools``, ``hook_context``), and
haystack's own ``ConfirmationHook`` with its policies, ``TokenBudgetHook`` and ``CompactionHook``. The model is
``ScriptedChatGenerator``; nothing of ours is mocked. Where we deliberately differ, the test says so and checks both
sides.
"""

import asyncio
import threading
from typing import Any

import pytest
from haystack.components.agents.state import State as HaystackState
from haystack.dataclasses import ChatMessage
from haystack.hooks import FunctionHook, hook
from haystack.hooks.budget import TokenBudgetHook
from haystack.hooks.compaction import CompactionHook, SlidingWindowCompactor
from haystack.hooks.human_in_the_loop import (
    AlwaysAskPolicy,
    AskOncePolicy,
    BlockingConfirmationStrategy,
    ConfirmationHook,
    ConfirmationUIResult,
    NeverAskPolicy,
)

from compat.agent_helpers import (
    AGENT_CLASSES,
    Recorder,
    always_continue,
    broken,
    call,
    common,
    critique,
    drop_pending_calls,
    final_answer,
    inject_once,
    offload_tool_results,
    record_a,
    record_after_run,
    record_b,
    record_on_exit,
    record_pending_tools,
    replace_pending_save_call,
    require_save,
    restore_step_count,
    rewrite_query_into_brief,
    run_both,
    save,
    scripted,
    stop_after_first_tool_step,
    stop_for_budget,
    texts,
    user,
    write_report,
)
from compat.agent_helpers import agent_class as agent_class  # fixtures
from compat.agent_helpers import trusted_here as trusted_here
from haystack_state import Agent, AgentRunError
from haystack_state.agent._hooks import is_hook_object
from haystack_state.testing import ScriptedChatGenerator

TRACE = {"trace": {"type": list[str]}}
EXPERIMENTAL = pytest.mark.filterwarnings("ignore::haystack.utils.experimental.ExperimentalWarning")


# --- validation ------------------------------------------------------------------------------------------------------


def test_an_unknown_hook_point_is_a_value_error(agent_class: Any) -> None:
    with pytest.raises(ValueError, match="bogus"):
        agent_class(chat_generator=scripted("x"), hooks={"bogus": [record_a]})


def test_an_object_without_a_run_method_is_a_type_error(agent_class: Any) -> None:
    with pytest.raises(TypeError, match=r"run\(state\)"):
        agent_class(chat_generator=scripted("x"), hooks={"before_llm": [object()]})


@EXPERIMENTAL
@pytest.mark.parametrize(
    ("point", "made"),
    [
        ("before_llm", lambda: ConfirmationHook(confirmation_strategies={})),
        ("after_tool", lambda: TokenBudgetHook(max_total_tokens=10)),
        ("on_exit", lambda: CompactionHook(SlidingWindowCompactor(), context_window=100)),
    ],
)
def test_a_hook_registered_outside_its_allowed_points_is_a_value_error(agent_class: Any, point: str, made: Any) -> None:
    with pytest.raises(ValueError, match="only supports"):
        agent_class(chat_generator=scripted("x"), hooks={point: [made()]})


def test_a_plain_function_is_a_hook_here_but_not_in_haystack() -> None:
    """Deliberate difference: plain callables (our hooks before haystack-ai had any) stay accepted."""

    def plain(state: HaystackState) -> None:
        state.set("trace", ["plain"])

    with pytest.raises(TypeError, match="@hook decorator"):
        AGENT_CLASSES[0](chat_generator=scripted("x"), hooks={"before_llm": [plain]})
    result = Agent(chat_generator=scripted("x"), state_schema=TRACE, hooks={"before_llm": [plain]}).run(user())
    assert result["trace"] == ["plain"]
    assert is_hook_object(record_a) and not is_hook_object(plain)


# --- the six points --------------------------------------------------------------------------------------------------


def test_the_six_points_run_in_order_and_see_the_same_run_values() -> None:
    logs: list[list[tuple[Any, ...]]] = []

    def build(cls: Any) -> Any:
        log: list[tuple[Any, ...]] = []
        logs.append(log)
        points = ["before_run", "before_llm", "before_tool", "after_tool", "on_exit", "after_run"]
        return cls(
            chat_generator=scripted(call("save", content="x"), "done"),
            tools=[save, final_answer],
            hooks={point: [Recorder(point, log)] for point in points},
        )

    haystack, ours = run_both(build, user())
    assert logs[0] == logs[1]
    assert [entry[0] for entry in logs[1]] == [
        "before_run",
        "before_llm",
        "before_tool",
        "after_tool",
        "before_llm",
        "on_exit",
        "after_run",
    ]
    before_run, _first_llm, before_tool, after_tool, second_llm, on_exit, after_run = logs[1]
    assert before_run[1:4] == (0, {}, {"save": 0, "final_answer": 0})
    assert before_run[6] == ["save", "final_answer"]
    assert before_tool[3] == {"save": 0, "final_answer": 0} and before_tool[2]["total_tokens"] > 0
    assert after_tool[3] == {"save": 1, "final_answer": 0}
    assert second_llm[1] == 1 and second_llm[4] == before_tool[4] > 0  # context_tokens: the last call's
    assert on_exit[1] == 2 and on_exit[5] == "text"
    assert after_run[5] == "text"
    assert common(ours).keys() == haystack.keys()
    assert texts(ours["messages"]) == texts(haystack["messages"])


def test_before_run_runs_once_per_run() -> None:
    def build(cls: Any) -> Any:
        return cls(
            chat_generator=scripted(call("save", content="x"), "done"),
            tools=[save],
            state_schema=TRACE,
            hooks={"before_run": [record_a]},
        )

    for result in run_both(build, user()):
        assert result["trace"] == ["a"]
        assert result["step_count"] == 2


def test_before_run_can_rewrite_the_first_messages(agent_class: Any) -> None:
    model = scripted("done")
    agent = agent_class(chat_generator=model, hooks={"before_run": [rewrite_query_into_brief]})
    result = agent.run(messages=user("original query"))
    assert [m.text for m in model.calls[0].messages] == ["BRIEF"]
    assert [m.text for m in result["messages"]] == ["BRIEF", "done"]


def test_hooks_at_one_point_run_in_list_order(agent_class: Any) -> None:
    for point in ("before_run", "before_llm"):
        agent = agent_class(chat_generator=scripted("done"), state_schema=TRACE, hooks={point: [record_a, record_b]})
        assert agent.run(messages=user())["trace"] == ["a", "b"]


def test_a_before_run_hook_restoring_the_step_count_moves_the_step_counter(agent_class: Any) -> None:
    agent = agent_class(chat_generator=scripted("done"), max_agent_steps=10, hooks={"before_run": [restore_step_count]})
    assert agent.run(messages=user())["step_count"] == 6


def test_after_run_runs_on_every_kind_of_exit(agent_class: Any) -> None:
    text = agent_class(chat_generator=scripted("done"), state_schema=TRACE, hooks={"after_run": [record_after_run]})
    assert text.run(messages=user())["trace"] == ["after_run"]
    by_tool = agent_class(
        chat_generator=scripted(call("final_answer", answer="42")),
        tools=[final_answer],
        exit_conditions=["final_answer"],
        state_schema=TRACE,
        hooks={"after_run": [record_after_run]},
    )
    assert by_tool.run(messages=user())["trace"] == ["after_run"]
    out_of_steps = agent_class(
        chat_generator=scripted(call("save", content="x"), call("save", content="y")),
        tools=[save],
        max_agent_steps=2,
        hooks={"after_run": [write_report]},
    )
    result = out_of_steps.run(messages=user())
    assert result["exit_reason"] == "max_agent_steps"
    assert result["last_message"].text == "REPORT"


def test_after_run_changes_are_in_the_outputs_and_continue_run_has_no_effect(agent_class: Any) -> None:
    model = scripted("done", "never")
    agent = agent_class(chat_generator=model, max_agent_steps=5, hooks={"after_run": [write_report, always_continue]})
    result = agent.run(messages=user())
    assert [m.text for m in result["messages"]] == ["hi", "done", "REPORT", "keep going"]
    assert model.call_count == 1


def test_on_exit_runs_before_after_run(agent_class: Any) -> None:
    agent = agent_class(
        chat_generator=scripted("done"),
        state_schema=TRACE,
        hooks={"on_exit": [record_on_exit], "after_run": [record_after_run]},
    )
    assert agent.run(messages=user())["trace"] == ["on_exit", "after_run"]


def test_a_before_llm_hook_keyed_on_step_count_injects_once(agent_class: Any) -> None:
    model = scripted(call("save", content="x"), "done")
    agent = agent_class(chat_generator=model, tools=[save], hooks={"before_llm": [inject_once]})
    result = agent.run(messages=user())
    assert [m.text for m in result["messages"] if m.is_from("system")] == ["INJECTED"]
    assert model.call_count == 2


def test_before_tool_sees_the_pending_calls_and_does_not_run_on_a_text_step(agent_class: Any) -> None:
    agent = agent_class(
        chat_generator=scripted(call("save", content="x"), "done"),
        tools=[save],
        state_schema=TRACE,
        hooks={"before_tool": [record_pending_tools]},
    )
    result = agent.run(messages=user())
    assert result["trace"] == ["save"]
    assert result["tool_call_counts"]["save"] == 1


def test_the_tool_calls_that_run_are_those_of_the_last_message_after_before_tool(agent_class: Any) -> None:
    agent = agent_class(
        chat_generator=scripted(call("save", content="original"), "done"),
        tools=[save],
        hooks={"before_tool": [replace_pending_save_call]},
    )
    result = agent.run(messages=user())
    results = [m.tool_call_result for m in result["messages"] if m.tool_call_result is not None]
    assert [r.origin.arguments for r in results] == [{"content": "changed"}]


def test_a_before_tool_hook_leaving_no_tool_calls_skips_the_tools(agent_class: Any) -> None:
    model = scripted(call("save", content="x"), "done")
    agent = agent_class(chat_generator=model, tools=[save], hooks={"before_tool": [drop_pending_calls]})
    result = agent.run(messages=user())
    assert model.call_count == 2
    assert result["tool_call_counts"]["save"] == 0
    assert [m.text for m in result["messages"]][-2:] == ["Skipping tools.", "done"]


def test_an_after_tool_hook_rewrites_the_fresh_tool_results_before_the_model_sees_them(agent_class: Any) -> None:
    model = scripted(call("save", content="x"), "done")
    agent = agent_class(chat_generator=model, tools=[save], hooks={"after_tool": [offload_tool_results]})
    result = agent.run(messages=user())
    sent = model.calls[1].messages
    assert [m.tool_call_result.result for m in sent if m.tool_call_result is not None] == ["OFFLOADED"]
    assert result["exit_reason"] == "text"


def test_an_on_exit_hook_setting_continue_run_keeps_the_run_going(agent_class: Any) -> None:
    model = scripted("first answer", call("save", content="x"), "done")
    agent = agent_class(chat_generator=model, tools=[save], hooks={"on_exit": [require_save]})
    result = agent.run(messages=user())
    assert model.call_count == 3
    assert result["tool_call_counts"]["save"] == 1
    assert "You must call save before finishing." in [m.text for m in model.calls[1].messages]
    assert result["exit_reason"] == "text"


def test_an_on_exit_hook_can_push_back_on_an_exit_tool(agent_class: Any) -> None:
    model = scripted(call("final_answer", answer="short"), call("final_answer", answer="long"))
    agent = agent_class(
        chat_generator=model, tools=[final_answer], exit_conditions=["final_answer"], hooks={"on_exit": [critique]}
    )
    result = agent.run(messages=user())
    assert result["exit_reason"] == "final_answer"
    assert result["tool_call_counts"]["final_answer"] == 2


def test_an_always_continuing_on_exit_hook_is_bounded_by_max_agent_steps(agent_class: Any) -> None:
    model = scripted("a", "b", "c")
    agent = agent_class(chat_generator=model, max_agent_steps=3, hooks={"on_exit": [always_continue]})
    result = agent.run(messages=user())
    assert model.call_count == 3
    assert result["exit_reason"] == "max_agent_steps"


def test_stop_run_set_before_the_model_call_ends_the_run_with_its_reason(agent_class: Any) -> None:
    model = scripted("never")
    agent = agent_class(chat_generator=model, hooks={"before_llm": [stop_for_budget]})
    result = agent.run(messages=user())
    assert model.call_count == 0
    assert result["exit_reason"] == "budget_exceeded"
    assert result["step_count"] == 0
    assert "stop_run" not in result and "continue_run" not in result


def test_stop_run_set_after_a_tool_step_ends_the_run_before_the_next_model_call(agent_class: Any) -> None:
    model = scripted(call("save", content="x"), "never")
    agent = agent_class(chat_generator=model, tools=[save], hooks={"after_tool": [stop_after_first_tool_step]})
    result = agent.run(messages=user())
    assert model.call_count == 1
    assert (result["exit_reason"], result["step_count"]) == ("enough", 1)


# --- hook objects ---------------------------------------------------------------------------------------------------


class AsyncAwareHook:
    """A class-based hook with both paths: async runs must use ``run_async``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, state: HaystackState) -> None:
        self.calls.append("sync")

    async def run_async(self, state: HaystackState) -> None:
        await asyncio.sleep(0)
        self.calls.append("async")


class LifecycleHook:
    """A class-based hook counting its lifecycle calls."""

    def __init__(self) -> None:
        self.counts = {"warm_up": 0, "warm_up_async": 0, "close": 0, "close_async": 0}

    def run(self, state: HaystackState) -> None:
        pass

    def warm_up(self) -> None:
        self.counts["warm_up"] += 1

    async def warm_up_async(self) -> None:
        self.counts["warm_up_async"] += 1

    def close(self) -> None:
        self.counts["close"] += 1

    async def close_async(self) -> None:
        self.counts["close_async"] += 1


def test_async_runs_prefer_run_async_and_sync_runs_use_run(agent_class: Any) -> None:
    shared = AsyncAwareHook()
    agent = agent_class(chat_generator=scripted("a", "b"), hooks={"before_llm": [shared], "after_run": [shared]})
    agent.run(messages=user())
    asyncio.run(agent.run_async(messages=user()))
    assert shared.calls == ["sync", "sync", "async", "async"]


def test_a_hook_registered_at_two_points_is_warmed_up_and_closed_once(agent_class: Any) -> None:
    lifecycle = LifecycleHook()
    agent = agent_class(chat_generator=scripted("a"), hooks={"before_llm": [lifecycle], "after_run": [lifecycle]})
    agent.warm_up()
    agent.close()
    asyncio.run(agent.warm_up_async())
    asyncio.run(agent.close_async())
    assert lifecycle.counts == {"warm_up": 1, "warm_up_async": 1, "close": 1, "close_async": 1}


def test_run_warms_hooks_up_once_here_and_at_every_run_in_haystack() -> None:
    """Deliberate difference: our Agent warms up once (until ``close``); haystack-ai's at every run."""
    counts = []
    for cls in AGENT_CLASSES:
        lifecycle = LifecycleHook()
        agent = cls(chat_generator=scripted("a", "b"), hooks={"before_llm": [lifecycle]})
        agent.run(messages=user())
        agent.run(messages=user())
        counts.append(lifecycle.counts["warm_up"])
    assert counts == [2, 1]


async def note_async(state: HaystackState) -> None:
    await asyncio.sleep(0)
    state.set("trace", ["async"])


def test_an_async_function_hook_runs_in_run_async(agent_class: Any) -> None:
    agent = agent_class(chat_generator=scripted("a"), state_schema=TRACE, hooks={"before_llm": [hook(note_async)]})
    assert asyncio.run(agent.run_async(messages=user()))["trace"] == ["async"]


def test_an_async_only_function_hook_fails_a_sync_run() -> None:
    """Deliberate difference: haystack-ai raises the hook's RuntimeError; ours wraps it in an AgentRunError."""
    only_async = FunctionHook(async_function=note_async)
    with pytest.raises(RuntimeError, match="only has an `async_function`"):
        AGENT_CLASSES[0](chat_generator=scripted("a"), state_schema=TRACE, hooks={"before_llm": [only_async]}).run(
            messages=user()
        )
    with pytest.raises(AgentRunError, match="before_llm") as caught:
        Agent(chat_generator=scripted("a"), state_schema=TRACE, hooks={"before_llm": [only_async]}).run(user())
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.usefixtures("trusted_here")
def test_hooks_serialize_as_haystack_serializes_them_and_round_trip(agent_class: Any) -> None:
    hooks = {"before_llm": [record_a, record_b], "on_exit": [require_save]}
    agent = agent_class(chat_generator=scripted("a"), tools=[save], state_schema=TRACE, hooks=hooks)
    data = agent.to_dict()
    assert data["init_parameters"]["hooks"] == {
        point: [
            {"type": "haystack.hooks.from_function.FunctionHook", "init_parameters": h.to_dict()["init_parameters"]}
            for h in entries
        ]
        for point, entries in hooks.items()
    }
    rebuilt = agent_class.from_dict(data)
    assert {point: [h.function for h in entries] for point, entries in rebuilt.hooks.items()} == {
        point: [h.function for h in entries] for point, entries in hooks.items()
    }


@EXPERIMENTAL
@pytest.mark.usefixtures("trusted_here")
def test_haystacks_hooks_round_trip_through_our_agent() -> None:
    hooks = {
        "before_llm": [TokenBudgetHook(max_total_tokens=50, add_final_message=True)],
        "before_tool": [
            ConfirmationHook(
                {
                    "save": BlockingConfirmationStrategy(
                        confirmation_policy=NeverAskPolicy(), confirmation_ui=ScriptedUI()
                    )
                }
            )
        ],
    }
    data = Agent(chat_generator=scripted("a"), tools=[save], hooks=hooks).to_dict()
    rebuilt = Agent.from_dict(data)
    assert isinstance(rebuilt.hooks["before_llm"][0], TokenBudgetHook)
    assert rebuilt.hooks["before_llm"][0].max_total_tokens == 50
    assert isinstance(rebuilt.hooks["before_tool"][0], ConfirmationHook)
    assert rebuilt.to_dict() == data


# --- run values ------------------------------------------------------------------------------------------------------


@hook
def corrupt_the_counters(state: HaystackState) -> None:
    usage = state.get("token_usage")
    if usage:
        usage["total_tokens"] = -(10**6)
    counts = state.get("tool_call_counts")
    counts["save"] = 100


def test_a_hook_changing_what_get_returned_does_not_change_the_run_values(agent_class: Any) -> None:
    agent = agent_class(
        chat_generator=scripted(call("save", content="x"), "done"),
        tools=[save],
        hooks={"before_llm": [corrupt_the_counters], "after_tool": [corrupt_the_counters]},
    )
    result = agent.run(messages=user())
    assert result["tool_call_counts"] == {"save": 1}
    assert result["token_usage"]["total_tokens"] > 0


class UsageGenerator:
    """A chat generator whose replies report usage with nested, numeric and non-numeric values."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
        self.calls += 1
        usage = {
            "prompt_tokens": 10 * self.calls,
            "completion_tokens": 1,
            "model": f"m-{self.calls}",
            "details": {"cached": 2, "tier": "free"},
        }
        if self.calls == 2:
            usage["extra"] = {"first_seen": 1}
            usage["details"] = {"cached": 3, "tier": "paid"}
        text = "done" if self.calls == 2 else None
        tool_calls = [] if text else [__import__("haystack").dataclasses.ToolCall("save", {"content": "x"}, id="c1")]
        return {"replies": [ChatMessage.from_assistant(text=text, tool_calls=tool_calls, meta={"usage": usage})]}


def test_token_usage_sums_numbers_and_keeps_the_latest_other_values() -> None:
    haystack, ours = run_both(lambda cls: cls(chat_generator=UsageGenerator(), tools=[save]), user())
    assert (
        ours["token_usage"]
        == haystack["token_usage"]
        == {
            "prompt_tokens": 30,
            "completion_tokens": 2,
            "model": "m-2",
            "details": {"cached": 5, "tier": "paid"},
            "extra": {"first_seen": 1},
        }
    )


class LockHolder:
    """Something a hook needs that cannot be copied (a lock, a socket, a queue)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[int] = []


class UseContext:
    def run(self, state: HaystackState) -> None:
        holder = state.data["hook_context"]["holder"]
        with holder.lock:
            holder.seen.append(state.data["step_count"])


def test_hook_context_reaches_hooks_uncopied(agent_class: Any) -> None:
    holder = LockHolder()
    agent = agent_class(
        chat_generator=scripted(call("save", content="x"), "done", call("save", content="y"), "done"),
        tools=[save],
        hooks={"before_llm": [UseContext()]},
    )
    result = agent.run(messages=user(), hook_context={"holder": holder})
    assert holder.seen == [0, 1]
    assert "hook_context" not in result
    holder.seen.clear()
    asyncio.run(agent.run_async(messages=user(), hook_context={"holder": holder}))
    assert holder.seen == [0, 1]


def test_an_on_exit_hook_object_returning_true_does_not_continue_but_a_plain_callable_does() -> None:
    """Ours only: plain callables may return True to continue (as our docs say); Hook objects are read as haystack's."""

    class ReturnsTrue:
        def run(self, state: HaystackState) -> bool:
            return True

    model = scripted("a", "b")
    assert Agent(chat_generator=model, hooks={"on_exit": [ReturnsTrue()]}).run(user())["step_count"] == 1
    model = scripted("a", "b")
    seen: list[int] = []

    def continue_once(state: Any) -> bool:
        seen.append(state.data["step_count"])
        return len(seen) == 1

    result = Agent(chat_generator=model, hooks={"on_exit": [continue_once]}).run(user())
    assert (result["step_count"], seen) == (2, [1, 2])


# --- haystack-ai's own hooks -----------------------------------------------------------------------------------------


class ScriptedUI:
    """A confirmation UI answering from a list, recording what it was asked."""

    def __init__(self, answers: list[ConfirmationUIResult] | None = None) -> None:
        self.answers = list(answers or [])
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def get_user_confirmation(self, tool_name: str, tool_description: str, tool_params: dict[str, Any]) -> Any:
        self.asked.append((tool_name, dict(tool_params)))
        return self.answers.pop(0)

    def to_dict(self) -> dict[str, Any]:
        return {"type": f"{__name__}.ScriptedUI", "init_parameters": {}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ScriptedUI":
        return cls()


def confirming(policy: Any, ui: ScriptedUI) -> ConfirmationHook:
    return ConfirmationHook({"save": BlockingConfirmationStrategy(confirmation_policy=policy, confirmation_ui=ui)})


def test_confirmation_hook_with_never_ask_runs_the_tool(agent_class: Any) -> None:
    ui = ScriptedUI()
    agent = agent_class(
        chat_generator=scripted(call("save", content="x"), "done"),
        tools=[save],
        hooks={"before_tool": [confirming(NeverAskPolicy(), ui)]},
    )
    result = agent.run(messages=user())
    assert ui.asked == []
    assert result["tool_call_counts"] == {"save": 1}


def test_confirmation_hook_rejection_and_modification_are_applied_the_same_way() -> None:
    answers = [
        ConfirmationUIResult("reject", feedback="not now"),
        ConfirmationUIResult("modify", new_tool_params={"content": "edited"}),
    ]
    uis: list[ScriptedUI] = []

    def build(cls: Any) -> Any:
        ui = ScriptedUI(list(answers))
        uis.append(ui)
        return cls(
            chat_generator=scripted(call("save", content="x"), call("save", content="y"), "done"),
            tools=[save],
            hooks={"before_tool": [confirming(AlwaysAskPolicy(), ui)]},
        )

    haystack, ours = run_both(build, user())
    assert uis[0].asked == uis[1].asked == [("save", {"content": "x"}), ("save", {"content": "y"})]
    assert texts(ours["messages"]) == texts(haystack["messages"])
    assert [m.role for m in ours["messages"]] == [m.role for m in haystack["messages"]]
    assert ours["tool_call_counts"] == haystack["tool_call_counts"]
    executed = [
        m.tool_call_result.origin.arguments
        for m in ours["messages"]
        if m.tool_call_result and m.tool_call_result.result == "saved"
    ]
    assert executed == [{"content": "edited"}]


def test_ask_once_policy_asks_once_for_the_same_arguments(agent_class: Any) -> None:
    ui = ScriptedUI([ConfirmationUIResult("confirm")])
    agent = agent_class(
        chat_generator=scripted(call("save", content="x"), call("save", content="x"), "done"),
        tools=[save],
        hooks={"before_tool": [confirming(AskOncePolicy(), ui)]},
    )
    result = agent.run(messages=user())
    assert ui.asked == [("save", {"content": "x"})]
    assert result["tool_call_counts"] == {"save": 2}


def test_confirmation_hook_runs_in_run_async(agent_class: Any) -> None:
    ui = ScriptedUI([ConfirmationUIResult("reject")])
    agent = agent_class(
        chat_generator=scripted(call("save", content="x"), "done"),
        tools=[save],
        hooks={"before_tool": [confirming(AlwaysAskPolicy(), ui)]},
    )
    result = asyncio.run(agent.run_async(messages=user()))
    assert ui.asked == [("save", {"content": "x"})]
    assert not any(m.tool_call_result and m.tool_call_result.result == "saved" for m in result["messages"])


@EXPERIMENTAL
def test_token_budget_hook_stops_the_run() -> None:
    def build(cls: Any) -> Any:
        return cls(
            chat_generator=scripted(call("save", content="x"), call("save", content="y"), "done"),
            tools=[save],
            hooks={"before_llm": [TokenBudgetHook(max_total_tokens=1, add_final_message=True)]},
        )

    haystack, ours = run_both(build, user())
    for result in (haystack, ours):
        assert result["exit_reason"] == "token_budget_exceeded"
        assert result["step_count"] == 1
        assert result["last_message"].text == "The Agent stopped because the token budget was exceeded."
    assert ours["token_usage"] == haystack["token_usage"]


@EXPERIMENTAL
def test_compaction_hook_compacts_a_long_conversation_the_same_way() -> None:
    models: list[ScriptedChatGenerator] = []
    padding = "lorem ipsum dolor sit amet " * 40

    def build(cls: Any) -> Any:
        model = scripted(*[call("save", content=f"{i} {padding}") for i in range(6)], "done")
        models.append(model)
        compaction = CompactionHook(
            SlidingWindowCompactor(min_keep_steps=1), context_window=1200, compact_at=0.5, compact_to=0.3
        )
        return cls(chat_generator=model, tools=[save], hooks={"before_llm": [compaction]})

    haystack, ours = run_both(build, user())
    assert texts(ours["messages"]) == texts(haystack["messages"])
    sent = [[m.text for m in c.messages] for c in models[1].calls]
    assert sent == [[m.text for m in c.messages] for c in models[0].calls]
    assert len(sent[-1]) < 1 + 2 * 6  # it did compact: uncompacted, the last call gets the user message and 6 steps
    assert ours["exit_reason"] == haystack["exit_reason"] == "text"


@EXPERIMENTAL
def test_compaction_hook_under_run_async(agent_class: Any) -> None:
    padding = "lorem ipsum dolor sit amet " * 40
    model = scripted(*[call("save", content=f"{i} {padding}") for i in range(4)], "done")
    compaction = CompactionHook(SlidingWindowCompactor(), context_window=1200, compact_at=0.5, compact_to=0.3)
    agent = agent_class(chat_generator=model, tools=[save], hooks={"before_llm": [compaction]})
    result = asyncio.run(agent.run_async(messages=user()))
    assert result["exit_reason"] == "text"
    assert len(model.calls[-1].messages) < 2 + 2 * 4


def test_a_failing_tool_in_a_confirmed_call_is_reported_to_the_model(agent_class: Any) -> None:
    ui = ScriptedUI([ConfirmationUIResult("confirm")])
    hook_ = ConfirmationHook(
        {"broken": BlockingConfirmationStrategy(confirmation_policy=AlwaysAskPolicy(), confirmation_ui=ui)}
    )
    agent = agent_class(
        chat_generator=scripted(call("broken", reason="disk"), "sorry"), tools=[broken], hooks={"before_tool": [hook_]}
    )
    result = agent.run(messages=user())
    errors = [m.tool_call_result for m in result["messages"] if m.tool_call_result and m.tool_call_result.error]
    assert len(errors) == 1 and "disk" in errors[0].result


class JudgeHook:
    """
    haystack's documented class-hook pattern: an LLM judge that holds its own chat generator, warms it up and closes
    it with the hook, and asks it about the last reply (here the offline ``ScriptedChatGenerator``).
    """

    def __init__(self) -> None:
        from haystack_state.testing import ScriptedChatGenerator

        self.judge = ScriptedChatGenerator(script=["GOOD"] * 4)

    def warm_up(self) -> None:
        self.judge.warm_up()

    async def warm_up_async(self) -> None:
        await self.judge.warm_up_async()

    def run(self, state: HaystackState) -> None:
        assert self.judge.is_warmed_up, "the judge must be warmed up before it is used"
        last = state.get("messages")[-1]
        verdict = self.judge.run(messages=[ChatMessage.from_user(f"Judge: {last.text}")])["replies"][0].text
        state.set("trace", [verdict])

    async def run_async(self, state: HaystackState) -> None:
        assert self.judge.is_warmed_up
        last = state.get("messages")[-1]
        replies = (await self.judge.run_async(messages=[ChatMessage.from_user(f"Judge: {last.text}")]))["replies"]
        state.set("trace", [replies[0].text])

    def close(self) -> None:
        self.judge.close()

    async def close_async(self) -> None:
        await self.judge.close_async()


def test_an_llm_judge_hook_with_the_scripted_generator(agent_class: Any) -> None:
    judge = JudgeHook()
    agent = agent_class(chat_generator=scripted("a", "b"), state_schema=TRACE, hooks={"after_run": [judge]})
    assert agent.run(messages=user())["trace"] == ["GOOD"]
    assert asyncio.run(agent.run_async(messages=user()))["trace"] == ["GOOD"]
    assert [call.messages[0].text for call in judge.judge.calls] == ["Judge: a", "Judge: b"]
    agent.close()
    assert not judge.judge.is_warmed_up
