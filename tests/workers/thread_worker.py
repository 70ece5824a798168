"""
A deterministic agent for the durable-thread tests, and a worker process that runs it on a shared store.

The agent's model is a policy that reads a task from the last user message, ``"<topic>:<steps>"`` or
``"<topic>:<steps>:<calls per step>"``: it calls ``write`` in ``steps`` replies, then answers ``"done <topic>"``. Tool
call ids are derived from the conversation, so two runs of the same task (one of them crashed and resumed in another
process) produce equal states.

Run as a worker (``python -m workers.thread_worker``, with ``tests/`` as the working directory)::

    --store sqlite:/path/db.sqlite | postgres:<dsn>#<schema>
    --thread T --message "alpha:3" [--topic T] [--interrupt]
    [--block tool:alpha-2 | model:alpha@3 --signal FILE [--hold SECONDS]]
    [--custom-type]

``--block`` makes the worker write ``FILE`` and hang when the ``write`` tool is called with that text (``tool:``) or
when the model is asked for that reply of the run (``model:<topic>@<n>``), for the parent to SIGKILL it there. The
worker prints a JSON summary of its run on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import Tool

from haystack_state import Agent, add, tool
from haystack_state.persistence import Checkpointer

SCHEMA: dict[str, Any] = {
    "notes": {"type": list[str]},
    "count": {"type": int, "handler": add, "default": 0},
    "scratch": {"type": list[str], "scope": "run"},
    "topic": {"type": str, "scope": "run", "default": "none"},
}

#: Set by the worker's command line: where to hang, and the file that tells the parent it got there.
BLOCK: dict[str, str] = {}
#: How long a blocked worker hangs before giving up on its own (the parent kills it long before).
HANG_SECONDS = 60.0
#: ``"tool:<text>"`` or ``"model:<topic>@<n>"`` points where the agent raises once (a failure inside the process).
FAIL_ONCE: set[str] = set()


def _maybe_block(where: str, label: str) -> None:
    if f"{where}:{label}" in FAIL_ONCE:
        FAIL_ONCE.discard(f"{where}:{label}")
        raise RuntimeError(f"simulated failure at {where}:{label}")
    if BLOCK.get("where") == where and BLOCK.get("label") == label:
        Path(BLOCK["signal"]).write_text(label)
        if BLOCK.get("hold"):  # a long call: hang this long, then go on
            time.sleep(float(BLOCK["hold"]))
            return
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(3)


@tool(outputs_to_state={"notes": {"source": "note"}, "scratch": {"source": "note"}, "count": {"source": "one"}})
def write(text: str) -> dict[str, Any]:
    """
    Write a note.

    :param text: The note.
    """
    _maybe_block("tool", text)
    return {"note": text, "one": 1}


def parse_task(text: str) -> tuple[str, int, int]:
    """``"alpha:3"`` -> ("alpha", 3, 1); ``"alpha:2:3"`` -> ("alpha", 2, 3)."""
    parts = text.split(":")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 else 1


def policy(messages: list[ChatMessage], tools: list[Tool]) -> ChatMessage:
    """The model: ``steps`` replies calling ``write``, then a text answer (see the module docstring)."""
    last_user = max(i for i, m in enumerate(messages) if m.is_from("user"))
    topic, steps, width = parse_task(messages[last_user].text or "")
    replies_in_run = sum(1 for m in messages[last_user:] if m.is_from("assistant"))
    replies_in_thread = sum(1 for m in messages if m.is_from("assistant"))
    _maybe_block("model", f"{topic}@{replies_in_run + 1}")
    meta = {"model": "policy", "finish_reason": "tool_calls"}
    if replies_in_run >= steps:
        return ChatMessage.from_assistant(f"done {topic}", meta={**meta, "finish_reason": "stop"})
    calls = [
        ToolCall(
            tool_name="write",
            arguments={"text": f"{topic}-{replies_in_run + 1}" + (f".{j}" if width > 1 else "")},
            id=f"c{replies_in_thread + 1}-{j}",
        )
        for j in range(width)
    ]
    return ChatMessage.from_assistant(tool_calls=calls, meta=meta)


def build_agent(checkpointer: Checkpointer | None, **kwargs: Any) -> Agent:
    """The deterministic agent on ``checkpointer``; ``kwargs`` go to ``Agent``."""
    from haystack_state.testing import ScriptedChatGenerator

    kwargs.setdefault("max_agent_steps", 50)
    return Agent(
        chat_generator=ScriptedChatGenerator(policy=policy),
        tools=[write],
        state_schema=SCHEMA,
        system_prompt="You write notes.",
        checkpointer=checkpointer,
        **kwargs,
    )


#: Workers hold short leases, so the tests that kill them wait little for a takeover.
WORKER_LEASE_TTL = 1.5


def open_store(spec: str) -> Checkpointer:
    """Open ``sqlite:<path>`` or ``postgres:<dsn>#<schema>``, with leases of :data:`WORKER_LEASE_TTL` seconds."""
    kind, _, target = spec.partition(":")
    if kind == "sqlite":
        from haystack_state.persistence import SQLiteCheckpointer

        return SQLiteCheckpointer(target, lease_ttl=WORKER_LEASE_TTL)
    if kind == "postgres":
        from haystack_state.persistence.postgres import PostgresCheckpointer

        dsn, _, schema = target.rpartition("#")
        return PostgresCheckpointer(dsn, schema=schema, max_connections=2, lease_ttl=WORKER_LEASE_TTL)
    raise SystemExit(f"unknown store {spec!r}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--message", required=True)
    parser.add_argument("--topic")
    parser.add_argument("--interrupt", action="store_true")
    parser.add_argument("--block")
    parser.add_argument("--signal")
    parser.add_argument("--hold", help="with --block: hang this many seconds, then go on (a long call)")
    parser.add_argument("--custom-type", action="store_true")
    args = parser.parse_args(argv)
    if args.block:
        where, _, label = args.block.partition(":")
        BLOCK.update(where=where, label=label, signal=args.signal, hold=args.hold or "")
    with open_store(args.store) as checkpointer:
        if args.custom_type:
            from workers.custom_types import run_with_custom_type

            result = run_with_custom_type(checkpointer, args.thread)
        else:
            agent = build_agent(checkpointer, interrupt_before=["write"] if args.interrupt else None)
            inputs = {"topic": args.topic} if args.topic else {}
            result = agent.run([ChatMessage.from_user(args.message)], thread_id=args.thread, **inputs)
        summary = {
            "exit_reason": result["exit_reason"],
            "pending": [call.id for call in result["pending_tool_calls"]],
            "checkpoint_id": result["checkpoint_id"],
        }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
