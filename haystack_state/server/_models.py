"""
The request bodies of the Agent Protocol endpoints, as pydantic models: the fields the spec (and LangGraph's SDK,
which implements a superset of it) sends. Unknown fields are refused, and fields the server does not implement yet
are refused when set, so a request is never half-understood; the error names the field (see ``app.py``).

Thread ids and metadata (and metadata filters) may not hold NUL characters, which the databases cannot store or query
as JSON; every other text check of a request is made at the edge for every field (see
:mod:`haystack_state.server._text`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from haystack_state._text import find_bad_text
from haystack_state.server._records import MultitaskStrategy, ThreadStatus
from haystack_state.server._streams import STREAM_MODES, SUPPORTED_STREAM_MODES

__all__ = [
    "AssistantCount",
    "AssistantSearch",
    "CheckpointRef",
    "Command",
    "HistoryRequest",
    "RunCreate",
    "StateAtCheckpoint",
    "StateUpdate",
    "ThreadCount",
    "ThreadCreate",
    "ThreadPatch",
    "ThreadSearch",
]

T = TypeVar("T")

#: The policies for new input on a thread whose last run stopped with tool calls unanswered.
UNFINISHED_CALLS_POLICIES = ("finish", "close", "refuse")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _unsupported(what: str) -> AfterValidator:
    """A field's check that refuses any value but an empty one, naming what the server does not support."""

    def check(value: T) -> T:
        if value not in (None, [], {}, False):
            raise ValueError(f"{what} is not supported by this server")
        return value

    return AfterValidator(check)


def _queryable(value: T) -> T:
    """
    Refuse what thread metadata (or a thread id) cannot hold on every database: a NUL character (PostgreSQL's text
    and jsonb refuse it, and a SQLite JSON path cannot name a key holding one). The error names where it is.
    """
    found = find_bad_text(value, nul=True, finite=True)
    if found is None:
        return value
    error = PydanticCustomError("unstorable_text", "{problem}", {"problem": found.problem})
    loc = tuple(step for _, step in found.path)
    raise ValidationError.from_exception_data("text", [InitErrorDetails(type=error, loc=loc, input=value)])


#: A JSON object of a request (metadata, a filter, a config), as sent.
Metadata = dict[str, Any]
#: Thread metadata (or a metadata filter) the databases can store and query.
StorableMetadata = Annotated[Metadata | None, AfterValidator(_queryable)]
#: A ``ttl`` (threads that expire): not supported.
NoTtl = Annotated[Metadata | None, _unsupported("ttl")]
#: A filter on threads' values: not supported.
NoValuesFilter = Annotated[Metadata | None, _unsupported("filtering threads by state values")]


class CheckpointRef(BaseModel):
    """A checkpoint reference: ``{"checkpoint_id": ..., "thread_id"?, "checkpoint_ns"?, ...}``."""

    model_config = ConfigDict(extra="allow")
    checkpoint_id: str | None = None
    checkpoint_ns: str = ""


_GRAPH_COMMAND = _unsupported("this command (an Agent has no graph nodes to go to; use threads' update_state)")


class Command(_Body):
    """A run's command: ``resume`` answers the thread's interrupt; ``update`` and ``goto`` are not supported."""

    resume: object = None
    update: Annotated[object, _GRAPH_COMMAND] = None
    goto: Annotated[object, _GRAPH_COMMAND] = None


_RUN_INTERRUPTS = _unsupported("choosing interrupts per run (give the Agent interrupt_before=[...] instead)")


