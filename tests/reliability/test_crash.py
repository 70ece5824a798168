"""
The crash test: many agent runs, each in a worker process SIGKILLed at a random point, then continued.

Each run is a multi-step task of the deterministic agent of ``workers.thread_worker`` (2 to 5 steps of 1 to 3
parallel tool calls) on a thread of its own, in a store shared by every worker (a SQLite file; a PostgreSQL schema).
The kill point is chosen at random by the parent, in one of three ways:

- ``tool``: the worker hangs inside a random tool call (of a random step) and is killed there;
- ``model``: the worker hangs in a random model call (the last one, which answers in text, included);
- ``delay``: the worker runs slowed down (a few ms per step) and is killed after a random delay; the kill lands
  anywhere: between a step's tools and their checkpoint, inside a commit, before the first commit, or after the end.

Then the parent reads the store, checks every thread (0 unreadable threads), continues each unfinished run
(``agent.run([], thread_id=...)``; a run killed before its first commit is started again) and checks that no
checkpoint committed before the kill is lost (every checkpoint id the parent saw before the kill, and every one stored
after it, is still there, and the thread's branch extends the one stored at the kill), and that the final state and the
shape of the branch equal those of an uninterrupted run.

Workers are forked from a fork server (see ``reliability.forkserver``), several at a time. The number of runs comes
from ``HAYSTACK_STATE_CRASH_RUNS`` (default: 12 in the default suite, 100 with ``-m stress``), the number of workers
at a time from ``HAYSTACK_STATE_CRASH_CONCURRENCY`` (default 4), the random seed from ``HAYSTACK_STATE_CRASH_SEED``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from persistence.harness import Harness, PostgresHarness, branch, shape
from without_ids import without_ids
from workers import harness
from workers.harness import store_spec, wait_for_leases
from workers.thread_worker import build_agent

from haystack_state.persistence import Checkpointer, InMemoryCheckpointer
from reliability.common import env_count
from reliability.forkserver import ForkServer, wait_for_file

DEFAULT_RUNS = 12
FULL_RUNS = 100


persistent_store = harness.persistent_store  # SQLite (a file) and PostgreSQL (a fresh schema)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One run and where it is killed."""

    index: int
    steps: int
    width: int
    mode: str  # "tool", "model" or "delay"
    block: str | None = None
    slow_ms: float = 0.0
    delay: float = 0.0

    @property
    def topic(self) -> str:
        return f"k{self.index}"

    @property
    def thread(self) -> str:
        return f"crash-{self.index}"

    @property
    def task(self) -> str:
        return f"{self.topic}:{self.steps}:{self.width}"

    @property
    def run_topic(self) -> str:
        return f"T{self.index}"


def make_plans(runs: int, seed: int, step_ms: float = 6.0) -> list[Plan]:
    """
    Draw the runs and their kill points.

    :param runs: How many.
    :param seed: The random seed.
    :param step_ms: Roughly what a step costs besides its pauses (model call, tools, two commits), in ms, with several
        workers at a time: random delays are drawn so that the kills spread over the whole run.
    """
    rng = random.Random(seed)
    plans = []
    for index in range(runs):
        steps, width = rng.randint(2, 5), rng.choice([1, 1, 2, 3])
        mode = rng.choices(["tool", "model", "delay"], weights=[3, 2, 5])[0]
        topic = f"k{index}"
        if mode == "tool":
            label = f"{topic}-{rng.randint(1, steps)}" + (f".{rng.randrange(width)}" if width > 1 else "")
            plans.append(Plan(index, steps, width, mode, block=f"tool:{label}"))
        elif mode == "model":
            plans.append(Plan(index, steps, width, mode, block=f"model:{topic}@{rng.randint(1, steps + 1)}"))
        else:
            slow_ms = rng.choice([2.0, 5.0, 10.0])
            # About what the run takes (two pauses and some work and commits per step): the kill lands anywhere
            # from before the first commit to a little after the end.
            expected = (steps + 1) * (2 * slow_ms + step_ms) / 1000
            plans.append(Plan(index, steps, width, mode, slow_ms=slow_ms, delay=rng.uniform(0, 1.2 * expected)))
    return plans


