"""
haystack-ai's own tool makers (``@tool``, ``create_tool_from_function``, ``ComponentTool``) and its Agent hide a
parameter from the model, and hand it the live State, only when it is annotated with haystack-ai's ``State`` class:
they test the annotation's identity. So the natural switch, ``from haystack_state import Agent, State`` in a module
whose tools are made with haystack's ``@tool``, used to fail with "Failed to create JSON schema".

:func:`recognize_our_state` widens that one test, in each haystack module that uses it, to our ``State`` as well (and
subclasses of either), keeping haystack's answer for everything else. It runs when ``haystack_state`` is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from haystack_state.tools._annotations import is_state_annotation

__all__ = ["HAYSTACK_MODULES", "recognize_our_state"]

#: The haystack-ai modules that test a parameter's annotation with their ``_is_state_annotation``.
HAYSTACK_MODULES = (
    "haystack.tools.parameters_schema_utils",
    "haystack.tools.from_function",
    "haystack.tools.component_tool",
    "haystack.components.agents.tool_calling",
)


def recognize_our_state() -> list[str]:
    """
    Make haystack-ai's State test recognise haystack-state's ``State`` too. Idempotent.

    :returns: The modules whose test now recognises it (a module that no longer has the test is left alone).
    """
    done = []
    for name in HAYSTACK_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # another haystack-ai layout: nothing to widen there
            continue
        original = getattr(module, "_is_state_annotation", None)
        if not callable(original):
            continue
        if not getattr(original, "recognizes_haystack_state", False):
            module._is_state_annotation = _widened(original)  # type: ignore[attr-defined]
        done.append(name)
    return done


def _widened(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def is_either_state_annotation(annotation: object) -> bool:
        return bool(original(annotation)) or is_state_annotation(annotation)

    is_either_state_annotation.recognizes_haystack_state = True  # type: ignore[attr-defined]
    is_either_state_annotation.__doc__ = original.__doc__
    return is_either_state_annotation
