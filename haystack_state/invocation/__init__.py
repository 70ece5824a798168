"""
Running a model's tool calls against a State: planning them (resolve, validate, order by what they read and write;
:mod:`.calls`), running them atomically in call order (:mod:`.invoker`), and the ``ToolInvoker`` component.
"""

from haystack_state.invocation.invoker import ToolInvoker
from haystack_state.invocation.outcome import BatchOutcome, PendingCall
from haystack_state.invocation.run import run_tool_batch, run_tool_batch_async

__all__ = ["BatchOutcome", "PendingCall", "ToolInvoker", "run_tool_batch", "run_tool_batch_async"]
