"""
``RunContext``: a run's dependencies (a database connection, an HTTP client, the current user), given to tools,
hooks, loaders and context policies, and never put in the State.

``agent.run(messages, context=obj)`` (or ``ToolInvoker.run(..., context=obj)``) makes ``obj`` the run's
dependencies. A tool parameter annotated ``RunContext[T]`` receives a frozen wrapper: ``.deps`` is ``obj`` itself,
never copied, with the run's ``thread_id``, ``run_id`` and current ``step``, and the agent's long-term memory
``store``. The parameter is hidden from the model like the other injected ones. The context is never stored in the
state or in a checkpoint, never returned as an output, never serialized and never shown to the model.

```python
from dataclasses import dataclass

from haystack_state import RunContext, tool


@dataclass
class Deps:
    user_id: str


@tool
def whoami(ctx: RunContext[Deps]) -> str:
    '''Say who is asking.'''
    return ctx.deps.user_id
```
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Generic, NoReturn, SupportsIndex, TypeVar, Union, get_args, get_origin

#: The ``context_params`` entry of a tool parameter annotated ``Store``: it receives the run's store
#: (``RunContext.store``), not the context.
STORE_PARAM: Final[object] = type("StoreParam", (), {"__repr__": lambda self: "STORE_PARAM"})()

__all__ = ["STORE_PARAM", "RunContext", "check_deps", "check_tool_deps", "deps_type"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RunContext(Generic[T]):
    """
    What a tool, hook, loader or context policy knows about the run it serves (see the module docstring).

    :param deps: The object given as ``run(context=...)``: the live object, never copied (None if none was given).
    :param thread_id: The durable thread the run is on, or None.
    :param run_id: The run's id (the one its events carry).
    :param step: The step (model call) under way, from 1; 0 before the first model call.
    :param store: The agent's long-term memory store (``Agent(store=...)``), or None.
    :param emitter: Delivers custom events to the run's listeners (see :meth:`emit`); None when no one listens.
    """

    deps: T
    thread_id: str | None = None
    run_id: str | None = None
    step: int = 0
    store: Any = None
    emitter: Callable[[str, Any], None] | None = dataclasses.field(default=None, repr=False, compare=False)

    def emit(self, name: str, data: object = None) -> None:
        """
        Send a ``CustomEvent`` to whoever streams the run (``Agent.stream``); nothing happens if no one does.

        :param name: The event's name.
        :param data: Its data (JSON-encodable by the checkpoint codec).
        """
        if self.emitter is not None:
            self.emitter(name, data)

    def at_step(self, step: int) -> RunContext[T]:
        """The same context at another step."""
        if step == self.step:
            return self
        # (a copy by hand: ``dataclasses.replace`` re-runs ``__init__`` and costs several times more, at every step)
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        object.__setattr__(clone, "step", step)
        return clone

    # The context is shared, never copied: its deps are the live object by design. Copying returns the context
    # itself (so a Pipeline that deep-copies a component's inputs passes it through unchanged); pickling is refused,
    # so it cannot leave the process in a pickled checkpoint or a worker's payload. The State refuses it too
    # (``freeze``), and so does the checkpoint codec.

    def __copy__(self) -> RunContext[T]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> RunContext[T]:
        return self

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise TypeError(
            "A RunContext cannot be pickled or stored: it carries the run's live dependencies. Pass them to each run "
            "as run(..., context=obj) instead."
        )

    def __repr__(self) -> str:
        # The deps are named by type only: a repr can end up in a log, a span or a tool result the model reads.
        deps = "None" if self.deps is None else f"<{type(self.deps).__qualname__}>"
        return (
            f"RunContext(deps={deps}, thread_id={self.thread_id!r}, run_id={self.run_id!r}, step={self.step}, "
            f"store={'None' if self.store is None else '<' + type(self.store).__qualname__ + '>'})"
        )


def deps_type(annotation: Any) -> Any:
    """
    The ``T`` of a ``RunContext[T]`` annotation (``Any`` for a bare ``RunContext``), or None if the annotation is not
    a ``RunContext``.

    :param annotation: A parameter's annotation (already unwrapped from ``Optional``/``Annotated``).
    :returns: ``T``, ``Any``, or None.
    """
    if annotation is RunContext:
        return Any
    if get_origin(annotation) is RunContext:
        args = get_args(annotation)
        return args[0] if args else Any
    return None


def check_deps(expected: object, deps: object, where: str) -> None:
    """
    Check the run's dependencies against what a ``RunContext[T]`` parameter expects, where ``T`` can be checked (a
    class, or a union of classes); other annotations are trusted.

    :param expected: ``T``.
    :param deps: The object given as ``run(context=...)``.
    :param where: What declares it, for the message (``"tool 'lookup', parameter 'ctx'"``).
    :raises TypeError: Naming ``where``, the expected type and what was given.
    """
    if expected is Any or isinstance(expected, TypeVar):
        return
    classes = _classes(expected)
    if classes is None or isinstance(deps, classes):
        return
    names = " | ".join(getattr(cls, "__qualname__", repr(cls)) for cls in classes)
    given = "no context" if deps is None else f"{type(deps).__module__}.{type(deps).__qualname__}"
    raise TypeError(
        f"{where} expects RunContext[{names}], but the run was given {given}. Pass the dependencies as "
        f"run(..., context=<a {names}>)."
    )


def check_tool_deps(specs: Mapping[str, Any] | Iterable[Any], deps: object) -> None:
    """
    Check the run's dependencies against every ``RunContext[T]`` parameter of a set of tools (see
    :func:`check_deps`), before anything runs. ``Agent.run`` and ``ToolInvoker.run`` call it at the start of a run.

    Usage example:

    .. code-block:: python

        from haystack_state.tools import tool_specs

        check_tool_deps(tool_specs([whoami]), Deps(user_id="u1"))  # passes
        check_tool_deps(tool_specs([whoami]), "not deps")  # TypeError naming tool 'whoami', parameter 'ctx'

    :param specs: The tools' :class:`~haystack_state.tools.ToolSpec` objects (a ``tool_specs`` dict, or any iterable
        of specs).
    :param deps: The object given as ``run(context=...)`` (None if none was given).
    :raises TypeError: At the first parameter whose ``T`` the object does not match, naming the tool and parameter.
    """
    items: Iterable[Any] = specs.values() if isinstance(specs, Mapping) else specs
    for spec in items:
        for param, expected in spec.context_params.items():
            if expected is not STORE_PARAM:
                check_deps(expected, deps, f"Tool '{spec.name}', parameter '{param}'")


def _classes(annotation: object) -> tuple[type, ...] | None:
    """The classes an annotation stands for, if ``isinstance`` can check it; None otherwise."""
    if isinstance(annotation, type) and get_origin(annotation) is None:
        if getattr(annotation, "_is_protocol", False) and not getattr(annotation, "_is_runtime_protocol", False):
            return None
        return (annotation,)
    if annotation is None or annotation is type(None):
        return (type(None),)
    args = get_args(annotation)
    if args and get_origin(annotation) in (types.UnionType, Union):
        parts = [_classes(arg) for arg in args]
        if any(part is None for part in parts):
            return None
        return tuple(cls for part in parts if part is not None for cls in part)
    return None
