"""
haystack-state next to Hayhooks' own durable execution (issue 28), measured on one scripted model and one tool.

Three servers, each started as a real process on a temporary folder:

- **ours**: ``haystack-state serve`` (SQLite), our Agent, driven with ``langgraph-sdk`` / ``httpx``;
- **our wrapper**: ``hayhooks run`` (request-bound) with ``haystack_state.hayhooks.agent_wrapper`` around the same
  Agent (SQLite), driven through its OpenAI chat completions route with an ``X-Thread-Id``;
- **Hayhooks durable**: ``HAYHOOKS_DURABLE_MODE=true hayhooks run`` with the Redis store and a wrapper whose
  ``run_durable`` runs haystack-ai's own ``Agent`` through ``context.run_agent(...)`` (Hayhooks' Haystack adapter),
  streaming with ``durable_streaming_callback``; driven through ``/{name}/run-durable`` and ``/executions/...``.

The model is ``haystack_state.testing.ScriptedChatGenerator`` with one policy on every side: ``"work N"`` calls the
tool ``slow_work`` (it appends ``N PID`` to a log file, sleeps ``WORK`` seconds, then appends ``N end``, so executions,
and the calls in flight at a kill, are counted across processes), then answers; ``"ask N"`` stops for a human;
``"drip N"`` streams a 40-chunk answer slowly (0.05 s per chunk); anything else is echoed. Rows: a crash mid-tool
(SIGKILL and restart), cancel, a human-in-the-loop wait across a restart, an idempotent retry, stream re-attach (hang
up mid-stream, re-attach after the last event id), and time to first token. Prints the table as markdown.

Usage (Redis on 127.0.0.1:6379; ``hayhooks`` 2.1 with the ``redis`` package, next to this Python or at
``HAYSTACK_STATE_HAYHOOKS=.../bin/hayhooks`` in an environment where haystack-state is installed)::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_hayhooks.py [--quick] [--runs 5] [--ttft 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import httpx
from langgraph_sdk import get_sync_client

ROOT = Path(__file__).resolve().parent.parent
REDIS = os.environ.get("HAYSTACK_STATE_REDIS_URL", "redis://127.0.0.1:6379/0")
WORK = 1.0
LEASE = 5.0  # seconds, on both servers

AGENTS = '''
"""The benchmark's agents: one scripted policy, our Agent and haystack-ai's Agent."""

import asyncio
import os
import time

from haystack import component
from haystack.dataclasses import ChatMessage

from haystack_state.testing import ScriptedChatGenerator

ANSWERS = {}  # execution id -> the resume input run_durable read (Hayhooks consumes it once per attempt)
LONG = " ".join(f"w{i:02d}" for i in range(80))  # 320 characters: 40 chunks of 8


def log_call(n):
    with open(os.environ["BENCH_TOOL_LOG"], "a", encoding="utf-8") as file:
        file.write(f"{n} {os.getpid()}\\n")
    time.sleep(float(os.environ.get("BENCH_WORK_SECONDS", "1")))
    with open(os.environ["BENCH_TOOL_LOG"], "a", encoding="utf-8") as file:
        file.write(f"{n} end\\n")
    return f"worked {n}"


def policy(messages, tools):
    last = messages[-1]
    if last.tool_call_result is not None:
        return f"Done: {last.tool_call_result.result}"
    word, _, rest = (last.text or "").partition(" ")
    if word == "work":
        return [("slow_work", {"n": rest})]
    if word == "ask":
        return [("ask_human", {"n": rest})]
    if word == "drip":
        return f"dripped {rest}: {LONG}"
    return f"echo: {last.text}"


@component
class Model:
    """The scripted model; a ``drip`` answer streams one chunk every 0.05 s."""

    def __init__(self):
        self.scripted = ScriptedChatGenerator(policy=policy)

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages, tools=None, streaming_callback=None):
        last = messages[-1]
        if streaming_callback is not None and last.is_from("user") and (last.text or "").startswith("drip"):
            inner = streaming_callback

            def streaming_callback(chunk):
                inner(chunk)
                time.sleep(0.05)

        return self.scripted.run(messages, tools=tools, streaming_callback=streaming_callback)

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages, tools=None, streaming_callback=None):
        last = messages[-1]
        if streaming_callback is not None and last.is_from("user") and (last.text or "").startswith("drip"):
            inner = streaming_callback

            async def streaming_callback(chunk):
                await inner(chunk)
                await asyncio.sleep(0.05)

        return await self.scripted.run_async(messages, tools=tools, streaming_callback=streaming_callback)


def make_ours(checkpointer):
    from haystack_state import Agent, interrupt, tool

    @tool
    def slow_work(n: str) -> str:
        """Do slow work."""
        return log_call(n)

    @tool
    def ask_human(n: str) -> str:
        """Ask a human."""
        return f"answer {interrupt({'question': f'approve {n}?'})}"

    return Agent(Model(), tools=[slow_work, ask_human], checkpointer=checkpointer)


def serve_ours(checkpointer):
    return {"agent": make_ours(checkpointer)}


def make_theirs():
    from haystack.components.agents import Agent
    from haystack.tools import create_tool_from_function

    def slow_work(n: str) -> str:
        """Do slow work."""
        return log_call(n)

    def ask_human(n: str) -> str:
        """Ask a human (a durable suspension: the execution waits for /resume)."""
        from hayhooks.durable import current_durable_context

        context = current_durable_context()
        answer = ANSWERS.get(context.execution_id)
        if answer is None:
            context.suspend_sync({"question": f"approve {n}?"})
        return f"answer {answer}"

    tools = [create_tool_from_function(slow_work), create_tool_from_function(ask_human)]
    return Agent(chat_generator=Model(), tools=tools)
'''

DURABLE_WRAPPER = """
from typing import Any

