"""
LangGraph's ``checkpoints``, ``tasks`` and ``debug`` stream modes, made from an Agent's steps (pure: no I/O).

An Agent runs as LangGraph's graph ``__start__ -> model <-> tools -> __end__`` (the one ``/assistants/{id}/graph``
draws): each model call and each batch of tool calls is a task, and each committed checkpoint is a checkpoint.

- ``checkpoints``: at each commit, the state there, in the shape of LangGraph's ``CheckpointPayload``: ``config`` and
  ``parent_config`` (``{"configurable": {"thread_id", "checkpoint_ns": "", "checkpoint_id"}}``), ``metadata``
  (``source``, ``step``, ``run_id``, ``thread_id``, ``parents``), ``values`` (the wire format of ``values``), ``next``
  (``["model"]`` after the input and after tool results, ``["tools"]`` after a reply that calls tools, ``[]`` after the
  last reply) and ``tasks`` (the next task, as ``{"id", "name", "interrupts", "state"}``).
- ``tasks``: a task's start, ``{"id", "name", "input", "triggers"}`` (``input`` is the state it starts from), and its
  result, ``{"id", "name", "error", "result", "interrupts"}`` (``result`` is what it wrote, as ``[key, value]``
  pairs: appended items for a key it appended to). A task's id is the id of the checkpoint it starts from, as a
  thread's state names its pending ``tools`` task. A tool batch that stops at a tool's ``interrupt()`` reports its
  result with the interrupts; a task the run's failure stopped, with the error. A call stopped before it starts
  (``interrupt_before``) starts no task, as in LangGraph.
- ``debug``: both, wrapped as ``{"type": "checkpoint" | "task" | "task_result", "timestamp", "step", "payload"}``;
  a checkpoint's payload also has ``checkpoint`` and ``parent_checkpoint`` (``{"thread_id", "checkpoint_ns",
  "checkpoint_id", "checkpoint_map"}``) and its tasks a ``checkpoint`` in place of ``state``, as LangGraph's platform
  sends them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["STEP_MODES", "StepStream"]

#: The stream modes this module makes.
STEP_MODES = ("checkpoints", "tasks", "debug")
MODEL = "model"
TOOLS = "tools"


def _timestamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat()


@dataclasses.dataclass
class _Task:
    id: str
    name: str
    step: int
    result: list[list[Any]] | None = None


class StepStream:
    """
    Follows one run's steps and makes the ``checkpoints``, ``tasks`` and ``debug`` events asked for.

    :param modes: The stream modes asked for (those of :data:`STEP_MODES` count).
    :param run_id: The server's run id.
    :param thread_id: The run's thread (None for a stateless run).
    """

    def __init__(self, modes: Iterable[str], *, run_id: str, thread_id: str | None) -> None:
        wanted = set(modes)
        self.checkpoints = "checkpoints" in wanted
        self.tasks = "tasks" in wanted
        self.debug = "debug" in wanted
        self.run_id = run_id
        self.thread_id = thread_id
        #: The last checkpoint (the run's starting one until it commits), its step, and what runs after it.
        self.parent: str | None = None
        self.step = 0
        self.next: list[str] = []
        #: Whether the last reply called tools, and how many calls started and have not finished.
        self.calls = False
        self.open_calls = 0
        self.task: _Task | None = None

    def started(self, checkpoint_id: str | None, step: int) -> None:
        """The run started from this checkpoint (None for a thread's first run), of this step."""
        self.parent, self.step, self.next = checkpoint_id, step, [MODEL]

    # --- tasks ------------------------------------------------------------------------------------------------------

    def begin(self, name: str, values: Callable[[], Any], at: float) -> list[tuple[str, Any]]:
        """
        A task is under way (its first event came): its start, unless it started already.

        :param name: ``model`` or ``tools``.
        :param values: The state it starts from (called only when a start is sent).
        :param at: When, in seconds since the epoch.
        """
        if self.task is not None and self.task.name == name:
            return []
        step = self.step + 1 if name == MODEL else self.step
        self.task = _Task(self.parent or self.run_id, name, step)
        trigger = f"branch:to:{name}"
        return self._task_event(
            "task", {"id": self.task.id, "name": name, "input": values(), "triggers": [trigger]}, at
        )

    def replied(self, calls: bool) -> None:
        """The model's reply came; ``calls`` says whether it calls tools."""
        self.calls = calls

    def call_started(self) -> None:
        self.open_calls += 1

    def call_finished(self) -> None:
        self.open_calls = max(0, self.open_calls - 1)

    def _result(self, at: float, *, error: str | None = None, interrupts: list[Any] | None = None) -> list[Any]:
        task = self.task
        if task is None:
            return []
        self.task = None
        payload = {
            "id": task.id,
            "name": task.name,
            "error": error,
            "result": task.result or [],
            "interrupts": interrupts or [],
        }
        return self._task_event("task_result", payload, at, step=task.step)

    def _task_event(self, kind: str, payload: dict[str, Any], at: float, *, step: int | None = None) -> list[Any]:
        out: list[tuple[str, Any]] = []
        if self.tasks:
            out.append(("tasks", payload))
        if self.debug:
            task_step = step if step is not None else self.task.step if self.task is not None else self.step
            out.append(("debug", {"type": kind, "timestamp": _timestamp(at), "step": task_step, "payload": payload}))
        return out

    def finished(self, source: str, changes: dict[str, Any], at: float) -> list[tuple[str, Any]]:
        """
        A checkpoint is committed: the result of the task it records (``source`` names it), unless that task stopped
        at a tool's interrupt (its result comes with :meth:`interrupted`).

        :param source: The checkpoint's source.
        :param changes: What it wrote: ``{key: appended items, new value or None}``.
        :param at: When, in seconds since the epoch.
        """
        task = self.task
        if task is None or task.name != source:
            return []
        task.result = [[key, value] for key, value in changes.items()]
        if source == TOOLS and self.open_calls:
            return []
        return self._result(at)

    def interrupted(self, interrupts: list[Any], at: float) -> list[tuple[str, Any]]:
        """The run stopped for a human: the result of the task a tool's ``interrupt()`` stopped, if any."""
        return self._result(at, interrupts=interrupts)

    def failed(self, error: str, at: float, values: Callable[[], Any]) -> list[tuple[str, Any]]:
        """The run failed: its task under way (or the one due next) ends with the error."""
        out: list[tuple[str, Any]] = []
        if self.task is None and self.next:
            out = self.begin(self.next[0], values, at)
        return out + self._result(at, error=error)

    # --- checkpoints --------------------------------------------------------------------------------------------------

    def _config(self, checkpoint_id: str | None) -> dict[str, Any] | None:
        if checkpoint_id is None:
            return None
        return {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}

    def _ref(self, checkpoint_id: str | None) -> dict[str, Any] | None:
        if checkpoint_id is None:
            return None
        return {
            "thread_id": self.thread_id,
            "checkpoint_ns": "",
            "checkpoint_id": checkpoint_id,
            "checkpoint_map": None,
        }

    def checkpoint(self, checkpoint_id: str, step: int, source: str, values: Any, at: float) -> list[tuple[str, Any]]:
        """
        The ``checkpoints`` (and ``debug``) events of a committed checkpoint.

        :param checkpoint_id: Its id.
        :param step: The thread's step it records.
        :param source: ``input``, ``model``, ``tools`` or ``update``.
        :param values: The state there, on the wire.
        :param at: When, in seconds since the epoch.
        """
        if source == "input" or (source == TOOLS and not self.open_calls):
            following = [MODEL]
        elif source == TOOLS or (source == MODEL and self.calls):
            following = [TOOLS]
        elif source == MODEL:
            following = []
        else:  # an update (a summary, a hook's writes, the run's end) changes nothing of what comes next
            following = list(self.next)
        parent, self.parent, self.step, self.next = self.parent, checkpoint_id, step, following
        if not (self.checkpoints or self.debug):
            return []
        payload: dict[str, Any] = {
            "config": self._config(checkpoint_id),
            "parent_config": self._config(parent),
            "values": values,
            "metadata": {
                "source": source,
                "step": step,
                "run_id": self.run_id,
                "thread_id": self.thread_id,
                "parents": {},
            },
            "next": following,
            "tasks": [{"id": checkpoint_id, "name": name, "interrupts": [], "state": None} for name in following],
        }
        out: list[tuple[str, Any]] = []
        if self.checkpoints:
            out.append(("checkpoints", payload))
        if self.debug:
            tasks: list[dict[str, Any]] = [
                {"id": checkpoint_id, "name": name, "interrupts": [], "checkpoint": None} for name in following
            ]
            wrapped = {
                **payload,
                "tasks": tasks,
                "checkpoint": self._ref(checkpoint_id),
                "parent_checkpoint": self._ref(parent),
            }
            out.append(("debug", {"type": "checkpoint", "timestamp": _timestamp(at), "step": step, "payload": wrapped}))
        return out
