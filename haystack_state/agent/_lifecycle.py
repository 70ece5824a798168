"""
The Agent's lifecycle: warming up its tools, hooks and chat generator before a first run (a lazy toolset loads its
tools then, and the names that depend on them are checked), releasing them, and cloning the Agent with some of its
parameters replaced. Functions of the Agent that its methods are (``Agent.warm_up = warm_up``).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from haystack.tools.utils import close_tools, close_tools_async, warm_up_tools, warm_up_tools_async

from haystack_state.agent._hooks import (
    call_lifecycle_async,
    hooks_lifecycle,
    hooks_lifecycle_async,
)

if TYPE_CHECKING:
    from haystack_state.agent._component import Agent

__all__ = ["clone", "close", "close_async", "warm_up", "warm_up_async"]


def warm_up(agent: Agent) -> None:
    """
    Warm up the tools (a lazy toolset loads its tools now), the hooks and the chat generator. ``run`` does it on
    first use.

    :raises ValueError: If ``interrupt_before`` names a tool that no tool provides.
    """
    if agent.setup.warmed_up:
        return
    warm_up_tools(agent.tools)
    hooks_lifecycle(agent.hooks, "warm_up")
    if hasattr(agent.chat_generator, "warm_up"):
        agent.chat_generator.warm_up()
    agent.setup.check_tools(agent)


async def warm_up_async(agent: Agent) -> None:
    """Warm up the tools, hooks and chat generator, awaiting their ``warm_up_async`` where they have one."""
    if agent.setup.warmed_up:
        return
    await warm_up_tools_async(agent.tools)
    await hooks_lifecycle_async(agent.hooks, "warm_up")
    await call_lifecycle_async(agent.chat_generator, "warm_up")
    agent.setup.check_tools(agent)


def close(agent: Agent) -> None:
    """Release what the tools, hooks and chat generator hold (clients, models). A later run warms up again."""
    close_tools(agent.tools)
    hooks_lifecycle(agent.hooks, "close")
    if hasattr(agent.chat_generator, "close"):
        agent.chat_generator.close()
    agent.setup.warmed_up = False


async def close_async(agent: Agent) -> None:
    """Release what the tools, hooks and chat generator hold, awaiting their ``close_async`` where they have one."""
    await close_tools_async(agent.tools)
    await hooks_lifecycle_async(agent.hooks, "close")
    await call_lifecycle_async(agent.chat_generator, "close")
    agent.setup.warmed_up = False


def clone(agent: Agent, **overrides: object) -> Agent:
    """
    A new Agent configured like this one, with the given ``__init__`` parameters replaced.

    :param overrides: Parameters to replace, e.g. ``agent.clone(system_prompt="...")``.
    :returns: The new Agent.
    """
    cls = type(agent)
    names = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    params = {name: getattr(agent, name) for name in names}
    return cls(**{**params, **overrides})
