"""
``AgentWrapper``: a Hayhooks pipeline wrapper around our Agent with a checkpointer, so that every conversation is a
durable thread. A subclass builds the Agent in ``setup()`` (or :func:`agent_wrapper` makes the subclass from a
factory), and Hayhooks serves it:

- ``/v1/chat/completions`` (``run_chat_completion_async``, or ``run_chat_completion`` in :class:`SyncAgentWrapper`):
  the request's conversation is mapped onto a thread (see :mod:`haystack_state.hayhooks._conversation`), only what is
  new in it is given to ``agent.run``, and the answer is the text of the run's replies, streamed or not;
- ``/v1/responses`` (``run_response_async`` / ``run_response``): a response's id names its checkpoint (and thread),
  ``previous_response_id`` continues from that checkpoint (a fork when it is not the thread's head), ``store=false``
  runs on a scratch thread that is deleted afterwards;
- ``/{name}/run`` and Hayhooks' MCP server (``run_api_async`` / ``run_api``): a message and a ``thread_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from fastapi import HTTPException
from fastapi_openai_compat import Response
from hayhooks.server.utils.base_pipeline_wrapper import BasePipelineWrapper
from haystack.dataclasses import ChatMessage
from starlette.datastructures import Headers

from haystack_state.agent import Agent
from haystack_state.agent.events import AgentEvent, RunFinished
from haystack_state.errors import CheckpointNotFoundError, ThreadBusyError, ThreadNotFoundError
from haystack_state.hayhooks._conversation import (
    response_id,
    scratch_response_id,
)
from haystack_state.hayhooks._planning import RunPlan, checkpointer_of, plan_chat, plan_response
from haystack_state.hayhooks._streams import ChatStreamer, ResponseStreamer, usage_of
from haystack_state.persistence.records import check_thread_id

__all__ = ["AgentWrapper", "RunPlan", "SyncAgentWrapper", "agent_wrapper", "http_errors"]


@contextlib.contextmanager
def http_errors() -> Iterator[None]:
    """
    Turn the errors of a request that nothing has run for yet into HTTP errors: a thread another run holds is 409, an
    unknown thread, checkpoint or response 404, a bad input (a thread id, a request without a user message) 400.
    """
    try:
        yield
    except HTTPException:
        raise
    except ThreadBusyError as error:
        raise HTTPException(status_code=409, detail=str(error)) from error
    except (ThreadNotFoundError, CheckpointNotFoundError) as error:
        raise HTTPException(status_code=404, detail=str(error).strip("\"'")) from error
    except ValueError as error:
        raise HTTPException(status_code=400, detail=str(error)) from error


def _close(events: Iterator[AgentEvent]) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        close()


async def _after(first: AgentEvent, events: AsyncIterator[AgentEvent]) -> AsyncGenerator[AgentEvent, None]:
    """``first``, then the rest of ``events`` (closed when this is)."""
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await _aclose(events)


async def _aclose(events: AsyncIterator[AgentEvent]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


class AgentWrapper(BasePipelineWrapper):  # type: ignore[misc]
    """
    A Hayhooks deployment of an Agent with a checkpointer. Subclass it and set ``self.agent`` in ``setup()``::

        class PipelineWrapper(AgentWrapper):
            def setup(self) -> None:
                self.agent = Agent(chat_generator, tools=[...], checkpointer=SQLiteCheckpointer("threads.db"))

    Hayhooks calls the ``*_async`` methods; :class:`SyncAgentWrapper` has it call the sync ones in its thread pool.
    """

    #: What Hayhooks' status page and dashboard call it.
    deployment_type = "agent"
    #: Open WebUI status events for tool calls in streamed chat completions: ``"auto"`` sends them when the request
    #: comes from Open WebUI (it has an ``X-OpenWebUI-*`` header, as Open WebUI sends with
    #: ``ENABLE_FORWARD_USER_INFO_HEADERS=true``), ``"always"``, or ``"never"``. An OpenAI client reads them as
    #: chunks without ``choices``.
    status_events: Literal["auto", "always", "never"] = "auto"
    #: Whether a client's system messages start a new thread (then the agent's own system prompt is not added). They
    #: are dropped by default: the agent's system prompt rules.
    client_system_messages: bool = False
    #: What goes between the texts of two model replies of one run.
    separator: str = "\n\n"
    #: A chat completion whose last user message starts with one of these is a side request, not a turn of the
    #: conversation it names: it runs on a scratch thread, deleted afterwards. Open WebUI's background tasks (a
    #: title, tags, follow-up questions, search queries) come with the chat's id, and their default prompts start
    #: with ``### Task:``.
    side_request_prefixes: tuple[str, ...] = ("### Task:",)

    agent: Agent

    # --- the agent and its threads ----------------------------------------------------------------------------

    def get_agent(self) -> Agent:
        """
        The deployed Agent: ``self.agent``, or ``self.pipeline`` if that is one.

        :raises RuntimeError: If ``setup()`` set neither, or the Agent has no checkpointer.
        """
        agent = getattr(self, "agent", None)
        if agent is None and isinstance(self.pipeline, Agent):
            agent = self.pipeline
        if not isinstance(agent, Agent):
            raise RuntimeError(
                f"{type(self).__name__}.setup() must set self.agent to a haystack_state Agent (got {agent!r})."
            )
        if agent.checkpointer is None:
            raise RuntimeError(f"{type(self).__name__}: the Agent needs a checkpointer (Agent(..., checkpointer=...)).")
        return agent

    def wants_status_events(self, headers: Mapping[str, str] | None) -> bool:
        """
        Whether a streamed chat completion announces tool calls as Open WebUI status events (see
        :attr:`status_events`).

        :param headers: The request's headers; None when Hayhooks passes none.
        """
        if self.status_events != "auto":
            return self.status_events == "always"
        return headers is not None and any(str(key).lower().startswith("x-openwebui-") for key in headers)

    def plan_chat(
        self, messages: Sequence[Mapping[str, Any]], body: Mapping[str, Any], headers: Mapping[str, str] | None
    ) -> RunPlan:
        """
        Where a chat completion runs and with which messages (see :mod:`haystack_state.hayhooks._conversation` and
        :func:`haystack_state.hayhooks._planning.plan_chat`). Reads the thread (blocking).

        :param messages: The request's messages.
        :param body: The request body.
        :param headers: The request's headers.
        :returns: The run's plan.
        """
        return plan_chat(
            self.get_agent(),
            messages,
            body,
            headers,
            side_request_prefixes=self.side_request_prefixes,
            client_system_messages=self.client_system_messages,
        )

    def plan_response(
        self, input_items: Sequence[Mapping[str, Any]], body: Mapping[str, Any], headers: Mapping[str, str] | None
    ) -> RunPlan:
        """
        Where a Responses API request runs (see :func:`haystack_state.hayhooks._planning.plan_response`). Reads the
        thread (blocking).

        :param input_items: The request's input items.
        :param body: The request body.
        :param headers: The request's headers.
        :returns: The run's plan.
        """
        return plan_response(
            self.get_agent(), input_items, body, headers, client_system_messages=self.client_system_messages
        )

    # --- running ----------------------------------------------------------------------------------------------

    def _stream(self, plan: RunPlan) -> Iterator[AgentEvent]:
        with http_errors():
            return self.get_agent().stream(
                plan.messages, thread_id=plan.thread_id, checkpoint_id=plan.checkpoint_id, **plan.inputs
            )

    async def _stream_async(self, plan: RunPlan) -> AsyncIterator[AgentEvent]:
        events = self.get_agent().stream_async(
            plan.messages, thread_id=plan.thread_id, checkpoint_id=plan.checkpoint_id, **plan.inputs
        )
        with http_errors():  # the run checks its inputs and takes its thread before its first event
            first = await anext(events)
        return _after(first, events)

    def _discard(self, plan: RunPlan) -> None:
        if plan.scratch:
            with contextlib.suppress(ThreadNotFoundError):
                checkpointer_of(self.get_agent()).delete_thread(plan.thread_id)

    def _finish(self, plan: RunPlan, events: Iterator[AgentEvent]) -> None:
        """The end of a run's answer, however it ends: close its events, and discard a scratch thread."""
        _close(events)
        self._discard(plan)

    async def _finish_async(self, plan: RunPlan, events: AsyncIterator[AgentEvent]) -> None:
        """:meth:`_finish` on the event loop (the thread is discarded in a worker thread)."""
        await _aclose(events)
        await asyncio.to_thread(self._discard, plan)

    def closing_note(self, thread_id: str, outputs: Mapping[str, Any]) -> str | None:
        """
        A line added after the answer when the run did not end with one: the run waits for a human
        (``exit_reason="interrupted"``), or was cut at its step limit.

        :param thread_id: The run's thread.
        :param outputs: The run's outputs.
        :returns: The line, or None.
        """
        reason = outputs.get("exit_reason")
        if reason == "interrupted":
            return f"(The run on thread '{thread_id}' waits for a human decision: resume it with agent.resume.)"
        if reason == "max_agent_steps":
            return "(The run stopped at its step limit.)"
        return None

    def _chat_items(
        self, plan: RunPlan, events: Iterator[AgentEvent], streamer: ChatStreamer
    ) -> Generator[Any, None, None]:
        try:
            for event in events:
                yield from streamer.feed(event)
                if isinstance(event, RunFinished) and (note := self.closing_note(plan.thread_id, event.outputs)):
                    yield from streamer.note(note)
        finally:
            self._finish(plan, events)

    async def _chat_items_async(
        self, plan: RunPlan, events: AsyncIterator[AgentEvent], streamer: ChatStreamer
    ) -> AsyncGenerator[Any, None]:
        try:
            async for event in events:
                for item in streamer.feed(event):
                    yield item
                if isinstance(event, RunFinished) and (note := self.closing_note(plan.thread_id, event.outputs)):
                    for item in streamer.note(note):
                        yield item
        finally:
            await self._finish_async(plan, events)

    # --- chat completions -------------------------------------------------------------------------------------

    def run_chat_completion(
        self, model: str, messages: list[dict[str, Any]], body: dict[str, Any], headers: Headers | None = None
    ) -> str | Generator[Any, None, None]:
        """
        An OpenAI chat completion on the conversation's durable thread: its new user messages are run, and the
        answer is the text of the run's replies (streamed when ``body["stream"]``).

        :param model: The deployment's name.
        :param messages: The conversation, as the client sends it.
        :param body: The request body.
        :param headers: The request's headers.
        :returns: The answer, or a generator of its pieces.
        """
        with http_errors():
            plan = self.plan_chat(messages, body, headers)
        streaming = bool(body.get("stream"))
        streamer = ChatStreamer(status=streaming and self.wants_status_events(headers), separator=self.separator)
        items = self._chat_items(plan, self._stream(plan), streamer)
        if streaming:
            return items
        for _ in items:
            pass
        return streamer.text

    async def run_chat_completion_async(
        self, model: str, messages: list[dict[str, Any]], body: dict[str, Any], headers: Headers | None = None
    ) -> str | AsyncGenerator[Any, None]:
        """
        :meth:`run_chat_completion` on the event loop, with the same parameters: the thread is read in a worker
        thread, the Agent runs with ``stream_async``.

        :returns: The answer, or an async generator of its pieces.
        """
        with http_errors():
            plan = await asyncio.to_thread(self.plan_chat, messages, body, headers)
        streaming = bool(body.get("stream"))
        streamer = ChatStreamer(status=streaming and self.wants_status_events(headers), separator=self.separator)
        items = self._chat_items_async(plan, await self._stream_async(plan), streamer)
        if streaming:
            return items
        async for _ in items:
            pass
        return streamer.text

    # --- the Responses API ------------------------------------------------------------------------------------

    def _response(
        self, model: str, plan: RunPlan, outputs: Mapping[str, Any], streamer: ResponseStreamer, body: Mapping[str, Any]
    ) -> Response:
        checkpoint_id = outputs.get("checkpoint_id")
        if plan.scratch or not isinstance(checkpoint_id, str):
            rid, metadata = scratch_response_id(), {}
        else:
            rid, metadata = (
                response_id(checkpoint_id, plan.thread_id),
                {"thread_id": plan.thread_id, "checkpoint_id": checkpoint_id},
            )
        return Response(
            id=rid,
            created_at=streamer.created_at,
            status="completed",
            model=model,
            output=[streamer.output_item()],
            usage=usage_of(dict(outputs)),
            metadata=metadata,
            previous_response_id=body.get("previous_response_id"),
            store=not plan.scratch,
        )

    def _response_events(
        self, model: str, plan: RunPlan, events: Iterator[AgentEvent], body: Mapping[str, Any]
    ) -> Generator[Any, None, None]:
        streamer = ResponseStreamer(self.separator)
        outputs: Mapping[str, Any] = {}
        try:
            for event in events:
                yield from streamer.feed(event)
                if isinstance(event, RunFinished):
                    outputs = event.outputs
            yield from streamer.finish()
            yield self._response(model, plan, outputs, streamer, body)
        finally:
            self._finish(plan, events)

    async def _response_events_async(
        self, model: str, plan: RunPlan, events: AsyncIterator[AgentEvent], body: Mapping[str, Any]
    ) -> AsyncGenerator[Any, None]:
        streamer = ResponseStreamer(self.separator)
        outputs: Mapping[str, Any] = {}
        try:
            async for event in events:
                for item in streamer.feed(event):
                    yield item
                if isinstance(event, RunFinished):
                    outputs = event.outputs
            for item in streamer.finish():
                yield item
            yield self._response(model, plan, outputs, streamer, body)
        finally:
            await self._finish_async(plan, events)

    def run_response(
        self, model: str, input_items: list[dict[str, Any]], body: dict[str, Any], headers: Headers | None = None
    ) -> Response | Generator[Any, None, None]:
        """
        An OpenAI Responses API request on a durable thread (see :meth:`plan_response`). The response's id is
        ``resp_<checkpoint id>_<thread id>``: the checkpoint its run ended at.

        :param model: The deployment's name.
        :param input_items: The request's input items.
        :param body: The request body.
        :param headers: The request's headers.
        :returns: The ``Response``, or a generator of its events (the last one the ``Response``).
        """
        with http_errors():
            plan = self.plan_response(input_items, body, headers)
        events = self._response_events(model, plan, self._stream(plan), body)
        if body.get("stream"):
            return events
        *_, response = events
        return cast(Response, response)

    async def run_response_async(
        self, model: str, input_items: list[dict[str, Any]], body: dict[str, Any], headers: Headers | None = None
    ) -> Response | AsyncGenerator[Any, None]:
        """
        :meth:`run_response` on the event loop, with the same parameters.

        :returns: The ``Response``, or an async generator of its events (the last one the ``Response``).
        """
        with http_errors():
            plan = await asyncio.to_thread(self.plan_response, input_items, body, headers)
        events = self._response_events_async(model, plan, await self._stream_async(plan), body)
        if body.get("stream"):
            return events
        response = None
        async for item in events:
            response = item
        return cast(Response, response)

    # --- /{name}/run and MCP ----------------------------------------------------------------------------------

    def run_api(self, message: str, thread_id: str) -> str:
        """
        Send a message to the agent and get its answer; the conversation is kept on a durable thread.

        :param message: What the user says.
        :param thread_id: The conversation's id: the same id continues it (the agent sees its earlier messages, tool
            results and state), a new id starts a new conversation.
        :returns: The agent's answer.
        """
        plan = RunPlan(check_thread_id(thread_id), None, [ChatMessage.from_user(message)])
        streamer = ChatStreamer(status=False, separator=self.separator)
        for _ in self._chat_items(plan, self._stream(plan), streamer):
            pass
        return streamer.text

    async def run_api_async(self, message: str, thread_id: str) -> str:
        plan = RunPlan(check_thread_id(thread_id), None, [ChatMessage.from_user(message)])
        streamer = ChatStreamer(status=False, separator=self.separator)
        async for _ in self._chat_items_async(plan, await self._stream_async(plan), streamer):
            pass
        return streamer.text

    # Hayhooks describes the endpoint and the MCP tool from the docstring of whichever of the two it serves.
    run_api_async.__doc__ = run_api.__doc__


