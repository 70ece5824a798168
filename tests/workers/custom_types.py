"""
An application class that only the worker process imports and registers with the codec: the test process loads the
thread the worker wrote and must fail with a clear error, without importing this module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_state import Agent, tool
from haystack_state.persistence import Checkpointer, register_type
from haystack_state.testing import ScriptedChatGenerator

TYPE_NAME = "workers.Receipt"


@register_type(name=TYPE_NAME)
@dataclasses.dataclass(frozen=True)
class Receipt:
    """A receipt, stored in the state."""

    number: int
    total: float


@tool(outputs_to_state={"receipt": {"source": "receipt"}})
def issue(number: int) -> dict[str, Any]:
    """
    Issue a receipt.

    :param number: The receipt number.
    """
    return {"receipt": Receipt(number, 9.5)}


def run_with_custom_type(checkpointer: Checkpointer, thread_id: str) -> dict[str, Any]:
    """Run an agent whose tool stores a ``Receipt`` in the thread's state."""
    agent = Agent(
        ScriptedChatGenerator(script=[[("issue", {"number": 7})], "issued"]),
        tools=[issue],
        state_schema={"receipt": {"type": Receipt}},
        checkpointer=checkpointer,
    )
    return agent.run([ChatMessage.from_user("issue one")], thread_id=thread_id)
