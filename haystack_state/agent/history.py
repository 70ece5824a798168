"""``CheckpointHistory``: a thread's checkpoints as a list, rendered as a table in notebooks."""

from __future__ import annotations

import html

from haystack_state.persistence.records import CheckpointMeta

__all__ = ["CheckpointHistory"]


class CheckpointHistory(list[CheckpointMeta]):
    """
    A thread's checkpoints, newest first (a plain ``list`` of ``CheckpointMeta``). In a notebook it renders as a
    table of id, parent, step, source, tools, time and changed keys.
    """

    def _repr_html_(self) -> str:
        head = "".join(
            f"<th>{h}</th>" for h in ("checkpoint", "parent", "step", "source", "tools", "created", "changed keys")
        )
        rows = []
        for meta in self:
            cells = (
                meta.checkpoint_id,
                meta.parent_id or "",
                str(meta.step),
                meta.source,
                ", ".join(meta.tool_names),
                meta.created_at.isoformat(timespec="milliseconds"),
                ", ".join(meta.changed_keys),
            )
            rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        body = "".join(rows)
        return f'<table class="haystack-state-history"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
