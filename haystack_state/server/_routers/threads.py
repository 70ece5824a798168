"""
``/threads``: create, search, count, get, patch, delete and copy threads; read a thread's state (at its head or at a
checkpoint), edit it, and page through its history.

The frequent, short requests (create a thread, read one) are async: their database work runs as the run queue's
does (``RunManager.db``: inline on SQLite, when it need not wait). The others are plain functions: FastAPI runs them
in its thread pool, so their longer database work (searches, histories, copies) never holds the event loop.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.responses import JSONResponse
from haystack import logging

from haystack_state.agent._session import ThreadSnapshot
from haystack_state.errors import CheckpointError, CheckpointStorageError, ThreadNotFoundError
from haystack_state.persistence.codec import encode
from haystack_state.server._context import Server, ServerDep, UserDep
from haystack_state.server._models import (
    HistoryRequest,
    StateAtCheckpoint,
    StateUpdate,
    ThreadCount,
    ThreadCreate,
    ThreadPatch,
    ThreadSearch,
)
from haystack_state.server._records import ThreadBusy, ThreadRecord
from haystack_state.server._responses import REFUSED, Thread, ThreadState, ThreadUpdateStateResponse, json_answer
from haystack_state.server._text import check_request
from haystack_state.server._threads import (
    agent_of,
    copy_values,
    head,
    head_async,
    not_found,
    owned_thread,
    owned_thread_async,
    seed_thread,
)
from haystack_state.server._views import checkpoint_ref, meta_view, outcome_status, select, state_view, thread_view
from haystack_state.server._wire import keys_named, values_from_wire

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/threads", tags=["Threads"], dependencies=[Depends(check_request)], responses=REFUSED)

_STATE_FIELDS = {"values", "next", "tasks", "interrupts"}


@router.post("", response_model=Thread)
async def create_thread(body: ThreadCreate, server: ServerDep, user: UserDep) -> JSONResponse:
    """Create a thread (it gets its first checkpoint from its first run, or from ``update_state``)."""
    thread_id = body.thread_id or str(uuid.uuid4())
    metadata, if_exists = body.metadata or {}, body.if_exists
    record = await server.storage.create_thread(thread_id, user, metadata, if_exists=if_exists)
    if record is None:
        raise HTTPException(409, f"Thread '{thread_id}' already exists.")
    # A thread id the server just made has no checkpoint; one the client names may (its agent wrote it before).
    snapshot = await head_async(server, record) if body.thread_id else None
    return JSONResponse(thread_view(record, snapshot, system_prompt=server.assistants.wire_system_prompt))


#: The fields of a ``ThreadSearch`` that are the storage's ``search_threads`` filters, order and page.
_SEARCH_FIELDS = {"metadata", "status", "ids", "limit", "offset", "sort_by", "sort_order"}


@router.post("/search", response_model=list[Thread])
def search_threads(body: ThreadSearch, server: ServerDep, user: UserDep) -> Response:
    """
    The user's threads matching the filters (metadata keys equal, status, ids), sorted and paged; with ``select``,
    only the fields it names.
    """
    records = server.storage.search_threads(user, **body.model_dump(include=_SEARCH_FIELDS)).result()
    with_values = body.select is None or bool({"values", "interrupts"} & set(body.select))
    prompt = server.assistants.wire_system_prompt
    return json_answer(
        [
            select(thread_view(r, _listed_head(server, r) if with_values else None, system_prompt=prompt), body.select)
            for r in records
        ]
    )


def _listed_head(server: Server, record: ThreadRecord) -> ThreadSnapshot | None:
    """A listed thread's head; a thread whose stored state cannot be read is listed without values, never failing
    the list (its own ``GET`` names the problem)."""
    try:
        return head(server, record)
    except CheckpointStorageError:
        raise
    except CheckpointError as error:
        logger.warning(
            "Thread '{thread_id}' is listed without its values: its stored state cannot be read ({error}).",
            thread_id=record.thread_id,
            error=error,
        )
        return None


@router.post("/count", response_model=int)
def count_threads(body: ThreadCount, server: ServerDep, user: UserDep) -> Response:
    """How many of the user's threads match the filters."""
    return json_answer(server.storage.count_threads(user, metadata=body.metadata, status=body.status).result())


