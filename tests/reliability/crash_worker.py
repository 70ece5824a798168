"""
The worker of the crash test: one run of the deterministic agent of ``workers.thread_worker`` on a shared store, to
be SIGKILLed somewhere in the middle.

Arguments: ``--store sqlite:PATH | postgres:DSN#SCHEMA --thread T --message "topic:steps:width" --topic T`` and

- ``--block tool:<text> | model:<topic>@<n> --signal FILE``: hang when the ``write`` tool is called with that text, or
  when the model is asked for that reply of the run, after writing ``FILE`` (``thread_worker``'s blocking points);
- ``--started FILE --slow-ms N``: write ``FILE`` just before the run starts, and sleep ``N`` ms before each model call
  and after each step's tools (in hooks, which change nothing in the state), so that a kill after a random delay
  lands anywhere in the run: in a tool, in the model, between a step's tools and their checkpoint, inside a commit.

The uninterrupted run of the same message and topic (see ``thread_worker.policy``) is what the thread must hold once
the killed run has been continued.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from haystack.dataclasses import ChatMessage
from workers import thread_worker


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="crash_worker")
    parser.add_argument("--store", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--message", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--block")
    parser.add_argument("--signal")
    parser.add_argument("--started")
    parser.add_argument("--slow-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.block:
        where, _, label = args.block.partition(":")
        thread_worker.BLOCK.update(where=where, label=label, signal=args.signal)
    hooks: dict[str, Any] = {}
    if args.slow_ms:

        def pause(state: Any) -> None:
            time.sleep(args.slow_ms / 1000)

        hooks = {"before_llm": pause, "after_tool": pause}
    with thread_worker.open_store(args.store) as checkpointer:
        agent = thread_worker.build_agent(checkpointer, hooks=hooks or None)
        checkpointer.head(args.thread)  # connect now: the run starts when the parent starts its clock
        if args.started:
            Path(args.started).write_text("started")
        result = agent.run([ChatMessage.from_user(args.message)], thread_id=args.thread, topic=args.topic)
    print(json.dumps({"exit_reason": result["exit_reason"], "checkpoint_id": result["checkpoint_id"]}))
    return 0
