"""
The request bodies of the Agent Protocol endpoints, as pydantic models: the fields the spec (and LangGraph's SDK,
which implements a superset of it) sends. Unknown fields are refused, and fields the server does not implement yet
are refused when set, so a request is never half-understood; the error names the field (see ``app.py``).

Thread ids and metadata (and metadata filters) may not hold NUL characters, which the databases cannot store or query
as JSON; every other text check of a request is made at the edge for every field (see
:mod:`haystack_state.server.text`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from haystack_state.server.streams import STREAM_MODES, SUPPORTED_STREAM_MODES
from haystack_state.text import find_bad_text

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


#: The policies for new input on a thread whose last run stopped with tool calls unanswered.
UNFINISHED_CALLS_POLICIES = ("finish", "close", "refuse")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _unsupported(value: Any, what: str) -> Any:
    if value not in (None, [], {}, False):
        raise ValueError(f"{what} is not supported by this server")
    return value


def _queryable(value: Any) -> Any:
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


class CheckpointRef(BaseModel):
    """A checkpoint reference: ``{"checkpoint_id": ..., "thread_id"?, "checkpoint_ns"?, ...}``."""

    model_config = ConfigDict(extra="allow")
    checkpoint_id: str | None = None
    checkpoint_ns: str = ""


class Command(_Body):
    """A run's command: ``resume`` answers the thread's interrupt; ``update`` and ``goto`` are not supported."""

    resume: Any = None
    update: Any = None
    goto: Any = None

    @field_validator("update", "goto")
    @classmethod
    def _refuse(cls, value: Any) -> Any:
        return _unsupported(value, "this command (an Agent has no graph nodes to go to; use threads' update_state)")


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
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    feedback_keys: list[str] | None = None
    webhook: str | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None
    checkpoint_during: bool | None = None
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback"] = "reject"
    if_not_exists: Literal["create", "reject"] = "reject"
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    after_seconds: float | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    strict_resume: bool | None = None
    langsmith_tracer: dict[str, Any] | None = None

    @field_validator("interrupt_before", "interrupt_after")
    @classmethod
    def _no_run_interrupts(cls, value: Any) -> Any:
        return _unsupported(value, "choosing interrupts per run (give the Agent interrupt_before=[...] instead)")

    @field_validator("webhook")
    @classmethod
    def _no_webhook(cls, value: Any) -> Any:
        return _unsupported(value, "webhook")

    @field_validator("after_seconds")
    @classmethod
    def _no_delay(cls, value: Any) -> Any:
        return _unsupported(value, "after_seconds (scheduled runs)")

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

    thread_id: str | None = Field(default=None, min_length=1, max_length=256)
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] = "raise"
    supersteps: list[Any] | None = None
    ttl: dict[str, Any] | None = None

    @field_validator("thread_id", "metadata")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return _queryable(value)

    @field_validator("supersteps")
    @classmethod
    def _no_supersteps(cls, value: Any) -> Any:
        return _unsupported(value, "supersteps (create the thread, then update_state)")

    @field_validator("ttl")
    @classmethod
    def _no_ttl(cls, value: Any) -> Any:
        return _unsupported(value, "ttl")


class ThreadPatch(_Body):
    """The body of ``PATCH /threads/{id}``: metadata to merge."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    ttl: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return _queryable(value)

    @field_validator("ttl")
    @classmethod
    def _no_ttl(cls, value: Any) -> Any:
        return _unsupported(value, "ttl")


ThreadStatusName = Literal["idle", "busy", "interrupted", "error"]


class ThreadSearch(_Body):
    """The body of ``POST /threads/search``."""

    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    ids: list[str] | None = None
    status: ThreadStatusName | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at"] = "created_at"
    sort_order: Literal["asc", "desc"] = "desc"
    select: list[str] | None = None
    extract: dict[str, Any] | None = None

    @field_validator("metadata", "ids")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return _queryable(value)

    @field_validator("values")
    @classmethod
    def _no_values(cls, value: Any) -> Any:
        return _unsupported(value, "filtering threads by state values")

    @field_validator("extract")
    @classmethod
    def _no_extract(cls, value: Any) -> Any:
        return _unsupported(value, "extract")


class ThreadCount(_Body):
    """The body of ``POST /threads/count``."""

    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: ThreadStatusName | None = None

    @field_validator("metadata")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return _queryable(value)

    @field_validator("values")
    @classmethod
    def _no_values(cls, value: Any) -> Any:
        return _unsupported(value, "filtering threads by state values")


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