@router.get("/{thread_id}", response_model=Thread)
async def get_thread(thread_id: str, server: ServerDep, user: UserDep) -> JSONResponse:
    """One thread, with its values and interrupts."""
    record = await owned_thread_async(server, thread_id, user)
    snapshot = await head_async(server, record)
    return JSONResponse(thread_view(record, snapshot, system_prompt=server.assistants.wire_system_prompt))


@router.patch("/{thread_id}", response_model=Thread)
def patch_thread(thread_id: str, body: ThreadPatch, server: ServerDep, user: UserDep) -> Response:
    """Merge metadata into a thread."""
    owned_thread(server, thread_id, user)
    server.storage.update_thread(thread_id, metadata=body.metadata).result()
    record = owned_thread(server, thread_id, user)
    return json_answer(thread_view(record, head(server, record), system_prompt=server.assistants.wire_system_prompt))


@router.delete("/{thread_id}", status_code=204)
def delete_thread(thread_id: str, server: ServerDep, user: UserDep) -> Response:
    """Delete a thread, its runs and its checkpoints (refused while a run is running: 409)."""
    record = owned_thread(server, thread_id, user)
    if not server.storage.delete_thread(thread_id, user).result():
        raise not_found(thread_id)
    with contextlib.suppress(ThreadNotFoundError):  # a thread that never ran has no checkpoints
        agent_of(server, record).checkpointer.delete_thread(thread_id)  # type: ignore[union-attr]
    return Response(status_code=204)


@router.post("/{thread_id}/copy", response_model=Thread)
def copy_thread(thread_id: str, server: ServerDep, user: UserDep) -> Response:
    """A new thread of the user's, with the same metadata and the same state (one checkpoint; not the history)."""
    source = owned_thread(server, thread_id, user)
    snapshot = head(server, source)
    new_id = str(uuid.uuid4())
    record = server.storage.create_thread(new_id, user, source.metadata).result()
    assert record is not None  # a fresh uuid4
    if snapshot is not None:
        copy_values(agent_of(server, source), new_id, snapshot)
        server.storage.update_thread(
            new_id, status=outcome_status(snapshot), assistant_id=source.assistant_id or None
        ).result()
    record = owned_thread(server, new_id, user)
    return json_answer(thread_view(record, head(server, record), system_prompt=server.assistants.wire_system_prompt))


def _state(server: ServerDep, thread_id: str, user: str, checkpoint_id: str | None) -> dict[str, Any]:
    record = owned_thread(server, thread_id, user)
    agent = agent_of(server, record)
    if checkpoint_id is None and head(server, record) is None:
        return {
            "values": {},
            "next": [],
            "tasks": [],
            "checkpoint": None,
            "metadata": {},
            "created_at": None,
            "parent_checkpoint": None,
            "interrupts": [],
        }
    return state_view(agent.get_state(thread_id, checkpoint_id), system_prompt=server.assistants.wire_system_prompt)


@router.get("/{thread_id}/state", response_model=ThreadState)
def get_state(
    thread_id: str,
    server: ServerDep,
    user: UserDep,
    subgraphs: bool = False,
    select_fields: Annotated[list[str] | None, Query(alias="select")] = None,
) -> Response:
    """The thread's state at its head (with ``select``, only the fields it names)."""
    return json_answer(select(_state(server, thread_id, user, None), select_fields))


@router.get("/{thread_id}/state/{checkpoint_id}", response_model=ThreadState)
def get_state_at(
    thread_id: str,
    checkpoint_id: str,
    server: ServerDep,
    user: UserDep,
    subgraphs: bool = False,
    select_fields: Annotated[list[str] | None, Query(alias="select")] = None,
) -> Response:
    """The thread's state at one of its checkpoints (with ``select``, only the fields it names)."""
    return json_answer(select(_state(server, thread_id, user, checkpoint_id), select_fields))


