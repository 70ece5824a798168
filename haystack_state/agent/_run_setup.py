"""
Setting a run up, before anything is committed: checking its inputs against the schema (:func:`check_request`) and
building its State (:func:`prepare_state`): fresh, or the thread's with the run-scoped keys reset, then the inputs
and the new messages. Raises for a run that cannot start, so that a refused run writes nothing.
"""

from __future__ import annotations

import dataclasses
import itertools

from haystack import logging
from haystack.dataclasses import ChatMessage

from haystack_state.agent._message_ids import SYSTEM_PROMPT_ID_PREFIX, new_message_id, with_id, with_ids
from haystack_state.agent._run_config import LoopConfig, RunRequest
from haystack_state.agent._run_state import RunState
from haystack_state.agent._session import ThreadSession, reset_run_scope

__all__ = ["INPUT_READ_ONLY", "PreparedState", "check_request", "prepare_state"]

logger = logging.getLogger(__name__)

#: Why a tool or hook may not write a ``"scope": "input"`` key.
INPUT_READ_ONLY = (
    'it has "scope": "input", so it is set by the caller when a run starts (agent.run(..., {key}=...)) and '
    "tools and hooks may only read it."
)


def check_request(config: LoopConfig, request: RunRequest, session: ThreadSession | None) -> None:
    """
    A run's inputs must be state keys the caller may set; a run of an agent that interrupts needs a thread.

    :raises ValueError: If they are not, or it has none.
    """
    unknown = sorted(set(request.inputs) - set(config.schema))
    if unknown:
        raise ValueError(f"Agent.run got unknown inputs {unknown}; the state keys are: {', '.join(config.schema)}.")
    for key in request.inputs:
        spec = config.schema[key]
        if spec.scope == "loaded":
            raise ValueError(
                f'State key \'{key}\' has "scope": "loaded": its loader computes it at the start of every run, '
                "so it cannot be given to run()."
            )
        if not spec.is_input:
            raise ValueError(
                f"State key '{key}' is private to the agent (\"input\": False in the schema): it cannot be given "
                "to run()."
            )
    if config.interrupt_before and session is None:
        raise ValueError(
            f"This agent stops before {', '.join(sorted(config.interrupt_before))} for a human's approval, which "
            "needs a durable thread to resume from: run it with thread_id=..."
        )


@dataclasses.dataclass
class PreparedState:
    """
    A run's State, and where its own messages start.

    :param state: The State.
    :param run_start: The index in ``messages`` where the run's own messages start.
    :param held: The run's new messages, held back until the thread's unfinished step is finished or closed.
    """

    state: RunState
    run_start: int
    held: list[ChatMessage]


def prepare_state(
    config: LoopConfig, request: RunRequest, session: ThreadSession | None, *, continuing: bool, then_input: bool
) -> PreparedState:
    """
    The run's State: fresh, or the thread's with the run-scoped keys reset (unless the run continues an unfinished
    one); then the inputs and messages (the system prompt first on a new conversation, the rendered user prompt
    after the messages).

    :param config: The agent's settings.
    :param request: The run's inputs.
    :param session: The run's thread, if any.
    :param continuing: Whether the run continues the thread's unfinished run.
    :param then_input: Whether the new messages wait until the thread's unfinished step is finished or closed.
    :returns: The State, where the run's messages start, and the messages held back.
    """
    if session is None:
        state = RunState({key: spec.as_entry() for key, spec in config.schema.items()})
    else:
        state = RunState.adopt(session.load_state())
        if not session.is_new and not continuing:
            reset_run_scope(state)
    state.update({key: value for key, value in request.inputs.items() if value is not None})
    conversation = with_ids(request.messages)  # a message keeps the id it came with
    if request.user_message is not None:
        conversation.append(with_id(request.user_message))
    is_new = session is None or session.is_new
    system = request.system_message
    if is_new and system is not None and not (conversation and conversation[0].is_from("system")):
        conversation.insert(0, with_id(system, SYSTEM_PROMPT_ID_PREFIX + new_message_id()))
    stored = len(state.view("messages") or [])
    # Where this run's own messages start: its latest user message (what came before it in the input is history
    # the caller passed along), or, without one, the end of the stored conversation. A continued run keeps the
    # start of the run it continues.
    users = [i for i, message in enumerate(conversation) if message.is_from("user")]
    run_start = stored + users[-1] if users else stored + len(conversation)
    previous = session.run_metadata().get("run_start") if session is not None and continuing else None
    if isinstance(previous, int) and 0 <= previous <= stored:
        run_start = previous
    held: list[ChatMessage] = []
    if then_input:  # taken once the unfinished step is finished or closed (see AgentRun.take_held_input)
        held = conversation
    elif conversation:
        state.set("messages", conversation)
    if all(message.is_from("system") for message in itertools.chain(state.view("messages") or [], held)):
        # As haystack-ai's Agent: the model is about to get nothing but instructions (or nothing at all).
        logger.warning("All messages provided to the Agent component are system messages. This is not recommended.")
    inputs = {key: INPUT_READ_ONLY.format(key=key) for key, spec in config.schema.items() if spec.scope == "input"}
    if inputs:
        state.protect(inputs)
    return PreparedState(state, run_start, held)
