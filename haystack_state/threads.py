"""
Durable threads: loading a thread's State from a checkpointer and committing what each step changed.

A :class:`ThreadSession` is one run's handle on a thread. It loads the state at the thread's head (or at an earlier
checkpoint, to fork), and each ``commit`` writes only the changes the State journaled since the previous commit:
the items appended to list keys, the new values of replaced keys. Commits are optimistic: if another run committed
to the thread in between, ``ThreadConflictError`` is raised and nothing is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state.errors import CheckpointError
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.delta import Source
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.schema import FieldSpec
from haystack_state.state import State

__all__ = ["REJECTED", "ThreadSession", "ThreadSnapshot", "apply_decisions", "pending_tool_calls"]

REJECTED = "A human reviewer rejected this tool call; it was not run."


def pending_tool_calls(state: State, head: CheckpointMeta | None) -> list[ToolCall]:
    """
    The tool calls of the thread's last model reply whose results were never committed: the head is a ``model``
    checkpoint (a crash, or an interrupt, came before the tools' checkpoint).

    :param state: The thread's state at ``head``.
    :param head: The checkpoint the state was loaded from.
    :returns: The pending calls, in the order the model listed them (empty if none).
    """
    if head is None or head.source != "model":
        return []
    messages: list[ChatMessage] = state.get("messages") or []
    calls: list[ToolCall] = []
    for message in reversed(messages):
        if not message.is_from("assistant"):
            break
        calls[:0] = message.tool_calls
    return calls


def apply_decisions(
    calls: list[ToolCall], decisions: Mapping[str, Any]
) -> tuple[list[ChatMessage], dict[str, ChatMessage]]:
    """
    Apply a human's decisions to interrupted tool calls.

    :param calls: The pending calls, in order.
    :param decisions: ``{call_id: "approve" | "reject" | {"arguments": {...}}}``; every pending call needs one.
    :returns: An assistant message holding the calls to run (with edited arguments where asked), and the error tool
        results of the rejected calls, by call id.
    :raises ValueError: For a missing decision, an unknown call id or a malformed decision.
    """
    ids = [call.id for call in calls]
    unknown = sorted(str(k) for k in decisions if k not in ids)
    missing = [str(call_id) for call_id in ids if call_id not in decisions]
    if unknown or missing:
        problems = []
        if missing:
            problems.append(f"no decision for pending call(s) {missing}")
        if unknown:
            problems.append(f"decisions name unknown call id(s) {unknown}")
        raise ValueError(f"resume: {'; '.join(problems)}. Pending calls: {ids}.")
    to_run: list[ToolCall] = []
    rejected: dict[str, ChatMessage] = {}
    for call in calls:
        decision = decisions[call.id]  # type: ignore[index]
        if decision == "approve":
            to_run.append(call)
        elif decision == "reject":
            rejected[call.id] = ChatMessage.from_tool(tool_result=REJECTED, origin=call, error=True)  # type: ignore[index]
        elif (
            isinstance(decision, Mapping) and set(decision) == {"arguments"} and isinstance(decision["arguments"], dict)
        ):
            to_run.append(ToolCall(tool_name=call.tool_name, arguments=dict(decision["arguments"]), id=call.id))
        else:
            raise ValueError(
                f"resume: the decision for call '{call.id}' must be 'approve', 'reject' or {{'arguments': {{...}}}}, "
                f"got {decision!r}."
            )
    return ([ChatMessage.from_assistant(tool_calls=to_run)] if to_run else []), rejected


@dataclasses.dataclass(frozen=True)
class ThreadSnapshot:
    """
    A thread's state at one checkpoint, as ``Agent.get_state`` returns it.

    :param values: The state values.
    :param checkpoint: The checkpoint's record (id, parent, step, source, tool names, time, changed keys).
    :param pending_tool_calls: Tool calls of the last model reply whose results are not committed yet (after a
        crash or an interrupt).
    """

    values: dict[str, Any]
    checkpoint: CheckpointMeta
    pending_tool_calls: list[ToolCall]

    @property
    def interrupted(self) -> bool:
        """Whether the run stopped at an ``interrupt_before`` tool and waits for ``Agent.resume``."""
        return bool(self.checkpoint.metadata.get("interrupted"))


class ThreadSession:
    """
    One run's handle on a thread.

    :param checkpointer: Where the thread lives.
    :param thread_id: The thread.
    :param schema: The agent's field specs.
    :param checkpoint_id: Load this checkpoint instead of the head; the first commit forks from it.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        thread_id: str,
        schema: Mapping[str, FieldSpec],
        checkpoint_id: str | None = None,
    ) -> None:
        self.checkpointer = checkpointer
        self.thread_id = thread_id
        self.schema = schema
        self.head_id = checkpointer.head(thread_id)
        self.parent_id = self.head_id
        self.loaded: CheckpointMeta | None = None
        self.step = 0
        if checkpoint_id is not None or self.head_id is not None:
            checkpoint = checkpointer.get(thread_id, checkpoint_id)
            self.loaded = checkpoint.meta
            self.parent_id = checkpoint.checkpoint_id
            self.step = checkpoint.meta.step
            self._values = checkpoint.values
        else:
            self._values = {}

    @property
    def is_new(self) -> bool:
        """Whether the thread had no checkpoint yet."""
        return self.loaded is None

    def load_state(self) -> State:
        """
        Build the State at the loaded checkpoint; its journal starts clean.

        :returns: The State.
        :raises CheckpointError: If a stored value no longer fits the schema (for example after a schema change).
        """
        unknown = sorted(set(self._values) - set(self.schema))
        try:
            values = {key: value for key, value in self._values.items() if key in self.schema}
            state = State({key: spec.as_entry() for key, spec in self.schema.items()}, values)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"Thread '{self.thread_id}': the stored state does not fit the agent's schema: {exc}"
            ) from exc
        if unknown:
            raise CheckpointError(
                f"Thread '{self.thread_id}' holds keys {unknown} that the agent's schema does not declare."
            )
        if not self.is_new:
            state.drain_changes()
        return state

    def commit(
        self,
        state: State,
        source: Source,
        *,
        tool_names: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> CheckpointMeta:
        """
        Commit what ``state`` changed since the last commit as a checkpoint of the thread.

        :param state: The run's State.
        :param source: What produced the changes: ``"input"``, ``"model"``, ``"tools"`` or ``"update"``.
        :param tool_names: The tools whose results the checkpoint records.
        :param metadata: Free-form metadata.
        :param step: The thread's step (defaults to the session's).
        :returns: The checkpoint's record.
        :raises ThreadConflictError: If another run committed to the thread since this session last did.
        :raises CodecError: If a value cannot be encoded (nothing is written; the changes stay journaled).
        """
        delta = state.peek_changes()
        meta = self.checkpointer.commit(
            self.thread_id,
            parent_id=self.parent_id,
            expected_head=self.head_id,
            delta=delta,
            step=self.step if step is None else step,
            source=source,
            tool_names=tuple(tool_names),
            metadata=metadata,
        )
        state.drain_changes()
        self.head_id = self.parent_id = meta.checkpoint_id
        self.loaded = meta
        return meta

    def snapshot(self) -> ThreadSnapshot:
        """
        The loaded checkpoint as a :class:`ThreadSnapshot`.

        :returns: The snapshot.
        :raises CheckpointError: If the thread has no checkpoint.
        """
        if self.loaded is None:
            raise CheckpointError(f"Thread '{self.thread_id}' has no checkpoints.")
        state = self.load_state()
        return ThreadSnapshot(state.data, self.loaded, pending_tool_calls(state, self.loaded))
