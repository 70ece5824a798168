"""haystack-state: a schema-driven, typed, durable State for Haystack tool-calling agents."""

from typing import TYPE_CHECKING, Any

from haystack.core.serialization import allow_deserialization_module

from haystack_state._display import StateDiff
from haystack_state.agent import Agent, Approve, Decision, Edit, InterruptRequest, Reject
from haystack_state.agent._history import CheckpointHistory
from haystack_state.agent._session import ThreadSnapshot
from haystack_state.agent.context import (
    ComposePolicies,
    ContextPlan,
    ContextPolicy,
    ContextSummary,
    ContextView,
    OffloadToolResults,
    SlidingWindow,
    Summarize,
    TokenBudget,
)
from haystack_state.errors import (
    AgentRunError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    CodecError,
    HaystackStateError,
    ReadOnlyStateKeyError,
    StateHandlerError,
    StateSchemaError,
    StateSerializationError,
    StateTypeError,
    StoreError,
    StoreInputError,
    ThreadBusyError,
    ThreadConflictError,
    ThreadNotFoundError,
    ToolArgumentsError,
    ToolCallLimitError,
    ToolDefinitionError,
    ToolExecutionError,
    ToolInterruptedError,
    ToolInvocationError,
    ToolMergeError,
    ToolNotFoundError,
    ToolTimeoutError,
    UnknownStateKeyError,
    UnstorableTextError,
    UnstorableValueError,
)
from haystack_state.handlers import RESET, add, merge_dicts, merge_lists, replace_values, unique
from haystack_state.interrupts import ToolInterrupt, interrupt
from haystack_state.invocation import ToolInvoker
from haystack_state.persistence import (
    Checkpoint,
    Checkpointer,
    CheckpointMeta,
    CheckpointMetadata,
    InMemoryCheckpointer,
    LeaseHolder,
    SQLiteCheckpointer,
    ThreadInfo,
    register_type,
)
from haystack_state.retry import RetryPolicy, transient_error
from haystack_state.runtime import RunContext
from haystack_state.state import StagedState, State
from haystack_state.store import InMemoryStore, Item, SQLiteStore, Store
from haystack_state.tools import ComponentTool, FunctionTool, ToolSpec, tool, tool_spec, tool_specs
from haystack_state.tools._haystack_compat import recognize_our_state
from haystack_state.values import FrozenDict, FrozenList, thaw

if TYPE_CHECKING:
    from haystack_state.store.postgres import PostgresStore as PostgresStore

# Our handlers and components are named by import path in serialized schemas and pipeline YAML; haystack-ai only
# loads callables and classes from allowlisted modules, and this package is safe to load from.
allow_deserialization_module("haystack_state")
# haystack-ai's @tool, ComponentTool and Agent recognise our State as theirs (the one-line import switch).
recognize_our_state()

__all__ = [
    "Agent",
    "AgentRunError",
    "Approve",
    "Checkpoint",
    "CheckpointError",
    "CheckpointHistory",
    "CheckpointMeta",
    "CheckpointMetadata",
    "CheckpointNotFoundError",
    "CheckpointStorageError",
    "Checkpointer",
    "CodecError",
    "ComponentTool",
    "ComposePolicies",
    "ContextPlan",
    "ContextPolicy",
    "ContextSummary",
    "ContextView",
    "Decision",
    "Edit",
    "FrozenDict",
    "FrozenList",
    "FunctionTool",
    "HaystackStateError",
    "InMemoryCheckpointer",
    "InMemoryStore",
    "InterruptRequest",
    "Item",
    "LeaseHolder",
    "OffloadToolResults",
    "RESET",
    "ReadOnlyStateKeyError",
    "Reject",
    "RetryPolicy",
    "RunContext",
    "SQLiteCheckpointer",
    "SQLiteStore",
    "SlidingWindow",
    "StagedState",
    "State",
    "StateDiff",
    "StateHandlerError",
    "StateSchemaError",
    "StateSerializationError",
    "StateTypeError",
    "Store",
    "StoreError",
    "StoreInputError",
    "Summarize",
    "ThreadBusyError",
    "ThreadConflictError",
    "ThreadInfo",
    "ThreadNotFoundError",
    "ThreadSnapshot",
    "TokenBudget",
    "ToolArgumentsError",
    "ToolCallLimitError",
    "ToolDefinitionError",
    "ToolExecutionError",
    "ToolInterrupt",
    "ToolInterruptedError",
    "ToolInvocationError",
    "ToolInvoker",
    "ToolMergeError",
    "ToolNotFoundError",
    "ToolSpec",
    "ToolTimeoutError",
    "UnknownStateKeyError",
    "UnstorableTextError",
    "UnstorableValueError",
    "add",
    "interrupt",
    "merge_dicts",
    "merge_lists",
    "register_type",
    "replace_values",
    "thaw",
    "tool",
    "tool_spec",
    "tool_specs",
    "transient_error",
    "unique",
]


def __getattr__(name: str) -> Any:
    # PostgresStore needs the postgres extra: imported on first use, and left out of __all__.
    if name != "PostgresStore":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from haystack_state.store.postgres import PostgresStore

    return PostgresStore
