"""
The Agent's loop, written once as a flow of effects: it yields what it needs done (call the model, run the tools,
run hooks, commit a checkpoint; see :mod:`haystack_state.agent._effects`) and receives the results. ``Agent.run``
executes the effects synchronously and ``Agent.run_async`` awaits them (:mod:`haystack_state.agent._drive`), so the
two cannot drift apart.

A run follows haystack-ai 3.4's Agent step by step: ``before_run`` hooks; then each step runs ``before_llm`` hooks
(a hook that sets ``stop_run`` ends the run there), calls the model, and either exits (a reply without tool calls,
or a run without tools: exit reason ``text``, or ``length``/``content_filter`` from the reply's finish reason), or
runs ``before_tool`` hooks, the tool calls of the conversation's last message, and ``after_tool`` hooks; a
successful call of an exit-condition tool exits too. ``on_exit`` hooks may keep the run going (``continue_run``);
``after_run`` hooks run last. An empty reply (no text, no tool calls) does not end a run that has tools: the model
is asked again.

With a durable thread, a checkpoint is committed after the inputs, after each model reply, after each step's tool
results and, if hooks changed the state after that, at the end.

:class:`AgentRun` holds a run's state and its steps; the model call (and the context the model is sent) is
:mod:`haystack_state.agent._model_step`'s, the requests left for a human :mod:`haystack_state.agent._human`'s, how a
thread's unfinished run goes on :mod:`haystack_state.agent._continuation`'s, and the run's setup
:mod:`haystack_state.agent._run_setup`'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from haystack import logging
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools.toolset import Toolset
from haystack.tracing.tracer import Span

from haystack_state._driver import Flow, perform
from haystack_state.agent import _effects as effects
from haystack_state.agent._continuation import HOOK_ANSWERS, Continuation, in_call_order, plan_continuation
from haystack_state.agent._hooks import is_hook_object
from haystack_state.agent._human import check_edits, hook_request, review_requests, waiting_requests
from haystack_state.agent._message_ids import with_ids
from haystack_state.agent._model_step import ModelCalls
from haystack_state.agent._run_commits import RunCommits
from haystack_state.agent._run_config import (
    EXIT_CANCELLED,
    EXIT_INTERRUPTED,
    EXIT_MAX_STEPS,
    LoopConfig,
    RunRequest,
)
from haystack_state.agent._run_events import emit_custom, emit_tool_call
from haystack_state.agent._run_outcome import exit_tool as exit_tool_of
from haystack_state.agent._run_outcome import model_exit_reason, run_outputs
from haystack_state.agent._run_setup import check_request, prepare_state
from haystack_state.agent._session import ThreadSession, before_request
from haystack_state.agent._spans import current_span, schema_tag, span, tracing_enabled
from haystack_state.agent.events import Interrupted, RunStarted
from haystack_state.agent.protocols import HookPoint, InterruptRequest
from haystack_state.errors import AgentRunError, ToolInvocationError
from haystack_state.invocation._outcome import BatchOutcome
from haystack_state.runtime import RunContext, check_tool_deps

__all__ = ["AgentRun", "agent_loop"]

logger = logging.getLogger(__name__)


class _Stopped(Exception):
    """
    The run failed: ``error`` is what the caller gets, raised after the thread records that the run stopped (unless
    ``record`` is false: a failed tool's calls stay pending, for a run without messages to finish them).
    """

    def __init__(self, error: Exception, *, record: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.record = record


def agent_loop(config: LoopConfig, request: RunRequest, session: ThreadSession | None = None) -> Flow[dict[str, Any]]:
    """
    The agent loop as a flow of effects (see the module docstring).

    Every failure raised while the run is under way carries the State as it was: a ``ToolInvocationError`` (with
    ``raise_on_tool_invocation_failure``) gets it as ``state``; anything else (the chat generator, a hook) is raised
    as an ``AgentRunError`` chained to the cause. On a thread, the run records that it stopped before raising.

    Run without new messages on an unfinished run (a crash, an error or an interrupt came first, see
    :mod:`haystack_state.agent._session`), it continues that run: the run-scoped keys, the step count and the token
    usage are kept, ``before_run`` hooks are not run again, and the tool calls whose results were never committed run
    first (``request.decisions``, from ``Agent.resume``, approve, reject or edit them).

    :param config: The agent's settings.
    :param request: The run's inputs.
    :param session: The thread to load and commit to, if any.
    :returns: The run, as a flow of effects that returns the run's outputs.
    :raises ValueError: For unknown inputs, or a run that does not fit the thread's pending calls (nothing is
        committed).
    """
    return AgentRun(config, request, session).execute()


class AgentRun:
    """One run of the loop: its state, counters and steps. Built before anything is committed; raises if invalid."""

    def __init__(self, config: LoopConfig, request: RunRequest, session: ThreadSession | None) -> None:
        check_request(config, request, session)
        self.config = config
        self.request = request
        self.session = session
        self.hooks = config.hooks
        self.hook_points = frozenset(point for point, hooks in config.hooks.items() if hooks)
        self.traced = tracing_enabled()
        self.planned: Continuation | None = None
        #: The run's new messages, held back until the thread's unfinished step is finished or closed.
        self.then_input = False
        self.continuing = False
        if session is not None:
            # raises before anything is committed
            policy = request.on_unfinished_calls or config.on_unfinished_calls
            self.planned = plan_continuation(session, request.messages, request.decisions, request.answers, policy)
            self.then_input = self.planned is not None and self.planned.then_input
            self.continuing = session.continues and (not request.messages or self.then_input)
        prepared = prepare_state(config, request, session, continuing=self.continuing, then_input=self.then_input)
        self.state, self.run_start, self.held = prepared.state, prepared.run_start, prepared.held
        self.step = session.run_step if session is not None and self.continuing else 0
        self.base_step = session.step - self.step if session is not None else 0
        self.current = max(self.step, 1)  # the step under way, for error messages
        self.exit_reason: str | None = None
        self.waiting: list[ToolCall] = []  # the calls without results that an interrupt left
        self.requests: list[InterruptRequest] = []  # what the interrupted run waits for (ThreadSnapshot.interrupts)
        self.answers: dict[str, list[object]] = dict(self.planned.answers) if self.planned is not None else {}
        self.tools = config.toolbox.resolve(request.tools)
        check_tool_deps(self.tools.specs, request.context)  # a mismatch fails the run before anything is written
        if self.planned is not None and request.decisions:
            check_edits(self.planned, self.tools.specs, request.decisions)
        # Toolsets are read again at every step: one may discover tools during the run.
        self.dynamic_tools = any(isinstance(item, Toolset) for item in request.tools)
        values = self.state.run_values
        if request.run_id is not None:
            self.run_id = request.run_id
        else:
            self.run_id = request.sink.run_id if request.sink is not None else str(uuid.uuid4())
        self.run_context: RunContext[Any] = RunContext(
            request.context,
            thread_id=session.thread_id if session is not None else None,
            run_id=self.run_id,
            step=self.step,
            store=config.store,
            emitter=partial(emit_custom, request.sink) if request.sink is not None else None,
        )
        values["context"] = self.run_context
        self.commits = RunCommits(self)
        self.model = ModelCalls(self)
        values["hook_context"] = request.hook_context if request.hook_context is not None else {}
        values["tools"] = self.tools.tools
        values["step_count"] = self.step
        previous = session.run_metadata() if session is not None and self.continuing else {}
        if session is not None and self.continuing:
            values["token_usage"] = session.run_usage
        counts = previous.get("tool_call_counts")
        values["tool_call_counts"] = {name: 0 for name in self.tools.specs} | (
            dict(counts) if isinstance(counts, dict) else {}
        )

    # --- setting up ------------------------------------------------------------------------------------------------

    def _take_held_input(self) -> Iterable[effects.Effect]:
        """Append the new messages held back while the thread's unfinished step was finished or closed."""
        held, self.held = self.held, []
        stored = len(self.state.view("messages") or [])
        users = [i for i, message in enumerate(held) if message.is_from("user")]
        self.run_start = stored + users[-1] if users else stored
        self.state.run_values["exit_reason"] = None
        if held:
            self.state.set("messages", held)
        return self.commits.commit("input", continues=True)

    def _at_step(self, step: int) -> None:
        """The step under way changed: the run context follows it."""
        context = self.run_context.at_step(step)
        if context is not self.run_context:
            self.run_context = context
            self.state.run_values["context"] = context

    def _load_fields(self) -> Flow[None]:
        """
        Compute the ``"scope": "loaded"`` keys with their loaders, in schema order, before anything is sent to the
        model. Their values are never stored: a checkpoint records only which keys were loaded. A loader that fails
        (or returns a value of the wrong type) fails the run, naming the key.
        """
        for key, spec in self.config.schema.items():
            if spec.scope != "loaded" or spec.loader is None:
                continue
            try:
                value = yield from perform(effects.LoadField(key, spec.loader, self.run_context, self.state))
                self.state.set(key, value)
            except Exception as exc:
                error = AgentRunError(
                    f"Agent: the loader of state key '{key}' failed before the model was called: "
                    f"{type(exc).__name__}: {exc}",
                    self.state,
                )
                error.__cause__ = exc
                raise _Stopped(error, record=False) from None
            self.commits.loaded.append(key)

    # --- effects the loop yields -----------------------------------------------------------------------------------

    def fail(self, stage: str, exc: Exception, attempts: int = 1) -> _Stopped:
        """The failure to raise for an effect that raised (on its last of ``attempts``): the error carries the state."""
        if isinstance(exc, ToolInvocationError):
            exc.state = self.state
            return _Stopped(exc, record=False)
        after = f" after {attempts} attempts" if attempts > 1 else ""
        error = AgentRunError(
            f"Agent: {stage} failed at step {self.current}{after}: {type(exc).__name__}: {exc}", self.state
        )
        error.__cause__ = exc
        return _Stopped(error)

    def _hooks(self, point: HookPoint) -> Flow[list[object]]:
        hooks = self.hooks.get(point)
        if not hooks:
            return []
        try:
            returned = yield from perform(effects.RunHooks(point, hooks, self.state))
        except Exception as exc:
            raise self.fail(f"the '{point}' hook", exc) from None
        return returned

    def _run_tools(self, calling: list[ChatMessage], hold: frozenset[str]) -> Flow[BatchOutcome | None]:
        """Run the tool calls of ``calling`` (the ``hold`` ones not at all); None if there are none."""
        if not calling:
            return None
        sink = self.request.sink
        try:
            outcome: BatchOutcome = yield from perform(
                effects.RunTools(
                    calling,
                    self.state,
                    self.tools.specs,
                    self.request.streaming_callback,
                    self.run_context,
                    self.answers or None,
                    hold,
                    self._on_call if sink is not None else None,
                )
            )
        except Exception as exc:
            raise self.fail("a tool call", exc) from None
        if outcome.retries:
            self.commits.retries.extend({**retry, "step": self.step} for retry in outcome.retries)
        return outcome

    def _record_results(self, tool_messages: list[ChatMessage]) -> None:
        """Put a step's tool results (in call order) in the state and count the calls per tool."""
        self.state.set("messages", tool_messages)
        counts = self.state.run_values["tool_call_counts"]
        for message in tool_messages:
            if message.tool_call_result is not None:
                name = message.tool_call_result.origin.tool_name
                counts[name] = counts.get(name, 0) + 1

    def _on_call(self, kind: str, data: dict[str, Any]) -> None:
        """The tool runner's per-call events, as ``ToolCallStarted``/``ToolCallFinished`` events."""
        sink = self.request.sink
        if sink is not None:
            emit_tool_call(sink, self.step, kind, data)

    def _keep_going_on_exit(self) -> Flow[bool]:
        """
        Run the ``on_exit`` hooks; whether one asked to keep going: set ``continue_run``, or, for a plain callable (not
        a ``Hook`` object, whose return value haystack-ai ignores), returned True.
        """
        if "on_exit" not in self.hook_points:
            return False
        values = self.state.run_values
        values["continue_run"] = False
        returned = yield from self._hooks("on_exit")
        hooks = self.hooks["on_exit"]
        keep_going = bool(values["continue_run"]) or any(
            r is True and not is_hook_object(h) for h, r in zip(hooks, returned, strict=True)
        )
        values["continue_run"] = False
        return keep_going

    def _tool_step(
        self,
        calling: list[ChatMessage],
        rejected: Mapping[str, ChatMessage],
        order: list[str | None],
        hold: frozenset[str] = frozenset(),
    ) -> Flow[str | None]:
        """
        Run a step's tool calls (the ``hold`` ones not at all), put their results (and the rejected calls') in order
        in the state, and commit them; the exit-condition tool that fired, if any, or ``EXIT_INTERRUPTED`` if the step
        stopped for a human (a held call, an ``interrupt()``, ``interrupt_after``).
        """
        outcome = yield from self._run_tools(calling, hold)
        tool_messages = with_ids(in_call_order(order, outcome.messages if outcome is not None else [], rejected))
        self._record_results(tool_messages)
        if "after_tool" in self.hook_points and tool_messages:
            yield from self._hooks("after_tool")
        pending = outcome.interrupts if outcome is not None else []
        names = [m.tool_call_result.origin.tool_name for m in tool_messages if m.tool_call_result is not None]
        self.state.run_values["step_count"] = self.step
        if pending:
            waits = {p.call_id for p in pending}
            self.waiting = [call for message in calling for call in message.tool_calls if call.id in waits]
            self.requests = waiting_requests(pending)
            yield from self.commits.commit("tools", names, continues=True)
            return EXIT_INTERRUPTED
        after = self.config.interrupt_after
        reviews = review_requests(tool_messages, after) if after and self.session is not None else []
        if reviews:
            self.requests = reviews
            yield from self.commits.commit("tools", names, continues=True)
            return EXIT_INTERRUPTED
        exit_tool = exit_tool_of(self.config.exit_conditions, calling, tool_messages)
        continues = exit_tool is None and self.step < self.config.max_agent_steps
        yield from self.commits.commit("tools", names, continues=continues)
        return exit_tool

    def _before_tool(self, answers: Sequence[object] = ()) -> Flow[bool]:
        """
        Run the ``before_tool`` hooks, where ``interrupt()`` works; whether one asked a human (the step then waits,
        its calls pending, and the thread is committed interrupted).
        """
        if "before_tool" not in self.hook_points:
            return False
        try:
            returned = yield from perform(
                effects.AskHooks("before_tool", self.hooks["before_tool"], self.state, list(answers))
            )
        except Exception as exc:
            raise self.fail("the 'before_tool' hook", exc) from None
        if not isinstance(returned, effects.HookInterrupt):
            return False
        last = self.state.last("messages")
        self.waiting = list(last.tool_calls) if last is not None and last.is_from("assistant") else []
        self.answers[HOOK_ANSWERS] = list(answers)[: returned.index]
        self.requests = [hook_request(self.waiting, returned.value, returned.index)]
        yield from self.commits.commit("update", force=True, continues=True)
        return True

    def _calling_after_hooks(self, replies: list[ChatMessage]) -> list[ChatMessage]:
        """
        The message whose tool calls run: after ``before_tool`` hooks (which may rewrite it, or answer its calls),
        the conversation's last message.
        """
        if "before_tool" not in self.hook_points:
            return [reply for reply in replies if reply.tool_calls]
        last = self.state.last("messages")
        return [last] if last is not None and last.tool_calls else []

    def _step(self, run_span: Span) -> Flow[str | None]:
        """One step: hooks, the model call, its tool calls. Returns the exit reason, or None to go on."""
        config = self.config
        step_tags = {"haystack.agent.step": self.step}
        with span("haystack.agent.step", step_tags, run_span) as step_span:
            if self.dynamic_tools:
                self.tools = config.toolbox.resolve(self.request.tools)
                self.state.run_values["tools"] = self.tools.tools
            control = self.request.control
            if control is not None and control.stop_requested:
                return EXIT_CANCELLED
            if self.session is not None and self.session.stop_requested:  # Agent.cancel, from any process
                return EXIT_CANCELLED
            self._at_step(self.step + 1)
            if "before_llm" in self.hook_points:
                yield from self._hooks("before_llm")
            stop = self.state.run_values["stop_run"]
            if stop is not None:
                return str(stop)
            replies = yield from self.model.call(step_span)
            self.step += 1
            calls = [call for reply in replies for call in reply.tool_calls]
            hold = frozenset(
                call.id
                for call in calls
                if self.session is not None and call.tool_name in config.interrupt_before and call.id is not None
            )
            if hold and len(hold) == len(calls):  # every call waits: stop before the tools (and their hooks)
                self.waiting = calls
                self.requests = [before_request(call) for call in calls]
                self.state.run_values["step_count"] = self.step
                yield from self.commits.commit("model", continues=True)
                return EXIT_INTERRUPTED
            yield from self.commits.commit("model", continues=bool(calls))
            if not self.tools.specs or not calls:
                reason = model_exit_reason(replies, has_tools=bool(self.tools.specs))
                self.state.run_values["step_count"] = self.step
                if reason is None:  # an empty reply: ask again
                    return None
                return None if (yield from self._exit(reason)) else reason
            if (yield from self._before_tool()):
                return EXIT_INTERRUPTED
            calling = self._calling_after_hooks(replies)
            hold = hold & {call.id for message in calling for call in message.tool_calls}
            exit_tool = yield from self._tool_step(calling, {}, [], hold)
            if exit_tool == EXIT_INTERRUPTED:
                return exit_tool
            if exit_tool is not None and not (yield from self._exit(exit_tool)):
                return exit_tool
            return None

    def _continue(self, plan: Continuation) -> Flow[str | None]:
        """Finish the thread's unfinished step (see :func:`plan_continuation`); the exit reason, or None to go on."""
        calling = plan.calling
        resuming = self.request.decisions is not None or self.request.answers is not None
        if plan.hooks or (not resuming and calling):
            before = self.state.last("messages")
            if (yield from self._before_tool(plan.answers.get(HOOK_ANSWERS, ()))):
                return EXIT_INTERRUPTED
            # Some of the step's calls may have results already (an interrupt held the others): then the calls to
            # run are the planned ones, unless a hook added messages.
            if before is None or before.is_from("assistant") or self.state.last("messages") is not before:
                calling = self._calling_after_hooks(calling)
        if not calling and not plan.rejected:  # a review (interrupt_after) was answered: the run goes on
            return None
        reason = yield from self._tool_step(calling, plan.rejected, plan.order)
        if reason not in (None, EXIT_INTERRUPTED) and (yield from self._exit(str(reason))):
            return None
        return reason

    def _exit(self, reason: str) -> Flow[bool]:
        """The run is about to stop for ``reason``: whether ``on_exit`` hooks keep it going."""
        self.state.run_values["exit_reason"] = reason
        keep_going = yield from self._keep_going_on_exit()
        if keep_going:
            self.state.run_values["exit_reason"] = None
        return keep_going

    def execute(self) -> Flow[dict[str, Any]]:
        """The run (see the module docstring)."""
        with span("haystack.agent.run", _run_tags(self), current_span()) as run_span:
            run_span.set_content_tag("haystack.agent.input", self.request.traced_inputs)
            if self.request.sink is not None:
                head = self.session.head_id if self.session is not None else None
                self.request.sink.emit(RunStarted, checkpoint_id=head, continuing=self.continuing)
            try:
                if self.session is not None:
                    # The run's inputs are checked: from here on, no other run may take the thread.
                    yield from perform(effects.TakeLease(self.session))
                yield from self._load_fields()
                yield from self.commits.commit("input", continues=True)
                if not self.continuing:
                    if "before_run" in self.hook_points:
                        yield from self._hooks("before_run")
                    # A before_run hook can restore a saved state: the step counter follows its step_count.
                    self.step = int(self.state.run_values["step_count"])
                reason: str | None = None
                if self.planned is not None:
                    reason = yield from self._continue(self.planned)
                    if self.then_input and reason != EXIT_INTERRUPTED:  # the new messages come now, and the run goes on
                        yield from self._take_held_input()
                        reason = None
                while reason is None and self.step < self.config.max_agent_steps:
                    self.current = self.step + 1
                    reason = yield from self._step(run_span)
                if reason == EXIT_INTERRUPTED and self.request.sink is not None:
                    self.request.sink.emit(Interrupted, requests=self.pending_requests())
                if reason is None:
                    logger.warning(
                        "Agent reached maximum agent steps of {max_agent_steps}, stopping.",
                        max_agent_steps=self.config.max_agent_steps,
                    )
                    reason = EXIT_MAX_STEPS
                self.exit_reason = reason
                self.state.run_values["exit_reason"] = reason
                self.state.run_values["step_count"] = self.step
                if "after_run" in self.hook_points:
                    yield from self._hooks("after_run")
                yield from self.commits.commit("update", continues=bool(self.requests))
                outputs = run_outputs(self)
            except _Stopped as stopped:
                if stopped.record:
                    yield from self.commits.record_stop(stopped.error)
                raise stopped.error from stopped.error.__cause__
            run_span.set_content_tag("haystack.agent.output", outputs)
            run_span.set_tag("haystack.agent.steps_taken", self.step)
        return outputs

    def pending_requests(self) -> list[dict[str, object]]:
        """The requests a human must answer before the run goes on (JSON-ready; see ``ThreadSnapshot.interrupts``)."""
        return [request.to_dict() for request in self.requests]


def _run_tags(run: AgentRun) -> dict[str, object]:
    """The tags of a run's span, as haystack-ai sets them."""
    config = run.config
    tags: dict[str, object] = {
        "haystack.agent.max_steps": config.max_agent_steps,
        "haystack.agent.tools": run.tools.tools,
        "haystack.agent.exit_conditions": config.exit_conditions,
    }
    if tracing_enabled():
        tags["haystack.agent.state_schema"] = schema_tag(config.resolved_schema)
    if run.session is not None:
        tags["haystack_state.thread_id"] = run.session.thread_id
    return tags
