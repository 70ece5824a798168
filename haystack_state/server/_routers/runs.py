"""
Runs: on a thread (background, ``wait``, ``stream``; list, get, join, join its stream, cancel, delete) and stateless
(``/runs/wait``, ``/runs/stream``).

A request is checked completely before anything is written (the assistant, the thread and its owner, the input
against the agent's schema, a ``command.resume`` against the pending tool calls, a fork's checkpoint), then queued.
Streams are Server-Sent Events in the format LangGraph's SDK reads: ``metadata`` first (``{"run_id", "attempt"}``),
then the run's events in the stream modes asked for (see :mod:`haystack_state.server._streams`; ``error`` if it
failed), each with its id (``id: ATTEMPT-SEQ``, see :mod:`haystack_state.server._live`). A client that lost the stream
joins it again with the last id it saw (``Last-Event-ID``, as ``langgraph-sdk``'s ``join_stream(last_event_id=...)``
and its own reconnects, and browsers' ``EventSource``, send it): the stream resumes after that event, from any server
process, without ``metadata``. ``runs/wait`` streams nothing while it runs: it waits for the thread's values at the
end.

``multitask_strategy`` decides what a run does on a busy thread: ``reject`` (409), ``enqueue`` (it waits its turn),
``interrupt`` or ``rollback`` (the thread's runs are cancelled, as ``cancel`` with that action would, and it starts
once the running one has stopped).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Response
from fastapi.responses import JSONResponse

from haystack_state.server._assistants import Assistant
from haystack_state.server._context import Server
from haystack_state.server._executor import RunJob, takes_answers
from haystack_state.server._interrupts import pending_requests, resume_from_command, unfinished_policy_of
from haystack_state.server._live import Cursor, LiveRun, Sent, parse_event_id
from haystack_state.server._models import RunCreate
from haystack_state.server._records import Idempotency, RunRecord, ThreadRecord
from haystack_state.server._responses import EVENT_STREAM, REFUSED, ErrorAnswer, Run, RunResult, json_answer
from haystack_state.server._run_jobs import job_from_kwargs, new_run
from haystack_state.server._sse import EventStream, frames
from haystack_state.server._text import CallerDep
from haystack_state.server._threads import head_async, not_found, owned_thread_async
from haystack_state.server._views import run_view
from haystack_state.server._wire import WireError, keys_named, values_from_wire
from haystack_state.state import State

#: Each route takes ``CallerDep`` (the server and the user, the request's text checked), in place of the other
#: routers' ``check_request`` dependency and ``ServerDep`` and ``UserDep``: one dependency instead of four.
router = APIRouter(tags=["Runs"], responses=REFUSED)


@dataclasses.dataclass(frozen=True)
class _Plan:
    assistant: Assistant
    kwargs: dict[str, Any]


async def _plan(server: Server, body: RunCreate, user: str, thread_id: str | None) -> _Plan:
    """Check a run request completely (nothing is written but a thread created by ``if_not_exists="create"``)."""
    assistant = server.assistants.resolve(body.assistant_id)
    if assistant is None:
        raise HTTPException(404, f"Assistant '{body.assistant_id}' not found.")
    agent = assistant.agent
    values = values_from_wire(body.input, field="input")
    messages = values.get("messages", [])
    if len(messages) > server.limits.max_messages:
        raise WireError(
            "input.messages", f"at most {server.limits.max_messages} messages per request, got {len(messages)}"
        )
    with keys_named("input"):
        State(agent.state_schema).update(values)
    kwargs: dict[str, Any] = {
        "input": body.input,
        "stream_mode": body.stream_mode,
        "config": body.config,
        "context": body.context,
    }
    if body.on_unfinished_calls is not None:
        kwargs["on_unfinished_calls"] = body.on_unfinished_calls
    if thread_id is None:
        if body.command is not None or body.fork_from is not None:
            raise WireError("command" if body.command is not None else "checkpoint", "needs a thread")
        return _Plan(assistant, kwargs)
    record = await _thread_for_run(server, thread_id, user, body.if_not_exists)
    if record.assistant_id is not None and record.assistant_id != assistant.assistant_id:
        other = server.assistants.resolve(record.assistant_id)
        raise HTTPException(
            409,
            f"Thread '{thread_id}' belongs to assistant '{other.name if other is not None else record.assistant_id}', "
            f"not '{assistant.name}': a thread's state follows its own agent's schema, so its runs go to that "
            "assistant. Start a new thread (or copy this one) for another assistant.",
        )
    snapshot = await head_async(server, record)
    if body.fork_from is not None:
        await agent.get_state_async(thread_id, body.fork_from)  # CheckpointNotFoundError (404) for an unknown one
        kwargs["checkpoint_id"] = body.fork_from
    if body.command is not None:
        if snapshot is None:
            raise HTTPException(409, f"Thread '{thread_id}' is not interrupted: there is nothing to resume.")
        requests = pending_requests(snapshot)
        if not requests:
            raise HTTPException(409, f"Thread '{thread_id}' is not interrupted: there is nothing to resume.")
        kwargs["command"] = body.command.model_dump(exclude_none=True)
        resume = resume_from_command(
            body.command.resume,
            requests,
            snapshot.pending_tool_calls,
            snapshot.checkpoint.checkpoint_id,
            takes_answers=takes_answers(agent),
        )
        kwargs.update(resume.to_kwargs())
    elif snapshot is not None and record.status != "busy" and body.fork_from is None:
        waiting = pending_requests(snapshot)
        if waiting:
            raise HTTPException(
                409,
                f"Thread '{thread_id}' waits on a human for tool call(s) to "
                f"{', '.join(sorted({str(r['tool_name']) for r in waiting}))}; answer it with "
                "command={'resume': ...} (approve, reject or edit each call; answer each question).",
            )
        if messages and unfinished_policy_of(agent, snapshot, body.on_unfinished_calls) == "refuse":
            names = ", ".join(sorted({call.tool_name for call in snapshot.pending_tool_calls})) or "no tool"
            raise HTTPException(
                409,
                f"Thread '{thread_id}' has unfinished tool call(s) to {names}: its last run stopped early (a crash "
                "or a cancel), and this agent refuses new messages until they are settled. Send a run with input "
                "null to finish them, or send the messages with config={'configurable': {'on_unfinished_calls': "
                "'finish' | 'close'}} (run them first, or answer them with errors). Nothing was written.",
            )
    return _Plan(assistant, kwargs)


async def _thread_for_run(server: Server, thread_id: str, user: str, if_not_exists: str | None) -> ThreadRecord:
    """The user's thread of a run (created if missing and ``if_not_exists="create"``); 404 otherwise."""
    record = await server.storage.get_thread(thread_id, user)
    if record is None:
        if if_not_exists != "create":
            raise not_found(thread_id)
        record = await server.storage.create_thread(thread_id, user, {})
        if record is None:  # the id is another user's
            raise not_found(thread_id)
    return record


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Submit safely again: a run its user created with the same key and request is answered instead "
        "(a 409 if the key was used for another request).",
    ),
]
MAX_IDEMPOTENCY_KEY = 255


