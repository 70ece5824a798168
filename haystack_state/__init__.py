"""haystack-state: a schema-driven, typed, durable State for Haystack tool-calling agents."""

from haystack.core.serialization import allow_deserialization_module

from haystack_state.agent import Agent
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
from haystack_state.agent.history import CheckpointHistory
from haystack_state.agent.session import ThreadSnapshot
from haystack_state.display import StateDiff
from haystack_state.errors import (
    AgentRunError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    CodecError,
    HaystackStateError,
    StateHandlerError,
    StateSchemaError,
    StateSerializationError,
    StateTypeError,
    ThreadBusyError,
    ThreadConflictError,
    ThreadNotFoundError,
    ToolArgumentsError,
    ToolDefinitionError,
    ToolExecutionError,
    ToolInterruptedError,
    ToolInvocationError,
    ToolMergeError,
    ToolNotFoundError,
    UnknownStateKeyError,
    UnstorableValueError,
)
from haystack_state.handlers import RESET, add, merge_dicts, merge_lists, replace_values, unique
from haystack_state.interrupts import ToolInterrupt, interrupt
from haystack_state.invocation import ToolInvoker
from haystack_state.persistence import (
    Checkpoint,
    Checkpointer,
    CheckpointMeta,
    InMemoryCheckpointer,
    SQLiteCheckpointer,
    ThreadInfo,
    register_type,
)
from haystack_state.state import StagedState, State
from haystack_state.tools import ComponentTool, FunctionTool, ToolSpec, tool, tool_spec, tool_specs
from haystack_state.values import FrozenDict, FrozenList, thaw

# Our handlers and components are named by import path in serialized schemas and pipeline YAML; haystack-ai only
# loads callables and classes from allowlisted modules, and this package is safe to load from.
allow_deserialization_module("haystack_state")

__all__ = [
    "ComposePolicies",
    "ContextPlan",
    "ContextPolicy",
    "ContextSummary",
    "ContextView",
    "OffloadToolResults",
    "SlidingWindow",
    "Summarize",
    "TokenBudget",
    "register_type",
    "ThreadSnapshot",
    "ThreadInfo",
    "StateDiff",
    "SQLiteCheckpointer",
    "InMemoryCheckpointer",
    "CheckpointHistory",
    "Checkpointer",
    "CheckpointMeta",
    "Checkpoint",
    "RESET",
    "Agent",
    "AgentRunError",
    "CheckpointError",
    "CheckpointStorageError",
    "CheckpointNotFoundError",
    "CodecError",
    "ComponentTool",
    "FunctionTool",
    "FrozenDict",
    "FrozenList",
    "HaystackStateError",
    "StagedState",
    "State",
    "StateHandlerError",
    "StateSchemaError",
    "StateSerializationError",
    "StateTypeError",
    "ThreadBusyError",
    "ThreadConflictError",
    "ThreadNotFoundError",
    "ToolArgumentsError",
    "ToolDefinitionError",
    "ToolExecutionError",
    "ToolInterrupt",
    "ToolInterruptedError",
    "ToolInvocationError",
    "ToolMergeError",
    "ToolInvoker",
    "ToolNotFoundError",
    "ToolSpec",
    "UnknownStateKeyError",
    "UnstorableValueError",
    "interrupt",
    "add",
    "merge_dicts",
    "merge_lists",
    "replace_values",
    "thaw",
    "tool",
    "tool_spec",
    "tool_specs",
    "unique",
]