from haystack.dataclasses import ChatMessage
from pydantic import BaseModel

from hayhooks import BasePipelineWrapper
from hayhooks.durable import DurableContext, durable_streaming_callback

import bench_agents


class Request(BaseModel):
    message: str


class PipelineWrapper(BasePipelineWrapper):
    durable_revision = "1"
    durable_resume_model = None

    def setup(self) -> None:
        self.pipeline = bench_agents.make_theirs()

    def run_durable(self, context: DurableContext, request: Request) -> dict:
        bench_agents.ANSWERS[context.execution_id] = context.resume_input
        result = context.run_agent(
            messages=[ChatMessage.from_user(request.message)], streaming_callback=durable_streaming_callback
        )
        return {"answer": result["last_message"].text}
"""

OUR_WRAPPER = """
import os

from haystack_state import SQLiteCheckpointer
from haystack_state.hayhooks import agent_wrapper

import bench_agents

def make_agent():
    checkpointer = SQLiteCheckpointer(os.environ["BENCH_DB"], lease_ttl=float(os.environ["BENCH_LEASE"]))
    return bench_agents.make_ours(checkpointer)


PipelineWrapper = agent_wrapper(make_agent)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hayhooks_bin() -> str:
    given = os.environ.get("HAYSTACK_STATE_HAYHOOKS")
    if given:
        return given
    beside = Path(sys.executable).parent / "hayhooks"
    return str(beside) if beside.exists() else (shutil.which("hayhooks") or "hayhooks")


