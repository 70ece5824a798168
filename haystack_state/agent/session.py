"""
Durable threads: loading a thread's State from a checkpointer and committing what each step changed.

A :class:`ThreadSession` is one run's handle on a thread. It loads the state at the thread's head (or at an earlier
checkpoint, to fork), and each ``commit`` writes only the changes the State journaled since the previous commit:
the items appended to list keys, the new values of replaced keys. Commits are optimistic: if another run committed
to the thread in between, ``ThreadConflictError`` is raised and nothing is written.

A run that did not finish (a crash, an error, an interrupt) leaves the thread *open*: its conversation ends with tool
calls whose results were never committed (*pending* calls), or its head is marked ``continues`` (the run committed
its input, or a step's tool results, and meant to go on). A later run with no new messages continues that run: it
keeps the run-scoped keys and the step count, and starts with the pending calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Literal, TypeVar

from haystack import logging
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state.errors import CheckpointError, ThreadBusyError, ThreadNotFoundError
from haystack_state.persistence.base import Checkpointer, conflict_error
from haystack_state.persistence.delta import Source, utc_now
from haystack_state.persistence.leases import LeaseKeeper, busy_error, new_owner
from haystack_state.persistence.records import CheckpointMeta, Lease, check_thread_id
from haystack_state.schema import FieldSpec
from haystack_state.state import State

__all__ = [
    "HOOK_ANSWERS",
    "REJECTED",
    "RUN_METADATA",
    "Call",
    "UNFINISHED_CALLS",
    "Continuation",
    "check_unfinished_calls",
    "UnfinishedCalls",
    "ThreadSession",
    "ThreadSnapshot",
    "apply_decisions",
    "before_request",
    "in_call_order",
    "pending_tool_calls",
    "plan_continuation",
    "unfinished_policy",
    "reset_run_scope",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

REJECTED = "A human reviewer rejected this tool call; it was not run."
#: The error result of a call closed by ``on_unfinished_calls="close"``: ``{why}`` says how its run stopped.
CLOSED = "This tool call was not run: the run that asked for it {why} before its tools ran, and the thread went on."

UnfinishedCalls = Literal["finish", "close", "refuse"]
"""
What a run with new messages does on a thread whose last run stopped with tool calls unanswered (a crash, or a
cancel, between the model's reply and its tools' results): ``"finish"`` runs them first, ``"close"`` answers them
with error results saying the run stopped, ``"refuse"`` raises ``ThreadBusyError``. Then the new messages are taken.
"""
UNFINISHED_CALLS: tuple[UnfinishedCalls, ...] = ("finish", "close", "refuse")

#: The checkpoint metadata that describes the run that wrote it: ``run_step`` (the model calls the run made so far),
#: ``usage`` (the token usage it summed so far), ``continues`` (the run meant to go on), ``interrupted`` and
#: ``pending`` (the ids of the calls waiting for ``Agent.resume``). A human ``update`` of an open thread carries them
#: over, so the run can still be continued.
RUN_METADATA = (
    "run_step",
    "run_start",
    "usage",
    "tool_call_counts",
    "continues",
    "interrupted",
    "pending",
    "interrupts",
    "answers",
)
#: The key, in the ``answers`` metadata, of the answers given to ``interrupt()`` calls of ``before_tool`` hooks.
HOOK_ANSWERS = "before_tool"


def _trailing_calls(messages: Sequence[ChatMessage]) -> list[ToolCall]:
    """
    The tool calls of the conversation's last step that have no result: those of the assistant message(s) that end
    the conversation, or, when some of their calls ran (an interrupt held the others), those of them whose results
    are not among the tool results that follow.
    """
    index = len(messages) - 1
    answered: set[str | None] = set()
    while index >= 0 and messages[index].is_from("tool"):
        result = messages[index].tool_call_result
        if result is not None:
            answered.add(result.origin.id)
        index -= 1
    calls: list[ToolCall] = []
    while index >= 0 and messages[index].is_from("assistant"):
        calls[:0] = messages[index].tool_calls
        index -= 1
    if not answered:
        return calls
    return [call for call in calls if call.id is not None and call.id not in answered]


def pending_tool_calls(state: State, head: CheckpointMeta | None) -> list[ToolCall]:
    """
    The tool calls whose results were never committed: those of the assistant message(s) that end the thread's
    conversation (a crash, an error or an interrupt came before the tools' checkpoint). Whatever the head's source:
    a human ``update`` on an interrupted thread leaves its calls pending.

    :param state: The thread's state at ``head``.
    :param head: The checkpoint the state was loaded from (None: a new thread, nothing is pending).
    :returns: The pending calls, in the order the model listed them (empty if none).
    """
    if head is None:
        return []
    return _trailing_calls(state.get("messages") or [])


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
            to_run.append(dataclasses.replace(call, arguments=dict(decision["arguments"])))  # keeps id and extra
        else:
            raise ValueError(
                f"resume: the decision for call '{call.id}' must be 'approve', 'reject' or {{'arguments': {{...}}}}, "
                f"got {decision!r}."
            )
    return ([ChatMessage.from_assistant(tool_calls=to_run)] if to_run else []), rejected


def before_request(call: ToolCall) -> dict[str, Any]:
    """The request of a call that waits for a decision before it runs (``interrupt_before``)."""
    return {
        "id": str(call.id),
        "kind": "before",
        "tool_name": call.tool_name,
        "call_id": call.id,
        "arguments": dict(call.arguments),
        "value": dict(call.arguments),
    }


def in_call_order(
    order: Sequence[str | None], executed: list[ChatMessage], rejected: Mapping[str, ChatMessage]
) -> list[ChatMessage]:
    """
    The tool results of the executed calls and the rejected ones, in the order the model listed the calls.

    :param order: The call ids, in the model's order.
    :param executed: The results of the calls that ran.
    :param rejected: The error results of the rejected calls, by call id.
    :returns: The results.
    """
    if not rejected:
        return executed
    by_id: dict[str | None, ChatMessage] = {
        m.tool_call_result.origin.id: m for m in executed if m.tool_call_result is not None
    }
    by_id.update(rejected)
    return [by_id[call_id] for call_id in order if call_id in by_id]


def reset_run_scope(state: State) -> None:
    """
    Start a new run on a thread: reset every ``"scope": "run"`` and ``"scope": "input"`` key to its default (or to
    no value). A key that already holds its default is left alone, so a run that changes nothing commits nothing.

    :param state: The thread's state.
    """
    for key, spec in state.specs.items():
        if spec.scope in ("run", "input") and _differs_from_default(state, spec):
            state.reset(key)


def _differs_from_default(state: State, spec: FieldSpec) -> bool:
    if not state.has(spec.key):
        return spec.has_default
    if not spec.has_default:
        return True
    try:
        return bool(state.get(spec.key) != spec.make_default())
    except Exception:  # an exotic __eq__: reset, to be safe
        return True


@dataclasses.dataclass(frozen=True)
class ThreadSnapshot:
    """
    A thread's state at one checkpoint, as ``Agent.get_state`` returns it.

    Reading it is cheap: ``values`` are shared with the checkpointer's cache and read-only, as a State's nested
    values are (lists and dicts raise ``TypeError`` if changed; haystack objects such as ``ChatMessage`` must not be
    changed in place). :meth:`to_state` gives a State of your own to work with.

    :param values: The state values (read-only).
    :param checkpoint: The checkpoint's record (id, parent, step, source, tool names, time, changed keys).
    :param pending_tool_calls: Tool calls of the last model reply whose results are not committed yet (after a
        crash or an interrupt).
    :param schema: The agent's field specs, for :meth:`to_state`.
    """

    values: dict[str, Any]
    checkpoint: CheckpointMeta
    pending_tool_calls: list[ToolCall]
    schema: Mapping[str, FieldSpec] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def interrupted(self) -> bool:
        """Whether the run stopped for a human (``interrupt_before``, ``interrupt_after``, ``interrupt()``) and waits
        for ``Agent.resume``."""
        if not self.checkpoint.metadata.get("interrupted"):
            return False
        return bool(self.pending_tool_calls) or any(r.get("kind") == "after" for r in self.interrupts)

    @property
    def interrupts(self) -> list[dict[str, Any]]:
        """
        The requests the interrupted run waits for: JSON-ready dicts with ``id`` (the key of ``resume``'s ``answers``;
        for ``"before"`` requests, the call id, the key of its ``decisions``), ``kind`` (``"before"``: a call held by
        ``interrupt_before``; ``"interrupt"``: a tool asked with ``interrupt(value)``; ``"hook"``: a ``before_tool``
        hook asked; ``"after"``: a result to review, ``interrupt_after``), ``tool_name``, ``call_id``, ``value`` (what
        was asked, the held call's arguments, or the result to review) and ``arguments``. Empty if the thread is not
        interrupted.
        """
        if not self.checkpoint.metadata.get("interrupted"):
            return []
        stored = self.checkpoint.metadata.get("interrupts")
        if isinstance(stored, list):
            return [dict(r) for r in stored if isinstance(r, Mapping)]
        return [before_request(call) for call in self.pending_tool_calls]

    def to_state(self) -> State:
        """
        A State holding these values, with the agent's schema: yours to read, change, ``diff`` or measure.

        :returns: The State.
        """
        schema = {key: spec.as_entry() for key, spec in self.schema.items()}
        return State(schema, {key: value for key, value in self.values.items() if key in schema})


#: One call a session makes on its checkpointer: the method's name (its async twin is ``"a" + name``), its
#: positional and its keyword arguments.
Call = tuple[str, tuple[Any, ...], dict[str, Any]]


class ThreadSession:
    """
    One run's handle on a thread. Open it with :meth:`open` (or ``await`` :meth:`open_async`), which loads the
    thread (refusing one a live run holds); :meth:`hold` takes the thread's lease once the run's inputs are checked
    and renews it from a background thread while the run works; :meth:`close` (or :meth:`aclose`) releases it. The
    I/O of opening, holding and committing is written once, as calls that the sync and async shells execute.

    :param checkpointer: Where the thread lives.
    :param thread_id: The thread.
    :param schema: The agent's field specs.
    """

    def __init__(self, checkpointer: Checkpointer, thread_id: str, schema: Mapping[str, FieldSpec]) -> None:
        self.checkpointer = checkpointer
        self.thread_id = check_thread_id(thread_id)
        self.schema = schema
        self.loaded: CheckpointMeta | None = None
        self.step = 0
        self.head_id: str | None = None
        self.parent_id: str | None = None
        #: The pending tool calls at the loaded checkpoint (see :func:`pending_tool_calls`).
        self.pending: list[ToolCall] = []
        self.lease: Lease | None = None
        self._guard: Lease | None = None
        self._wants_lease = False
        self._keeper: LeaseKeeper | None = None
        self._stop_requested = threading.Event()
        self._values: dict[str, Any] = {}

    @classmethod
    def open(
        cls,
        checkpointer: Checkpointer,
        thread_id: str,
        schema: Mapping[str, FieldSpec],
        checkpoint_id: str | None = None,
        *,
        lease: bool = True,
    ) -> ThreadSession:
        """
        Open a thread and load its head, or ``checkpoint_id`` to fork from it. With ``lease=True`` a thread a live
        run holds is refused at once, and :meth:`hold` takes the lease before the run's first effect.

        :param checkpointer: Where the thread lives.
        :param thread_id: The thread.
        :param schema: The agent's field specs.
        :param checkpoint_id: Load this checkpoint instead of the head; the first commit forks from it.
        :param lease: Take the thread's lease (with :meth:`hold`) and keep it until :meth:`close`.
        :returns: The session.
        :raises ThreadBusyError: If another run holds the thread's lease.
        :raises ValueError: For an invalid thread id.
        """
        session = cls(checkpointer, thread_id, schema)
        _call_sync(checkpointer, session._open_calls(checkpoint_id, lease))
        return session

    @classmethod
    async def open_async(
        cls,
        checkpointer: Checkpointer,
        thread_id: str,
        schema: Mapping[str, FieldSpec],
        checkpoint_id: str | None = None,
        *,
        lease: bool = True,
    ) -> ThreadSession:
        """:meth:`open`, awaiting the checkpointer's async methods."""
        session = cls(checkpointer, thread_id, schema)
        await _call_async(checkpointer, session._open_calls(checkpoint_id, lease))
        return session

    def _open_calls(self, checkpoint_id: str | None, lease: bool) -> Generator[Call, Any, None]:
        checkpoint = None
        if lease and checkpoint_id is None:
            # Refuse a thread a live run holds before doing anything (its lease and head are read together); the
            # lease itself is taken by :meth:`hold`, once the run's inputs are checked (a run refused for bad input
            # writes nothing at all). Read-only: the values are shared with the checkpointer's cache; a State copies
            # what it keeps, and a snapshot hands them out read-only.
            holder, checkpoint = yield ("open_thread", (self.thread_id,), {"read_only": True})
            self._want_lease(holder)
        else:
            if lease:
                self._want_lease((yield ("read_lease", (self.thread_id,), {})))
            # The first commit expects the head this session saw: the checkpoint it loaded (read as one, even if
            # another writer moves the head meanwhile), or for a fork the head read before the fork point. A commit
            # in between makes that commit fail with ThreadConflictError; nothing of it is silently dropped.
            if checkpoint_id is not None:
                self.head_id = yield ("head", (self.thread_id,), {})
            try:
                checkpoint = yield ("get", (self.thread_id, checkpoint_id), {"read_only": True})
            except ThreadNotFoundError:
                if checkpoint_id is not None:
                    raise
        if checkpoint is not None:
            if checkpoint_id is None:
                self.head_id = checkpoint.checkpoint_id
            self.loaded = checkpoint.meta
            self.step = checkpoint.meta.step
            self._values = checkpoint.values
        self.parent_id = self.loaded.checkpoint_id if self.loaded is not None else None
        self.pending = _trailing_calls(self._values.get("messages") or []) if self.loaded else []

    def _want_lease(self, holder: Lease | None) -> None:
        """Refuse a thread whose lease another run holds; otherwise take the lease at :meth:`hold`."""
        if holder is not None:
            raise busy_error(self.thread_id, holder.owner, holder.expires_at)
        self._wants_lease = True

    def hold(self) -> None:
        """
        Take the thread's lease for the run (before its first commit, model call or tool call) and keep renewing it
        from a background thread until :meth:`close`. Does nothing for a session opened with ``lease=False`` or
        already holding it.

        :raises ThreadBusyError: If another run took the thread since the session opened it.
        :raises ThreadConflictError: If another writer moved the thread's head since the session loaded it.
        """
        if self._wants_lease and self.lease is None:
            _call_sync(self.checkpointer, self._hold_calls())
            self._keep()

    async def hold_async(self) -> None:
        """:meth:`hold`, awaiting the checkpointer."""
        if self._wants_lease and self.lease is None:
            await _call_async(self.checkpointer, self._hold_calls())
            self._keep()

    def _hold_calls(self) -> Generator[Call, Any, None]:
        lease, head = yield ("hold_thread", (self.thread_id,), {})  # the lease, then the head as it is once held
        if head != self.head_id:
            yield ("release_lease", (lease,), {})
            raise conflict_error(self.thread_id, self.head_id, head)
        self.lease = lease

    def _keep(self) -> None:
        if self.lease is not None:
            self._keeper = LeaseKeeper(self.checkpointer, self.lease, on_stop=self._stop_requested.set)

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was asked of this session's run (``Agent.cancel``, from any process)."""
        return self._stop_requested.is_set()

    def guard_commits(self) -> None:
        """
        Without taking the thread's lease (nothing is written until a commit), make this session's commits fail with
        ``ThreadBusyError`` while another run holds it: for a short edit such as ``Agent.update_state``.
        """
        self._guard = Lease(self.thread_id, new_owner(), utc_now())

    def close(self) -> None:
        """Stop renewing the lease and release it (a new run may start on the thread at once). Idempotent."""
        lease = self._stop_keeping()
        if lease is not None:
            try:
                self.checkpointer.release_lease(lease)
            except CheckpointError as error:  # it expires on its own
                logger.warning(
                    "Could not release the lease on thread '{thread_id}': {error}",
                    thread_id=self.thread_id,
                    error=error,
                )

    async def aclose(self) -> None:
        """:meth:`close`, awaiting the checkpointer."""
        keeper, self._keeper = self._keeper, None
        lease, self.lease = self.lease, None
        if keeper is not None:
            lease = keeper.try_stop()  # (no thread hop, unless a renewal is under way: then wait for it there)
            if lease is None:
                lease = await asyncio.to_thread(keeper.stop)
        if lease is not None:
            try:
                await self.checkpointer.arelease_lease(lease)
            except CheckpointError as error:
                logger.warning(
                    "Could not release the lease on thread '{thread_id}': {error}",
                    thread_id=self.thread_id,
                    error=error,
                )

    def _stop_keeping(self) -> Lease | None:
        keeper, self._keeper = self._keeper, None
        lease, self.lease = self.lease, None
        if keeper is not None:
            lease = keeper.stop()
        return lease

    @property
    def is_new(self) -> bool:
        """Whether the thread had no checkpoint yet."""
        return self.loaded is None

    @property
    def interrupted(self) -> bool:
        """Whether the loaded checkpoint is a run stopped for a human (``interrupt_before``, ``interrupt_after``, or
        ``interrupt()`` in a tool or hook), waiting for ``Agent.resume``."""
        if self.loaded is None or not self.loaded.metadata.get("interrupted"):
            return False
        return bool(self.pending) or any(r.get("kind") == "after" for r in self.requests)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """
        The requests the interrupted run waits for (JSON-ready dicts: ``id``, ``kind`` (``"before"``, ``"interrupt"``,
        ``"hook"`` or ``"after"``), ``tool_name``, ``call_id``, ``value``, and ``arguments`` for calls), or [].
        """
        if self.loaded is None or not self.loaded.metadata.get("interrupted"):
            return []
        stored = self.loaded.metadata.get("interrupts")
        if isinstance(stored, list):
            return [dict(r) for r in stored if isinstance(r, Mapping) and isinstance(r.get("id"), str)]
        # A checkpoint written before in-tool interrupts: every pending call waits for a decision.
        return [before_request(call) for call in self.pending]

    @property
    def answers(self) -> dict[str, list[Any]]:
        """The answers the interrupted run was given so far, per tool call id (and ``HOOK_ANSWERS``)."""
        stored = self.loaded.metadata.get("answers") if self.loaded is not None else None
        if not isinstance(stored, Mapping):
            return {}
        return {str(k): list(v) for k, v in stored.items() if isinstance(v, list)}

    @property
    def continues(self) -> bool:
        """Whether the loaded checkpoint is an unfinished run: pending calls, or a run that meant to go on."""
        return bool(self.pending) or (self.loaded is not None and bool(self.loaded.metadata.get("continues")))

    @property
    def run_step(self) -> int:
        """The model calls the unfinished run at the loaded checkpoint made so far (0 if the run finished)."""
        value = self.loaded.metadata.get("run_step") if self.loaded is not None and self.continues else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    @property
    def run_usage(self) -> dict[str, Any]:
        """The token usage the unfinished run at the loaded checkpoint recorded so far (empty if it finished)."""
        value = self.loaded.metadata.get("usage") if self.loaded is not None and self.continues else None
        return dict(value) if isinstance(value, Mapping) else {}

    def run_metadata(self) -> dict[str, Any]:
        """The loaded checkpoint's :data:`RUN_METADATA`, for an ``update`` commit to carry over."""
        if self.loaded is None:
            return {}
        return {key: value for key, value in self.loaded.metadata.items() if key in RUN_METADATA}

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
        :raises ThreadBusyError: If this session's lease was lost to another run.
        :raises CodecError: If a value cannot be encoded (nothing is written; the changes stay journaled).
        """
        calls = self._commit_calls(state, source, tool_names, metadata, step)
        return self._committed(state, _call_sync(self.checkpointer, calls))

    async def commit_async(
        self,
        state: State,
        source: Source,
        *,
        tool_names: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> CheckpointMeta:
        """:meth:`commit`, awaiting the checkpointer."""
        calls = self._commit_calls(state, source, tool_names, metadata, step)
        return self._committed(state, await _call_async(self.checkpointer, calls))

    def _commit_calls(
        self,
        state: State,
        source: Source,
        tool_names: Sequence[str],
        metadata: dict[str, Any] | None,
        step: int | None,
    ) -> Generator[Call, Any, CheckpointMeta]:
        lease = self._keeper.lease if self._keeper is not None else self.lease or self._guard
        meta: CheckpointMeta = yield (
            "commit",
            (self.thread_id,),
            {
                "parent_id": self.parent_id,
                "expected_head": self.head_id,
                "delta": state.peek_changes(),
                "step": self.step if step is None else step,
                "source": source,
                "tool_names": tuple(tool_names),
                "metadata": metadata,
                "lease": lease,
                "frozen": True,  # a State's read-only values: the checkpointer's cache adopts them
            },
        )
        return meta

    def _committed(self, state: State, meta: CheckpointMeta) -> CheckpointMeta:
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
        return ThreadSnapshot(dict(self._values), self.loaded, list(self.pending), self.schema)


def _call_sync(checkpointer: Checkpointer, calls: Generator[Call, Any, T]) -> T:
    """Execute a session's calls with the checkpointer's sync methods; an error is thrown back into the calls."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            name, args, kwargs = calls.throw(error) if error is not None else calls.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            result, error = getattr(checkpointer, name)(*args, **kwargs), None
        except Exception as exc:
            result, error = None, exc


async def _call_async(checkpointer: Checkpointer, calls: Generator[Call, Any, T]) -> T:
    """Execute a session's calls with the checkpointer's async methods (``a`` + name)."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            name, args, kwargs = calls.throw(error) if error is not None else calls.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            result, error = await getattr(checkpointer, "a" + name)(*args, **kwargs), None
        except Exception as exc:
            result, error = None, exc


@dataclasses.dataclass
class Continuation:
    """
    How a run continues the thread's unfinished step (see :func:`plan_continuation`).

    :param calling: An assistant message holding the calls to run (approved, edited or waiting for no one), or [].
    :param rejected: The error results of the calls a human rejected, by call id.
    :param order: The pending calls' ids, in the model's order (the results are put in this order).
    :param answers: The answers to ``interrupt()`` calls so far, per call id (and :data:`HOOK_ANSWERS`).
    :param hooks: Whether the ``before_tool`` hooks run (again) before the calls.
    :param then_input: Whether the run's new messages are taken once the unfinished step is finished or closed
        (see :data:`UnfinishedCalls`), rather than at the start.
    """

    calling: list[ChatMessage]
    rejected: dict[str, ChatMessage]
    order: list[str | None]
    answers: dict[str, list[Any]]
    hooks: bool
    then_input: bool = False


def check_unfinished_calls(policy: Any, where: str) -> UnfinishedCalls | None:
    """An ``on_unfinished_calls`` value, checked: one of :data:`UNFINISHED_CALLS`, or None; else ValueError."""
    if policy is None or policy in UNFINISHED_CALLS:
        return policy  # type: ignore[no-any-return]
    raise ValueError(
        f"{where} on_unfinished_calls must be one of {', '.join(UNFINISHED_CALLS)} or None, got {policy!r}."
    )


def unfinished_policy(head: Mapping[str, Any] | None, policy: UnfinishedCalls | None) -> UnfinishedCalls:
    """
    The policy that applies to new messages on an unfinished thread: ``policy``, else ``"close"`` after a cancel
    (its head is marked ``cancelled``) and ``"finish"`` after a crash.

    :param head: The metadata of the thread's head checkpoint.
    :param policy: The run's or the Agent's policy, if any.
    """
    if policy is not None:
        return policy
    return "close" if head is not None and head.get("cancelled") else "finish"


def _closed(session: ThreadSession, calls: Sequence[ToolCall]) -> dict[str, ChatMessage]:
    cancelled = session.loaded is not None and bool(session.loaded.metadata.get("cancelled"))
    text = CLOSED.format(why="was cancelled" if cancelled else "stopped (its worker or process died)")
    return {
        str(call.id): ChatMessage.from_tool(tool_result=text, origin=call, error=True)
        for call in calls
        if call.id is not None
    }


def plan_continuation(
    session: ThreadSession,
    messages: Sequence[ChatMessage],
    decisions: Mapping[str, Any] | None,
    answers: Mapping[str, Any] | None = None,
    policy: UnfinishedCalls | None = None,
) -> Continuation | None:
    """
    Check a run against the thread's pending tool calls and interrupt requests, and plan how it continues, before
    anything is committed.

    :param session: The run's thread.
    :param messages: The run's new messages.
    :param decisions: ``Agent.resume``'s decisions on calls held by ``interrupt_before`` (and reviews of
        ``interrupt_after``), by call id; None for ``run``.
    :param answers: ``Agent.resume``'s answers to ``interrupt()`` requests (and reviews), by request id.
    :param policy: What new messages do on a thread whose last run stopped early (see :data:`UnfinishedCalls`);
        ``"close"`` after a cancel and ``"finish"`` after a crash if None. Without new messages, ``"close"`` answers
        the pending calls with error results instead of running them.
    :returns: None if nothing is pending; otherwise the :class:`Continuation`.
    :raises ThreadBusyError: With ``policy="refuse"``, if new messages come while the thread's last run has not
        finished (it stopped early): a ``ThreadConflictError``, so a caller that retries on conflicts retries.
    :raises ValueError: If the thread is interrupted and ``run`` was called (not ``resume``), if ``resume`` is called
        on a thread that is not interrupted, or for decisions and answers that do not fit the pending requests.
    """
    pending = session.pending
    names = ", ".join(sorted({call.tool_name for call in pending}))
    requests = session.requests if session.interrupted else []
    resuming = decisions is not None or answers is not None
    if session.interrupted and not resuming:
        where = f"before tool call(s) to {names}" if pending else "after a tool call"
        raise ValueError(
            f"Thread '{session.thread_id}' is interrupted {where}, waiting for {_describe(requests)}; continue it with "
            "agent.resume(thread_id, decisions={call_id: 'approve' | 'reject' | {'arguments': {...}}}, "
            "answers={interrupt_id: answer})."
        )
    order: list[str | None] = [call.id for call in pending]
    if messages and (pending or session.continues) and not resuming:
        chosen = unfinished_policy(session.loaded.metadata if session.loaded is not None else None, policy)
        if chosen == "refuse":
            unfinished = f"tool call(s) to {names} whose results are not committed" if pending else "an unfinished run"
            raise ThreadBusyError(
                f"Thread '{session.thread_id}' has {unfinished}: its last run stopped early (a crash or a cancel) and "
                "no run holds the thread now. Nothing was written. Finish that run first with "
                "agent.run(messages=[], thread_id=...) (over HTTP: a run with input null), or send the messages "
                "with on_unfinished_calls='finish' (run the calls first) or 'close' (answer them with errors) (over "
                "HTTP: config={'configurable': {'on_unfinished_calls': ...}})."
            )
        if chosen == "close":
            return Continuation([], _closed(session, pending), order, {}, False, then_input=True)
        calling = [ChatMessage.from_assistant(tool_calls=list(pending))] if pending else []
        return Continuation(calling, {}, order, {}, bool(pending), then_input=True)
    if resuming and not session.interrupted:
        hint = (
            f" Its pending tool call(s) to {names} come from a run that stopped early; agent.run(messages=[], "
            "thread_id=...) finishes them."
            if pending
            else ""
        )
        raise ValueError(f"Thread '{session.thread_id}' is not interrupted: there is nothing to resume.{hint}")
    if not resuming:
        if not pending:
            return None
        if policy == "close":
            return Continuation([], _closed(session, pending), order, {}, False)
        return Continuation([ChatMessage.from_assistant(tool_calls=list(pending))], {}, order, {}, True)
    for name, given in (("decisions", decisions), ("answers", answers)):
        if given is not None and not isinstance(given, Mapping):
            raise ValueError(f"resume: {name} must be a dict, got {type(given).__name__}.")
    decided = dict(decisions or {})
    answered = dict(answers or {})
    _check_resume(requests, decided, answered)
    # Calls held before they ran get their decision; the others (asked from inside, or waiting for those) run as
    # they are, with the answers so far.
    before_ids = {r["call_id"] for r in requests if r["kind"] == "before"}
    held = [call for call in pending if call.id in before_ids]
    approved, rejected = apply_decisions(held, {k: v for k, v in decided.items() if k in before_ids})
    replaced = {call.id: call for message in approved for call in message.tool_calls}
    to_run = [replaced.get(call.id, call) for call in pending if call.id not in rejected]
    to_run = [call for call in to_run if call.id not in before_ids or call.id in replaced]
    # A call that asked from inside runs again with the arguments it ran with (a human may have edited them before).
    ran_with = {
        r["call_id"]: r["arguments"]
        for r in requests
        if r["kind"] == "interrupt" and isinstance(r.get("arguments"), dict)
    }
    to_run = [dataclasses.replace(c, arguments=dict(ran_with[c.id])) if c.id in ran_with else c for c in to_run]
    given = session.answers
    hooks = False
    for request in requests:
        if request["kind"] not in ("interrupt", "hook"):
            continue
        key = HOOK_ANSWERS if request["kind"] == "hook" else str(request["call_id"])
        index = request.get("index")
        so_far = given.get(key, [])
        if isinstance(index, int) and 0 <= index <= len(so_far):
            so_far = so_far[:index]
        given[key] = [*so_far, answered[request["id"]]]
        hooks = hooks or request["kind"] == "hook"
    calling = [ChatMessage.from_assistant(tool_calls=to_run)] if to_run else []
    return Continuation(calling, rejected, order, given, hooks)


def _describe(requests: Sequence[Mapping[str, Any]]) -> str:
    if not requests:
        return "a human"
    return ", ".join(f"{r['kind']} '{r['id']}' ({r.get('tool_name')})" for r in requests)


def _check_resume(requests: list[dict[str, Any]], decisions: dict[str, Any], answers: dict[str, Any]) -> None:
    """Every request has a decision or an answer of the right kind, and nothing else is given; else ValueError."""
    needs_decision = [str(r["call_id"]) for r in requests if r["kind"] == "before"]
    needs_answer = [r["id"] for r in requests if r["kind"] in ("interrupt", "hook")]
    reviews = {r["id"]: str(r["call_id"]) for r in requests if r["kind"] == "after"}
    problems = []
    missing = [i for i in needs_decision if i not in decisions]
    missing += [i for i in needs_answer if i not in answers]
    missing += [i for i, call_id in reviews.items() if i not in answers and call_id not in decisions]
    if missing:
        problems.append(f"no decision or answer for pending request(s) {missing}")
    unknown_decisions = sorted(str(k) for k in decisions if k not in needs_decision and k not in reviews.values())
    unknown_answers = sorted(str(k) for k in answers if k not in needs_answer and k not in reviews)
    if unknown_decisions:
        problems.append(f"decisions name unknown call id(s) {unknown_decisions}")
    if unknown_answers:
        problems.append(f"answers name unknown interrupt id(s) {unknown_answers}")
    if problems:
        raise ValueError(f"resume: {'; '.join(problems)}. Pending: {_describe(requests)}. Nothing was written.")
