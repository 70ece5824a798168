"""
The served agents, each an *assistant*: its id is a UUID derived from its name (as LangGraph's platform derives a
graph's default assistant), and requests may name it by either.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from haystack_state.agent import Agent
from haystack_state.persistence.base import Checkpointer
from haystack_state.server._records import now_text

__all__ = ["Assistant", "Assistants"]

#: The namespace of assistant ids: ``uuid5(NAMESPACE, name)``.
NAMESPACE = uuid.UUID("6ba7b812-9dad-11d1-80b4-00c04fd430c8")  # the RFC 4122 URL namespace


@dataclasses.dataclass(frozen=True)
class Assistant:
    """
    One served agent.

    :param name: The name it is served under (the ``graph_id``).
    :param agent: The Agent.
    :param created_at: When the server started serving it.
    :param wire_system_prompt: Whether its threads' ``values.messages`` on the wire keep the Agent's own system prompt.
    """

    name: str
    agent: Agent
    created_at: str
    wire_system_prompt: bool = False

    @property
    def assistant_id(self) -> str:
        """The assistant's UUID (derived from its name)."""
        return str(uuid.uuid5(NAMESPACE, self.name))

    def view(self) -> dict[str, Any]:
        """The spec's ``Assistant``."""
        return {
            "assistant_id": self.assistant_id,
            "graph_id": self.name,
            "name": self.name,
            "description": self.agent.system_prompt,
            "config": {},
            "context": {},
            "metadata": {"created_by": "system"},
            "version": 1,
            "created_at": self.created_at,
            "updated_at": self.created_at,
        }


class Assistants:
    """
    The served agents, by assistant id and by name.

    :param agents: name -> Agent; every agent needs a checkpointer, the same one.
    :param checkpointer: The checkpointer; the agents' (shared) one if None.
    :param wire_system_prompt: Whether threads' ``values.messages`` on the wire keep the Agent's own system prompt.
    :raises ValueError: For no agents, an agent without checkpointer, or agents with different checkpointers.
    """

    def __init__(
        self, agents: Mapping[str, Agent], checkpointer: Checkpointer | None = None, *, wire_system_prompt: bool = False
    ) -> None:
        if not agents:
            raise ValueError("create_app needs at least one agent: agents={'name': agent}.")
        created = now_text()
        self.wire_system_prompt = wire_system_prompt
        self._by_name = {name: Assistant(name, agent, created, wire_system_prompt) for name, agent in agents.items()}
        for name, agent in agents.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"Assistant names must be non-empty strings, got {name!r}.")
            if not isinstance(agent, Agent):
                raise ValueError(f"Assistant '{name}' must be a haystack_state Agent, got {type(agent).__name__}.")
            if agent.checkpointer is None:
                raise ValueError(
                    f"Assistant '{name}': the Agent has no checkpointer; threads live in it. Create the Agent with "
                    "checkpointer=SQLiteCheckpointer('threads.db') (or PostgresCheckpointer(...))."
                )
        shared = checkpointer if checkpointer is not None else next(iter(agents.values())).checkpointer
        others = [name for name, agent in agents.items() if agent.checkpointer is not shared]
        if others:
            raise ValueError(
                f"Assistants {others} use another checkpointer than "
                f"{'the one given to create_app' if checkpointer is not None else 'the first agent'}; the server keeps "
                "every thread in one checkpointer: give all agents the same one."
            )
        assert shared is not None
        self.checkpointer: Checkpointer = shared
        self._by_id = {assistant.assistant_id: assistant for assistant in self._by_name.values()}

    def resolve(self, key: str) -> Assistant | None:
        """The assistant with this id or name, or None."""
        return self._by_id.get(key) or self._by_name.get(key)

    def __iter__(self) -> Iterator[Assistant]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def ids(self) -> list[str]:
        """The assistant ids."""
        return list(self._by_id)

    @property
    def default(self) -> Assistant:
        """The first assistant."""
        return next(iter(self._by_name.values()))