class Server:
    """One server process (``kind``: ours, wrapper or durable) on the folder ``tmp``; restartable on its port."""

    def __init__(self, kind: str, tmp: Path, prefix: str) -> None:
        self.kind, self.tmp, self.port = kind, tmp, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)]),
            "BENCH_TOOL_LOG": str(tmp / "tools.log"),
            "BENCH_WORK_SECONDS": str(WORK),
            "BENCH_DB": str(tmp / "wrapper.db"),
            "BENCH_LEASE": str(LEASE),
            "HAYSTACK_TELEMETRY_ENABLED": "False",
        }
        if kind == "ours":
            self.command = [sys.executable, "-m", "haystack_state.server.cli", "serve", "bench_agents:serve_ours"]
            self.command += ["--db", str(tmp / "threads.db"), "--port", str(self.port), "--poll-interval", "0.05"]
            self.command += ["--lease-seconds", str(LEASE)]
        else:
            self.command = [hayhooks_bin(), "run", "--pipelines-dir", str(tmp / kind), "--port", str(self.port)]
            if kind == "durable":
                self.env |= {
                    "HAYHOOKS_DURABLE_MODE": "true",
                    "HAYHOOKS_DURABLE_STORE": "redis",
                    "HAYHOOKS_DURABLE_REDIS_URL": REDIS,
                    "HAYHOOKS_DURABLE_REDIS_KEY_PREFIX": prefix,
                    "HAYHOOKS_DURABLE_LEASE_DURATION_MS": str(int(LEASE * 1000)),
                    "HAYHOOKS_DURABLE_POLL_INTERVAL_SECONDS": "0.05",
                    "HAYHOOKS_DURABLE_MAINTENANCE_INTERVAL_SECONDS": "0.5",
                    "HAYHOOKS_DURABLE_WORKER_CONCURRENCY": "8",
                }
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> float:
        started = time.monotonic()
        with open(self.tmp / f"{self.kind}.out", "ab") as out:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=out, cwd=self.tmp)
        probe = "/ok" if self.kind == "ours" else "/status"
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + probe, timeout=1).status_code == 200:
                    return time.monotonic() - started
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{self.kind} did not start: see {self.tmp / (self.kind + '.out')}")
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def tool_calls(tmp: Path, ended: bool = False) -> Counter[str]:
    """How many times each call started (``ended``: ran to its end), in every process."""
    log = tmp / "tools.log"
    lines = [line.split() for line in log.read_text().splitlines() if line] if log.exists() else []
    return Counter(n for n, what in lines if (what == "end") == ended)


def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


# --- the three clients ------------------------------------------------------------------------------------------------


class Ours:
    """``haystack-state serve`` through langgraph-sdk."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def client(self) -> Any:
        return get_sync_client(url=self.server.url, api_key=None)

    def submit(self, text: str, headers: dict[str, str] | None = None) -> tuple[str, str]:
        with self.client() as client:
            thread_id = client.threads.create()["thread_id"]
            run = client.runs.create(thread_id, "agent", input=human(text), headers=headers)
            return thread_id, run["run_id"]

    def status(self, run: tuple[str, str]) -> str:
        with self.client() as client:
            return str(client.runs.get(*run)["status"])

    def answer(self, run: tuple[str, str]) -> str:
        with self.client() as client:
            return str(client.threads.get_state(run[0])["values"]["messages"][-1]["content"])

    def done(self, run: tuple[str, str]) -> bool:
        return self.status(run) not in ("pending", "running")

    def cancel(self, run: tuple[str, str]) -> None:
        with self.client() as client:
            client.runs.cancel(*run)


class Durable:
    """Hayhooks' durable routes of the deployment ``durable``."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def submit(self, text: str, headers: dict[str, str] | None = None) -> str:
        reply = httpx.post(
            f"{self.server.url}/durable/run-durable", json={"message": text}, headers=headers, timeout=30
        )
        reply.raise_for_status()
        return str(reply.json()["execution_id"])

    def get(self, execution: str) -> dict[str, Any]:
        reply = httpx.get(f"{self.server.url}/durable/executions/{execution}", timeout=30)
        reply.raise_for_status()
        return dict(reply.json())

    def status(self, execution: str) -> str:
        return str(self.get(execution)["status"])

    def done(self, execution: str) -> bool:
        return self.status(execution) in ("completed", "failed", "canceled")

    def answer(self, execution: str) -> str:
        return str((self.get(execution).get("result") or {}).get("answer"))

    def cancel(self, execution: str) -> None:
        httpx.post(f"{self.server.url}/durable/executions/{execution}/cancel", timeout=30).raise_for_status()


def chat(url: str, thread: str, text: str, timeout: float = 60) -> str:
    body = {"model": "wrapper", "messages": [{"role": "user", "content": text}]}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Thread-Id": thread}, timeout=timeout)
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"])


# --- rows ------------------------------------------------------------------------------------------------------------


