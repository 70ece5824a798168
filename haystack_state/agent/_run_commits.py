"""
The checkpoints of a run: when the loop commits (after the inputs, each model reply, each step's tool results, and at
the end if hooks changed the state), the metadata each checkpoint records about the run (its step, usage, tool call
counts, interrupt requests, loaded keys, retries), and the run's stop when it fails. Without a thread, the changes
are streamed where a checkpoint would be committed. :class:`RunCommits` is composed into
:class:`~haystack_state.agent._loop.AgentRun`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from haystack import logging

from haystack_state._driver import Flow, perform
from haystack_state.agent._effects import Commit, Effect
from haystack_state.agent._run_events import emit_state_changes
from haystack_state.agent._session import ThreadSession
from haystack_state.agent._spans import span
from haystack_state.agent.events import CheckpointCommitted
from haystack_state.errors import ThreadConflictError
from haystack_state.persistence.delta import Source

if TYPE_CHECKING:
    from haystack_state.agent._loop import AgentRun

__all__ = ["RunCommits"]

logger = logging.getLogger(__name__)


class RunCommits:
    """
    The commits of one run (see the module docstring).

    :param run: The run.
    """

    def __init__(self, run: AgentRun) -> None:
        self.run = run
        self.loaded: list[str] = []  # the "loaded" keys computed for this run, until a checkpoint records them
        #: The retried model and tool calls (a retry policy's), until a checkpoint records them (``retries``).
        self.retries: list[dict[str, object]] = []

    def commit(
        self,
        source: Source,
        tool_names: Sequence[str] = (),
        *,
        continues: bool = False,
        force: bool = False,
        **extra: object,
    ) -> Iterable[Effect]:
        """Commit a checkpoint (an ``input`` or ``update`` one only if the state changed, unless ``force``)."""
        run = self.run
        session, state, sink = run.session, run.state, run.request.sink
        if session is None:
            if sink is not None:  # no checkpoint: the changes are streamed where one would be committed
                emit_state_changes(sink, state.peek_changes(transient=True))
                state.drain_changes()
            return ()
        if source in ("input", "update") and not force and not state.has_changes():
            return ()  # nothing to do: no generator to make
        return self._commit(session, source, tool_names, continues=continues, extra=extra)

    def metadata(self, *, continues: bool, extra: dict[str, object]) -> dict[str, Any]:
        """What a checkpoint records about the run (see ``RUN_METADATA``); the loaded keys and retries are taken."""
        run = self.run
        values = run.state.run_values
        metadata: dict[str, Any] = {"run_step": run.step, "run_start": run.run_start, **extra}
        if run.request.run_id is not None:
            metadata["run_id"] = run.request.run_id
        if values["token_usage"]:
            metadata["usage"] = values["token_usage"]
        if any(values["tool_call_counts"].values()):
            metadata["tool_call_counts"] = {k: v for k, v in values["tool_call_counts"].items() if v}
        if continues:
            metadata["continues"] = True
        if run.requests:
            metadata.update(
                interrupted=True, pending=[call.id for call in run.waiting], interrupts=run.pending_requests()
            )
            if run.answers:
                metadata["answers"] = run.answers
        if self.loaded:
            metadata["loaded"] = self.loaded
            self.loaded = []
        if self.retries:
            metadata["retries"] = self.retries
            self.retries = []
        return metadata

    def _commit(
        self,
        session: ThreadSession,
        source: Source,
        tool_names: Sequence[str],
        *,
        continues: bool,
        extra: dict[str, object],
    ) -> Flow[None]:
        run = self.run
        state = run.state
        metadata = self.metadata(continues=continues, extra=extra)
        tags = {"haystack_state.thread_id": session.thread_id, "haystack_state.checkpoint.source": source}
        sink = run.request.sink
        delta = state.peek_changes(transient=True) if sink is not None else None
        with span("haystack_state.checkpoint.commit", tags) as commit_span:
            meta = yield from perform(
                Commit(session, state, source, tuple(tool_names), metadata, run.base_step + run.step)
            )
            commit_span.set_tag("haystack_state.checkpoint.id", meta.checkpoint_id)
        if sink is not None and delta is not None:
            emit_state_changes(sink, delta)
            sink.emit(CheckpointCommitted, checkpoint_id=meta.checkpoint_id, step=meta.step, source=meta.source)

    def record_stop(self, error: Exception) -> Flow[None]:
        """
        The run ends here, in this process: record that on the thread, so that a new run may start on it. (A crashed
        run cannot do this: its thread stays marked until agent.run([], thread_id=...) finishes it.) Tool calls left
        pending by a failed tool stay pending; so does a thread another run has taken.
        """
        session = self.run.session
        if (
            session is None
            or isinstance(error, ThreadConflictError)
            or isinstance(error.__cause__, ThreadConflictError)
        ):
            return
        try:
            yield from self.commit("update", force=True, stopped=str(error)[:500])
        except Exception as exc:  # the original failure is what the caller must see
            logger.warning(
                "Agent: could not record on thread '{thread_id}' that the run stopped: {error}",
                thread_id=session.thread_id,
                error=exc,
            )
