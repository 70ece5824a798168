"""
``Agent.stream`` and ``Agent.stream_async``: a run as a stream of live events (see
:mod:`haystack_state.agent.events`), as functions of the Agent that its methods are (``Agent.stream = stream``).

Events cost only when someone listens: a plain ``run`` has no sink, and the loop makes no event. A stream runs the
loop with a sink that buffers events for the consumer.

``stream`` drives the loop (a generator of effects, see :mod:`haystack_state.agent._loop`) from the iterator itself,
on the consumer's thread: it yields the events made so far before each effect, and executes the effect only when the
consumer asks for the next event, so that events cost no thread hand-off. The effects that may emit events while
they are under way (a model call that streams its chunks, a tool batch, a loaded key's loader) are executed by a
helper thread of the stream instead, while the iterator yields their events as they come; but a model or tools whose
last call in the stream took less than :data:`QUICK_EFFECT` (a millisecond) run on the consumer's thread too, their
events yielded when they return, that little later (a hand-off per call would cost more than such a call). The other
effects (hooks, commits, taking the lease, a retry's backoff) run on the consumer's thread, and what they emit is
yielded when they return. ``stream_async`` drives the run in a task of the caller's event loop.

The consumer may stop early: breaking out of the iteration (or closing the iterator) cancels the run before its next
effect (a model call, a tool batch, a hook, a commit); an effect under way is let finish first. What was committed
stands, and the thread can be continued with ``agent.run([], thread_id=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from haystack.dataclasses import ChatMessage
from haystack.dataclasses.streaming_chunk import StreamingCallbackT
from haystack.tools.utils import warm_up_tools, warm_up_tools_async

from haystack_state._driver import Flow
from haystack_state.agent._drive import EffectRunner, RunCancelled, drive_async, execute
from haystack_state.agent._effects import CallModel, Effect, LoadField, RunTools
from haystack_state.agent._loop import agent_loop
from haystack_state.agent._run_config import RunControl, RunOptions
from haystack_state.agent._runner import effect_runner, open_thread, open_thread_async, prepare, runtime_tools
from haystack_state.agent._session import ThreadSession
from haystack_state.agent.events import AgentEvent, EventSink, RunFailed, RunFinished
from haystack_state.agent.protocols import DecisionLike, UnfinishedCalls
from haystack_state.tools.spec import ToolsArg

if TYPE_CHECKING:
    from haystack_state.agent._component import Agent

__all__ = ["QUICK_EFFECT", "check_resume", "stream", "stream_async"]

#: A model call or tool call of a sync stream that took less than this (seconds) runs on the consumer's thread the next
#: time (its events are yielded when it returns: that late at most, unless it is slower this time); one that took
#: longer (or failed, or has not run yet in the stream) runs on the stream's helper thread, its events yielded as
#: they come.
QUICK_EFFECT = 0.001


def check_resume(
    messages: list[ChatMessage],
    thread_id: str | None,
    checkpoint_id: str | None,
    decisions: Mapping[str, DecisionLike] | None,
    answers: Mapping[str, object] | None,
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


_DONE = object()


@dataclasses.dataclass(frozen=True)
class _Raised:
    error: BaseException


def stream(
    agent: Agent,
    messages: list[ChatMessage],
    streaming_callback: StreamingCallbackT | None = None,
    thread_id: str | None = None,
    checkpoint_id: str | None = None,
    *,
    generation_kwargs: dict[str, Any] | None = None,
    tools: ToolsArg | list[str] | None = None,
    hook_context: dict[str, Any] | None = None,
    context: Any = None,
    decisions: Mapping[str, DecisionLike] | None = None,
    answers: Mapping[str, object] | None = None,
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

    Takes the same parameters as :meth:`Agent.run`; a bad input (a missing prompt variable, an unknown input, a busy
    thread) raises here, before anything runs. The run goes on as the iteration asks for events, on the caller's
    thread (model and tool calls that take time run on a helper thread, their chunks and events yielded as they
    come); its thread is released before the last event. Stop iterating (or close the iterator) to cancel the
    run: it stops before its next effect, and what it committed stands.

    :param messages: The conversation so far.
    :param streaming_callback: Also receives the model's chunks and the tool results.
    :param thread_id: Run on this durable thread.
    :param checkpoint_id: With ``thread_id``, fork from this earlier checkpoint.
    :param generation_kwargs: Settings for the chat generator for this run.
    :param tools: The tools for this run.
    :param hook_context: Per-run resources for hooks.
    :param context: The run's dependencies (see :meth:`Agent.run`).
    :param decisions: Resume the interrupted thread ``thread_id`` with these decisions, as :meth:`Agent.resume` takes
        them (``messages`` empty): the resumed run's events are streamed.
    :param answers: Resume it with these answers to ``interrupt()`` requests, as :meth:`Agent.resume` takes them.
    :param on_unfinished_calls: See :meth:`Agent.run`.
    :param run_id: An id for the run (its events' ``run_id``), recorded in its checkpoints' metadata.
    :param enable_streaming_callback_passthrough: See :meth:`Agent.run`.
    :param kwargs: Initial values for state keys, and the prompts' variables.
    :returns: An iterator of events.
    """
    check_resume(messages, thread_id, checkpoint_id, decisions, answers)
    agent.warm_up()
    warm_up_tools(runtime_tools(tools))
    channel = _Channel()
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
    sink, control = _event_sink(options, channel.put), RunControl()
    request = prepare(agent, messages, kwargs, options, is_async=False, sink=sink, control=control)
    session = open_thread(agent, options)
    try:
        flow = agent_loop(agent.setup.loop_config, request, session)
    except BaseException:
        if session is not None:
            session.close()
        raise
    return _pump(flow, effect_runner(agent, control, options), session, sink, channel, control)