@router.post("/{thread_id}/state/checkpoint", response_model=ThreadState)
def post_state_at(thread_id: str, body: StateAtCheckpoint, server: ServerDep, user: UserDep) -> Response:
    """The thread's state at a checkpoint given in the body (with ``select``, only the fields it names)."""
    return json_answer(select(_state(server, thread_id, user, body.checkpoint.checkpoint_id), body.select))


@router.post("/{thread_id}/state", response_model=ThreadUpdateStateResponse)
def update_state(thread_id: str, body: StateUpdate, server: ServerDep, user: UserDep) -> Response:
    """
    A human edit of the thread's state, recorded as a checkpoint (values go through their keys' handlers: messages
    are appended). Refused while a run is pending or running (409); ``as_node`` is ignored.
    """
    record = owned_thread(server, thread_id, user)
    if record.status == "busy":
        raise ThreadBusy(f"Thread '{thread_id}' has a pending or running run; edit its state when the run ends.")
    agent = agent_of(server, record)
    snapshot = head(server, record)
    wanted = body.checkpoint.checkpoint_id if body.checkpoint is not None else body.checkpoint_id
    if wanted is not None and (snapshot is None or wanted != snapshot.checkpoint.checkpoint_id):
        raise HTTPException(
            422,
            f"checkpoint: only the thread's head can be edited (its head is "
            f"{snapshot.checkpoint.checkpoint_id if snapshot else 'not written yet'}); to change the past, start a "
            "run from that checkpoint (it forks a new branch).",
        )
    values = values_from_wire(body.values or {}, field="values")
    with keys_named("values"):
        meta = seed_thread(agent, thread_id, values) if snapshot is None else agent.update_state(thread_id, values)
    server.storage.update_thread(thread_id, status=outcome_status(agent.get_state(thread_id))).result()
    return json_answer({"checkpoint": checkpoint_ref(thread_id, meta.checkpoint_id)})


def _history(server: ServerDep, thread_id: str, user: str, body: HistoryRequest) -> list[dict[str, Any]]:
    record = owned_thread(server, thread_id, user)
    agent = agent_of(server, record)
    try:
        items = list(agent.get_history(thread_id))
    except ThreadNotFoundError:
        return []
    before = body.before_id
    if before is not None:
        ids = [meta.checkpoint_id for meta in items]
        if before not in ids:
            raise HTTPException(404, f"Thread '{thread_id}' has no checkpoint '{before}' (before).")
        items = items[ids.index(before) + 1 :]
    if body.metadata:
        wanted = encode(body.metadata, where="metadata")
        items = [m for m in items if all(encode(m.metadata.get(k)) == v for k, v in wanted.items())]
    page = items[: body.limit]
    if body.select is not None and not _STATE_FIELDS & set(body.select):
        return [select(meta_view(meta), body.select) for meta in page]
    prompt = server.assistants.wire_system_prompt
    return [
        select(state_view(agent.get_state(thread_id, meta.checkpoint_id), system_prompt=prompt), body.select)
        for meta in page
    ]


@router.post("/{thread_id}/history", response_model=list[ThreadState])
def post_history(thread_id: str, body: HistoryRequest, server: ServerDep, user: UserDep) -> Response:
    """
    The thread's checkpoints (every branch), newest first: ``limit`` of them, starting after ``before``; with
    ``select``, only the fields it names.
    """
    return json_answer(_history(server, thread_id, user, body))


@router.get("/{thread_id}/history", response_model=list[ThreadState])
def get_history(
    thread_id: str, server: ServerDep, user: UserDep, limit: int = Query(10, ge=1, le=1000), before: str | None = None
) -> Response:
    """The thread's checkpoints, newest first (query parameters ``limit`` and ``before``)."""
    return json_answer(_history(server, thread_id, user, HistoryRequest(limit=limit, before=before)))
