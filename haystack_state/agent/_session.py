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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack

from haystack import logging
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state._driver import Flow, Op, perform, run_flow, run_flow_async
from haystack_state._schema import FieldSpec
from haystack_state.agent.protocols import InterruptRequest
from haystack_state.errors import CheckpointError, ThreadNotFoundError
from haystack_state.persistence._leases import LeaseKeeper, busy_error, new_owner
from haystack_state.persistence.base import Checkpointer, conflict_error
from haystack_state.persistence.delta import Source, utc_now
from haystack_state.persistence.records import CheckpointMeta, Lease, check_thread_id
from haystack_state.state import State

__all__ = [
    "RUN_METADATA",
    "CheckpointerCall",
    "ThreadSession",
    "ThreadSnapshot",
    "before_request",
    "pending_tool_calls",
    "reset_run_scope",
]

logger = logging.getLogger(__name__)
R = TypeVar("R")
P = ParamSpec("P")

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


def before_request(call: ToolCall) -> InterruptRequest:
    """The request of a call that waits for a decision before it runs (``interrupt_before``)."""
    return InterruptRequest(str(call.id), "before", call.tool_name, call.id, dict(call.arguments), dict(call.arguments))


def _requests(stored: Sequence[object]) -> list[InterruptRequest]:
    """The stored requests (see :meth:`InterruptRequest.to_dict`) that can be read."""
    requests = []
    for item in stored:
        if isinstance(item, Mapping):
            try:
                requests.append(InterruptRequest.from_dict(item))
            except ValueError:  # not a request of a known kind: nothing to answer
                continue
    return requests


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
        return bool(self.pending_tool_calls) or any(r.kind == "after" for r in _requests(self.interrupts))

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
        return [before_request(call).to_dict() for call in self.pending_tool_calls]

    def to_state(self) -> State:
        """
        A State holding these values, with the agent's schema: yours to read, change, ``diff`` or measure.

        :returns: The State.
        """
        schema = {key: spec.as_entry() for key, spec in self.schema.items()}
        return State(schema, {key: value for key, value in self.values.items() if key in schema})


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointerCall(Op[R]):
    """
    One call a session makes on its checkpointer, as an operation of its flows: the sync method and its async twin,
    their arguments bound (``functools.partial``). :func:`run_flow` runs ``call``, :func:`run_flow_async` awaits
    ``acall``.
    """

    call: Callable[[], R]
    acall: Callable[[], Awaitable[R]]