class SyncAgentWrapper(AgentWrapper):
    """
    An :class:`AgentWrapper` that Hayhooks serves through its sync methods (``run_chat_completion``,
    ``run_response``, ``run_api``), each request in a thread of its thread pool, with ``Agent.stream``. For agents
    whose chat generator, tools or hooks have no async side worth having.
    """

    # Hayhooks serves a method when the wrapper overrides it: these are the base class's own again.
    run_api_async = BasePipelineWrapper.run_api_async
    run_chat_completion_async = BasePipelineWrapper.run_chat_completion_async
    run_response_async = BasePipelineWrapper.run_response_async


def agent_wrapper(make_agent: Callable[[], Agent], *, sync: bool = False, **attributes: Any) -> type[AgentWrapper]:
    """
    A ``PipelineWrapper`` class whose ``setup()`` sets ``self.agent = make_agent()``: the one line a Hayhooks
    ``pipeline_wrapper.py`` needs.

    :param make_agent: Builds the Agent (with its checkpointer) when Hayhooks deploys the wrapper.
    :param sync: Serve it through the sync methods (:class:`SyncAgentWrapper`).
    :param attributes: Class attributes to set (``status_events``, ``skip_mcp``, ...).
    :returns: The class.
    """
    base = SyncAgentWrapper if sync else AgentWrapper

    def setup(self: AgentWrapper) -> None:
        self.agent = make_agent()

    return cast(type[AgentWrapper], type("PipelineWrapper", (base,), {"setup": setup, **attributes}))