async def stream_async(
    agent: Agent,
    messages: list[ChatMessage],
    streaming_callback: StreamingCallbackT | None = None,
    thread_id: str | None = None,
    checkpoint_id: str | None = None,
    *,
    generation_kwargs: dict[str, Any] | None = None,
    tools: ToolsArg | list[str] | None = None,
    hook_context: dict[str, Any] | None = None,
    context: Any = None,
    decisions: Mapping[str, DecisionLike] | None = None,
    answers: Mapping[str, object] | None = None,
    on_unfinished_calls: UnfinishedCalls | None = None,
    run_id: str | None = None,
    enable_streaming_callback_passthrough: bool | None = None,
    **kwargs: Any,
) -> AsyncIterator[AgentEvent]:
    """
    Run the agent asynchronously and yield its events as they happen. Same parameters and events as
    :func:`stream`; the ``streaming_callback`` may be sync or async. Stop iterating (or cancel the consuming task) to
    cancel the run.

    :returns: An async iterator of events.
    """
    check_resume(messages, thread_id, checkpoint_id, decisions, answers)
    await agent.warm_up_async()
    await warm_up_tools_async(runtime_tools(tools))
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Any] = asyncio.Queue()

    def deliver(event: object) -> None:  # tool calls emit from worker threads
        loop.call_soon_threadsafe(events.put_nowait, event)

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
    sink, control = _event_sink(options, deliver), RunControl()
    request = prepare(agent, messages, kwargs, options, is_async=True, sink=sink, control=control)
    session = await open_thread_async(agent, options)
    try:
        flow = agent_loop(agent.setup.loop_config, request, session)
    except BaseException:
        if session is not None:
            await session.aclose()
        raise
    effects = effect_runner(agent, control, options)

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


def _event_sink(options: RunOptions, deliver: Callable[[AgentEvent], None]) -> EventSink:
    """A stream's sink, handing its events to ``deliver``; they carry the run's ``run_id`` if one was given."""
    sink = EventSink(deliver, options.thread_id)
    if options.run_id is not None:
        sink.run_id = options.run_id
    return sink


def _report(sink: EventSink, error: BaseException) -> None:
    """Emit the ``RunFailed`` event for an error that ends a run."""
    cancelled = isinstance(error, RunCancelled | asyncio.CancelledError)
    sink.emit(RunFailed, error=str(error), error_type=type(error).__name__, cancelled=cancelled)


def _pump(
    flow: Flow[dict[str, Any]],
    effects: EffectRunner,
    session: ThreadSession | None,
    sink: EventSink,
    channel: _Channel,
    control: RunControl,
) -> Iterator[AgentEvent]:
    """
    Drive the run from the iterator, yielding its events: before each effect, every event made so far is yielded, and
    the effect is executed when the consumer asks for more. If the consumer stops, the run stops there (an effect
    under way on the helper thread is let finish first); what was committed stands.
    """
    context = contextvars.copy_context()  # the run's context vars stay its own; the caller's span is its parent
    helper = _Helper(context, channel)
    pending = channel.pending
    pace: dict[Hashable, bool] = {}  # whether the model, each tool, ran in less than QUICK_EFFECT last time
    ended = False  # the loop has ended (then the session is closed)
    value: object = None
    error: BaseException | None = None
    failure: BaseException | None = None
    outputs: dict[str, Any] = {}
    try:
        while True:
            try:
                effect = context.run(flow.send, value) if error is None else context.run(flow.throw, error)
            except StopIteration as stop:
                outputs = stop.value
                break
            except BaseException as exc:  # the loop raised: it is over
                failure = exc
                break
            while pending:  # the consumer takes every event made so far before the next effect
                yield pending.popleft()
            if control.cancelled:
                context.run(flow.close)  # the loop's spans end; nothing more runs
                failure = RunCancelled("The run was cancelled; its last committed checkpoint stands.")
                break
            value, error = None, None
            keys = _under_way_keys(effect)
            if keys is None:  # it emits nothing while under way
                try:
                    value = context.run(execute, effects, effect)
                except BaseException as exc:
                    error = exc
            else:
                if keys and all(pace.get(key, False) for key in keys):  # quick last time: its events can wait
                    started = time.perf_counter()
                    try:
                        value = context.run(execute, effects, effect)
                    except BaseException as exc:
                        error = exc
                    took = time.perf_counter() - started
                else:
                    value, error, took = yield from helper.execute(effect, effects)
                quick = error is None and took < QUICK_EFFECT
                for key in keys:
                    pace[key] = quick
            if error is not None and not isinstance(error, Exception):  # (KeyboardInterrupt, SystemExit)
                context.run(flow.close)
                failure = error
                break
        ended = True
        if failure is None:
            sink.emit(RunFinished, outputs=outputs)
        else:
            _report(sink, failure)
        if session is not None:
            session.close()  # before the last event: a consumer that acts on it finds the thread free
        while pending:
            yield pending.popleft()
        if failure is not None:
            raise failure
    finally:
        if not ended:  # the consumer stopped listening (or raised into the iterator): stop the run where it is
            control.cancel()
            try:
                helper.settle()
                context.run(flow.close)
            finally:
                if session is not None:
                    session.close()
        helper.stop()


