"""
The exceptions raised by haystack-state.

Every error names its subject (the key, tool, parameter, thread or checkpoint at fault) and, where one
exists, the fix. Each class also derives from the built-in exception that haystack-ai raises in the same
situation, so ``except ValueError`` and ``except TypeError`` written for haystack-ai keep working.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from haystack.components.agents.tool_calling import ToolNotFoundException as HaystackToolNotFoundException
from haystack.tools.errors import SchemaGenerationError
from haystack.tools.errors import ToolInvocationError as HaystackToolInvocationError

from haystack_state._text import find_bad_text, shown


class HaystackStateError(Exception):
    """Base class of every error raised by haystack-state."""


# --- State -----------------------------------------------------------------------------------------


class StateSchemaError(HaystackStateError, ValueError):
    """
    A state schema is invalid. Raised at construction, listing every problem of the schema at once.

    :param problems: One human-readable sentence per problem, each naming the key at fault.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"Invalid state schema ({len(self.problems)} problem(s)):\n{lines}")


class UnknownStateKeyError(HaystackStateError, ValueError):
    """A key that the state schema does not declare was read, written or reset."""

    def __init__(self, key: str, known: list[str]) -> None:
        self.key = key
        self.known = sorted(known)
        super().__init__(f"State: Key '{key}' not found in schema. Known keys: {', '.join(self.known)}.")


class StateTypeError(HaystackStateError, TypeError):
    """A value written to the state does not match the type its key declares. The state is unchanged."""

    def __init__(self, key: str, expected: str, value: object, detail: str = "") -> None:
        self.key = key
        self.expected = expected
        self.value = value
        received = type(value).__name__
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        message = f"State key '{key}' expects {expected}, got {received} ({shown})."
        if detail:
            message += f" {detail}"
        super().__init__(message)


