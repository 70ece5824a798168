"""
The helpers the ``@tool`` tests share (``test_function_tool*.py``): a class pydantic cannot describe, and a tool's
schema properties.
"""

from typing import Any

from haystack.tools import Tool


class Opaque:
    """A class pydantic cannot describe."""


def properties(t: Tool) -> dict[str, Any]:
    return dict(t.parameters["properties"])
