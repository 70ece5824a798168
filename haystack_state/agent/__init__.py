"""
The ``Agent`` component and what runs it: the loop written once as a generator of effects (:mod:`.loop`), the sync
and async drivers that execute those effects (:mod:`.drive`), durable-thread sessions (:mod:`.session`) and the
thread inspection methods (:mod:`.thread_methods`, :mod:`.history`).
"""

from haystack_state.agent.component import Agent

__all__ = ["Agent"]
