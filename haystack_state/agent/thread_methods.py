"""
The Agent's durable-thread inspection and editing methods (``get_state``, ``get_history``, ``update_state``), as a
mixin of :class:`haystack_state.agent.Agent`.
"""

from __future__ import annotations

from typing import Any

from haystack_state.agent.history import CheckpointHistory
from haystack_state.agent.session import ThreadSession, ThreadSnapshot
from haystack_state.errors import ThreadNotFoundError
from haystack_state.persistence.base import Checkpointer
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.schema import FieldSpec

__all__ = ["ThreadMethods"]


class ThreadMethods:
    """The methods of ``Agent`` that read and edit its checkpointer's threads."""

    checkpointer: Checkpointer | None
    _specs_fields: dict[str, FieldSpec]

    def _session(self, thread_id: str | None, checkpoint_id: str | None) -> ThreadSession | None:
        """
        Open a run's thread, or None without a ``thread_id``.

        :raises ValueError: For a ``checkpoint_id`` without ``thread_id``, or a ``thread_id`` without checkpointer.
        """
        if thread_id is None:
            if checkpoint_id is not None:
                raise ValueError("checkpoint_id needs a thread_id.")
            return None
        return ThreadSession(
            self._checkpointer(f"thread_id='{thread_id}'"), thread_id, self._specs_fields, checkpoint_id
        )

    def _existing(self, thread_id: str, checkpoint_id: str | None = None) -> ThreadSession:
        """Open a thread that must exist (``ThreadNotFoundError`` otherwise)."""
        session = ThreadSession(
            self._checkpointer(f"thread_id='{thread_id}'"), thread_id, self._specs_fields, checkpoint_id
        )
        if session.is_new:
            raise ThreadNotFoundError(thread_id)
        return session

    def _checkpointer(self, what: str) -> Checkpointer:
        if self.checkpointer is None:
            raise ValueError(f"{what} needs an Agent created with a checkpointer.")
        return self.checkpointer

    def get_state(self, thread_id: str, checkpoint_id: str | None = None) -> ThreadSnapshot:
        """
        A thread's state at its head, or at an earlier checkpoint.

        :param thread_id: The thread.
        :param checkpoint_id: An earlier checkpoint of the thread; the head if None.
        :returns: The values, the checkpoint's record and any pending tool calls.
        :raises ValueError: If the agent has no checkpointer.
        :raises ThreadNotFoundError: If the thread has no checkpoint.
        :raises CheckpointNotFoundError: If the thread has no such checkpoint.
        """
        return self._existing(thread_id, checkpoint_id).snapshot()

    def get_history(self, thread_id: str) -> CheckpointHistory:
        """
        A thread's checkpoints (every branch), newest first, each with its id, parent id, step, source (input, model,
        tools or update), tool names, creation time and changed keys. Renders as a table in notebooks.

        :param thread_id: The thread.
        :returns: The checkpoints.
        :raises ValueError: If the agent has no checkpointer.
        :raises ThreadNotFoundError: If the thread has no checkpoint.
        """
        return CheckpointHistory(self._checkpointer("get_history").history(thread_id))

    def update_state(self, thread_id: str, values: dict[str, Any]) -> CheckpointMeta:
        """
        A human edit of a thread's state: the values are written through their keys' handlers, all or nothing, and
        recorded as a checkpoint of its own (source ``"update"``). An interrupted run stays interrupted (and a crashed
        run can still be continued) unless the edit answers its pending tool calls.

        :param thread_id: The thread.
        :param values: key -> value.
        :returns: The new checkpoint's record.
        :raises ValueError: If the agent has no checkpointer.
        :raises ThreadNotFoundError: If the thread has no checkpoint (a thread starts with a run).
        :raises StateTypeError: If a value does not fit its key (nothing is written).
        :raises UnknownStateKeyError: If a key is not in the schema (nothing is written).
        :raises ThreadConflictError: If a run committed to the thread meanwhile.
        """
        session = self._existing(thread_id)
        state = session.load_state()
        state.update(values)
        return session.commit(state, "update", metadata=session.run_metadata())
