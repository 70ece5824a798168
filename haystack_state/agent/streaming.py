"""
``Agent.stream`` and ``Agent.stream_async``: a run as a stream of live events (see
:mod:`haystack_state.agent.events`), as a mixin of :class:`haystack_state.agent.Agent`.

Events cost only when someone listens: a plain ``run`` has no sink, and the loop makes no event. A stream runs the
loop with a sink that queues events for the consumer: ``stream`` drives the run in a worker thread (so that model
chunks arrive while the model call is under way), ``stream_async`` in a task of the caller's event loop.

The consumer may stop early: breaking out of the iteration cancels the run before its next effect (a model call, a
tool batch, a hook, a commit). What was committed stands, and the thread can be continued with
``agent.run([], thread_id=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.tools.tool import Tool
from haystack.tools.toolset import Toolset
from haystack.tools.utils import warm_up_tools, warm_up_tools_async

from haystack_state.agent.drive import Effects, RunCancelled, drive, drive_async
from haystack_state.agent.events import AgentEvent, EventSink, ModelChunk, RunFailed, RunFinished
from haystack_state.agent.loop import Effect, LoopConfig, RunControl, RunRequest, agent_loop
from haystack_state.agent.session import ThreadSession, UnfinishedCalls

if TYPE_CHECKING:
    from haystack_state.agent.toolbox import ToolsArg

__all__ = ["RunOptions", "StreamMethods", "model_callback", "runtime_tools"]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The per-run options of ``run``, ``resume`` and ``stream``, besides the messages and the state inputs."""

    streaming_callback: StreamingCallbackT | None = None
    thread_id: str | None = None
    checkpoint_id: str | None = None
    generation_kwargs: dict[str, Any] | None = None
    tools: ToolsArg | list[str] | None = None
    hook_context: dict[str, Any] | None = None
    decisions: dict[str, Any] | None = None
    context: Any = None
    answers: dict[str, Any] | None = None
    on_unfinished_calls: Any = None
    run_id: str | None = None
    enable_streaming_callback_passthrough: bool | None = None


def check_resume(
    messages: list[ChatMessage],
    thread_id: str | None,
    checkpoint_id: str | None,
    decisions: dict[str, Any] | None,
    answers: dict[str, Any] | None,
) -> None:
    """
    A streamed resume (``decisions`` or ``answers`` given) continues an interrupted thread's head, as ``resume`` does.

    :raises ValueError: If it has no ``thread_id``, new messages, or a ``checkpoint_id``.
    """
    if decisions is None and answers is None:
        return
    if thread_id is None:
        raise ValueError("decisions and answers resume an interrupted thread: give its thread_id.")
    if messages:
        raise ValueError(
            f"Thread '{thread_id}': a resume (decisions or answers) takes no new messages; resume, then send them."
        )
    if checkpoint_id is not None:
        raise ValueError(
            f"Thread '{thread_id}': a resume continues the thread's head; checkpoint_id '{checkpoint_id}' cannot be "
            "given with decisions or answers."
        )


def runtime_tools(tools: ToolsArg | list[str] | None) -> list[Tool | Toolset]:
    """The tool objects given to a run (not names), which the run warms up."""
    if isinstance(tools, Toolset):
        return [tools]
    return [tool for tool in tools or [] if not isinstance(tool, str)]


def model_callback(
    callback: StreamingCallbackT | None, sink: EventSink | None, *, is_async: bool
) -> StreamingCallbackT | None:
    """
    The streaming callback given to the chat generator when someone listens: it emits each chunk as a
    ``ModelChunk`` event, then passes it on to the run's own callback (if any).

    :param callback: The run's streaming callback.
    :param sink: The run's event sink; None if no one listens (then no wrapper is made).
    :param is_async: Whether the run is async (the wrapper must then be a coroutine function).
    :returns: The wrapper, or None.
    """
    if sink is None:
        return None
    if is_async:

        async def on_chunk_async(chunk: StreamingChunk) -> None:
            sink.emit(ModelChunk, step=sink.step, chunk=chunk, message_id=sink.message_id)
            if callback is not None:
                await callback(chunk)  # type: ignore[misc]

        return on_chunk_async

    def on_chunk(chunk: StreamingChunk) -> None:
        sink.emit(ModelChunk, step=sink.step, chunk=chunk, message_id=sink.message_id)
        if callback is not None:
            callback(chunk)

    return on_chunk


_DONE = object()


@dataclasses.dataclass(frozen=True)
class _Raised:
    error: BaseException


