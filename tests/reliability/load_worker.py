"""
The worker of the concurrency test: many short agent runs on a few shared threads, retried on conflicts.

Each run appends one marker (``p<proc>-r<run>``) to the thread's ``markers`` list: the model calls the ``mark`` tool,
which is an exit condition, so the tools' checkpoint is the run's last commit and the marker is stored if and only if
the run succeeds. A run that gets :class:`ThreadConflictError` (another run committed to the thread first) is retried
on the thread's new head, after a jittered exponential backoff; one that finds the thread busy (another run's tool
calls are committed but their results not yet: ``ValueError``) waits a moment and retries too. Both are counted.

Arguments: ``--store SPEC --proc N --runs N --threads N --seed N --ready FILE --go FILE --out FILE``. The worker
opens its store, writes ``--ready``, waits for ``--go`` (so that all workers start together), then does its runs. Its
first run goes to thread ``load-0``, with a slow first model call: every worker meets every other one there, which
forces conflicts. It writes a JSON report to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from haystack.dataclasses import ChatMessage, ToolCall
from haystack.tools import Tool
from workers.thread_worker import open_store

from haystack_state import Agent, ThreadConflictError, tool
from haystack_state.persistence import Checkpointer
from haystack_state.testing import ScriptedChatGenerator

SCHEMA: dict[str, Any] = {"markers": {"type": list[str]}}
#: How long the next model call sleeps (set per attempt).
PAUSE: dict[str, float] = {"seconds": 0.0}
ATTEMPTS = 500


@tool(outputs_to_state={"markers": {"source": "marker"}})
def mark(marker: str) -> dict[str, str]:
    """
    Record that a run happened.

    :param marker: The run's marker.
    """
    return {"marker": marker}


def policy(messages: list[ChatMessage], tools: list[Tool]) -> ChatMessage:
    """The model: the last user message is ``"mark <marker> <attempt>"``; call ``mark`` with that marker."""
    time.sleep(PAUSE["seconds"])
    _, marker, attempt = (messages[-1].text or "").split()
    return ChatMessage.from_assistant(tool_calls=[ToolCall("mark", {"marker": marker}, id=f"{marker}-{attempt}")])


def build_agent(checkpointer: Checkpointer) -> Agent:
    """The marking agent on ``checkpointer``."""
    return Agent(
        ScriptedChatGenerator(policy=policy),
        tools=[mark],
        state_schema=SCHEMA,
        exit_conditions=["mark"],
        checkpointer=checkpointer,
        max_agent_steps=3,
    )


def thread_name(index: int) -> str:
    return f"load-{index}"


def _wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="load_worker")
    for name in ("--store", "--ready", "--go", "--out"):
        parser.add_argument(name, required=True)
    for name in ("--proc", "--runs", "--threads", "--seed"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed * 1000 + args.proc)
    runs: list[dict[str, Any]] = []
    conflicts = busy = 0
    with open_store(args.store) as checkpointer:
        agent = build_agent(checkpointer)
        Path(args.ready).write_text("ready")
        _wait_for(Path(args.go))
        started = time.monotonic()
        for run in range(args.runs):
            thread_id = thread_name(0 if run == 0 else rng.randrange(args.threads))
            marker = f"p{args.proc}-r{run}"
            for attempt in range(1, ATTEMPTS + 1):
                # The very first model call is slow, so that the other workers commit to the thread meanwhile.
                PAUSE["seconds"] = 0.15 if run == 0 and attempt == 1 else rng.uniform(0, 0.004)
                try:
                    result = agent.run([ChatMessage.from_user(f"mark {marker} {attempt}")], thread_id=thread_id)
                except ThreadConflictError:
                    conflicts += 1
                    # Jittered exponential backoff, as a client would: without it, runs that keep starting on one thread
                    # keep preempting each other (see the report of issue 7) and the thread can livelock.
                    time.sleep(rng.uniform(0, min(0.05, 0.001 * 2 ** min(attempt, 6))))
                    continue
                except ValueError as error:
                    if "not committed" not in str(error):
                        raise
                    busy += 1
                    time.sleep(rng.uniform(0.001, 0.01))
                    continue
                assert result["markers"][-1] == marker, result["markers"]
                runs.append(
                    {
                        "thread": thread_id,
                        "marker": marker,
                        "attempts": attempt,
                        "checkpoint_id": result["checkpoint_id"],
                    }
                )
                break
            else:
                raise RuntimeError(f"run {marker} on {thread_id} did not succeed in {ATTEMPTS} attempts")
        elapsed = time.monotonic() - started
    report = {"proc": args.proc, "runs": runs, "conflicts": conflicts, "busy": busy, "seconds": elapsed}
    Path(args.out).write_text(json.dumps(report))
    return 0