def crash_row(side: Ours | Durable, server: Server, runs: int, prefix: str, success: str) -> str:
    """``runs`` runs at once, the process SIGKILLed inside all their tool calls, the same command started again."""
    submitted: list[Any] = [side.submit(f"work {prefix}{i}") for i in range(runs)]
    if not wait_for(lambda: sum(k.startswith(prefix) for k in tool_calls(server.tmp)) >= runs):
        return "tools did not start"
    time.sleep(0.3)
    server.kill()
    started = time.monotonic()
    in_flight = {n for n in tool_calls(server.tmp) if n.startswith(prefix)} - set(tool_calls(server.tmp, ended=True))
    boot = server.start()
    wait_for(lambda: all(side.done(run) for run in submitted), 120 + LEASE)
    took = time.monotonic() - started
    ok = sum(
        side.status(run) == success and side.answer(run) == f"Done: worked {prefix}{i}"
        for i, run in enumerate(submitted)
    )
    counts = tool_calls(server.tmp)
    twice = {n for n, count in counts.items() if n.startswith(prefix) and count == 2}
    more = sum(count > 2 for n, count in counts.items() if n.startswith(prefix))
    return (
        f"{ok}/{runs} finished with the answer; in flight at the kill {len(in_flight)}, run twice {len(twice)} "
        f"({len(twice - in_flight)} not in flight), more than twice {more}; "
        f"{took:.1f} s from the kill to the last answer (process start {boot:.1f} s)"
    )


def crash_wrapper(server: Server, runs: int) -> str:
    """Requests die with the process; the client sends the same request again, on the same thread."""
    errors: list[str] = []

    def send(i: int) -> None:
        try:
            chat(server.url, f"t{i}", f"work wx{i}")
        except httpx.HTTPError as error:
            errors.append(type(error).__name__)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(runs)]
    for sender in senders:
        sender.start()
    if not wait_for(lambda: sum(k.startswith("wx") for k in tool_calls(server.tmp)) >= runs):
        return "tools did not start"
    time.sleep(0.3)
    server.kill()
    in_flight = {n for n in tool_calls(server.tmp) if n.startswith("wx")} - set(tool_calls(server.tmp, ended=True))
    for sender in senders:
        sender.join()
    started = time.monotonic()
    boot = server.start()
    answers = []
    busy = 0
    for i in range(runs):  # the client's retry: the same conversation on the same thread, again while 409 (busy)
        deadline = time.monotonic() + 90
        while True:
            try:
                answers.append(chat(server.url, f"t{i}", f"work wx{i}"))
                break
            except httpx.HTTPStatusError as error:
                if error.response.status_code != 409 or time.monotonic() > deadline:
                    answers.append(f"HTTP {error.response.status_code}")
                    break
                busy += 1
                time.sleep(0.5)
    took = time.monotonic() - started
    ok = sum(f"worked wx{i}" in answer for i, answer in enumerate(answers))
    counts = tool_calls(server.tmp)
    runs_twice = sum(counts[f"wx{i}"] == 2 for i in range(runs))
    more = sum(counts[f"wx{i}"] > 2 for i in range(runs))
    return (
        f"{len(errors)}/{runs} requests cut off; re-sent (409 busy {busy} times): {ok}/{runs} answered; "
        f"in flight at the kill {len(in_flight)}, run twice {runs_twice}, more than twice {more}; "
        f"{took:.1f} s from the restart to the last answer (process start {boot:.1f} s)"
    )


def cancel_row(side: Ours | Durable, tmp: Path, name: str, repeats: int) -> str:
    latencies, statuses, answered, executions, ended = [], Counter(), 0, 0, 0
    for i in range(repeats):
        key = f"{name}c{i}"
        run = side.submit(f"work {key}")
        wait_for(lambda key=key: key in tool_calls(tmp))  # type: ignore[misc]
        time.sleep(0.2)  # mid-tool
        started = time.monotonic()
        side.cancel(run)  # type: ignore[arg-type]
        wait_for(lambda run=run: side.done(run), 30)  # type: ignore[misc, arg-type]
        latencies.append(time.monotonic() - started)
        statuses[side.status(run)] += 1  # type: ignore[arg-type]
        answered += "Done:" in side.answer(run)  # type: ignore[arg-type]
        executions += tool_calls(tmp)[key]
        wait_for(lambda key=key: key in tool_calls(tmp, ended=True), 2 * WORK)  # type: ignore[misc]
        ended += tool_calls(tmp, ended=True)[key]
    return (
        f"{dict(statuses)}; cancel to terminal median {statistics.median(latencies):.2f} s (the tool had "
        f"{WORK - 0.2:.1f} s left); the tool ran to its end {ended}/{executions}; "
        f"model called after the cancel {answered}/{repeats}"
    )