def _under_way_keys(effect: Effect) -> tuple[Hashable, ...] | None:
    """
    What runs in an effect that may emit events while it is under way (a model call given a streaming callback, a
    tool batch, a loader): the keys its pace is kept under. None for the other effects.
    """
    if isinstance(effect, CallModel):
        return None if effect.inputs.get("streaming_callback") is None else (("model", id(effect.generator)),)
    if isinstance(effect, RunTools):
        if effect.on_call is None:
            return None
        return tuple(("tool", call.tool_name) for message in effect.messages for call in message.tool_calls)
    if isinstance(effect, LoadField):
        return (("load", effect.key),)
    return None


class _Channel:
    """
    Where a sync stream's events wait for the consumer. Between effects the run and the consumer share one thread,
    and events only queue up; during an effect on the helper thread (``live``), each event also wakes the consumer.
    """

    __slots__ = ("live", "pending", "wake")

    def __init__(self) -> None:
        self.pending: deque[AgentEvent] = deque()
        self.wake: queue.SimpleQueue[_Outcome | None] = queue.SimpleQueue()
        self.live = False

    def put(self, event: AgentEvent) -> None:
        """Queue an event (the sink's listener; the sink serializes its calls)."""
        self.pending.append(event)
        if self.live:
            self.wake.put(None)


class _Outcome:
    """What an effect executed on the helper thread produced or raised, and how long it took (seconds)."""

    __slots__ = ("error", "took", "value")

    def __init__(self, value: object, error: BaseException | None, took: float) -> None:
        self.value = value
        self.error = error
        self.took = took


class _Helper:
    """
    The helper thread of a sync stream, started at its first live effect and kept until the stream ends: it executes
    the effects that emit events while they are under way, so that the consumer receives them as they come.
    """

    def __init__(self, context: contextvars.Context, channel: _Channel) -> None:
        self._context = context
        self._channel = channel
        self._jobs: queue.SimpleQueue[tuple[Effect, EffectRunner] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._in_flight = False

    def execute(
        self, effect: Effect, effects: EffectRunner
    ) -> Generator[AgentEvent, None, tuple[Any, BaseException | None, float]]:
        """
        Execute an effect on the helper thread, yielding the events it emits meanwhile; return its result, its error
        and how long it took (seconds).
        """
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="haystack-state-stream", daemon=True)
            self._thread.start()
        channel = self._channel
        wake, pending = channel.wake, channel.pending
        channel.live = True
        self._in_flight = True
        self._jobs.put((effect, effects))
        while True:
            token = wake.get()
            if token is not None:  # the effect is over: the events it made are all pending
                self._in_flight = channel.live = False
            while pending:
                yield pending.popleft()
            if token is not None:
                return token.value, token.error, token.took

    def settle(self) -> None:
        """Wait until the effect under way (if any) is over, dropping its result."""
        while self._in_flight:
            if self._channel.wake.get() is not None:
                self._in_flight = self._channel.live = False

    def stop(self) -> None:
        """End the helper thread (after :meth:`settle`)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _serve(self) -> None:
        jobs, wake, context = self._jobs, self._channel.wake, self._context
        while (job := jobs.get()) is not None:
            started = time.perf_counter()
            try:
                outcome = _Outcome(context.run(execute, job[1], job[0]), None, time.perf_counter() - started)
            except BaseException as exc:  # handed to the consumer's thread, which decides
                outcome = _Outcome(None, exc, time.perf_counter() - started)
            wake.put(outcome)
