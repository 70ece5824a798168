"""
``ToolRunSettings``: the options of running tool calls that an ``Agent`` or a ``ToolInvoker`` fixes at construction,
carried as one frozen object to the batch runners (:func:`~haystack_state.invocation._run.run_tool_batch` and its async
twin). What changes per run (the streaming callback, the run's context, a resume's answers, the calls held for
approval) is passed beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from haystack_state.retry import RetryPolicy

__all__ = ["DEFAULT_TOOL_RUN_SETTINGS", "ToolRunSettings"]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolRunSettings:
    """
    How a batch of tool calls runs: the one description of these options, for every runner
    (:func:`~haystack_state.invocation._run.run_tool_batch`, :func:`~haystack_state.invocation._run.run_tool_calls` and
    their async twins).

    :param raise_on_failure: Raise a ``ToolInvocationError`` at the first failed call (in call order) instead of
        returning an error tool result. The calls before it stay merged; calls not started yet do not run (the async
        runner cancels those still running).
    :param max_workers: How many calls may run at once.
    :param passthrough: Pass the streaming callback to tools that take a ``streaming_callback`` parameter.
    :param convert_result_to_json_string: How results are rendered for the model: None for haystack-ai's Agent's rule
        (strings as they are, other values as JSON), True for ``json.dumps``, False for ``str()`` (see
        :func:`~haystack_state.invocation._calls.result_to_string`).
    :param on_interrupt: ``"pend"``: a call that stops at ``interrupt()`` is pending (it and its dependents merge
        nothing, and the outcome lists them); ``"fail"``: it fails with a ``ToolInterruptedError`` like any failed
        call, and its dependents run.
    :param max_tool_calls: The most calls of one batch that run; the others are answered with a
        ``ToolCallLimitError``. No limit if None.
    :param tool_timeout: The timeout, in seconds, of calls whose tool has none of its own; None for no timeout. A call
        over time is answered with a ``ToolTimeoutError`` and merges nothing (an async tool is cancelled, a sync one
        abandoned in its daemon worker thread).
    :param retry_policy: How a call whose tool raised (or overran its timeout) is called again: each attempt gets the
        timeout, the backoff waits between them do not count; only the last attempt's State writes are merged. A
        call whose budget is spent fails as it would have without retries, its message saying how many attempts
        were made. Never retried if None.
    """

    raise_on_failure: bool = True
    max_workers: int = 4
    passthrough: bool = False
    convert_result_to_json_string: bool | None = None
    on_interrupt: Literal["pend", "fail"] = "pend"
    max_tool_calls: int | None = 64
    tool_timeout: float | None = None
    retry_policy: RetryPolicy | None = None


#: The settings of a runner called without any.
DEFAULT_TOOL_RUN_SETTINGS = ToolRunSettings()