class StreamMethods:
    """The streaming methods of ``Agent``."""

    _loop_config: LoopConfig
    _prepare: Callable[..., RunRequest]
    _effects: Callable[..., Effects]
    _open: Callable[[RunOptions], ThreadSession | None]
    _open_async: Callable[[RunOptions], Awaitable[ThreadSession | None]]

    def warm_up(self) -> None: ...  # provided by Agent

    async def warm_up_async(self) -> None: ...  # provided by Agent

    def stream(
        self,
        messages: list[ChatMessage],
        streaming_callback: StreamingCallbackT | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        *,
        generation_kwargs: dict[str, Any] | None = None,
        tools: ToolsArg | list[str] | None = None,
        hook_context: dict[str, Any] | None = None,
        context: Any = None,
        decisions: dict[str, Any] | None = None,
        answers: dict[str, Any] | None = None,
        on_unfinished_calls: UnfinishedCalls | None = None,
        run_id: str | None = None,
        enable_streaming_callback_passthrough: bool | None = None,
        **kwargs: Any,
    ) -> Iterator[AgentEvent]:
        """
        Run the agent and yield its events as they happen: ``RunStarted``, ``ModelChunk`` (when the chat generator
        streams), ``ModelReply``, ``ToolCallStarted``/``ToolCallFinished``, ``StateChanged``, ``CheckpointCommitted``,
        ``Interrupted``, ``CustomEvent``, and last ``RunFinished`` (with the dict ``run`` returns) or ``RunFailed``
        (then the error is raised).

        Takes the same parameters as :meth:`run`; a bad input (a missing prompt variable, an unknown input, a busy
        thread) raises here, before anything runs. Stop iterating to cancel the run: it stops before its next
        effect, and what it committed stands.

        :param messages: The conversation so far.
        :param streaming_callback: Also receives the model's chunks and the tool results.
        :param thread_id: Run on this durable thread.
        :param checkpoint_id: With ``thread_id``, fork from this earlier checkpoint.
        :param generation_kwargs: Settings for the chat generator for this run.
        :param tools: The tools for this run.
        :param hook_context: Per-run resources for hooks.
        :param context: The run's dependencies (see :meth:`run`).
        :param decisions: Resume the interrupted thread ``thread_id`` with these decisions, as :meth:`resume` takes
            them (``messages`` empty): the resumed run's events are streamed.
        :param answers: Resume it with these answers to ``interrupt()`` requests, as :meth:`resume` takes them.
        :param on_unfinished_calls: See :meth:`run`.
        :param run_id: An id for the run (its events' ``run_id``), recorded in its checkpoints' metadata.
        :param enable_streaming_callback_passthrough: See :meth:`run`.
        :param kwargs: Initial values for state keys, and the prompts' variables.
        :returns: An iterator of events.
        """
        check_resume(messages, thread_id, checkpoint_id, decisions, answers)
        self.warm_up()
        warm_up_tools(runtime_tools(tools))
        events = _Handoff()
        sink = EventSink(events.put, thread_id)
        if run_id is not None:
            sink.run_id = run_id
        control = RunControl()
        control.gate = lambda: events.wait_taken(control)
        options = RunOptions(
            streaming_callback,
            thread_id,
            checkpoint_id,
            generation_kwargs,
            tools,
            hook_context,
            decisions,
            context,
            answers,
            on_unfinished_calls,
            run_id,
            enable_streaming_callback_passthrough,
        )
        request = self._prepare(messages, kwargs, options, is_async=False, sink=sink, control=control)
        session = self._open(options)
        try:
            flow = agent_loop(self._loop_config, request, session)
        except BaseException:
            if session is not None:
                session.close()
            raise
        return _pump(flow, self._effects(control, options), session, sink, events, control)

    async def stream_async(
        self,
        messages: list[ChatMessage],
        streaming_callback: StreamingCallbackT | None = None,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        *,
        generation_kwargs: dict[str, Any] | None = None,
        tools: ToolsArg | list[str] | None = None,
        hook_context: dict[str, Any] | None = None,
        context: Any = None,
        decisions: dict[str, Any] | None = None,
        answers: dict[str, Any] | None = None,
        on_unfinished_calls: UnfinishedCalls | None = None,
        run_id: str | None = None,
        enable_streaming_callback_passthrough: bool | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AgentEvent]:
        """
        Run the agent asynchronously and yield its events as they happen (see :meth:`stream`). Stop iterating (or
        cancel the consuming task) to cancel the run.

        :param messages: The conversation so far.
        :param streaming_callback: Also receives the model's chunks and the tool results (sync or async).
        :param thread_id: Run on this durable thread.
        :param checkpoint_id: With ``thread_id``, fork from this earlier checkpoint.
        :param generation_kwargs: Settings for the chat generator for this run.
        :param tools: The tools for this run.
        :param hook_context: Per-run resources for hooks.
        :param context: The run's dependencies (see :meth:`run`).
        :param decisions: Resume the interrupted thread ``thread_id`` with these decisions, as :meth:`resume` takes
            them (``messages`` empty): the resumed run's events are streamed.
        :param answers: Resume it with these answers to ``interrupt()`` requests, as :meth:`resume` takes them.
        :param on_unfinished_calls: See :meth:`run`.
        :param run_id: An id for the run (its events' ``run_id``), recorded in its checkpoints' metadata.
        :param enable_streaming_callback_passthrough: See :meth:`run`.
        :param kwargs: Initial values for state keys, and the prompts' variables.
        :returns: An async iterator of events.
        """
        check_resume(messages, thread_id, checkpoint_id, decisions, answers)
        await self.warm_up_async()
        await warm_up_tools_async(runtime_tools(tools))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()

        def deliver(event: Any) -> None:  # tool calls emit from worker threads
            loop.call_soon_threadsafe(events.put_nowait, event)

        sink = EventSink(deliver, thread_id)
        if run_id is not None:
            sink.run_id = run_id
        control = RunControl()
        options = RunOptions(
            streaming_callback,
            thread_id,
            checkpoint_id,
            generation_kwargs,
            tools,
            hook_context,
            decisions,
            context,
            answers,
            on_unfinished_calls,
            run_id,
            enable_streaming_callback_passthrough,
        )
        request = self._prepare(messages, kwargs, options, is_async=True, sink=sink, control=control)
        session = await self._open_async(options)
        try:
            flow = agent_loop(self._loop_config, request, session)
        except BaseException:
            if session is not None:
                await session.aclose()
            raise
        effects = self._effects(control, options)

        async def work() -> None:
            try:
                outputs = await drive_async(flow, effects)
                sink.emit(RunFinished, outputs=outputs)
            except BaseException as exc:
                _report(sink, exc)
                deliver(_Raised(exc))
                if not isinstance(exc, Exception):
                    raise
            finally:
                if session is not None:
                    await session.aclose()
                deliver(_DONE)

        task = asyncio.ensure_future(work())
        failed = False
        try:
            while (item := await events.get()) is not _DONE:
                if isinstance(item, _Raised):
                    failed = True  # the run is over: let it release its thread rather than cancel that
                    raise item.error
                yield item
        finally:
            if not task.done() and not failed:
                control.cancel()
                task.cancel()
            with contextlib.suppress(BaseException):
                await task


