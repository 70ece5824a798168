"""
Reading a tool's description and its parameters' descriptions from a docstring.

Google, reST (``:param x:``) and NumPy styles are recognised (through ``docstring-parser``, which picks the style
that matches best).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

from docstring_parser import parse

__all__ = ["DocstringInfo", "parse_docstring"]


@dataclass(frozen=True)
class DocstringInfo:
    """
    What a docstring says about a callable.

    :param description: The summary and the longer description, without the parameter and return sections.
    :param params: The description of each documented parameter, with its whitespace collapsed.
    """

    description: str = ""
    params: dict[str, str] = field(default_factory=dict)


def parse_docstring(obj: Any) -> DocstringInfo:
    """
    Parse the docstring of a function, method or class.

    Usage example:

    .. code-block:: python

        def search(query: str) -> list[str]:
            '''
            Search the knowledge base.

            :param query: What to look for.
            '''

        info = parse_docstring(search)
        assert info.description == "Search the knowledge base."
        assert info.params == {"query": "What to look for."}

    :param obj: The object whose docstring to read. Only its own docstring counts (none is inherited), and the
        signature that ``@dataclass`` writes into an undocumented dataclass is not a description.
    :returns: The description and parameter descriptions; empty ones when there is no docstring.
    """
    own = getattr(obj, "__doc__", None)
    if not isinstance(own, str) or not own.strip():
        return DocstringInfo()
    if dataclasses.is_dataclass(obj) and isinstance(obj, type) and own.startswith(f"{obj.__name__}("):
        return DocstringInfo()
    text = inspect.cleandoc(own)
    if not text:
        return DocstringInfo()
    try:
        parsed = parse(text)
    except Exception:  # a docstring the parser cannot read still has a description: the raw text
        return DocstringInfo(description=text.strip())
    parts = [part.strip() for part in (parsed.short_description, parsed.long_description) if part and part.strip()]
    params = {
        param.arg_name: " ".join(param.description.split())
        for param in parsed.params
        if param.description and param.description.strip()
    }
    return DocstringInfo(description="\n\n".join(parts), params=params)
