"""Short text and HTML renderings of a State, for ``repr`` and notebooks."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from haystack_state.schema import FieldSpec, type_name

__all__ = ["state_html", "state_repr", "summarize"]


def summarize(value: Any, width: int = 40) -> str:
    """
    A one-line summary of a value: the item count of containers, a shortened repr of the rest.

    :param value: The value.
    :param width: The longest summary, in characters.
    :returns: The summary.
    """
    if isinstance(value, list | tuple | set | frozenset):
        noun = "item" if len(value) == 1 else "items"
        return f"{len(value)} {noun}"
    if isinstance(value, dict):
        noun = "key" if len(value) == 1 else "keys"
        return f"{len(value)} {noun}"
    try:
        text = repr(value)
    except Exception:  # a display must not fail because of one value
        return f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def state_repr(name: str, specs: Mapping[str, FieldSpec], values: Mapping[str, Any]) -> str:
    """
    ``State(documents: list = 2 items, user_name: str = 'Bob', ...)``; keys without a value show ``<unset>``.

    :param name: The class name.
    :param specs: The field specs.
    :param values: The stored values.
    :returns: The repr.
    """
    parts = []
    for key, spec in specs.items():
        shown = summarize(values[key], 24) if key in values else "<unset>"
        parts.append(f"{key}: {type_name(spec.type)} = {shown}")
    return f"{name}({', '.join(parts)})"


def state_html(specs: Mapping[str, FieldSpec], values: Mapping[str, Any]) -> str:
    """
    An HTML table of key, type, handler, value summary and description.

    :param specs: The field specs.
    :param values: The stored values.
    :returns: The HTML.
    """
    rows = []
    for key, spec in specs.items():
        shown = summarize(values[key], 60) if key in values else "<unset>"
        cells = (key, type_name(spec.type), spec.handler_name, shown, spec.description or "")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("key", "type", "handler", "value", "description"))
    return f'<table class="haystack-state"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