def _idempotency(key: str | None, route: str, thread_id: str, body: RunCreate) -> Idempotency | None:
    """
    A submission's ``Idempotency-Key`` (as Hayhooks and payment APIs take it), with a digest of what it asks: the
    route, the thread and the body as the client sent it.
    """
    if key is None:
        return None
    if not key.strip() or len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise WireError("Idempotency-Key", f"must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters, got {key[:40]!r}")
    request = {"route": route, "thread_id": thread_id, "body": body.model_dump(mode="json", exclude_unset=True)}
    digest = hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
    return Idempotency(key, digest)


async def _submit(
    server: Server,
    body: RunCreate,
    user: str,
    thread_id: str,
    *,
    here: bool,
    streams: bool = True,
    idempotency: Idempotency | None = None,
) -> RunRecord:
    plan = await _plan(server, body, user, thread_id)
    if not streams:
        plan.kwargs["stream_mode"] = []
    run = new_run(
        str(uuid.uuid4()),
        thread_id,
        plan.assistant,
        user,
        plan.kwargs,
        metadata=body.metadata,
        multitask_strategy=body.multitask_strategy,
    )
    return await server.runs.submit(run, here=here, idempotency=idempotency)


def _locations(run: RunRecord, tail: str) -> dict[str, str]:
    base = f"/threads/{run.thread_id}/runs/{run.run_id}"
    return {"Content-Location": base, "Location": base + tail}