class ReadOnlyStateKeyError(HaystackStateError, ValueError):
    """A key that is read-only during an Agent run (``"scope": "input"``) was written. The state is unchanged."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        super().__init__(f"State key '{key}' is read-only: {reason}")


class StateHandlerError(HaystackStateError, RuntimeError):
    """A merge handler raised while merging a value into a key. The state is unchanged."""

    def __init__(self, key: str, handler: str, cause: BaseException) -> None:
        self.key = key
        self.handler = handler
        super().__init__(
            f"Handler '{handler}' failed while merging into state key '{key}': {type(cause).__name__}: {cause}. "
            "The state is unchanged."
        )


class StateSerializationError(HaystackStateError, ValueError):
    """A serialized state (``State.from_dict`` input) is malformed."""


class UnstorableValueError(StateTypeError):
    """
    A value the State cannot keep: it cannot be copied (a database connection, a lock, a socket, an open file, a
    generator), or it is the run's ``RunContext``. The State keeps a private copy of every value it holds and
    checkpoints store it as JSON, so live objects belong in the run's context instead: pass them as
    ``run(..., context=obj)`` and read them in a tool through a parameter annotated ``RunContext[T]`` (``ctx.deps``).
    The state is unchanged. The copy's error, if there was one, is the ``__cause__``.

    :param key: The state key written, or None when the value is frozen outside a State write.
    :param value: The value that cannot be stored (the part of it that failed, for a container).
    :param reason: Why it cannot be stored.
    """

    def __init__(self, key: str | None, value: object, reason: str) -> None:
        kind = type(value)
        self.key = key  # type: ignore[assignment]  # None only before a State names the key
        self.expected = "a value that can be copied and stored"
        self.value = value
        self.reason = reason
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        subject = f"State key '{key}' cannot hold" if key is not None else "The State cannot hold"
        HaystackStateError.__init__(
            self,
            f"{subject} a {name}: {reason} Pass live objects such as connections, clients and locks as "
            "run(..., context=obj), and read them in a tool through a parameter annotated RunContext[T] (ctx.deps).",
        )

    def for_key(self, key: str, whole: object = None) -> UnstorableValueError:
        """
        The same error, naming the state key that was written.

        :param key: The key.
        :param whole: The whole value written to the key (text errors use it to name where the text is).
        :returns: A new error.
        """
        return UnstorableValueError(key, self.value, self.reason)


class UnstorableTextError(UnstorableValueError):
    """
    Text that cannot be stored: a string (a value, a dict key, a dataclass field, however deep) holding a lone
    surrogate, a code point between U+D800 and U+DFFF that is half of a UTF-16 pair rather than a character (JSON's
    ``"\\ud800"`` escape decodes to one). Every backend stores text as UTF-8, which cannot encode it. Raised by State
    writes and by checkpointer commits before anything is written: the state and the storage are unchanged.

    :param key: The state key written, or None when there is none yet (or the text is not a state value).
    :param problem: What is wrong (``"lone surrogate '\\ud800' at position 3 is not valid Unicode text"``).
    :param path: Where in the value the text is (``"[2].text"``), or "" for the value itself.
    :param subject: What holds the text when it is not a state key (``"The checkpoint metadata"``).
    :param value: The string at fault.
    """

    def __init__(
        self, key: str | None, problem: str, *, path: str = "", subject: str | None = None, value: object = None
    ) -> None:
        self.key = key  # type: ignore[assignment]  # None only before a State names the key
        self.expected = "text that is valid Unicode"
        self.value = value
        self.reason = problem
        self.path = path
        self.subject = subject
        if subject is None:
            subject = f"State key {_named(key)}" if key is not None else "The State"
        at = f" at {path}" if path else ""
        HaystackStateError.__init__(
            self,
            f"{subject} cannot hold the text{at}: {problem}. Text is stored as UTF-8, which cannot encode it; "
            "replace the character (for example with U+FFFD, '\\ufffd') or leave it out.",
        )

    def for_key(self, key: str, whole: object = None) -> UnstorableTextError:
        """
        The same error, naming the state key that was written, and where in its value the text is.

        :param key: The key.
        :param whole: The whole value written to the key, searched for the text.
        :returns: A new error.
        """
        found = find_bad_text(whole) if whole is not None else None
        if found is None:
            return UnstorableTextError(key, self.reason, path=self.path, value=self.value)
        return UnstorableTextError(key, found.problem, path=found.python_path(), value=self.value)


def _named(key: str) -> str:
    return f"'{key}'" if key.isprintable() else shown(key)


# --- Tools -----------------------------------------------------------------------------------------


class ToolDefinitionError(HaystackStateError, ValueError, SchemaGenerationError):
    """
    A tool definition is invalid. Raised when the tool is created, listing every problem at once.

    It is a ``ValueError`` and a haystack-ai ``SchemaGenerationError``: haystack-ai raises the one or the other for
    the same mistakes, so code catching either keeps working.

    :param tool_name: The name of the tool at fault.
    :param problems: One human-readable sentence per problem.
    """

    def __init__(self, tool_name: str, problems: list[str]) -> None:
        self.tool_name = tool_name
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"Invalid tool '{tool_name}' ({len(self.problems)} problem(s)):\n{lines}")


class ToolInvocationError(HaystackStateError, HaystackToolInvocationError):
    """
    A tool call failed. Raised by ``ToolInvoker`` and ``Agent`` when failures are not sent back to the model.

    It is also a haystack-ai ``haystack.tools.errors.ToolInvocationError``, so ``except`` blocks written for
    haystack-ai's Agent catch it.

    :param tool_name: The tool that was called (as named by the model).
    :param message: What went wrong.
    """

    def __init__(self, tool_name: str, message: str) -> None:
        Exception.__init__(self, message)  # haystack's __init__ takes (message, tool_name): set both here
        self.tool_name = tool_name
        self.state: Any = None  # set by Agent: the State as it was when the call failed

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.tool_name, str(self)), {"state": self.state}


class ToolNotFoundError(ToolInvocationError, HaystackToolNotFoundException):
    """
    The model called a tool that is not available (or sent a tool name that is not a string). Also a haystack-ai
    ``ToolNotFoundException``, which its Agent raises in the same case.
    """


class ToolArgumentsError(ToolInvocationError):
    """The model's arguments are not valid JSON, are hostile (too deep, too large, not storable) or do not match the
    tool's parameters."""


class ToolExecutionError(ToolInvocationError):
    """The tool itself raised."""


class ToolMergeError(ToolInvocationError, RuntimeError):
    """
    The tool's result could not be merged into the state (a handler or a type check failed). Also a
    ``RuntimeError``, which haystack-ai's Agent raises in the same case.
    """


class ToolCallLimitError(ToolInvocationError):
    """A model reply asked for more tool calls than ``max_tool_calls``: the calls past the limit did not run."""


