"""
The ``Agent`` component and what runs it: the loop written once as a flow of effects (:mod:`._loop`,
:mod:`._effects`), the sync and async drivers that execute those effects (:mod:`._drive`), durable-thread sessions
(:mod:`._session`), resuming an interrupted or unfinished run (:mod:`._continuation`) and the thread inspection methods
(:mod:`._thread_methods`, :mod:`._history`). A human's decisions and the requests they answer are the typed records of
:mod:`.protocols`, whose names this package exports too.
"""

from haystack_state.agent import protocols
from haystack_state.agent._component import Agent
from haystack_state.agent.protocols import *  # noqa: F403 (the protocols' public names, listed in their __all__)

__all__ = ["Agent"]
__all__ += protocols.__all__