def hitl_ours(server: Server) -> str:
    side = Ours(server)
    run = side.submit("ask o1")
    wait_for(lambda: side.done(run))
    first = side.status(run)
    server.kill()
    server.start()
    with side.client() as client:
        state = client.threads.get_state(run[0])
        waiting = bool(state["interrupts"]) or bool(state.get("tasks"))
        started = time.monotonic()
        final = client.runs.wait(run[0], "agent", command={"resume": "yes"})
        took = time.monotonic() - started
    answer = final["messages"][-1]["content"] if isinstance(final, dict) else final
    return f"{first}; after SIGKILL and restart still waiting: {waiting}; resumed to {answer!r} in {took:.2f} s"


def hitl_durable(server: Server) -> str:
    side = Durable(server)
    execution = side.submit("ask h1")
    wait_for(lambda: side.status(execution) not in ("queued", "running"))
    first = side.status(execution)
    server.kill()
    server.start()
    waiting = side.status(execution)
    started = time.monotonic()
    reply = httpx.post(f"{server.url}/durable/executions/{execution}/resume", json="yes", timeout=30)
    if reply.status_code >= 400:
        return f"{first}; after restart {waiting}; resume: HTTP {reply.status_code} {reply.text[:120]}"
    wait_for(lambda: side.done(execution), 60)
    took = time.monotonic() - started
    return f"{first}; after SIGKILL and restart {waiting}; resumed to {side.answer(execution)!r} in {took:.2f} s"


def idempotent_durable(server: Server) -> str:
    side = Durable(server)
    key = {"Idempotency-Key": f"bench-{uuid.uuid4().hex}"}
    first = side.submit("work hi1", key)
    second = side.submit("work hi1", key)  # the client's retry, say after a timeout
    wait_for(lambda: side.done(first))
    wait_for(lambda: side.done(second))
    third = side.submit("work hi1", key)  # after the end: the stored result
    other = httpx.post(f"{server.url}/durable/run-durable", json={"message": "work hi2"}, headers=key, timeout=30)
    return (
        f"same execution id: {first == second == third}; tool executions: {tool_calls(server.tmp)['hi1']}; "
        f"another body with the same key: HTTP {other.status_code}"
    )


def idempotent_ours(server: Server) -> str:
    """The same submission with one ``Idempotency-Key``: while the run runs, and after it ended; then another body."""
    side = Ours(server)
    key = {"Idempotency-Key": f"bench-{uuid.uuid4().hex}"}
    with side.client() as client:
        thread_id = client.threads.create()["thread_id"]
        first = client.runs.create(thread_id, "agent", input=human("work oi1"), headers=key)["run_id"]
        during = client.runs.create(thread_id, "agent", input=human("work oi1"), headers=key)["run_id"]
        client.runs.join(thread_id, first)
        after = client.runs.create(thread_id, "agent", input=human("work oi1"), headers=key)["run_id"]
        other = httpx.post(
            f"{server.url}/threads/{thread_id}/runs",
            json={"assistant_id": "agent", "input": human("work oi2")},
            headers=key,
            timeout=30,
        )
    return (
        f"same run id: {first == during == after}; tool executions: {tool_calls(server.tmp)['oi1']}; "
        f"another body with the same key: HTTP {other.status_code}"
    )


def idempotent_wrapper(server: Server) -> str:
    chat(server.url, "ti", "work wi1")
    chat(server.url, "ti", "work wi1")  # the same conversation again: a regenerate, on a fork
    return f"tool executions: {tool_calls(server.tmp)['wi1']} (the same request again is a regenerate)"


def sse_events(response: httpx.Response) -> Any:
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(": ")
            event[field] = event.get(field, "") + value


