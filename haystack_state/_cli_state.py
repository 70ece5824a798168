"""
``haystack-state show`` and ``haystack-state log``: one checkpoint of a thread (the head by default, or ``--at``) as
its state, key by key (or one key's value), and as its conversation, a transcript (see
:mod:`haystack_state._transcript`).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from haystack_state import _cli_text as fmt
from haystack_state._cli_open import CliError, read_checkpoint
from haystack_state._display import summarize
from haystack_state._transcript import is_conversation, transcript_json, transcript_lines
from haystack_state.agent._session import pending_tool_calls
from haystack_state.persistence.records import CheckpointMeta
from haystack_state.state import State

__all__ = ["run_log", "run_show"]


def run_show(args: argparse.Namespace, out: fmt.Output) -> None:
    history, meta, values = read_checkpoint(args)
    if args.key is not None:
        _show_key(args, history, meta, values, out)
        return
    messages = values.get("messages")
    pending = pending_tool_calls(State({}, {"messages": messages}), meta) if is_conversation(messages) else []
    keys = sorted(values, key=lambda key: -fmt.size(values[key]))
    if args.json:
        document = {
            "thread_id": args.thread,
            "head": meta.checkpoint_id == history[0].checkpoint_id,
            **fmt.meta_json(meta),
            "interrupted": bool(meta.metadata.get("interrupted")) and bool(pending),
            "keys": [
                {
                    "key": k,
                    "type": fmt.type_name(values[k]),
                    "size": fmt.size(values[k]),
                    "value": fmt.jsonable(values[k]),
                }
                for k in keys
            ],
            "pending_tool_calls": [{"id": c.id, "tool_name": c.tool_name, "arguments": c.arguments} for c in pending],
            "context_summary": _summary_json(values.get("context_summary")),
            "pending_interrupts": _interrupts(meta) if pending or meta.metadata.get("interrupts") else [],
        }
        out(json.dumps(document, indent=2, ensure_ascii=False))
        return
    where_ = " (head)" if meta.checkpoint_id == history[0].checkpoint_id else ""
    out(f"thread      {args.thread}")
    out(f"checkpoint  {meta.checkpoint_id}{where_}")
    out(f"step        {meta.step}, {meta.source}, {fmt.time_text(meta.created_at)}")
    out("")
    rows = [("KEY", "TYPE", "BYTES", "VALUE")]
    rows += [(k, fmt.type_name(values[k]), f"{fmt.size(values[k]):,}", summarize(values[k], 50)) for k in keys]
    for line in fmt.table(rows, right=[2]) if keys else ["(no values)"]:
        out(line)
    out("")
    summary = _summary_json(values.get("context_summary"))
    if summary is not None:
        start, end = summary["covers"]
        out(f"context summary: covers messages {start}-{end - 1} of {len(messages or [])} ({summary['tokens']} tokens)")
        for line in textwrap.wrap(summary["text"], fmt.WIDTH - 2) or [""]:
            out(f"  {line}")
        out("")
    requests = _interrupts(meta)
    if requests:
        out("interrupted: waiting for Agent.resume; pending interrupts:")
        for request in requests:
            value = request.get("value")
            shown = json.dumps(fmt.jsonable(value), ensure_ascii=False) if value is not None else "-"
            out(f"  {request.get('id')}  {request.get('kind')}  {request.get('tool_name')}  {fmt.clip(shown, 60)}")
        out("")
    if not pending:
        out("pending tool calls: none")
        return
    out("pending tool calls:")
    for call in pending:
        out(f"  {call.id}  {call.tool_name}({json.dumps(call.arguments, ensure_ascii=False)})")


def _interrupts(meta: CheckpointMeta) -> list[dict[str, Any]]:
    """The requests an interrupted checkpoint waits for (see ``ThreadSnapshot.interrupts``)."""
    if not meta.metadata.get("interrupted"):
        return []
    stored = meta.metadata.get("interrupts")
    if isinstance(stored, list):
        return [dict(r) for r in stored if isinstance(r, dict)]
    pending = meta.metadata.get("pending")
    return [{"id": str(i), "kind": "before", "call_id": i} for i in pending] if isinstance(pending, list) else []


def _summary_json(value: object) -> dict[str, Any] | None:
    """A ``context_summary`` value (a ContextSummary, or its JSON form) as JSON, or None."""
    text = getattr(value, "text", None)
    covers = getattr(value, "covers", None)
    if isinstance(text, str) and covers is not None:
        return {"text": text, "covers": list(covers), "tokens": int(getattr(value, "tokens", 0))}
    return None


def _show_key(
    args: argparse.Namespace,
    history: list[CheckpointMeta],
    meta: CheckpointMeta,
    values: dict[str, Any],
    out: fmt.Output,
) -> None:
    if args.key not in values:
        raise CliError(
            f"thread '{args.thread}' has no value for key '{args.key}' at checkpoint {meta.checkpoint_id} "
            f"(keys: {', '.join(sorted(values)) or 'none'})"
        )
    value = values[args.key]
    if args.json:
        document = {
            "key": args.key,
            "type": fmt.type_name(value),
            "size": fmt.size(value),
            "value": fmt.jsonable(value),
        }
        out(json.dumps(document, indent=2, ensure_ascii=False))
        return
    if is_conversation(value) and value:  # a conversation reads as a transcript, as `log` prints it
        _transcript(args, history, meta, value, out)
        return
    rendered = fmt.jsonable(value)
    out(rendered if isinstance(rendered, str) else json.dumps(rendered, indent=2, ensure_ascii=False))


def run_log(args: argparse.Namespace, out: fmt.Output) -> None:
    history, meta, values = read_checkpoint(args)
    messages = values.get("messages")
    if messages is None:
        raise CliError(
            f"thread '{args.thread}' has no messages at checkpoint {meta.checkpoint_id} "
            f"(keys: {', '.join(sorted(values)) or 'none'})"
        )
    if not is_conversation(messages):
        shown = fmt.command_line("show", args.db, args.thread, "--key", "messages", "--json", schema=args.schema)
        raise CliError(
            f"the messages of thread '{args.thread}' are {fmt.type_name(messages)}, not chat messages (see them with: "
            f"{shown})"
        )
    _transcript(args, history, meta, list(messages), out)


def _transcript(
    args: argparse.Namespace, history: list[CheckpointMeta], meta: CheckpointMeta, messages: list[Any], out: fmt.Output
) -> None:
    head = meta.checkpoint_id == history[0].checkpoint_id
    if args.json:
        records = transcript_json(messages, args.thread)
        document = {"thread_id": args.thread, "head": head, **fmt.meta_json(meta), "messages": records}
        out(json.dumps(document, indent=2, ensure_ascii=False))
        return
    short = fmt.short_ids(history)[meta.checkpoint_id]
    at = f"{short}{' (head)' if head else ''}, step {meta.step}, {fmt.time_text(meta.created_at)}"
    out(f"thread '{args.thread}' at checkpoint {at}: {fmt.plural(len(messages), 'message')}")
    out("")
    for line in transcript_lines(messages):
        out(line)