def _final(name: str, data: Any) -> Any:
    return data if name == "values" else {"__error__": data}


def _cursor(last_event_id: str | None) -> Cursor | None:
    if not last_event_id:
        return None
    try:
        return parse_event_id(last_event_id)
    except ValueError as error:
        raise WireError("Last-Event-ID", str(error)) from error


# --- runs on a thread ----------------------------------------------------------------------------------------------


@router.post("/threads/{thread_id}/runs", response_model=Run)
async def create_run(
    thread_id: str, body: RunCreate, caller: CallerDep, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    """
    Queue a background run; any worker (of any server process on the database) runs it. With an
    ``Idempotency-Key``, a retried submission answers the run the first one created.
    """
    server, user = caller
    idempotency = _idempotency(idempotency_key, "runs", thread_id, body)
    run = await _submit(server, body, user, thread_id, here=False, idempotency=idempotency)
    return JSONResponse(run_view(run), headers=_locations(run, ""))


@router.post("/threads/{thread_id}/runs/wait", response_model=RunResult)
async def wait_run(
    thread_id: str, body: RunCreate, caller: CallerDep, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    """
    Run and wait for the final values (``{"__error__": {...}}`` if the run failed). With an ``Idempotency-Key``, a
    retried submission waits for the run the first one created.
    """
    server, user = caller
    idempotency = _idempotency(idempotency_key, "runs/wait", thread_id, body)
    run = await _submit(server, body, user, thread_id, here=True, streams=False, idempotency=idempotency)
    final = await server.runs.wait(run)
    return JSONResponse(_final(*final), headers=_locations(run, "/join"))


@router.post("/threads/{thread_id}/runs/stream", response_class=Response, responses=EVENT_STREAM)
async def stream_run(
    thread_id: str, body: RunCreate, caller: CallerDep, idempotency_key: IdempotencyKey = None
) -> EventStream:
    """
    Run and stream its events. A client that disconnects does not stop the run; it can join it again. With an
    ``Idempotency-Key``, a retried submission streams the run the first one created, from its first event.
    """
    server, user = caller
    idempotency = _idempotency(idempotency_key, "runs/stream", thread_id, body)
    run = await _submit(server, body, user, thread_id, here=True, idempotency=idempotency)
    batches = server.runs.event_batches(run)
    return EventStream(frames(run.run_id, batches, attempt=run.attempt), headers=_locations(run, "/stream"))


async def _owned_run(server: Server, thread_id: str, run_id: str, user: str) -> RunRecord:
    await owned_thread_async(server, thread_id, user)
    run = await server.storage.get_run(run_id, user)
    if run is None or run.thread_id != thread_id:
        raise HTTPException(404, f"Run '{run_id}' not found in thread '{thread_id}'.")
    return run


async def _runs_of(
    server: Server, thread_id: str, user: str, limit: int, offset: int, status: str | None
) -> list[RunRecord]:
    await owned_thread_async(server, thread_id, user)
    return await server.storage.list_runs(thread_id, user, limit=limit, offset=offset, status=status)


@router.get("/threads/{thread_id}/runs", response_model=list[Run])
async def list_runs(
    thread_id: str,
    caller: CallerDep,
    limit: int = Query(10, ge=1, le=1000),
    offset: int = Query(0, ge=0),
    status: str | None = None,
) -> JSONResponse:
    """The thread's runs, newest first."""
    server, user = caller
    runs = await _runs_of(server, thread_id, user, limit, offset, status)
    return JSONResponse([run_view(run) for run in runs])


@router.get("/threads/{thread_id}/runs/{run_id}", response_model=Run)
async def get_run(thread_id: str, run_id: str, caller: CallerDep) -> JSONResponse:
    """One run."""
    server, user = caller
    return JSONResponse(run_view(await _owned_run(server, thread_id, run_id, user)))


@router.get("/threads/{thread_id}/runs/{run_id}/join", response_model=RunResult)
async def join_run(thread_id: str, run_id: str, caller: CallerDep) -> Response:
    """Wait for a run to end; answer the thread's values (``{"__error__": {...}}`` if it failed)."""
    server, user = caller
    run = await _owned_run(server, thread_id, run_id, user)
    return json_answer(_final(*await server.runs.wait(run)))


@router.get("/threads/{thread_id}/runs/{run_id}/stream", response_class=Response, responses=EVENT_STREAM)
async def join_stream(
    thread_id: str,
    run_id: str,
    caller: CallerDep,
    stream_mode: Annotated[list[str] | None, Query()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventStream:
    """
    Stream a run's events, from its first (or the one after ``Last-Event-ID``), wherever it executes, in
    ``stream_mode`` (a subset of the run's modes; all of them by default).
    """
    server, user = caller
    after = _cursor(last_event_id)
    run = await _owned_run(server, thread_id, run_id, user)
    own = list(run.kwargs.get("stream_mode") or ["values"])
    stream_mode = [mode for mode in stream_mode or [] if mode]  # the SDK sends an empty value for "all"
    if stream_mode:
        outside = [mode for mode in stream_mode if mode not in own]
        if outside:
            raise WireError("stream_mode", f"{outside} not among the run's stream modes {own}")
    batches = server.runs.event_batches(run, stream_mode or own, after)
    stream = frames(run.run_id, batches, attempt=run.attempt, resumed=after is not None)
    return EventStream(stream, headers=_locations(run, "/stream"))


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", status_code=204)
async def cancel_run(
    thread_id: str,
    run_id: str,
    caller: CallerDep,
    wait: bool = False,
    action: str = Query("interrupt", pattern="^(interrupt|rollback)$"),
) -> Response:
    """
    Cancel a run: a pending one leaves the queue; a running one stops before its next step, wherever it executes
    (status ``interrupted``; the thread keeps what it committed). ``action=rollback`` also restores the thread to
    where the run started and deletes the run. ``wait`` waits for the run to stop.
    """
    server, user = caller
    run = await _owned_run(server, thread_id, run_id, user)
    await server.runs.cancel(run, "rollback" if action == "rollback" else "interrupt")  # (as the pattern checked)
    if wait:
        await server.runs.wait(run)
    return Response(status_code=204)


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204)
async def delete_run(thread_id: str, run_id: str, caller: CallerDep) -> Response:
    """Delete a run's record (refused while it runs: 409)."""
    server, user = caller
    await _owned_run(server, thread_id, run_id, user)
    if not await server.storage.delete_run(run_id):
        raise HTTPException(409, f"Run '{run_id}' is running; delete it when it ends.")
    return Response(status_code=204)


# --- stateless runs ------------------------------------------------------------------------------------------------


async def _stateless(server: Server, body: RunCreate, user: str, *, streams: bool = True) -> LiveRun:
    plan = await _plan(server, body, user, None)
    if not streams:
        plan.kwargs["stream_mode"] = []
    job: RunJob = job_from_kwargs(str(uuid.uuid4()), plan.assistant, None, plan.kwargs)
    return await server.runs.run_stateless(job)


@router.post("/runs/wait", response_model=RunResult)
async def wait_stateless(body: RunCreate, caller: CallerDep) -> Response:
    """Run without a thread and wait for the final values."""
    server, user = caller
    live = await _stateless(server, body, user, streams=False)
    final: Sent | None = None
    async for event in live.follow():
        final = event
    assert final is not None
    return json_answer(_final(final[1], final[2]))


@router.post("/runs/stream", response_class=Response, responses=EVENT_STREAM)
async def stream_stateless(body: RunCreate, caller: CallerDep) -> EventStream:
    """Run without a thread and stream its events."""
    server, user = caller
    live = await _stateless(server, body, user)
    return EventStream(frames(live.run_id, live.follow_batches()))


@router.post(
    "/runs",
    status_code=422,
    response_class=Response,
    responses={422: {"model": ErrorAnswer, "description": "Always: a background run needs a thread."}},
)
async def create_stateless(body: RunCreate, _: CallerDep) -> None:
    """A background run needs a thread (to join it later)."""
    raise WireError("thread_id", "a background run needs a thread: POST /threads/{thread_id}/runs")
