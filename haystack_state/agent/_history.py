"""``CheckpointHistory``: a thread's checkpoints as a list, rendered as a table in notebooks."""

from __future__ import annotations

import html

from haystack_state._cli_text import shorten
from haystack_state.persistence.records import CheckpointMeta

__all__ = ["CheckpointHistory"]


class CheckpointHistory(list[CheckpointMeta]):
    """
    A thread's checkpoints, newest first (a plain ``list`` of ``CheckpointMeta``). In a notebook it renders as a
    table of id, parent, step, source, tools, time and changed keys, marking the checkpoints that wrote a new context
    summary (see :meth:`summaries`). Ids show short, as the ``haystack-state`` command shows them (the last 8
    characters, longer where two would be the same); the full id is the cell's ``title``.
    """

    def summaries(self) -> list[tuple[CheckpointMeta, tuple[int, int]]]:
        """
        The checkpoints that wrote a new ``context_summary`` (a ``Summarize`` context policy's), newest first, each
        with the range ``(start, end)`` of stored messages the summary covers (``end`` excluded).

        :returns: ``(checkpoint, covers)`` pairs.
        """
        found = []
        for meta in self:
            covered = meta.metadata.get("context_summary")
            if isinstance(covered, dict):
                covers = covered.get("covers")
                if isinstance(covers, list | tuple) and len(covers) == 2:
                    found.append((meta, (int(covers[0]), int(covers[1]))))
        return found

    def _repr_html_(self) -> str:
        head = "".join(
            f"<th>{h}</th>" for h in ("checkpoint", "parent", "step", "source", "tools", "created", "changed keys")
        )
        shorts = shorten([i for meta in self for i in (meta.checkpoint_id, meta.parent_id) if i])
        rows = []
        for meta in self:
            ids = "".join(
                f'<td title="{html.escape(i)}">{html.escape(shorts[i])}</td>' if i else "<td></td>"
                for i in (meta.checkpoint_id, meta.parent_id)
            )
            cells = (
                str(meta.step),
                meta.source,
                ", ".join(meta.tool_names),
                meta.created_at.isoformat(timespec="milliseconds"),
                ", ".join(meta.changed_keys) + _summary_note(meta),
            )
            rows.append("<tr>" + ids + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        body = "".join(rows)
        return f'<table class="haystack-state-history"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _summary_note(meta: CheckpointMeta) -> str:
    covered = meta.metadata.get("context_summary")
    covers = covered.get("covers") if isinstance(covered, dict) else None
    if isinstance(covers, list | tuple) and len(covers) == 2:
        return f" (new summary of messages {covers[0]}-{int(covers[1]) - 1})"
    return ""
