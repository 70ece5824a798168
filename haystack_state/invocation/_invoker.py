"""
``ToolInvoker``: a Haystack component that runs a model's tool calls against a State (see :mod:`._run`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from haystack import component, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.dataclasses.streaming_chunk import StreamingCallbackT, select_streaming_callback
from haystack.tools.serde_utils import deserialize_tools_or_toolset_inplace, serialize_tools_or_toolset
from haystack.tools.toolset import Toolset
from haystack.tools.utils import flatten_tools_or_toolsets, warm_up_tools, warm_up_tools_async
from haystack.utils import deserialize_callable, serialize_callable

from haystack_state.invocation._run import run_tool_calls, run_tool_calls_async
from haystack_state.invocation._settings import ToolRunSettings
from haystack_state.invocation._timeouts import check_max_tool_calls, check_timeout
from haystack_state.retry import RetryPolicy
from haystack_state.runtime import RunContext, check_tool_deps
from haystack_state.state import State
from haystack_state.store import Store, store_from_dict
from haystack_state.tools.spec import ToolsArg, ToolSpec, tool_specs

__all__ = ["ToolInvoker"]

#: The attributes of a ``ToolInvoker`` that make its ``ToolRunSettings``.
_SETTING_ATTRIBUTES = frozenset(
    {
        "raise_on_failure",
        "max_workers",
        "enable_streaming_callback_passthrough",
        "convert_result_to_json_string",
        "tool_timeout",
        "max_tool_calls",
        "retry_policy",
    }
)

#: The init parameters besides the tools that ``to_dict`` serialises, and what rebuilds each (when it is set).
_DESERIALIZERS: tuple[tuple[str, Callable[[Any], object]], ...] = (
    ("streaming_callback", deserialize_callable),
    ("store", store_from_dict),
    ("retry_policy", RetryPolicy.from_dict),
)

#: A ``ToolInvoker`` has no human to ask: a call that stops at ``interrupt()`` without an answer fails.
_ON_INTERRUPT: Literal["fail"] = "fail"


def _state_or_new(state: object) -> State:
    """The State to run against: the one given, or a new empty one. Anything else is refused with the fix."""
    if state is None:
        return State({})
    if not isinstance(state, State):
        raise TypeError(
            f"ToolInvoker needs a haystack_state State, got {type(state).__module__}.{type(state).__name__}. "
            "Convert one of haystack-ai's with haystack_state.State.from_dict(state.to_dict())."
        )
    return state


@component
class ToolInvoker:
    """
    Runs the tool calls of a model's messages against a State: resolves each tool, validates the model's arguments,
    fills parameters from state, injects the State, calls the tools (in parallel where they do not depend on each
    other), merges their outputs into the state in the order the model listed the calls, and returns one tool
    result message per call.

    A call that fails merges nothing, including what it wrote through an injected State. Parameters hidden from
    the model always come from state: a value the model sends for one is dropped. Live dependencies (a database
    connection, a client) are passed as ``run(..., context=obj)`` and reach parameters annotated ``RunContext[T]``.

    ### Usage example
    ```python
    from haystack.dataclasses import ChatMessage, ToolCall
    from haystack_state import State, ToolInvoker, tool

    @tool(outputs_to_state={"total": {"source": "sum"}})
    def add(a: int, b: int) -> dict:
        '''Add two numbers.'''
        return {"sum": a + b}

    invoker = ToolInvoker(tools=[add])
    state = State({"total": {"type": int}})
    call = ToolCall(tool_name="add", arguments={"a": 1, "b": 2})
    result = invoker.run(messages=[ChatMessage.from_assistant(tool_calls=[call])], state=state)
    assert result["state"].get("total") == 3
    ```

    :param tools: The tools: haystack ``Tool`` instances (this package's or haystack-ai's), ``ComponentTool``s,
        ``Toolset``s, or a list mixing them.
    :param raise_on_failure: If True, a failing call raises a ``ToolInvocationError`` naming the tool and the cause.
        If False, it becomes a tool result with ``error=True`` that tells the model what went wrong.
    :param max_workers: How many calls may run at once.
    :param streaming_callback: Receives each tool result as a ``StreamingChunk`` as it is produced.
    :param enable_streaming_callback_passthrough: Pass the streaming callback to tools that take a
        ``streaming_callback`` parameter. ``run(enable_streaming_callback_passthrough=...)`` overrides it per run.
    :param tool_timeout: The most seconds a call may take, for tools without a ``timeout`` of their own
        (``@tool(timeout=...)``); None (the default) for no timeout. A call over time is answered with a
        ``ToolTimeoutError`` and merges nothing: an async tool is cancelled, a sync one is abandoned in its daemon
        worker thread.
    :param max_tool_calls: The most tool calls of one model reply that run; the calls past it are answered with a
        ``ToolCallLimitError`` and do not run. None for no limit.
    :param store: A long-term memory store (``haystack_state.store``), given to tools through their ``RunContext``
        (``ctx.store``) or a parameter annotated ``Store`` (hidden from the model).
    :param convert_result_to_json_string: How a tool result without an ``outputs_to_string`` handler becomes the
        text the model sees. None (the default): a string as it is, any other value as JSON (haystack-ai's Agent's
        rule). True: ``json.dumps`` of every result, a string too; False: ``str()``, objects with ``to_dict``
        (haystack's dataclasses) converted to dicts first. True and False are haystack-ai's ``ToolInvoker``'s.
    :param retry_policy: How a call whose tool raised an error ``retry_on`` matches (or overran its timeout, if
        ``retry_on`` names ``ToolTimeoutError``) is called again (see ``haystack_state.RetryPolicy``); only the last
        attempt's State writes are merged. None (the default): never.
    :raises ValueError: For a ``tool_timeout`` that is not a positive number, or ``max_tool_calls`` below 1.
    """

    # Serialized (and registered with Pipelines) under its public path, whatever module it is defined in.
    __module__ = "haystack_state.invocation"

    def __init__(
        self,
        tools: ToolsArg,
        raise_on_failure: bool = True,
        max_workers: int = 4,
        streaming_callback: StreamingCallbackT | None = None,
        enable_streaming_callback_passthrough: bool = False,
        tool_timeout: float | None = None,
        max_tool_calls: int | None = 64,
        store: Store | None = None,
        convert_result_to_json_string: bool | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        # The attributes in the order of the parameters, the ones that need it checked.
        self.tools = tools
        self.raise_on_failure = raise_on_failure
        self.max_workers = max_workers
        self.streaming_callback = streaming_callback
        self.enable_streaming_callback_passthrough = enable_streaming_callback_passthrough
        self.tool_timeout = check_timeout(tool_timeout, "ToolInvoker tool_timeout")
        self.max_tool_calls = check_max_tool_calls(max_tool_calls, "ToolInvoker max_tool_calls")
        self.store = store
        self.convert_result_to_json_string = convert_result_to_json_string
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise ValueError(f"ToolInvoker retry_policy must be a RetryPolicy or None, got {retry_policy!r}.")
        self.retry_policy = retry_policy
        self._settings = self._run_settings()
        self._specs = tool_specs(tools)
        self._has_toolsets = isinstance(tools, Toolset) or any(isinstance(item, Toolset) for item in tools)
        self._specs_of: tuple[int, ...] = self._tool_ids()
        self._is_warmed_up = False

    def _run_settings(self) -> ToolRunSettings:
        """The settings of this invoker's runs, from its attributes."""
        return ToolRunSettings(
            raise_on_failure=self.raise_on_failure,
            max_workers=self.max_workers,
            passthrough=self.enable_streaming_callback_passthrough,
            convert_result_to_json_string=self.convert_result_to_json_string,
            on_interrupt=_ON_INTERRUPT,
            max_tool_calls=self.max_tool_calls,
            tool_timeout=self.tool_timeout,
            retry_policy=self.retry_policy,
        )

    def __setattr__(self, name: str, value: object) -> None:
        """Keep the run settings in step with the attributes they come from, should one be reassigned."""
        object.__setattr__(self, name, value)  # (not super(): @component makes a new class of this one)
        if name in _SETTING_ATTRIBUTES and "_settings" in self.__dict__:
            object.__setattr__(self, "_settings", self._run_settings())

    def _tool_ids(self) -> tuple[int, ...]:
        return tuple(map(id, flatten_tools_or_toolsets(self.tools)))

    def _current_specs(self) -> dict[str, ToolSpec]:
        """The specs of the tools as they are now: a toolset may load its tools at warm-up, or change them."""
        if self._has_toolsets:
            ids = self._tool_ids()
            if ids != self._specs_of:
                self._specs, self._specs_of = tool_specs(self.tools), ids
        return self._specs

    def warm_up(self) -> None:
        """
        Warm up the tools and toolsets (a lazy toolset, such as an MCP one, connects and loads its tools now). ``run``
        does it on first use; calling it again does nothing.
        """
        if not self._is_warmed_up:
            warm_up_tools(self.tools)
            self._is_warmed_up = True
            self._current_specs()

    async def warm_up_async(self) -> None:
        """Warm up the tools and toolsets, awaiting their ``warm_up_async`` where they have one."""
        if not self._is_warmed_up:
            await warm_up_tools_async(self.tools)
            self._is_warmed_up = True
            self._current_specs()

    def _prepare(
        self, tools: ToolsArg | None, context: object, passthrough: bool | None
    ) -> tuple[dict[str, ToolSpec], RunContext[Any], ToolRunSettings]:
        """
        What ``run`` and ``run_async`` prepare alike: the tools' specs, the run's context (checked against the tools'
        ``RunContext[T]`` parameters) and the settings (with the run's passthrough).
        """
        specs = self._current_specs() if tools is None else tool_specs(tools)
        run_context = context if isinstance(context, RunContext) else RunContext(deps=context, store=self.store)
        check_tool_deps(specs, run_context.deps)
        settings = self._settings
        if passthrough is not None and passthrough != settings.passthrough:
            settings = dataclasses.replace(settings, passthrough=passthrough)
        return specs, run_context, settings

    @component.output_types(tool_messages=list[ChatMessage], state=State)
    def run(
        self,
        messages: list[ChatMessage],
        state: State | None = None,
        tools: ToolsArg | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        context: Any = None,
        answers: dict[str, list[Any]] | None = None,
        enable_streaming_callback_passthrough: bool | None = None,
    ) -> dict[str, Any]:
        """
        Run the tool calls of ``messages``.

        :param messages: Messages whose tool calls to run (typically the model's replies).
        :param state: The State the tools read and write. A new empty State if None.
        :param tools: Tools to use for this run instead of the ones given at construction.
        :param streaming_callback: Overrides the callback given at construction for this run.
        :param context: The run's dependencies (a database connection, a client, the current user): tool parameters
            annotated ``RunContext[T]`` receive a ``RunContext`` whose ``deps`` is this very object, never copied.
            It is never put in the state or in the outputs. A ``RunContext`` is passed as it is: in a Pipeline, which
            deep-copies the inputs of its components, pass ``RunContext(deps=obj)`` to keep ``obj`` itself.
        :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls, in order. A call that asks
            for more than it is given fails with a ``ToolInterruptedError`` (only an ``Agent`` can wait for a human).
        :param enable_streaming_callback_passthrough: Overrides the setting given at construction for this run: pass
            the streaming callback to tools that take a ``streaming_callback`` parameter. None keeps the setting.
        :returns: ``tool_messages``: one tool result per call, in call order; ``state``: the State.
        :raises ToolInvocationError: With ``raise_on_failure=True``, when a call fails.
        :raises TypeError: If ``context`` does not match a tool's ``RunContext[T]`` parameter (before any call runs).
        """
        self.warm_up()
        if tools is not None:
            warm_up_tools(tools)
        state = _state_or_new(state)
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        specs, run_context, settings = self._prepare(tools, context, enable_streaming_callback_passthrough)
        tool_messages = run_tool_calls(
            messages, state, specs, settings=settings, streaming_callback=callback, context=run_context, answers=answers
        )
        return {"tool_messages": tool_messages, "state": state}

    @component.output_types(tool_messages=list[ChatMessage], state=State)
    async def run_async(
        self,
        messages: list[ChatMessage],
        state: State | None = None,
        tools: ToolsArg | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        context: Any = None,
        answers: dict[str, list[Any]] | None = None,
        enable_streaming_callback_passthrough: bool | None = None,
    ) -> dict[str, Any]:
        """
        Run the tool calls of ``messages`` asynchronously. Same parameters and results as :meth:`run`.

        :param messages: Messages whose tool calls to run.
        :param state: The State the tools read and write. A new empty State if None.
        :param tools: Tools to use for this run instead of the ones given at construction.
        :param streaming_callback: Overrides the callback given at construction for this run (sync or async).
        :param context: The run's dependencies, given to ``RunContext[T]`` parameters (see :meth:`run`).
        :param answers: Per tool call id, the answers to the call's ``interrupt()`` calls (see :meth:`run`).
        :param enable_streaming_callback_passthrough: Overrides the setting given at construction for this run.
        :returns: ``tool_messages`` and ``state``.
        """
        await self.warm_up_async()
        if tools is not None:
            await warm_up_tools_async(tools)
        state = _state_or_new(state)
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        specs, run_context, settings = self._prepare(tools, context, enable_streaming_callback_passthrough)
        tool_messages = await run_tool_calls_async(
            messages, state, specs, settings=settings, streaming_callback=callback, context=run_context, answers=answers
        )
        return {"tool_messages": tool_messages, "state": state}

    def to_dict(self) -> dict[str, Any]:
        """
        Serialise the component, its tools included.

        :returns: The serialised component.
        """
        callback = serialize_callable(self.streaming_callback) if self.streaming_callback else None
        return default_to_dict(
            self,
            tools=serialize_tools_or_toolset(self.tools),
            raise_on_failure=self.raise_on_failure,
            max_workers=self.max_workers,
            streaming_callback=callback,
            enable_streaming_callback_passthrough=self.enable_streaming_callback_passthrough,
            tool_timeout=self.tool_timeout,
            max_tool_calls=self.max_tool_calls,
            store=self.store.to_dict() if self.store is not None else None,
            convert_result_to_json_string=self.convert_result_to_json_string,
            retry_policy=self.retry_policy.to_dict() if self.retry_policy is not None else None,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolInvoker:
        """
        Rebuild the component from :meth:`to_dict` output. ``data`` itself is left as it is.

        :param data: The serialised component.
        :returns: The component.
        """
        data = copy.deepcopy(data)  # tool deserialization works in place
        params = data.setdefault("init_parameters", {})
        deserialize_tools_or_toolset_inplace(params, key="tools")
        for key, deserialize in _DESERIALIZERS:
            if params.get(key):
                params[key] = deserialize(params[key])
        return default_from_dict(cls, data)