def reattach_ours(server: Server, repeats: int) -> str:
    lost = repeated = 0
    for i in range(repeats):
        with get_sync_client(url=server.url, api_key=None) as client:
            thread_id = client.threads.create()["thread_id"]
            stream = client.runs.stream(thread_id, "agent", input=human(f"drip o{i}"), stream_mode="messages-tuple")
            first = [next(stream) for _ in range(10)]
            stream.close()
            run_id = first[0].data["run_id"]
            rest = list(client.runs.join_stream(thread_id, run_id, last_event_id=first[-1].id))
            whole = list(client.runs.join_stream(thread_id, run_id))
        seen = [p.id for p in first[1:] + rest if p.event != "metadata"]
        every = [p.id for p in whole if p.event != "metadata"]
        lost += len(set(every) - set(seen))
        repeated += len(seen) - len(set(seen))
    return f"{repeats} re-attaches after 9 events: {lost} events lost, {repeated} repeated"


def reattach_durable(server: Server, repeats: int) -> str:
    lost = repeated = 0
    side = Durable(server)
    for i in range(repeats):
        execution = side.submit(f"drip h{i}")
        url = f"{server.url}/durable/executions/{execution}/stream"
        seen: list[str] = []
        with httpx.stream("GET", url, timeout=60) as response:
            for event in sse_events(response):
                if event.get("event") == "chunk":
                    seen.append(event["id"])
                    if len(seen) == 9:
                        break
        with httpx.stream("GET", url, timeout=60, headers={"Last-Event-ID": seen[-1]}) as response:
            seen += [e["id"] for e in sse_events(response) if e.get("event") == "chunk"]
        wait_for(lambda execution=execution: side.done(execution))
        with httpx.stream("GET", url, timeout=60) as response:
            every = [e["id"] for e in sse_events(response) if e.get("event") == "chunk"]
        lost += len(set(every) - set(seen))
        repeated += len(seen) - len(set(seen))
    return f"{repeats} re-attaches after 9 chunks: {lost} chunks lost, {repeated} repeated"


def ttft_ours(server: Server, repeats: int) -> list[float]:
    times = []
    with get_sync_client(url=server.url, api_key=None) as client:
        for i in range(repeats):
            thread_id = client.threads.create()["thread_id"]
            started = time.monotonic()
            for part in client.runs.stream(thread_id, "agent", input=human(f"hi {i}"), stream_mode="messages-tuple"):
                if part.event == "messages" and part.data[0].get("content"):
                    times.append(time.monotonic() - started)
                    break
            client.runs.join(thread_id, client.runs.list(thread_id)[0]["run_id"])
    return times


def ttft_durable(server: Server, repeats: int) -> list[float]:
    times = []
    side = Durable(server)
    for i in range(repeats):
        started = time.monotonic()
        execution = side.submit(f"hi {i}")
        with httpx.stream("GET", f"{server.url}/durable/executions/{execution}/stream", timeout=60) as response:
            for event in sse_events(response):
                if event.get("event") == "chunk" and json.loads(event["data"])["payload"].get("content"):
                    times.append(time.monotonic() - started)
                    break
        wait_for(lambda execution=execution: side.done(execution))
    return times


def ttft_wrapper(server: Server, repeats: int) -> list[float]:
    times = []
    for i in range(repeats):
        body = {"model": "wrapper", "stream": True, "messages": [{"role": "user", "content": f"hi {i}"}]}
        started = time.monotonic()
        url = f"{server.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers={"X-Thread-Id": f"tt{i}"}, timeout=60) as response:
            found = False
            for line in response.iter_lines():
                if line.startswith("data: {") and not found:
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        times.append(time.monotonic() - started)
                        found = True
    return times


def median_ms(times: list[float]) -> str:
    if not times:
        return "no token"
    return f"median {statistics.median(times) * 1000:.0f} ms (p90 {sorted(times)[int(len(times) * 0.9)] * 1000:.0f})"


# --- main ------------------------------------------------------------------------------------------------------------