def _report(sink: EventSink, error: BaseException) -> None:
    """Emit the ``RunFailed`` event for an error that ends a run."""
    cancelled = isinstance(error, RunCancelled | asyncio.CancelledError)
    sink.emit(RunFailed, error=str(error), error_type=type(error).__name__, cancelled=cancelled)


def _pump(
    flow: Generator[Effect, Any, dict[str, Any]],
    effects: Effects,
    session: ThreadSession | None,
    sink: EventSink,
    events: _Handoff,
    control: RunControl,
) -> Iterator[AgentEvent]:
    """Drive the run in a worker thread, yielding its events; cancel it if the consumer stops early."""

    def work() -> None:
        try:
            outputs = drive(flow, effects)
            sink.emit(RunFinished, outputs=outputs)
        except BaseException as exc:
            _report(sink, exc)
            events.put(_Raised(exc))
        finally:
            if session is not None:
                session.close()
            events.put(_DONE)

    context = contextvars.copy_context()  # the caller's tracing span stays the run's parent
    worker = threading.Thread(target=context.run, args=(work,), name="haystack-state-stream", daemon=True)
    worker.start()
    try:
        while (item := events.get()) is not _DONE:
            if isinstance(item, _Raised):
                raise item.error
            yield item
            events.taken()
    finally:
        control.cancel()  # a no-op if the run is over; otherwise it stops before its next effect
        events.release()
        worker.join()


class _Handoff:
    """
    The queue between a sync stream's run (in its worker thread) and the consumer, with back-pressure: before each
    effect the run waits until the consumer has taken every event emitted so far (:meth:`wait_taken`), so breaking
    out of the iterator stops the run right after the event the consumer saw last.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._condition = threading.Condition()
        self._put = 0
        self._taken = 0
        self._released = False

    def put(self, item: Any) -> None:
        with self._condition:
            self._put += 1
        self._queue.put(item)

    def get(self) -> Any:
        return self._queue.get()

    def taken(self) -> None:
        """The consumer is done with the last event it got."""
        with self._condition:
            self._taken += 1
            if self._taken >= self._put:
                self._condition.notify_all()

    def release(self) -> None:
        """The consumer is gone: never wait for it again."""
        with self._condition:
            self._released = True
            self._condition.notify_all()

    def wait_taken(self, control: RunControl) -> None:
        with self._condition:
            while self._taken < self._put and not self._released and not control.cancelled:
                self._condition.wait(0.5)