@dataclasses.dataclass
class Killed:
    plan: Plan
    status: int  # -9: killed; 0: the run had finished before the kill
    seen: set[str]  # the checkpoint ids the parent read from the store just before the kill


def reference(plan: Plan) -> tuple[dict[str, Any], list[Any]]:
    """The final state and branch shape of the uninterrupted run."""
    with InMemoryCheckpointer() as cp:
        build_agent(cp).run([ChatMessage.from_user(plan.task)], thread_id="reference", topic=plan.run_topic)
        return cp.get("reference").values, shape(cp, "reference")


def _ids(cp: Checkpointer, thread_id: str) -> set[str]:
    return {meta.checkpoint_id for meta in cp.history(thread_id)} if cp.head(thread_id) is not None else set()


def kill_one(server: ForkServer, spec: str, plan: Plan, folder: Path, watcher: Checkpointer) -> Killed:
    """Start the plan's worker, wait for its kill point, read what is committed, and SIGKILL it."""
    log, mark = folder / f"{plan.index}.log", folder / f"{plan.index}.mark"
    args = ["--store", spec, "--thread", plan.thread, "--message", plan.task, "--topic", plan.run_topic]
    if plan.block is not None:
        args += ["--block", plan.block, "--signal", str(mark)]
    else:
        args += ["--started", str(mark), "--slow-ms", str(plan.slow_ms)]
    pid = server.spawn("crash", args, log)
    try:
        wait_for_file(server, pid, mark, log)
        if plan.mode == "delay":
            time.sleep(plan.delay)
        seen = _ids(watcher, plan.thread)
    finally:
        status = server.kill(pid)
    assert status in (-signal.SIGKILL, 0), f"worker of run {plan.index} failed ({status}):\n{log.read_text()}"
    assert plan.mode == "delay" or status == -signal.SIGKILL, f"run {plan.index} went past its blocking point"
    return Killed(plan, status, seen)


