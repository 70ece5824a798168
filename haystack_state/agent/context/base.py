"""
What a context policy receives and returns, the policy protocol, and composition (``policy_a | policy_b``).

A policy decides what the model is sent before each call; it never changes what is stored. The loop hands it a
:class:`ContextView` of the stored conversation and sends the messages of the :class:`ContextPlan` it returns.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from haystack.core.serialization import component_to_dict, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.token_counters import TokenCounter
from haystack.tools.tool import Tool
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_state.agent.context._summary import ContextSummary, SummaryRequest
from haystack_state.agent.context._tokens import APPROXIMATE_COUNTER

__all__ = [
    "ComposePolicies",
    "ContextPlan",
    "ContextPolicy",
    "ContextView",
    "PolicyBase",
    "check_count",
    "policy_from_dict",
    "policy_to_dict",
    "policy_tools",
]


@dataclasses.dataclass(frozen=True)
class ContextView:
    """
    What the loop hands a policy before each model call.

    :param messages: The stored conversation, read-only. It may be long and live: a policy reads it from the end
        and never copies it whole.
    :param run_start: The index of the current run's first message; the run's own messages are always sent.
    :param summary: The ``context_summary`` state value, if any.
    :param counter: The haystack ``TokenCounter`` to measure with (a policy may bring its own).
    :param tools: The tools sent to the model: their schemas cost tokens too.
    :param context: The run's context (its dependencies), for custom policies.
    """

    messages: Sequence[ChatMessage]
    run_start: int
    summary: ContextSummary | None = None
    counter: TokenCounter = APPROXIMATE_COUNTER
    tools: Sequence[Tool] = ()
    context: Any = None

    def __post_init__(self) -> None:
        """Check ``run_start``."""
        if not 0 <= self.run_start <= len(self.messages):
            raise ValueError(
                f"ContextView.run_start must be an index into the messages (0 to {len(self.messages)}), "
                f"got {self.run_start}."
            )


@dataclasses.dataclass(frozen=True)
class ContextPlan:
    """
    What a policy decided: the messages to send, and possibly a summary to write first.

    :param messages: Exactly what to send, in order; the loop sends ``list(messages)``. (A policy may return a lazy
        sequence here, which a composition passes on without building it whole.)
    :param summarize: Ask the loop to fold messages into the summary, then plan again, before calling the model.
        ``messages`` is still a valid thing to send, if the summary cannot be made.
    :param run_start: Where the current run's first message is in ``messages``, for the next policy of a composition;
        None if unknown (the composition then looks for it).
    """

    messages: Sequence[ChatMessage]
    summarize: SummaryRequest | None = None
    run_start: int | None = None


@runtime_checkable
class ContextPolicy(Protocol):
    """
    Decides what the model is sent, from a view of the stored conversation.

    A policy keeps the invariants: the system prompt, the latest user message, every tool call with all its results
    (and no result without its call), and the current run's own messages. It may also give tools the model needs to
    go with it (``tools()``, optional; see :func:`policy_tools`).
    """

    def plan(self, view: ContextView) -> ContextPlan:
        """
        Decide what to send.

        :param view: The stored conversation and what goes with it.
        :returns: The plan.
        """
        ...


def policy_tools(policy: ContextPolicy) -> list[Tool]:
    """
    The tools a policy needs the model to have (such as ``read_tool_result`` for ``OffloadToolResults``).

    :param policy: The policy.
    :returns: Its tools, or an empty list.
    """
    tools = getattr(policy, "tools", None)
    return list(tools()) if callable(tools) else []


def policy_to_dict(policy: ContextPolicy) -> dict[str, Any]:
    """
    Serialize a policy (one with ``to_dict``, or whose init parameters are its attributes).

    :param policy: The policy.
    :returns: ``{"type": ..., "init_parameters": ...}``.
    """
    return component_to_dict(policy, "context_policy")


def policy_from_dict(data: dict[str, Any]) -> ContextPolicy:
    """
    Deserialize a policy from :func:`policy_to_dict`'s output (its class must be on haystack's import allowlist).

    :param data: The serialized policy.
    :returns: The policy.
    """
    holder: dict[str, Any] = {"policy": data}
    deserialize_component_inplace(holder, key="policy")
    policy: ContextPolicy = holder["policy"]
    return policy


class PolicyBase:
    """
    The base of the built-in policies: ``a | b`` composes them (``b`` applies to what ``a`` decided to send).

    ``preserves_positions`` says that the policy's output has the stored messages at their stored positions (it
    only replaces some, as ``OffloadToolResults`` does); ``Summarize`` must see stored positions, so in a
    composition it may only follow such policies.
    """

    preserves_positions: ClassVar[bool] = False
    folds_summary: ClassVar[bool] = False

    def plan(self, view: ContextView) -> ContextPlan:
        """
        Decide what to send.

        :param view: The stored conversation and what goes with it.
        :returns: The plan.
        """
        raise NotImplementedError

    def tools(self) -> list[Tool]:
        """
        The tools the model needs beside this policy.

        :returns: The tools (none by default).
        """
        return []

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the policy.

        :returns: The serialized policy.
        """
        return default_to_dict(self, **self._init_parameters())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """
        Deserialize the policy.

        :param data: What ``to_dict`` returned.
        :returns: The policy.
        """
        return default_from_dict(cls, data)

    def _init_parameters(self) -> dict[str, Any]:
        """
        The ``__init__`` parameters, read from the attributes of the same names (a policy that keeps one under
        another name overrides this).
        """
        return {name: getattr(self, name) for name in _init_names(type(self))}

    def __or__(self, other: ContextPolicy) -> ComposePolicies:
        return ComposePolicies([self, other])

    def __ror__(self, other: ContextPolicy) -> ComposePolicies:
        return ComposePolicies([other, self])

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._init_parameters().items())
        return f"{type(self).__name__}({fields})"