class RunCreate(_Body):
    """The body of ``POST /threads/{id}/runs[/wait|/stream]`` and ``POST /runs/wait|stream``."""

    assistant_id: str = Field(min_length=1)
    input: dict[str, Any] | None = None
    command: Command | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream_mode: str | list[str] = Field(default="values", validate_default=True)
    stream_subgraphs: bool = False
    stream_resumable: bool = False
    interrupt_before: Annotated[Literal["*"] | list[str] | None, _RUN_INTERRUPTS] = None
    interrupt_after: Annotated[Literal["*"] | list[str] | None, _RUN_INTERRUPTS] = None
    feedback_keys: list[str] | None = None
    webhook: Annotated[str | None, _unsupported("webhook")] = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None
    checkpoint_during: bool | None = None
    multitask_strategy: MultitaskStrategy = "reject"
    if_not_exists: Literal["create", "reject"] = "reject"
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    after_seconds: Annotated[float | None, _unsupported("after_seconds (scheduled runs)")] = None
    durability: Literal["sync", "async", "exit"] | None = None
    strict_resume: bool | None = None
    langsmith_tracer: dict[str, Any] | None = None

    @field_validator("stream_mode")
    @classmethod
    def _modes(cls, value: str | list[str]) -> list[str]:
        modes = [value] if isinstance(value, str) else list(value)
        unknown = [m for m in modes if m not in STREAM_MODES]
        if unknown:
            raise ValueError(f"unknown stream mode(s) {unknown}; modes: {', '.join(STREAM_MODES)}")
        unsupported = [m for m in modes if m not in SUPPORTED_STREAM_MODES]
        if unsupported:
            raise ValueError(
                f"stream mode(s) {unsupported} are not supported; supported: {', '.join(SUPPORTED_STREAM_MODES)}"
            )
        return modes or ["values"]

    @model_validator(mode="after")
    def _input_or_command(self) -> RunCreate:
        if self.command is not None and self.input:
            raise ValueError("send either input (new messages and values) or command (resume), not both")
        return self

    @field_validator("config")
    @classmethod
    def _policy(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        configurable = (value or {}).get("configurable")
        policy = configurable.get("on_unfinished_calls") if isinstance(configurable, dict) else None
        if policy is not None and policy not in UNFINISHED_CALLS_POLICIES:
            raise ValueError(
                f"configurable.on_unfinished_calls must be one of {', '.join(UNFINISHED_CALLS_POLICIES)}, "
                f"got {policy!r}"
            )
        return value

    @property
    def on_unfinished_calls(self) -> str | None:
        """
        The run's policy for new input on a thread whose last run stopped mid-tools (``finish``, ``close`` or
        ``refuse``), from ``config={"configurable": {"on_unfinished_calls": ...}}``; the Agent's if None.
        """
        configurable = (self.config or {}).get("configurable")
        policy = configurable.get("on_unfinished_calls") if isinstance(configurable, dict) else None
        return None if policy is None else str(policy)

    @property
    def fork_from(self) -> str | None:
        """The checkpoint to start from (``checkpoint.checkpoint_id`` or ``checkpoint_id``), or None for the head."""
        if self.checkpoint is not None and self.checkpoint.checkpoint_id:
            return self.checkpoint.checkpoint_id
        return self.checkpoint_id


class ThreadCreate(_Body):
    """The body of ``POST /threads``."""

    thread_id: Annotated[str | None, AfterValidator(_queryable)] = Field(default=None, min_length=1, max_length=256)
    metadata: StorableMetadata = None
    if_exists: Literal["raise", "do_nothing"] = "raise"
    supersteps: Annotated[list[Any] | None, _unsupported("supersteps (create the thread, then update_state)")] = None
    ttl: NoTtl = None


class ThreadPatch(_Body):
    """The body of ``PATCH /threads/{id}``: metadata to merge."""

    metadata: Annotated[Metadata, AfterValidator(_queryable)] = Field(default_factory=dict)
    ttl: NoTtl = None


class ThreadSearch(_Body):
    """The body of ``POST /threads/search``."""

    metadata: StorableMetadata = None
    values: NoValuesFilter = None
    ids: Annotated[list[str] | None, AfterValidator(_queryable)] = None
    status: ThreadStatus | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at"] = "created_at"
    sort_order: Literal["asc", "desc"] = "desc"
    select: list[str] | None = None
    extract: Annotated[Metadata | None, _unsupported("extract")] = None


class ThreadCount(_Body):
    """The body of ``POST /threads/count``."""

    metadata: StorableMetadata = None
    values: NoValuesFilter = None
    status: ThreadStatus | None = None


class StateUpdate(_Body):
    """The body of ``POST /threads/{id}/state``."""

    values: dict[str, Any] | None = None
    as_node: str | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None


class StateAtCheckpoint(_Body):
    """The body of ``POST /threads/{id}/state/checkpoint``."""

    checkpoint: CheckpointRef
    subgraphs: bool = False
    select: list[str] | None = None


class HistoryRequest(_Body):
    """The body of ``POST /threads/{id}/history``."""

    limit: int = Field(default=10, ge=1, le=1000)
    before: str | CheckpointRef | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointRef | None = None
    select: list[str] | None = None

    @property
    def before_id(self) -> str | None:
        """The checkpoint id the page starts after (newest first), or None for the head."""
        if isinstance(self.before, CheckpointRef):
            return self.before.checkpoint_id
        return self.before


class AssistantSearch(_Body):
    """The body of ``POST /assistants/search``."""

    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    sort_by: Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None


class AssistantCount(_Body):
    """The body of ``POST /assistants/count``."""

    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
