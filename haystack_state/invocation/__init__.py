"""
Running a model's tool calls against a State: reading what the model sent, hostile or not (:mod:`.arguments`),
planning the calls (resolve, validate, order by what they read and write; :mod:`._calls`), the books and the control
flow of a batch, written once (:mod:`._batch`), one call's scope (:mod:`._scope`), the sync and async runners that
execute the flow, merging atomically in call order with timeouts, in daemon worker threads, each call in its tracing
span (:mod:`._run`, :mod:`._timeouts`, :mod:`._workers`, :mod:`._spans`), the options of a run in one frozen object
(:mod:`._settings`), and the ``ToolInvoker`` component (:mod:`._invoker`).
"""

from haystack_state.invocation._invoker import ToolInvoker
from haystack_state.invocation._outcome import BatchOutcome, PendingCall
from haystack_state.invocation._run import run_tool_batch, run_tool_batch_async
from haystack_state.invocation._settings import ToolRunSettings
from haystack_state.invocation.arguments import safe_tool_calls

__all__ = [
    "BatchOutcome",
    "PendingCall",
    "ToolInvoker",
    "ToolRunSettings",
    "run_tool_batch",
    "run_tool_batch_async",
    "safe_tool_calls",
]
