"""
The small typed records a run and its caller exchange: the requests an interrupted run waits for
(:class:`InterruptRequest`), a human's decision on a held tool call (:data:`Decision`: :class:`Approve`,
:class:`Reject` or :class:`Edit`), and the closed sets of hook points (:data:`HookPoint`) and built-in exit reasons
(:data:`ExitReason`).

They replace dicts and bare strings inside the package; at the boundaries the old forms stay: a checkpoint stores an
interrupt request as the dict :meth:`InterruptRequest.to_dict` writes (and ``ThreadSnapshot.interrupts`` returns),
and ``Agent.resume`` still takes ``"approve"``, ``"reject"`` and ``{"arguments": {...}}`` as decisions
(:func:`as_decision` reads them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal, TypeAlias

__all__ = [
    "Approve",
    "Decision",
    "DecisionLike",
    "Edit",
    "ExitReason",
    "HookPoint",
    "InterruptKind",
    "InterruptRequest",
    "Reject",
    "UnfinishedCalls",
    "as_decision",
]

#: Where hooks run in a run (see ``Agent``'s ``hooks`` parameter).
HookPoint: TypeAlias = Literal["before_run", "before_llm", "before_tool", "after_tool", "on_exit", "after_run"]

#: The exit reasons a run sets itself: a reply without tool calls (``"text"``, or ``"length"``/``"content_filter"``
#: for an incomplete one), the step limit, an interrupt, a cancel. A run may also exit with the name of an
#: exit-condition tool, or the value a hook set as ``stop_run``.
ExitReason: TypeAlias = Literal["text", "length", "content_filter", "max_agent_steps", "interrupted", "cancelled"]

#: What a run with new messages does on a thread whose last run stopped with tool calls unanswered (a crash, or a
#: cancel, between the model's reply and its tools' results): ``"finish"`` runs them first, ``"close"`` answers them
#: with error results saying the run stopped, ``"refuse"`` raises ``ThreadBusyError``. Then the new messages are taken.
#: (``Agent``'s and ``Agent.run``'s ``on_unfinished_calls``.)
UnfinishedCalls: TypeAlias = Literal["finish", "close", "refuse"]

#: What an interrupted run waits for: ``"before"``, a call held by ``interrupt_before``; ``"interrupt"``, a tool asked
#: with ``interrupt(value)``; ``"hook"``, a ``before_tool`` hook asked; ``"after"``, a result to review
#: (``interrupt_after``).
InterruptKind: TypeAlias = Literal["before", "interrupt", "hook", "after"]
_KINDS: frozenset[str] = frozenset({"before", "interrupt", "hook", "after"})


@dataclasses.dataclass(frozen=True, slots=True)
class InterruptRequest:
    """
    One request an interrupted run waits for.

    :param id: The key of ``resume``'s ``answers`` (for ``"before"`` requests, the call id, the key of its
        ``decisions``).
    :param kind: What waits (see :data:`InterruptKind`).
    :param tool_name: The tool (for a hook, the names of the step's tools, joined by ``", "``).
    :param call_id: The tool call (None for a hook).
    :param arguments: The call's arguments (empty for a hook).
    :param value: What was asked: the held call's arguments, the ``interrupt()`` value, or the result to review.
    :param index: For ``"interrupt"`` and ``"hook"``: which ``interrupt()`` call of the tool or hooks asked (0 first).
    """

    id: str
    kind: InterruptKind
    tool_name: str | None
    call_id: str | None
    arguments: dict[str, object]
    value: object
    index: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON-ready dict a checkpoint stores (``index`` for ``"interrupt"`` and ``"hook"`` requests only)."""
        data: dict[str, object] = {
            "id": self.id,
            "kind": self.kind,
            "tool_name": self.tool_name,
            "call_id": self.call_id,
            "arguments": self.arguments,
            "value": self.value,
        }
        if self.kind in ("interrupt", "hook"):
            data["index"] = self.index
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> InterruptRequest:
        """
        Read a stored request (see :meth:`to_dict`).

        :raises ValueError: If it has no string ``id`` or an unknown ``kind``.
        """
        kind, ident = data.get("kind"), data.get("id")
        if not isinstance(ident, str) or kind not in _KINDS:
            raise ValueError(f"Not an interrupt request: {dict(data)!r}.")
        arguments, index, tool_name, call_id = (
            data.get("arguments"),
            data.get("index"),
            data.get("tool_name"),
            data.get("call_id"),
        )
        return cls(
            ident,
            kind,  # type: ignore[arg-type]
            tool_name if isinstance(tool_name, str) else None,
            call_id if isinstance(call_id, str) else None,
            dict(arguments) if isinstance(arguments, Mapping) else {},
            data.get("value"),
            index if isinstance(index, int) and not isinstance(index, bool) else None,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Approve:
    """Run the held tool call as the model made it (the old form: ``"approve"``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reject:
    """Do not run the held tool call: the model is told a human rejected it (the old form: ``"reject"``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Edit:
    """
    Run the held tool call with these arguments instead (checked against the tool's parameters; the old form:
    ``{"arguments": {...}}``).

    :param arguments: The call's new arguments.
    """

    arguments: dict[str, object]


#: A human's decision on a tool call held by ``interrupt_before``.
Decision: TypeAlias = Approve | Reject | Edit
#: What ``Agent.resume`` takes as a decision: a :data:`Decision`, or its old form (``"approve"``, ``"reject"``,
#: ``{"arguments": {...}}``).
DecisionLike: TypeAlias = Decision | str | Mapping[str, object]


def as_decision(value: object) -> Decision | None:
    """
    A decision, from a :data:`Decision` or its old form.

    :param value: ``Approve()``, ``Reject()``, ``Edit(arguments)``, ``"approve"``, ``"reject"`` or
        ``{"arguments": {...}}``.
    :returns: The decision; None if ``value`` is none of these.
    """
    if isinstance(value, Approve | Reject | Edit):
        return value
    if value == "approve":
        return Approve()
    if value == "reject":
        return Reject()
    if isinstance(value, Mapping) and set(value) == {"arguments"} and isinstance(value["arguments"], dict):
        return Edit(dict(value["arguments"]))
    return None
