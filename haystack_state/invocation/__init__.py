"""
Running a model's tool calls against a State: planning them (resolve, validate, order by what they read and write;
:mod:`.calls`), running them atomically in call order (:mod:`.invoker`), and the ``ToolInvoker`` component.
"""

from haystack_state.invocation.invoker import ToolInvoker

__all__ = ["ToolInvoker"]
