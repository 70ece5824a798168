"""
The answers of the Agent Protocol endpoints, as pydantic models (the spec's and LangGraph's SDK's ``Thread``,
``ThreadState``, ``Run``, ``Assistant``, store ``Item``, ...), field for field as :mod:`haystack_state.server._views`,
the assistants and the store router build them. The routes declare them as their ``response_model`` for the OpenAPI
document (``/openapi.json``, ``/docs``); the answers themselves are never validated nor filtered through them: a route
answers a :class:`~starlette.responses.Response` of JSON bytes (:func:`json_answer`, or a ``JSONResponse``), so an
answer is exactly what its view built, with no validation pass.

A route that takes ``select`` answers only the fields it names. Fields that hold an agent's state or a user's
metadata are free-form objects; so are models with ``extra="allow"`` (their other keys are the agent's state keys or
the caller's metadata).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema
from starlette.responses import Response

from haystack_state.server._records import MultitaskStrategy, RunStatus, ThreadStatus

__all__ = [
    "Assistant",
    "Checkpoint",
    "CheckpointMetadata",
    "EVENT_STREAM",
    "REFUSED",
    "ErrorAnswer",
    "FieldProblem",
    "Graph",
    "GraphEdge",
    "GraphNode",
    "GraphSchema",
    "Info",
    "InfoFlags",
    "InfoHost",
    "InfoPackage",
    "Interrupt",
    "Item",
    "ListNamespaceResponse",
    "Ok",
    "Run",
    "RunError",
    "RunResult",
    "SearchItem",
    "SearchItemsResponse",
    "Thread",
    "ThreadState",
    "ThreadTask",
    "ThreadUpdateStateResponse",
    "json_answer",
]

#: ISO-8601 time text, as the server writes it (``2025-01-31T12:00:00.000000+00:00``).
IsoTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]

#: The type of a field that an answer may leave out (it is never null): ``int | Omitted`` documents an integer.
Omitted = SkipJsonSchema[None]


def _drop_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _optional(description: str) -> Any:
    """
    A field an answer may leave out (its model's default is None, which the document does not show).

    :param description: What the field holds.
    """
    return Field(default=None, description=description, json_schema_extra=_drop_default)


#: Any JSON value, as FastAPI's own serialization of an ``Any`` answer writes it.
_JSON: TypeAdapter[Any] = TypeAdapter(Any)


def json_answer(content: object, headers: Mapping[str, str] | None = None) -> Response:
    """
    A 200 answer of ``content`` as JSON, in the bytes FastAPI writes for a route that returns it with a
    ``dict``/``list``/``Any`` return type (pydantic's ``dump_json``: non-finite floats as ``null``), without its
    validation pass: the route's ``response_model`` then only describes the answer.

    :param content: JSON-ready data.
    :param headers: More response headers.
    :returns: The response.
    """
    return Response(_JSON.dump_json(content), media_type="application/json", headers=headers)


# --- system --------------------------------------------------------------------------------------------------------


class Ok(BaseModel):
    """The health check's answer."""

    ok: bool = Field(description="Always true: the server answers.")


class InfoFlags(BaseModel):
    """What the server supports, as LangGraph's ``/info`` flags it."""

    assistants: bool = Field(description="Assistants can be listed and read (they cannot be created).")
    crons: bool = Field(description="Scheduled runs (not supported).")
    langsmith: bool = Field(description="LangSmith tracing (not supported).")
    langsmith_tracing_replicas: bool = Field(description="LangSmith tracing replicas (not supported).")


class InfoHost(BaseModel):
    """Where the server runs, as LangGraph's ``/info`` says it."""

    kind: str = Field(description="``self-hosted``.")
    project_id: str | None = Field(description="Always null.")
    host_revision_id: str | None = Field(description="Always null.")
    revision_id: str | None = Field(description="Always null.")


class InfoPackage(BaseModel):
    """The haystack-state package that serves."""

    version: str = Field(description="Its version.")


class Info(BaseModel):
    """The server's version and what it supports, in the shape of LangGraph's ``/info``."""

    version: str = Field(description="The haystack-state version.")
    langgraph_py_version: str | None = Field(description="Always null: no LangGraph runs here.")
    flags: InfoFlags = Field(description="What the server supports.")
    host: InfoHost = Field(description="Where it runs.")
    haystack_state: InfoPackage = Field(description="The serving package.")


class FieldProblem(BaseModel):
    """One field at fault in a refused request."""

    field: str = Field(description="The field, dotted (``input.messages``), or ``body``.")
    message: str = Field(description="What is wrong with it.")


class ErrorAnswer(BaseModel):
    """A refused request: its message, and for a 422 the fields at fault."""

    detail: str = Field(description="What went wrong.")
    param: str | None = _optional("The first field at fault, if any (422 only).")
    errors: list[FieldProblem] | Omitted = _optional("Every field at fault (422 only).")


#: A route's 422, as the app's error handlers answer it (in place of FastAPI's own ``HTTPValidationError``).
REFUSED: dict[int | str, dict[str, Any]] = {
    422: {
        "model": ErrorAnswer,
        "description": "The request is refused: ``detail`` says why; ``param`` and ``errors`` name the fields at "
        "fault.",
    }
}

#: A streaming route's 200 (the route's ``response_class`` is ``Response``, so no JSON answer is described).
EVENT_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: ``metadata`` (``{run_id, attempt}``) first, then the run's events in the "
        "stream modes asked for (``values``, ``updates``, ``messages-tuple``, ...; ``error`` if it failed), each with "
        "its id (``ATTEMPT-SEQ``, for ``Last-Event-ID``) and its data as JSON.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


# --- threads -------------------------------------------------------------------------------------------------------


class Interrupt(BaseModel):
    """Something a thread waits on a human for, in LangGraph's ``Interrupt`` shape."""

    id: str = Field(description="Its id: the key of its answer in ``command.resume``.")
    value: Any = Field(
        description="What the human is asked: ``{action_requests, review_configs}`` for tool calls awaiting "
        "approval, or what a tool's ``interrupt(value)`` asked."
    )


class Checkpoint(BaseModel):
    """A reference to one checkpoint of a thread."""

    thread_id: str = Field(description="The thread.")
    checkpoint_ns: str = Field(description="Always empty (an Agent has no subgraphs).")
    checkpoint_id: str = Field(description="The checkpoint's id.")
    checkpoint_map: dict[str, Any] | None = Field(description="Always null.")


class Thread(BaseModel):
    """A thread (a conversation): the spec's ``Thread``."""

    thread_id: str = Field(description="The thread's id.")
    created_at: IsoTime = Field(description="When it was created.")
    updated_at: IsoTime = Field(description="When it last changed.")
    metadata: dict[str, Any] = Field(description="Free-form metadata (with ``graph_id`` and ``assistant_id``).")
    status: ThreadStatus = Field(description="``idle``, ``busy`` (a run is pending or running), ``interrupted``...")
    values: dict[str, Any] | None = Field(description="The state at its head; null before its first checkpoint.")
    interrupts: dict[str, list[Interrupt]] = Field(description="The interrupts it waits on, by checkpoint id.")
    config: dict[str, Any] = Field(description="Always empty.")
    error: str | None = Field(description="Always null.")


class ThreadTask(BaseModel):
    """The step a thread would take next: its tools (pending tool calls, or calls awaiting a human)."""

    id: str = Field(description="The checkpoint the task follows.")
    name: str = Field(description="``tools``.")
    error: str | None = Field(description="Always null.")
    interrupts: list[Interrupt] = Field(description="The interrupts the task waits on.")
    checkpoint: Checkpoint | None = Field(description="Always null.")
    state: dict[str, Any] | None = Field(description="Always null.")
    result: dict[str, Any] | None = Field(description="Always null.")


class CheckpointMetadata(BaseModel):
    """
    What a checkpoint records besides the values: the fields below, and the run's own free-form metadata (``run_id``,
    ``usage``, ``pending``, ...). Empty for a thread that has no checkpoint yet.
    """

    model_config = ConfigDict(extra="allow")

    source: str | Omitted = _optional("What wrote it, such as ``input``, ``model``, ``tools`` or ``update``.")
    step: int | Omitted = _optional("The agent step that wrote it.")
    tool_names: list[str] | Omitted = _optional("The tools whose results it records.")
    changed_keys: list[str] | Omitted = _optional("The state keys it changed, in order.")


class ThreadState(BaseModel):
    """A thread's state at one checkpoint: the spec's ``ThreadState``."""

    values: dict[str, Any] = Field(description="The state (empty where not selected or before the first checkpoint).")
    next: list[str] = Field(description='``["tools"]`` when tool calls are pending or awaiting a human, else empty.')
    tasks: list[ThreadTask] = Field(description="The pending step, if any.")
    checkpoint: Checkpoint | None = Field(description="This checkpoint; null before the thread's first.")
    metadata: CheckpointMetadata = Field(description="What the checkpoint records besides the values.")
    created_at: IsoTime | None = Field(description="When it was written; null before the thread's first checkpoint.")
    parent_checkpoint: Checkpoint | None = Field(description="The checkpoint it follows; null for the first.")
    interrupts: list[Interrupt] = Field(description="The interrupts the thread waits on at this checkpoint.")


class ThreadUpdateStateResponse(BaseModel):
    """The checkpoint a state edit wrote."""

    checkpoint: Checkpoint = Field(description="The new head.")


# --- runs ----------------------------------------------------------------------------------------------------------


class Run(BaseModel):
    """A run of an assistant on a thread: the spec's ``Run``."""

    run_id: str = Field(description="The run's id (a UUIDv7: ids sort by creation).")
    thread_id: str = Field(description="Its thread.")
    assistant_id: str = Field(description="The assistant that runs it.")
    created_at: IsoTime = Field(description="When it was created.")
    updated_at: IsoTime = Field(description="When it last changed.")
    status: RunStatus = Field(description="``pending``, ``running``, ``success``, ``error``, ``timeout``...")
    metadata: dict[str, Any] = Field(description="Free-form metadata.")
    kwargs: dict[str, Any] = Field(description="What it does: input, command, stream modes, ...")
    multitask_strategy: MultitaskStrategy = Field(description="What it does on a busy thread.")
    cancel_reason: str | None = Field(description="Always null.")
    error: str | None = Field(description="What went wrong, for a failed run.")


class RunError(BaseModel):
    """Why a run failed."""

    error: str = Field(description="The kind of error (an exception's class name).")
    message: str = Field(description="Its message.")


class RunResult(BaseModel):
    """
    What a run ends with: the thread's values (free-form: the agent's state keys), with ``__interrupt__`` when the
    thread waits on a human; or ``{"__error__": {...}}`` alone if the run failed.
    """

    model_config = ConfigDict(extra="allow")

    interrupt: list[Interrupt] | Omitted = Field(
        default=None,
        alias="__interrupt__",
        description="The interrupts the thread waits on, if any.",
        json_schema_extra=_drop_default,
    )
    error: RunError | Omitted = Field(
        default=None, alias="__error__", description="Why the run failed (alone).", json_schema_extra=_drop_default
    )


# --- assistants ----------------------------------------------------------------------------------------------------


class Assistant(BaseModel):
    """A served agent: the spec's ``Assistant``."""

    assistant_id: str = Field(description="Its id (a UUID derived from its name).")
    graph_id: str = Field(description="The name it is served under.")
    name: str = Field(description="The same name.")
    description: str | None = Field(description="The agent's system prompt.")
    config: dict[str, Any] = Field(description="Always empty.")
    context: dict[str, Any] = Field(description="Always empty.")
    metadata: dict[str, Any] = Field(description='``{"created_by": "system"}``.')
    version: int = Field(description="Always 1.")
    created_at: IsoTime = Field(description="When the server started serving it.")
    updated_at: IsoTime = Field(description="The same time.")


class GraphSchema(BaseModel):
    """The JSON schemas of an assistant: its state (its input and output are state keys)."""

    graph_id: str = Field(description="The assistant's name.")
    input_schema: dict[str, Any] | None = Field(description="The state's JSON schema.")
    output_schema: dict[str, Any] | None = Field(description="The state's JSON schema.")
    state_schema: dict[str, Any] | None = Field(description="The state's JSON schema.")
    config_schema: dict[str, Any] | None = Field(description="Always null.")
    context_schema: dict[str, Any] | None = Field(description="Always null.")


class GraphNode(BaseModel):
    """A node of an assistant's drawing."""

    id: str = Field(description="``__start__``, ``model``, ``tools`` or ``__end__``.")
    type: str = Field(description="``schema`` (start, end) or ``runnable``.")
    data: str | dict[str, Any] = Field(description="The node's name, or ``{id, name}`` for a runnable.")


class GraphEdge(BaseModel):
    """An edge of an assistant's drawing."""

    source: str = Field(description="The node it leaves.")
    target: str = Field(description="The node it reaches.")
    conditional: bool = Field(description="Whether it is taken only sometimes.")


class Graph(BaseModel):
    """An assistant drawn as LangGraph draws an agent."""

    nodes: list[GraphNode] = Field(description="Its nodes.")
    edges: list[GraphEdge] = Field(description="Its edges.")


# --- store ---------------------------------------------------------------------------------------------------------


class Item(BaseModel):
    """One item of the long-term memory store."""

    namespace: list[str] = Field(description="Its namespace, as labels.")
    key: str = Field(description="Its key, unique within the namespace.")
    value: dict[str, Any] = Field(description="Its value.")
    created_at: IsoTime = Field(description="When the key was first written.")
    updated_at: IsoTime = Field(description="When it was last written.")


class SearchItem(Item):
    """An item found by a search."""

    score: float | Omitted = _optional("Its relevance to the search's ``query`` (absent without one).")


class SearchItemsResponse(BaseModel):
    """A page of a store search."""

    items: list[SearchItem] = Field(description="The items found.")


class ListNamespaceResponse(BaseModel):
    """A page of the store's namespaces."""

    namespaces: list[list[str]] = Field(description="The namespaces, each as labels.")