def crash_and_resume(store: Harness, folder: Path, runs: int, report: Callable[[str], None]) -> None:
    seed = int(os.environ.get("HAYSTACK_STATE_CRASH_SEED") or random.randrange(2**32))
    concurrency = env_count("HAYSTACK_STATE_CRASH_CONCURRENCY", 4)
    plans = make_plans(runs, seed, step_ms=20.0 if isinstance(store, PostgresHarness) else 8.0)
    started = time.monotonic()
    watcher = store.make()  # the parent's view of the store while the workers run
    with ForkServer(folder / "forkserver.log") as server, ThreadPoolExecutor(concurrency) as pool:
        killed = list(pool.map(lambda plan: kill_one(server, store_spec(store), plan, folder, watcher), plans))
    kill_seconds = time.monotonic() - started

    cp = store.make()  # a fresh checkpointer: nothing cached from before the kills
    lease_wait = wait_for_leases(cp, [outcome.plan.thread for outcome in killed])  # the dead runs' leases expire
    agent = build_agent(cp)
    problems: list[str] = []
    differ: set[int] = set()
    lost = unreadable = committed = 0
    resumed: collections.Counter[str] = collections.Counter()
    heads: collections.Counter[str] = collections.Counter()  # what the head was when the worker died
    for outcome in killed:
        plan = outcome.plan
        where = f"run {plan.index} (seed {seed}, {plan})"
        try:
            stored = _ids(cp, plan.thread)
            at_kill = branch(cp, plan.thread) if stored else []
            snapshot = agent.get_state(plan.thread) if stored else None
            if stored:
                cp.get(plan.thread)
                for meta in at_kill:
                    cp.get(plan.thread, meta.checkpoint_id)
        except Exception as error:
            unreadable += 1
            problems.append(f"{where}: unreadable after the kill: {type(error).__name__}: {error}")
            continue
        committed += len(stored)
        heads[at_kill[-1].source if at_kill else "none"] += 1
        missing = outcome.seen - stored
        try:
            if snapshot is None:
                resumed["started again"] += 1
                agent.run([ChatMessage.from_user(plan.task)], thread_id=plan.thread, topic=plan.run_topic)
            elif snapshot.pending_tool_calls or snapshot.checkpoint.metadata.get("continues"):
                resumed["continued"] += 1
                agent.run([], thread_id=plan.thread)
            else:
                resumed["already complete"] += 1
        except Exception as error:
            differ.add(plan.index)
            lost += len(missing)
            problems.append(f"{where}: the resume failed: {type(error).__name__}: {error}")
            continue
        final = branch(cp, plan.thread)
        after = _ids(cp, plan.thread)
        missing |= stored - after
        if final[: len(at_kill)] != at_kill:
            missing |= {meta.checkpoint_id for meta in at_kill} - {meta.checkpoint_id for meta in final}
            problems.append(f"{where}: the branch after the resume does not extend the one stored at the kill")
        if missing:
            lost += len(missing)
            problems.append(f"{where}: committed checkpoints lost: {sorted(missing)}")
        if len(after) != len(final):
            problems.append(f"{where}: the resume left a stray branch ({len(after)} checkpoints, {len(final)} on it)")
        expected_values, expected_shape = reference(plan)
        if without_ids(cp.get(plan.thread).values) != without_ids(expected_values):  # each run's messages: own ids
            differ.add(plan.index)
            problems.append(f"{where}: the final state differs from the uninterrupted run's")
        if shape(cp, plan.thread) != expected_shape:
            differ.add(plan.index)
            problems.append(f"{where}: the checkpoints differ from the uninterrupted run's")
    modes = collections.Counter(outcome.plan.mode for outcome in killed)
    finished = sum(outcome.status == 0 for outcome in killed)
    report(
        f"crash[{store.name}]: runs={runs} seed={seed} workers-at-a-time={concurrency} "
        f"kill-points(tool={modes['tool']} model={modes['model']} random-delay={modes['delay']}) "
        f"killed={runs - finished} finished-before-kill={finished} committed-before-kill={committed} "
        f"head-at-kill({', '.join(f'{k}={v}' for k, v in sorted(heads.items()))}) "
        f"resumed({', '.join(f'{k}={v}' for k, v in sorted(resumed.items()))}) "
        f"lost-committed-steps={lost} unreadable-threads={unreadable} "
        f"final-states-equal={runs - unreadable - len(differ)}/{runs} "
        f"kill-phase={kill_seconds:.1f}s lease-wait={lease_wait:.1f}s total={time.monotonic() - started:.1f}s"
    )
    assert not problems, "\n".join(problems)
    assert lost == 0 and unreadable == 0


@pytest.mark.slow
def test_killed_runs_resume_without_loss(
    persistent_store: Harness, tmp_path: Path, report: Callable[[str], None]
) -> None:
    crash_and_resume(persistent_store, tmp_path, env_count("HAYSTACK_STATE_CRASH_RUNS", DEFAULT_RUNS), report)


@pytest.mark.stress
def test_killed_runs_resume_without_loss_full(
    persistent_store: Harness, tmp_path: Path, report: Callable[[str], None]
) -> None:
    crash_and_resume(persistent_store, tmp_path, env_count("HAYSTACK_STATE_CRASH_RUNS", FULL_RUNS), report)


def test_the_plans_cover_every_kind_of_kill_point() -> None:
    plans = make_plans(FULL_RUNS, seed=7)
    assert {plan.mode for plan in plans} == {"tool", "model", "delay"}
    assert {plan.width for plan in plans} == {1, 2, 3}
    assert any(plan.block is not None and plan.block.endswith(f"@{plan.steps + 1}") for plan in plans)