def measure(kind: str, tmp: Path, rows: dict[str, dict[str, str]], args: argparse.Namespace) -> None:
    folder = tmp / kind
    folder.mkdir()
    (folder / "tools.log").touch()
    (folder / "bench_agents.py").write_text(AGENTS)
    if kind != "ours":
        (folder / kind).mkdir()
        (folder / kind / kind).mkdir()
        wrapper = DURABLE_WRAPPER if kind == "durable" else OUR_WRAPPER
        (folder / kind / kind / "pipeline_wrapper.py").write_text(textwrap.dedent(wrapper))
    prefix = f"bench-hayhooks:{uuid.uuid4().hex[:8]}"
    server = Server(kind, folder, prefix)

    def row(name: str, measure: Callable[[], Any]) -> None:
        try:
            rows[name][kind] = str(measure())
        except Exception as error:  # a row that fails is reported as such, not hidden
            rows[name][kind] = f"error: {type(error).__name__}: {error}"[:200]
        print(f"  {kind:8} {name}: {rows[name][kind]}", flush=True)

    try:
        if kind == "ours":
            row("time to first token", lambda: median_ms(ttft_ours(server, args.ttft)))
            row("stream re-attach", lambda: reattach_ours(server, args.runs))
            row("idempotent retry", lambda: idempotent_ours(server))
            row("cancel mid-tool", lambda: cancel_row(Ours(server), folder, "o", args.runs))
            row("human-in-the-loop across a restart", lambda: hitl_ours(server))
            row("crash mid-tool", lambda: crash_row(Ours(server), server, args.runs, "ox", "success"))
        elif kind == "durable":
            row("time to first token", lambda: median_ms(ttft_durable(server, args.ttft)))
            row("stream re-attach", lambda: reattach_durable(server, args.runs))
            row("idempotent retry", lambda: idempotent_durable(server))
            row("cancel mid-tool", lambda: cancel_row(Durable(server), folder, "h", args.runs))
            row("human-in-the-loop across a restart", lambda: hitl_durable(server))
            row("crash mid-tool", lambda: crash_row(Durable(server), server, args.runs, "hx", "completed"))
        else:
            row("time to first token", lambda: median_ms(ttft_wrapper(server, args.ttft)))
            row("idempotent retry", lambda: idempotent_wrapper(server))
            row("crash mid-tool", lambda: crash_wrapper(server, args.runs))
            rows["cancel mid-tool"][kind] = "no route (request-bound; `agent.cancel(thread_id)` in Python)"
            rows["human-in-the-loop across a restart"][kind] = (
                "the answer ends with a line saying the run waits; no resume route (`agent.resume` in Python)"
            )
            rows["stream re-attach"][kind] = "no: the stream is the request's response"
    finally:
        server.stop()
        if kind == "durable":
            with contextlib.suppress(Exception):
                import redis

                client = redis.Redis.from_url(REDIS)
                for key in client.scan_iter(f"{prefix}*"):
                    client.delete(key)


ROWS = [
    "crash mid-tool",
    "cancel mid-tool",
    "human-in-the-loop across a restart",
    "idempotent retry",
    "stream re-attach",
    "time to first token",
]
COLUMNS = {"ours": "haystack-state serve", "wrapper": "our Hayhooks wrapper", "durable": "Hayhooks durable (Redis)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 runs per row, 3 first tokens")
    parser.add_argument("--runs", type=int, default=5, help="runs per row (crash, cancel, re-attach)")
    parser.add_argument("--ttft", type=int, default=20, help="streamed requests for the time to first token")
    parser.add_argument("--only", choices=list(COLUMNS), action="append", help="measure these servers only")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.ttft = 2, 3
    rows: dict[str, dict[str, str]] = {name: {} for name in ROWS}
    with tempfile.TemporaryDirectory() as folder:
        for kind in args.only or list(COLUMNS):
            print(f"{COLUMNS[kind]}:", flush=True)
            measure(kind, Path(folder), rows, args)
    kinds = args.only or list(COLUMNS)
    print()
    print(f"runs per row {args.runs}, first tokens {args.ttft}, tool {WORK:g} s, lease {LEASE:g} s (both servers)")
    print("| row | " + " | ".join(COLUMNS[k] for k in kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for name in ROWS:
        print(f"| {name} | " + " | ".join(rows[name].get(k, "not measured") for k in kinds) + " |")


if __name__ == "__main__":
    main()
