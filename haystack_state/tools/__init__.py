"""
Tools for haystack-state agents: ``@tool`` and ``ComponentTool`` make haystack-ai ``Tool`` instances whose state
mappings are hidden from the model, and ``tool_spec`` tells a tool runner how to call any haystack tool.
"""

from haystack_state.tools._annotations import STATE_CLASSES, is_state_annotation
from haystack_state.tools.component_tool import ComponentTool
from haystack_state.tools.function_tool import FunctionTool, tool
from haystack_state.tools.spec import ToolsArg, ToolSpec, tool_spec, tool_specs

__all__ = [
    "STATE_CLASSES",
    "ComponentTool",
    "FunctionTool",
    "ToolSpec",
    "ToolsArg",
    "is_state_annotation",
    "tool",
    "tool_spec",
    "tool_specs",
]
