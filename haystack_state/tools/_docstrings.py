"""
Reading parameter descriptions from docstrings, the way haystack-ai's ``ComponentTool`` reads them.

Google, reST (``:param x:``) and NumPy styles are recognised (through ``docstring-parser``, which picks the style
that matches best). The docstring is the one :func:`inspect.getdoc` returns: cleaned of its indentation, and
inherited from a base class when the object has none of its own (a component subclass whose ``run`` has no docstring
is described by its parent's).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from docstring_parser import parse

__all__ = ["DocstringInfo", "parse_docstring"]


@dataclass(frozen=True)
class DocstringInfo:
    """
    What a docstring says about a callable.

    :param description: The summary and the longer description, without the parameter and return sections.
    :param params: The description of each documented parameter, stripped of surrounding whitespace (its inner line
        breaks kept); ``""`` for a parameter listed without a description.
    """

    description: str = ""
    params: dict[str, str] = field(default_factory=dict)


def parse_docstring(obj: object) -> DocstringInfo:
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

    :param obj: The object whose docstring to read.
    :returns: The description and parameter descriptions; empty ones when there is no docstring. A docstring the
        parser cannot read gives its whole text as the description and no parameter descriptions.
    """
    text = inspect.getdoc(obj)
    if not text or not text.strip():
        return DocstringInfo()
    try:
        parsed = parse(text)
    except Exception:  # a docstring the parser cannot read still has a description: the raw text
        return DocstringInfo(description=text.strip())
    parts = [part.strip() for part in (parsed.short_description, parsed.long_description) if part and part.strip()]
    params = {param.arg_name: (param.description or "").strip() for param in parsed.params}
    return DocstringInfo(description="\n\n".join(parts), params=params)
