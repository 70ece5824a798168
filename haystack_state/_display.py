"""Short text and HTML renderings of a State, for ``repr`` and notebooks, and the sizes ``State.size`` reports."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator, Mapping
from typing import Any

from haystack_state._schema import FieldSpec, type_name
from haystack_state.values import to_jsonable

__all__ = ["StateDiff", "state_html", "state_repr", "summarize", "value_sizes"]


def summarize(value: object, width: int = 40) -> str:
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


def _shown(specs: Mapping[str, FieldSpec], values: Mapping[str, object], width: int) -> Iterator[tuple[str, str]]:
    """Each key with the summary of its value (``<unset>`` when it holds none), in the schema's order."""
    for key in specs:
        yield key, summarize(values[key], width) if key in values else "<unset>"


def state_repr(name: str, specs: Mapping[str, FieldSpec], values: Mapping[str, object]) -> str:
    """
    ``State(documents: list = 2 items, user_name: str = 'Bob', ...)``; keys without a value show ``<unset>``.

    :param name: The class name.
    :param specs: The field specs.
    :param values: The stored values.
    :returns: The repr.
    """
    parts = [f"{key}: {type_name(specs[key].type)} = {shown}" for key, shown in _shown(specs, values, 24)]
    return f"{name}({', '.join(parts)})"


def state_html(specs: Mapping[str, FieldSpec], values: Mapping[str, object]) -> str:
    """
    An HTML table of key, type, handler, value summary and description.

    :param specs: The field specs.
    :param values: The stored values.
    :returns: The HTML.
    """
    rows = []
    for key, shown in _shown(specs, values, 60):
        spec = specs[key]
        cells = (key, type_name(spec.type), spec.handler_name, shown, spec.description or "")
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("key", "type", "handler", "value", "description"))
    return f'<table class="haystack-state"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def value_sizes(values: Mapping[str, object]) -> dict[str, int]:
    """
    The bytes each value holds, measured as the UTF-8 length of its JSON rendering (``str()`` when it has none).

    :param values: key -> value.
    :returns: key -> bytes, largest first.
    """
    sizes = {}
    for key, value in values.items():
        try:
            text = json.dumps(to_jsonable(value), ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(value)
        sizes[key] = len(text.encode("utf-8"))
    return dict(sorted(sizes.items(), key=lambda item: item[1], reverse=True))


class StateDiff(dict[str, tuple[Any, Any]]):
    """
    What differs between two states: ``{key: (before, after)}`` for each key whose value differs (a missing value is
    ``None``). Prints as one line per key and renders as a table in notebooks.
    """

    def __str__(self) -> str:
        if not self:
            return "no changes"
        return "\n".join(f"{key}: {_change(before, after)}" for key, (before, after) in self.items())

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(key)}</td><td>{html.escape(_change(before, after))}</td></tr>"
            for key, (before, after) in self.items()
        )
        head = "<thead><tr><th>key</th><th>change</th></tr></thead>"
        return f'<table class="haystack-state-diff">{head}<tbody>{rows}</tbody></table>'


def _change(before: object, after: object) -> str:
    """``+2 items``, ``3 keys -> 4 keys``, ``'Alice' -> 'Bob'``, ``unset -> 1 item``."""
    if isinstance(before, list) and isinstance(after, list) and after[: len(before)] == before:
        added = len(after) - len(before)
        return f"+{added} item{'s' if added != 1 else ''}"
    left = "unset" if before is None else summarize(before)
    right = "unset" if after is None else summarize(after)
    return f"{left} -> {right}"