_INIT_NAMES: dict[type[PolicyBase], tuple[str, ...]] = {}


def _init_names(cls: type[PolicyBase]) -> tuple[str, ...]:
    names = _INIT_NAMES.get(cls)
    if names is None:
        names = _INIT_NAMES[cls] = tuple(name for name in inspect.signature(cls.__init__).parameters if name != "self")
    return names


def check_count(value: object, minimum: int, where: str) -> int:
    """
    A whole number of at least ``minimum`` (a bool is not one).

    :param where: What names it in the error, e.g. ``"Summarize: trigger_tokens"``.
    :raises ValueError: If ``value`` is not such a number.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        wanted = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{where} must be {wanted}, got {value!r}.")
    return value


def _locate_run_start(view: ContextView, plan: ContextPlan) -> int:
    """Where the view's current run begins in a plan's messages that did not say so: found by identity from the end."""
    messages = plan.messages
    if view.run_start >= len(view.messages):
        return len(messages)
    first = view.messages[view.run_start]
    for index in range(len(messages) - 1, -1, -1):
        if messages[index] is first:
            return index
    return 0  # not found: the next policy must keep everything


class ComposePolicies(PolicyBase):
    """
    Policies applied one after the other: each plans on what the previous one decided to send.

    ``SlidingWindow(max_turns=20) | TokenBudget(max_tokens=60_000)`` keeps the last 20 turns, then as many of them as
    fit the budget. ``Summarize`` works on stored positions: it comes first, or after position-preserving policies
    only (``OffloadToolResults``); what follows it sees its output, whose summary note is kept like the system
    prompt. A summary request from any policy is passed on to the loop.

    :param policies: The policies, in the order they apply; nested compositions are flattened.
    :raises ValueError: If there are none, if one has no ``plan`` method, if two fold the summary, or if
        ``Summarize`` follows a policy that moves messages.
    """

    preserves_positions: ClassVar[bool] = False

    def __init__(self, policies: Sequence[ContextPolicy]) -> None:
        """
        Compose policies.

        :param policies: The policies, in the order they apply.
        """
        flat: list[ContextPolicy] = []
        for policy in policies:
            flat.extend(policy.policies if isinstance(policy, ComposePolicies) else [policy])
        if not flat:
            raise ValueError("ComposePolicies needs at least one policy.")
        for position, policy in enumerate(flat):
            if not callable(getattr(policy, "plan", None)):
                raise ValueError(f"ComposePolicies: item {position} ({policy!r}) is not a context policy (no plan()).")
        folding = [p for p in flat if getattr(p, "folds_summary", False)]
        if len(folding) > 1:
            raise ValueError("ComposePolicies: only one policy may fold the conversation into the summary.")
        for position, policy in enumerate(flat):
            moved = [p for p in flat[:position] if not getattr(p, "preserves_positions", False)]
            if getattr(policy, "folds_summary", False) and moved:
                raise ValueError(
                    f"ComposePolicies: {type(policy).__name__} folds stored messages into the summary, so it must "
                    f"see them at their stored positions, but it comes after {type(moved[0]).__name__}, which moves "
                    f"them. Put {type(policy).__name__} first."
                )
        self.policies: list[ContextPolicy] = flat

    def plan(self, view: ContextView) -> ContextPlan:
        """
        Apply each policy to what the previous one decided.

        :param view: The stored conversation and what goes with it.
        :returns: The last policy's messages, with the first summary request any policy made.
        """
        current = view
        request: SummaryRequest | None = None
        for policy in self.policies:
            plan = policy.plan(current)
            request = request or plan.summarize
            run_start = plan.run_start if plan.run_start is not None else _locate_run_start(current, plan)
            current = dataclasses.replace(current, messages=plan.messages, run_start=run_start)
        return ContextPlan(current.messages, summarize=request, run_start=current.run_start)

    def tools(self) -> list[Tool]:
        """
        The tools the composed policies need.

        :returns: Their tools, in order.
        """
        return [tool for policy in self.policies for tool in policy_tools(policy)]

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the composition and its policies.

        :returns: The serialized composition.
        """
        return default_to_dict(self, policies=[policy_to_dict(p) for p in self.policies])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ComposePolicies:
        """
        Deserialize the composition.

        :param data: What ``to_dict`` returned.
        :returns: The composition.
        """
        params = dict(data.get("init_parameters", {}))
        params["policies"] = [policy_from_dict(p) for p in params.get("policies", [])]
        return cls(**params)
