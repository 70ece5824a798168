"""
``interrupt(value)``: ask a human from inside a tool (or a ``before_tool`` hook), and get the answer on resume.

Inside a tool call run by an ``Agent`` (or ``ToolInvoker``, ``run_tool_batch``), ``interrupt(value)`` either returns
the human's answer, or stops the call. The first time, there is no answer: the call stops with :class:`ToolInterrupt`,
its effects are discarded, and the ``Agent`` checkpoints the thread with the request (``value``) and returns
``exit_reason="interrupted"``. On ``agent.resume(thread_id, answers=...)`` the call runs again from the start, and
this time ``interrupt(value)`` returns the answer. A call that asks several times gets its answers in order: the k-th
``interrupt()`` of the call returns the k-th answer.

```python
from haystack_state import interrupt, tool


@tool
def transfer(amount: int) -> str:
    '''Transfer money, once a human approves.'''
    approved = interrupt({"question": f"Transfer {amount}?"})
    return "done" if approved else "cancelled"
```

Since the call runs again from the start, whatever it does before ``interrupt()`` runs again too: ask first, act
after. Writes through an injected State and ``outputs_to_state`` are discarded with the stopped call, so they do not
happen twice; other side effects (a request, a file) do.

Works in sync and async tools, in the worker threads the runner starts them in, and in threads or tasks the tool
starts itself with ``contextvars.copy_context()`` (``asyncio`` tasks and ``asyncio.to_thread`` copy it). The runner
opens one :func:`interrupt_scope` per call; an ``Agent`` opens one around a call's ``before_tool`` hooks too.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from haystack_state.errors import CodecError
from haystack_state.persistence.codec import encode

__all__ = ["InterruptScope", "ToolInterrupt", "current_scope", "interrupt", "interrupt_scope"]


class ToolInterrupt(BaseException):
    """
    Raised by :func:`interrupt` when it has no answer: the tool call stops here and waits for a human.

    It derives from ``BaseException``, like ``asyncio.CancelledError``, so that a tool's (or a library's) ``except
    Exception`` does not swallow it, and haystack's tool wrappers do not turn it into a failed call. Do not catch it
    in a tool. The runner catches it, discards the call's effects, and reports the call as pending.

    :param value: What the tool asked (JSON-encodable by the checkpoint codec).
    :param index: Which ``interrupt()`` of the call it was, from 0 (the answers given before it were used).
    :param call_id: The id of the tool call.
    :param tool_name: The tool.
    :param source: Where it was raised: ``"tool"`` (the tool's body) or what the scope was opened for (``"hook"``).
    """

    def __init__(self, value: object, index: int, call_id: str | None, tool_name: str, source: str = "tool") -> None:
        self.value = value
        self.index = index
        self.call_id = call_id
        self.tool_name = tool_name
        self.source = source
        super().__init__(
            f"Tool '{tool_name}' (call {call_id!r}) asked for human input (interrupt #{index}): {value!r}."
        )


@dataclass
class InterruptScope:
    """
    The interrupts of one tool call (or of one call's hooks): the answers it has, and how many it asked.

    :param call_id: The id of the tool call.
    :param tool_name: The tool.
    :param answers: The answers to the scope's ``interrupt()`` calls, in order.
    :param source: Where the scope is: ``"tool"`` or ``"hook"``; carried by the :class:`ToolInterrupt`.
    """

    call_id: str | None
    tool_name: str
    answers: Sequence[Any] = ()
    source: str = "tool"
    asked: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def next_index(self) -> int:
        """Count one more ``interrupt()`` and return its index (thread-safe: a tool may ask from several threads)."""
        with self._lock:
            index = self.asked
            self.asked += 1
        return index


_SCOPE: contextvars.ContextVar[InterruptScope | None] = contextvars.ContextVar(
    "haystack_state_interrupt_scope", default=None
)


def current_scope() -> InterruptScope | None:
    """The interrupt scope of the tool call running in this context, or None outside one."""
    return _SCOPE.get()


def interrupt_scope(
    call_id: str | None, tool_name: str, answers: Sequence[Any] | None = None, *, source: str = "tool"
) -> AbstractContextManager[InterruptScope]:
    """
    Make :func:`interrupt` work in the block, for one tool call: the k-th ``interrupt()`` in it returns
    ``answers[k]`` if there is one, and raises :class:`ToolInterrupt` otherwise. The tool runner opens one per call;
    an ``Agent`` opens one around a call's ``before_tool`` hooks (``source="hook"``), so that a hook's
    ``interrupt()`` stops the call before the tool runs. The scope is a context variable: threads and tasks started
    from the block with the block's context (``contextvars.copy_context()``) share it.

    Usage example:

    .. code-block:: python

        with interrupt_scope("call_1", "transfer", answers=[True]) as scope:
            assert interrupt("Transfer 100?") is True
        assert scope.asked == 1

    :param call_id: The id of the tool call.
    :param tool_name: The tool.
    :param answers: The answers, in the order the block asks; None or empty for none.
    :param source: Where the scope is (``"tool"`` or ``"hook"``); the :class:`ToolInterrupt` carries it.
    :returns: A context manager yielding the scope (its ``asked`` counts the block's ``interrupt()`` calls).
    """
    return _Entered(InterruptScope(call_id, tool_name, tuple(answers) if answers else (), source))


class _Entered:
    """Makes a scope current for a block (a plain context manager: the runner opens one per tool call)."""

    __slots__ = ("scope", "token")

    def __init__(self, scope: InterruptScope) -> None:
        self.scope = scope

    def __enter__(self) -> InterruptScope:
        self.token = _SCOPE.set(self.scope)
        return self.scope

    def __exit__(self, *exc_info: object) -> None:
        _SCOPE.reset(self.token)


def interrupt(value: object = None) -> Any:
    """
    Ask a human, from inside a tool (sync or async) or a ``before_tool`` hook, and return the answer.

    Without an answer yet, the call stops here (:class:`ToolInterrupt`): its effects are discarded and an ``Agent``
    with a checkpointer stops with ``exit_reason="interrupted"`` and the request in ``pending_interrupts``. On
    ``agent.resume(thread_id, answers=...)`` the call runs again from the start and this ``interrupt()`` returns the
    answer. The k-th ``interrupt()`` of a call returns the k-th answer.

    :param value: What to ask: anything the checkpoint codec can store (JSON types, dataclasses it knows, registered
        types), since it is stored with the thread and shown to the human.
    :returns: The human's answer.
    :raises ToolInterrupt: When there is no answer yet (let it propagate).
    :raises CodecError: If ``value`` cannot be stored by the checkpoint codec (checked before anything else).
    :raises RuntimeError: If called outside a tool call run by ``Agent``, ``ToolInvoker`` or ``run_tool_batch``
        (or outside an :func:`interrupt_scope`).
    """
    scope = _SCOPE.get()
    if scope is None:
        raise RuntimeError(
            "interrupt() was called outside a tool call. It works only inside a tool (or a before_tool hook) run by "
            "Agent, ToolInvoker or run_tool_batch, and in threads or tasks started from one with its context "
            "(contextvars.copy_context())."
        )
    try:
        encode(value, where="value")
    except CodecError as error:
        raise CodecError(
            f"interrupt() in tool '{scope.tool_name}': the value must be storable by the checkpoint codec, since it "
            f"is saved with the thread until a human answers. {error}"
        ) from error
    index = scope.next_index()
    if index < len(scope.answers):
        return scope.answers[index]
    raise ToolInterrupt(value, index, scope.call_id, scope.tool_name, scope.source)
