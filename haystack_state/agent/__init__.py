"""
The ``Agent`` component and what runs it: the loop written once as a flow of effects (:mod:`.loop`, :mod:`.effects`),
the sync and async drivers that execute those effects (:mod:`.drive`), durable-thread sessions (:mod:`.session`),
resuming an interrupted or unfinished run (:mod:`.continuation`) and the thread inspection methods
(:mod:`.thread_methods`, :mod:`.history`). A human's decisions and the requests they answer are the typed records of
:mod:`.protocols`.
"""

from haystack_state.agent._component import Agent
from haystack_state.agent.protocols import (
    Approve,
    Decision,
    Edit,
    ExitReason,
    HookPoint,
    InterruptKind,
    InterruptRequest,
    Reject,
)

__all__ = [
    "Agent",
    "Approve",
    "Decision",
    "Edit",
    "ExitReason",
    "HookPoint",
    "InterruptKind",
    "InterruptRequest",
    "Reject",
]