class ToolTimeoutError(ToolInvocationError):
    """
    A tool call did not finish within its timeout. Its result and its State writes are discarded, even if it finishes
    later; an async tool is cancelled, a sync one is abandoned in its worker thread.

    :param tool_name: The tool.
    :param timeout: The timeout, in seconds.
    """

    def __init__(self, tool_name: str, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(
            tool_name,
            f"Tool '{tool_name}' timed out after {timeout:g} s; its result and state writes were discarded.",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.tool_name, self.timeout), {"state": self.state}


class ToolInterruptedError(ToolInvocationError):
    """
    A tool called ``interrupt(value)`` to ask a human, and the runner has no answer to give (``ToolInvoker``, or
    ``run_tool_calls`` without ``answers``). Only an ``Agent`` with a checkpointer can stop, wait for the answer and
    resume; with ``ToolInvoker``, pass the answers up front as ``answers={call_id: [answer, ...]}``. The call merged
    nothing.

    :param tool_name: The tool.
    :param message: What happened.
    :param call_id: The id of the tool call.
    :param value: What the tool asked (the ``interrupt`` value).
    :param index: Which of the call's ``interrupt()`` calls it was, from 0.
    """

    def __init__(self, tool_name: str, message: str, *, call_id: str | None, value: object, index: int) -> None:
        super().__init__(tool_name, message)
        self.call_id = call_id
        self.value = value
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_interrupted, (self.tool_name, str(self), self.call_id, self.value, self.index, self.state)


# --- Agent -----------------------------------------------------------------------------------------


class AgentRunError(HaystackStateError):
    """
    An Agent run failed part-way. Carries the partial state, so nothing the run computed is lost.

    :param message: What went wrong.
    :param state: The State as it was when the run failed.
    """

    def __init__(self, message: str, state: Any) -> None:
        self.state = state
        super().__init__(message)


# --- Persistence -----------------------------------------------------------------------------------


class CheckpointError(HaystackStateError):
    """Base class of the errors of checkpointers and the codec."""


class ThreadNotFoundError(CheckpointError, KeyError):
    """A thread id that the checkpointer does not hold."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"Thread '{thread_id}' has no checkpoints.")

    def __str__(self) -> str:
        return str(self.args[0])


class CheckpointNotFoundError(CheckpointError, KeyError):
    """A checkpoint id that the thread does not hold."""

    def __init__(self, thread_id: str, checkpoint_id: str) -> None:
        self.thread_id = thread_id
        self.checkpoint_id = checkpoint_id
        super().__init__(f"Thread '{thread_id}' has no checkpoint '{checkpoint_id}'.")

    def __str__(self) -> str:
        return str(self.args[0])


class ThreadConflictError(CheckpointError):
    """Another run committed to the same thread first (optimistic versioning). Nothing of this commit was written."""


class ThreadBusyError(ThreadConflictError, ValueError):
    """
    A run was started on a thread that another run holds (its lease is live), or with new messages on a thread whose
    last run has not finished (it stopped early: a crash, an error). Nothing of the new run was written. Retry later;
    if the last run stopped, finish it first with ``agent.run(messages=[], thread_id=...)``.

    :param message: What happened.
    :param holder: The owner of the live lease on the thread, if that is the reason.
    :param expires_at: When that lease expires unless its holder renews it (a timezone-aware UTC datetime).
    """

    def __init__(self, message: str, *, holder: str | None = None, expires_at: datetime | None = None) -> None:
        self.holder = holder
        self.expires_at = expires_at
        super().__init__(message)


class CheckpointStorageError(CheckpointError):
    """
    The storage under a checkpointer failed (a full disk, a read-only or deleted file, a lost database connection).
    The message names the thread and the operation; the driver's error is the ``__cause__``. A commit that raises
    this was not written, unless the message says its outcome is unknown.
    """


class CodecError(CheckpointError, ValueError):
    """A value cannot be encoded to, or decoded from, stored JSON."""


# --- Long-term memory store ------------------------------------------------------------------------


class StoreError(HaystackStateError):
    """
    A long-term memory store failed: its storage (a locked or deleted file, a lost database connection; the driver's
    error is the ``__cause__``), unreadable stored data, or a closed store. The message names the operation, the
    namespace and the key.
    """


class StoreInputError(StoreError, ValueError):
    """
    A namespace, key, value, filter or paging argument given to a store is invalid. The message names it; nothing
    was read or written.
    """


def _rebuild_interrupted(
    tool_name: str, message: str, call_id: str | None, value: object, index: int, state: object
) -> ToolInterruptedError:
    error = ToolInterruptedError(tool_name, message, call_id=call_id, value=value, index=index)
    error.state = state
    return error