def _on(method: Callable[P, R], amethod: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> Flow[R]:
    """Call a checkpointer method (``method`` under :func:`run_flow`, its async twin under :func:`run_flow_async`)."""
    return perform(CheckpointerCall(partial(method, *args, **kwargs), partial(amethod, *args, **kwargs)))


def _run(op: CheckpointerCall[object]) -> object:
    return op.call()


def _arun(op: CheckpointerCall[object]) -> Awaitable[object]:
    return op.acall()


class CommitOptions(TypedDict, total=False):
    """
    What a :meth:`ThreadSession.commit` records beside the State's changes.

    :param tool_names: The tools whose results the checkpoint records.
    :param metadata: Free-form metadata (what an Agent's run writes is documented by ``CheckpointMetadata``).
    :param step: The thread's step (defaults to the session's).
    """

    tool_names: Sequence[str]
    metadata: dict[str, Any] | None
    step: int | None


class ThreadSession:
    """
    One run's handle on a thread: ``ThreadSession(checkpointer, thread_id, schema).open()`` (or ``await``
    :meth:`open_async`) loads the thread (refusing one a live run holds); :meth:`hold` takes the thread's lease once
    the run's inputs are checked and renews it from a background thread while the run works; :meth:`close` (or
    :meth:`aclose`) releases it. Opening and holding are written once, as flows of :class:`CheckpointerCall`
    operations that :func:`~haystack_state._driver.run_flow` and :func:`~haystack_state._driver.run_flow_async` run.

    :param checkpointer: Where the thread lives.
    :param thread_id: The thread.
    :param schema: The agent's field specs.
    :raises ValueError: For an invalid thread id.
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

    def open(self, checkpoint_id: str | None = None, *, lease: bool = True) -> ThreadSession:
        """
        Load the thread's head, or ``checkpoint_id`` to fork from it (``ThreadSession(...).open()``). With
        ``lease=True`` a thread a live run holds is refused at once, and :meth:`hold` takes the lease before the
        run's first effect.

        :param checkpoint_id: Load this checkpoint instead of the head; the first commit forks from it.
        :param lease: Take the thread's lease (with :meth:`hold`) and keep it until :meth:`close`.
        :returns: The session.
        :raises ThreadBusyError: If another run holds the thread's lease.
        """
        run_flow(self._open_calls(checkpoint_id, lease), _run)
        return self

    async def open_async(self, checkpoint_id: str | None = None, *, lease: bool = True) -> ThreadSession:
        """:meth:`open`, awaiting the checkpointer's async methods."""
        await run_flow_async(self._open_calls(checkpoint_id, lease), _arun)
        return self

    def _open_calls(self, checkpoint_id: str | None, lease: bool) -> Flow[None]:
        cp, thread_id = self.checkpointer, self.thread_id
        checkpoint = None
        if lease and checkpoint_id is None:
            # Refuse a thread a live run holds before doing anything (its lease and head are read together); the
            # lease itself is taken by :meth:`hold`, once the run's inputs are checked (a run refused for bad input
            # writes nothing at all). Read-only: the values are shared with the checkpointer's cache; a State copies
            # what it keeps, and a snapshot hands them out read-only.
            holder, checkpoint = yield from _on(cp.open_thread, cp.aopen_thread, thread_id, read_only=True)
            self._want_lease(holder)
        else:
            if lease:
                self._want_lease((yield from _on(cp.read_lease, cp.aread_lease, thread_id)))
            # The first commit expects the head this session saw: the checkpoint it loaded (read as one, even if
            # another writer moves the head meanwhile), or for a fork the head read before the fork point. A commit
            # in between makes that commit fail with ThreadConflictError; nothing of it is silently dropped.
            if checkpoint_id is not None:
                self.head_id = yield from _on(cp.head, cp.ahead, thread_id)
            try:
                checkpoint = yield from _on(cp.get, cp.aget, thread_id, checkpoint_id, read_only=True)
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
            run_flow(self._hold_calls(), _run)
            self._keep()

    async def hold_async(self) -> None:
        """:meth:`hold`, awaiting the checkpointer."""
        if self._wants_lease and self.lease is None:
            await run_flow_async(self._hold_calls(), _arun)
            self._keep()

    def _hold_calls(self) -> Flow[None]:
        cp = self.checkpointer
        # the lease, then the head as it is once held
        lease, head = yield from _on(cp.hold_thread, cp.ahold_thread, self.thread_id)
        if head != self.head_id:
            yield from _on(cp.release_lease, cp.arelease_lease, lease)
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
        return bool(self.pending) or any(r.kind == "after" for r in self.requests)

    @property
    def requests(self) -> list[InterruptRequest]:
        """
        The requests the interrupted run waits for (see :class:`InterruptRequest`), or [].
        """
        if self.loaded is None or not self.loaded.metadata.get("interrupted"):
            return []
        stored = self.loaded.metadata.get("interrupts")
        if isinstance(stored, list):
            return _requests(stored)
        # A checkpoint written before in-tool interrupts: every pending call waits for a decision.
        return [before_request(call) for call in self.pending]

    @property
    def answers(self) -> dict[str, list[object]]:
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

    def commit(self, state: State, source: Source, **options: Unpack[CommitOptions]) -> CheckpointMeta:
        """
        Commit what ``state`` changed since the last commit as a checkpoint of the thread.

        :param state: The run's State.
        :param source: What produced the changes: ``"input"``, ``"model"``, ``"tools"`` or ``"update"``.
        :param options: What the checkpoint records beside the changes (see :class:`CommitOptions`).
        :returns: The checkpoint's record.
        :raises ThreadConflictError: If another run committed to the thread since this session last did.
        :raises ThreadBusyError: If this session's lease was lost to another run.
        :raises CodecError: If a value cannot be encoded (nothing is written; the changes stay journaled).
        """
        return self._committed(
            state, self.checkpointer.commit(self.thread_id, **self._commit_args(state, source, options))
        )

    async def commit_async(self, state: State, source: Source, **options: Unpack[CommitOptions]) -> CheckpointMeta:
        """:meth:`commit`, awaiting the checkpointer."""
        args = self._commit_args(state, source, options)
        return self._committed(state, await self.checkpointer.acommit(self.thread_id, **args))

    def _commit_args(self, state: State, source: Source, options: CommitOptions) -> dict[str, Any]:
        """The keyword arguments of ``Checkpointer.commit`` (and ``acommit``) for a commit of ``state``."""
        step = options.get("step")
        return {
            "parent_id": self.parent_id,
            "expected_head": self.head_id,
            "delta": state.peek_changes(),
            "step": self.step if step is None else step,
            "source": source,
            "tool_names": tuple(options.get("tool_names", ())),
            "metadata": options.get("metadata"),
            "lease": self._keeper.lease if self._keeper is not None else self.lease or self._guard,
            "frozen": True,  # a State's read-only values: the checkpointer's cache adopts them
        }

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
