"""
What serving a run costs, side by side: our server (``haystack-state serve`` as a process, on SQLite; with
``--postgres`` on PostgreSQL too), LangGraph's own server (``langgraph dev`` from ``langgraph-cli[inmem]``: its
in-memory runtime, analytics off, ``--n-jobs-per-worker 64``) and, as the floor, a bare FastAPI app that answers the
same requests after 50 ms and does nothing else. One client drives all three: LangGraph's ``langgraph-sdk``
(``runs.wait``, and ``runs.stream`` with the ``values``, ``updates`` and ``messages-tuple`` modes, reading every
event), each run on a fresh thread, from 1, 10 and 50 concurrent clients (one SDK client, so one connection, each).
``GET /ok`` through the same client is the HTTP floor of each server; ``Agent.run_async`` called in this process with
the same concurrency is the in-process baseline of ours.

The model answers ``"ok"`` after 50 ms (``asyncio.sleep``), streaming it in two chunks: on our side a Haystack chat
generator, on LangGraph's a LangChain chat model called by the one node of a ``StateGraph`` (in a temporary project
with a ``langgraph.json``). A run is one model call.

Per server, operation and concurrency: runs/s, p50, p99 and mean latency, the p50 overhead over the 50 ms model, the
server process's own CPU milliseconds per run (user + system over the measured window, divided by the runs; with
``--postgres``, also the CPU of the database backends that served it) and this process's (the client's: one Python
thread, whose own queueing is part of the latencies at 50 clients). Each figure is the median of ``--rounds`` rounds.
Each round starts every server afresh (LangGraph's in-memory queue scans every run it holds at each poll, so its cost
per run grows with its history) and measures the servers one after the other, in an order that rotates from round to
round. Then ratios ours/LangGraph and ours/floor, and ours against in-process runs and ``GET /ok``. The cores
that other processes kept busy during the windows are reported too: the machine may be shared.

``langgraph`` is found with ``--langgraph PATH``, else ``$BENCH_LANGGRAPH``, else beside this Python, else on
``PATH``: it may live in a virtualenv of its own. It runs as ``langgraph dev --no-browser --no-reload
--allow-blocking`` (no Studio, no reloader, and no blockbuster, a dev-only check that patches blocking calls) with
``LANGGRAPH_CLI_NO_ANALYTICS=1``, ``LANGSMITH_TRACING=false``, ``LANGGRAPH_NO_VERSION_CHECK=true`` and
``LOG_LEVEL=WARNING``; nothing reaches the network.

Usage::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_server.py                 # 3 rounds
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_server.py --quick         # a smoke run
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_server.py --no-langgraph  # ours and the floor
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_server.py --postgres      # and ours on PostgreSQL
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import httpx
from haystack import component
from haystack.dataclasses import ChatMessage, StreamingChunk

from haystack_state import Agent
from haystack_state.persistence import Checkpointer, SQLiteCheckpointer

LATENCY = 0.05
CLIENTS = (1, 10, 50)
JOBS = 64  # runs each server executes at once: --max-concurrent-runs, --n-jobs-per-worker
STREAM_MODES = ["values", "updates", "messages-tuple"]
POSTGRES_DSN = os.environ.get("HAYSTACK_STATE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
ROOT = Path(__file__).resolve().parent.parent


# -- the model, on our side and on LangGraph's ------------------------------------------------------------------------


@component
class SlowChatGenerator:
    """A model that answers ``"ok"`` after ``LATENCY`` seconds (in two chunks, to a streaming callback)."""

    @component.output_types(replies=list[ChatMessage])
    def run(
        self, messages: list[ChatMessage], tools: Any = None, streaming_callback: Any = None
    ) -> dict[str, list[ChatMessage]]:
        time.sleep(LATENCY)
        if streaming_callback is not None:
            for text in ("o", "k"):
                streaming_callback(StreamingChunk(content=text))
        return {"replies": [ChatMessage.from_assistant("ok")]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], tools: Any = None, streaming_callback: Any = None
    ) -> dict[str, list[ChatMessage]]:
        await asyncio.sleep(LATENCY)
        if streaming_callback is not None:
            for text in ("o", "k"):
                await streaming_callback(StreamingChunk(content=text))
        return {"replies": [ChatMessage.from_assistant("ok")]}


def make_agent(checkpointer: Checkpointer) -> Agent:
    return Agent(SlowChatGenerator(), checkpointer=checkpointer)


def served_agents(checkpointer: Checkpointer) -> dict[str, Agent]:
    """What ``haystack-state serve bench_server:served_agents --db ...`` serves: the agent as ``agent``."""
    return {"agent": make_agent(checkpointer)}


LANGGRAPH_GRAPH = f'''
"""The LangGraph side of bench_server.py: one node that calls a model that answers after 50 ms."""

import asyncio

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph


class SlowChatModel(BaseChatModel):
    @property
    def _llm_type(self):
        return "slow"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        raise NotImplementedError("the graph calls the model asynchronously")

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        await asyncio.sleep({LATENCY})
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        await asyncio.sleep({LATENCY})
        for text in ("o", "k"):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
            if run_manager is not None:
                await run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk


model = SlowChatModel()


async def call_model(state):
    return {{"messages": [await model.ainvoke(state["messages"])]}}


builder = StateGraph(MessagesState)
builder.add_node("model", call_model)
builder.add_edge(START, "model")
builder.add_edge("model", END)
graph = builder.compile()
'''


# -- the floor: a bare FastAPI app that speaks the same requests ------------------------------------------------------


def floor_app() -> Any:
    """
    The requests the SDK makes, answered after ``LATENCY`` by a bare FastAPI app: create a thread, wait for a run,
    stream one (the events our server sends, and a ``Location`` so the SDK checks the run after the stream, as it
    does with the other two), read a run, ``GET /ok``.
    """
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        human = {**body["input"]["messages"][-1], "id": str(uuid.uuid4())}
        return {"messages": [human, {"type": "ai", "content": "ok", "id": str(uuid.uuid4())}]}

    def event(name: str, data: Any) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/threads")
    async def create_thread(body: dict[str, Any]) -> dict[str, Any]:
        return {"thread_id": str(uuid.uuid4()), "metadata": body.get("metadata") or {}, "status": "idle"}

    @app.post("/threads/{thread_id}/runs/wait")
    async def wait(thread_id: str, body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(LATENCY)
        return reply(body)

    @app.post("/threads/{thread_id}/runs/stream")
    async def stream(thread_id: str, body: dict[str, Any]) -> StreamingResponse:
        run_id = str(uuid.uuid4())
        values = reply(body)
        human, ai = values["messages"]

        async def events() -> AsyncIterator[bytes]:
            yield event("metadata", {"run_id": run_id, "attempt": 1})
            yield event("updates", {"input": {"messages": [human]}})
            yield event("values", {"messages": [human]})
            await asyncio.sleep(LATENCY)
            for text in ("o", "k"):
                yield event("messages", [{"type": "AIMessageChunk", "content": text, "id": ai["id"]}, {}])
            yield event("updates", {"model": {"messages": [ai]}})
            yield event("values", values)

        location = f"/threads/{thread_id}/runs/{run_id}"
        headers = {"Location": f"{location}/stream", "Content-Location": location}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    @app.get("/threads/{thread_id}/runs/{run_id}")
    async def get_run(thread_id: str, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "thread_id": thread_id, "status": "success"}

    return app


# -- the server processes ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Server:
    """A server process under test."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    backend: str = ""  # "sqlite" or "postgres" for ours
    log: Path | None = None
    sdks: list[Any] = dataclasses.field(default_factory=list)  # one SDK client (one connection) per client

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(server: Server, timeout: float = 90.0) -> Server:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/ok", timeout=1).status_code == 200:
                return server
        if server.process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            tail = server.log.read_text(errors="replace")[-3000:] if server.log else ""
            raise SystemExit(f"{server.name} did not start (exit code {server.process.returncode}):\n{tail}")
        time.sleep(0.1)


def start(name: str, command: list[str], *, cwd: Path, env: dict[str, str], folder: Path, backend: str = "") -> Server:
    port = free_port()
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port)], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return Server(name, f"http://127.0.0.1:{port}", process, backend, log)


def our_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False", "PYTHONPATH": path}


def start_ours(folder: Path, db: str, backend: str, schema: str | None = None) -> Server:
    """
    ``haystack-state serve bench_server:served_agents --db DB``, from this folder: as
    ``python -m haystack_state.server.cli serve``, the same command without the CLI's other sub-commands.
    """
    command = [sys.executable, "-m", "haystack_state.server.cli", "serve", "bench_server:served_agents"]
    command += ["--db", db, "--max-concurrent-runs", str(JOBS)]
    if schema:
        command += ["--schema", schema]
    name = "ours" if backend == "sqlite" else f"ours-{backend}"
    return start(name, command, cwd=Path(__file__).parent, env=our_env(), folder=folder, backend=backend)


def start_floor(folder: Path) -> Server:
    command = [sys.executable, __file__, "--serve-floor"]
    return start("floor", command, cwd=Path(__file__).parent, env=our_env(), folder=folder)


def find_langgraph(given: str | None) -> str:
    """The ``langgraph`` command: ``--langgraph``, ``$BENCH_LANGGRAPH``, beside this Python, or on ``PATH``."""
    named = given or os.environ.get("BENCH_LANGGRAPH")
    if named:
        found = shutil.which(named)
        if not found:
            raise SystemExit(f"--langgraph / BENCH_LANGGRAPH: {named} is not an executable")
        return found
    beside = Path(sys.executable).with_name("langgraph")
    found = str(beside) if beside.exists() else shutil.which("langgraph")
    if not found:
        raise SystemExit(
            "`langgraph` not found: pip install 'haystack-state[bench]' (langgraph-cli[inmem]), or name one in "
            "another virtualenv with --langgraph PATH or BENCH_LANGGRAPH; or pass --no-langgraph"
        )
    return found


def start_langgraph(folder: Path, langgraph: str) -> Server:
    """``langgraph dev`` on the one-node graph, in a project of its own."""
    project = folder / "langgraph-project"
    project.mkdir()
    (project / "graph.py").write_text(LANGGRAPH_GRAPH)
    (project / "langgraph.json").write_text(
        json.dumps({"dependencies": ["."], "graphs": {"agent": "./graph.py:graph"}})
    )
    env = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", "LANGSMITH_API_KEY")
    }
    env.update(
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        LANGSMITH_TRACING="false",
        LANGGRAPH_NO_VERSION_CHECK="true",
        LOG_LEVEL="WARNING",
    )
    command = [langgraph, "dev", "--no-browser", "--no-reload", "--allow-blocking", "--host", "127.0.0.1"]
    command += ["--n-jobs-per-worker", str(JOBS), "--server-log-level", "WARNING"]
    return start("langgraph", command, cwd=project, env=env, folder=folder)


def interpreter_of(script: str) -> str:
    """The Python that runs a console script (its ``#!`` line), else this one."""
    with contextlib.suppress(OSError, UnicodeDecodeError), open(script, encoding="utf-8") as file:
        first = file.readline()
        if first.startswith("#!") and "python" in first:
            return first[2:].strip().split()[0]
    return sys.executable


def event_loop_of(python: str) -> str:
    """What uvicorn's ``auto`` picks under ``python``: uvloop and httptools if installed, else asyncio and h11."""
    code = "import importlib.util as u; print(bool(u.find_spec('uvloop')), bool(u.find_spec('httptools')))"
    found = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False).stdout.split()
    loop = "uvloop" if found[:1] == ["True"] else "asyncio"
    http = "httptools" if found[1:2] == ["True"] else "h11"
    return f"{loop}+{http}"


# -- CPU time ---------------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU seconds of a process, and of its live children (psutil, else ``/proc``: without them)."""
    try:
        import psutil
    except ImportError:
        ticks = os.sysconf("SC_CLK_TCK")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks
    process = psutil.Process(pid)
    total = 0.0
    for each in [process, *(process.children(recursive=True) if children else [])]:
        with contextlib.suppress(psutil.Error):
            times = each.cpu_times()
            total += times.user + times.system
    return total


def machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has spent (``/proc/stat``); 0 where there is none."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def postgres_cpu(client_pid: int) -> tuple[dict[int, float], set[int]]:
    """The CPU seconds of every PostgreSQL process (psutil), and which of them serve ``client_pid``'s connections."""
    import psutil

    ports = {
        c.laddr.port for c in psutil.Process(client_pid).net_connections(kind="tcp") if c.raddr and c.raddr.port == 5432
    }
    seconds: dict[int, float] = {}
    serving: set[int] = set()
    for process in psutil.process_iter(["name"]):
        if process.info["name"] != "postgres":
            continue
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            seconds[process.pid] = times.user + times.system
            if any(c.raddr and c.raddr.port in ports for c in process.net_connections(kind="tcp")):
                serving.add(process.pid)
    return seconds, serving


# -- one measurement --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Window:
    """What one measured window saw."""

    latencies: list[float]
    seconds: float
    server_cpu: float | None
    client_cpu: float
    others_cpu: float
    db_cpu: float | None = None
    dropped: int = 0

    def figures(self) -> dict[str, float]:
        runs = len(self.latencies)
        found = {
            "runs/s": runs / self.seconds,
            "p50": percentile(self.latencies, 0.5) * 1000,
            "p99": percentile(self.latencies, 0.99) * 1000,
            "mean": statistics.fmean(self.latencies) * 1000,
            "client": self.client_cpu * 1000 / runs,
            "others": self.others_cpu / self.seconds,
            "dropped": float(self.dropped),
        }
        if self.server_cpu is not None:
            found["cpu"] = self.server_cpu * 1000 / runs
        if self.db_cpu is not None:
            found["db"] = self.db_cpu * 1000 / runs
        return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Clocks:
    """
    The CPU clocks of one measured window, started when made: the server's, its database backends' (for a
    ``db_client_pid``), this process's (the client's) and the whole machine's.
    """

    def __init__(self, server_pid: int | None, db_client_pid: int | None) -> None:
        self.server_pid, self.db_client_pid = server_pid, db_client_pid
        self.server = cpu_seconds(server_pid) if server_pid else 0.0
        self.db = postgres_cpu(db_client_pid)[0] if db_client_pid else {}
        self.client, self.machine = cpu_seconds(os.getpid(), children=False), machine_busy_seconds()
        self.started = time.perf_counter()

    def window(self, latencies: list[float], dropped: int) -> Window:
        """Stop the clocks: what the window saw."""
        seconds = time.perf_counter() - self.started
        machine = machine_busy_seconds() - self.machine
        client = cpu_seconds(os.getpid(), children=False) - self.client
        server = cpu_seconds(self.server_pid) - self.server if self.server_pid else None
        db = None
        if self.db_client_pid:
            after, serving = postgres_cpu(self.db_client_pid)
            db = sum(after[pid] - self.db.get(pid, 0.0) for pid in serving)
        others = max(0.0, machine - client - (server or 0.0) - (db or 0.0)) if machine else 0.0
        return Window(latencies, seconds, server, client, others, db, dropped)


async def again_if_dropped(request: Callable[[], Awaitable[Any]]) -> Any:
    """A request made before a window, sent again if its kept-alive connection was closed under it (idle too long)."""
    try:
        return await request()
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return await request()


async def through_sdk(server: Server, operation: str, clients: int, runs: int) -> Window:
    """``runs`` runs (or ``GET /ok``) from ``clients`` SDK clients at once, each run on a thread made beforehand."""
    sdks = server.sdks[:clients]
    threads: list[str] = []
    if operation != "ok":  # made beforehand, out of the window; this refreshes every client's connection too
        for batch in range(0, runs, clients):
            made = await asyncio.gather(*(again_if_dropped(sdk.threads.create) for sdk in sdks[: runs - batch]))
            threads.extend(thread["thread_id"] for thread in made)
    else:
        await asyncio.gather(*(again_if_dropped(functools.partial(sdk.http.get, "/ok")) for sdk in sdks))
    await asyncio.sleep(0.2)  # what the requests above left to do, out of the window
    queue = list(range(runs))
    latencies: list[float] = []
    dropped = 0

    async def client(sdk: Any) -> None:
        nonlocal dropped
        while queue:
            index = queue.pop()
            body = {"messages": [{"type": "human", "content": f"hi {index}"}]}
            started = time.perf_counter()
            try:
                if operation == "wait":
                    values = await sdk.runs.wait(threads[index], "agent", input=body)
                elif operation == "stream":
                    values = None
                    async for part in sdk.runs.stream(threads[index], "agent", input=body, stream_mode=STREAM_MODES):
                        if part.event == "values":
                            values = part.data
                else:
                    await sdk.http.get("/ok")
                    values = {"messages": [{"content": "ok"}]}
            except (httpx.ReadError, httpx.RemoteProtocolError):  # a kept-alive connection closed under us
                dropped += 1
                continue
            latencies.append(time.perf_counter() - started)
            assert values and values["messages"][-1]["content"] == "ok", (server.name, operation, values)

    pid = server.process.pid
    clocks = Clocks(pid, pid if server.backend == "postgres" else None)
    await asyncio.gather(*(client(sdk) for sdk in sdks))
    return clocks.window(latencies, dropped)


async def in_process(agent: Agent, clients: int, runs: int, postgres: bool) -> Window:
    """``Agent.run_async`` in this process, ``clients`` runs at a time, each on a fresh thread."""
    queue = list(range(runs))
    latencies: list[float] = []
    prefix = uuid.uuid4().hex[:8]

    async def client() -> None:
        while queue:
            index = queue.pop()
            started = time.perf_counter()
            await agent.run_async([ChatMessage.from_user(f"hello {index}")], thread_id=f"direct-{prefix}-{index}")
            latencies.append(time.perf_counter() - started)

    clocks = Clocks(None, os.getpid() if postgres else None)
    await asyncio.gather(*(client() for _ in range(clients)))
    return clocks.window(latencies, 0)


# -- rounds and the report --------------------------------------------------------------------------------------------

COLUMNS = [  # key, heading, width, format
    ("runs/s", "runs/s", 8, "{:8.1f}"),
    ("p50", "p50 ms", 8, "{:8.1f}"),
    ("p99", "p99 ms", 8, "{:8.1f}"),
    ("mean", "mean ms", 8, "{:8.1f}"),
    ("over", "p50-model", 9, "{:+9.1f}"),
    ("cpu", "CPU ms/run", 10, "{:10.2f}"),
    ("db", "DB ms/run", 9, "{:9.2f}"),
    ("client", "client ms/run", 13, "{:13.2f}"),
    ("others", "others' cores", 13, "{:13.2f}"),
]


def median_figures(rounds: list[dict[str, float]]) -> dict[str, float]:
    keys = set.intersection(*(set(r) for r in rounds))
    return {key: statistics.median(r[key] for r in rounds) for key in keys}


def print_table(results: dict[tuple[str, str, int], dict[str, float]], postgres: bool) -> None:
    columns = [c for c in COLUMNS if postgres or c[0] != "db"]
    print(f"{'operation':<10} {'clients':>7}  {'server':<15}" + "".join(f" {c[1]:>{c[2]}}" for c in columns))
    for (operation, server, clients), figures in results.items():
        cells = []
        for key, _, width, form in columns:
            value = figures["p50"] - LATENCY * 1000 if key == "over" and operation != "ok" else figures.get(key)
            cells.append(form.format(value) if value is not None else f"{'-':>{width}}")
        print(f"{operation:<10} {clients:>7}  {server:<15} " + " ".join(cells))


def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:6.2f}x" if ours is not None and theirs else "      -"


def print_ratios(results: dict[tuple[str, str, int], dict[str, float]], ours: str, theirs: str, title: str) -> None:
    print(f"\n{title}: {'runs/s':>7} {'p50':>7} {'p50-model':>9} {'CPU/run':>7}")
    for (operation, server, clients), figures in results.items():
        other = results.get((operation, theirs, clients))
        if server != ours or other is None:
            continue
        over = (figures["p50"] - LATENCY * 1000, other["p50"] - LATENCY * 1000) if operation != "ok" else (None, None)
        print(
            f"  {operation:<7} {clients:>3} clients "
            f"{ratio(figures['runs/s'], other['runs/s'])} {ratio(figures['p50'], other['p50'])} "
            f"  {ratio(*over)} {ratio(figures.get('cpu'), other.get('cpu'))}"
        )


def print_versus_in_process(results: dict[tuple[str, str, int], dict[str, float]], server: str, base: str) -> None:
    """Our HTTP runs against ``Agent.run_async`` in-process, and the HTTP floor (``GET /ok``) of our server."""
    for clients in sorted({key[2] for key in results}):
        direct = results.get(("run_async", base, clients))
        if direct is None:
            continue
        for operation, label in (("wait", "runs/wait"), ("stream", f"runs/stream ({', '.join(STREAM_MODES)})")):
            served = results.get((operation, server, clients))
            if served:
                print(
                    f"{server}, {clients} clients, {label}: p50 {served['p50'] - direct['p50']:+.1f} ms, "
                    f"p99 {served['p99'] - direct['p99']:+.1f} ms over in-process; "
                    f"throughput {served['runs/s'] / direct['runs/s']:.2f}x of in-process"
                )
        floor = results.get(("ok", server, clients))
        if floor:
            print(
                f"{server}, {clients} clients, of which HTTP itself (GET /ok, no work): "
                f"p50 {floor['p50']:.1f} ms, p99 {floor['p99']:.1f} ms"
            )


def runs_for(clients: int, quick: bool, runs: int | None) -> int:
    """Runs per measurement: ``--runs``, else 40 for one client and 10 per client beyond (quick: 5, and 1)."""
    if runs:
        return max(runs, clients)
    if clients == 1:
        return 5 if quick else 40
    return clients * (1 if quick else 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, few runs")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, each figure their median (default: 3)")
    parser.add_argument("--runs", type=int, default=None, help="runs per measurement (default: 40, or 10 per client)")
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)), help="concurrencies (default: 1,10,50)")
    parser.add_argument("--no-langgraph", action="store_true", help="ours and the FastAPI floor only")
    parser.add_argument("--langgraph", metavar="PATH", help="the `langgraph` command (default: $BENCH_LANGGRAPH, ...)")
    parser.add_argument(
        "--postgres", nargs="?", const=POSTGRES_DSN, metavar="DSN", help=f"ours on PostgreSQL too ({POSTGRES_DSN})"
    )
    parser.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor:
        import uvicorn

        uvicorn.run(floor_app(), host="127.0.0.1", port=args.port, log_level="warning")
        return
    args.concurrencies = [int(c) for c in args.clients.split(",")]
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.langgraph = None if args.no_langgraph else find_langgraph(args.langgraph)
    load = os.getloadavg()
    print(
        f"{args.rounds} round(s), each on servers started afresh; model latency {LATENCY * 1000:.0f} ms; "
        "runs per measurement "
        + ", ".join(f"{runs_for(c, args.quick, args.runs)} at {c} client(s)" for c in args.concurrencies)
        + f"; {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start"
    )
    with tempfile.TemporaryDirectory() as folder:
        results = asyncio.run(measure_all(Path(folder), args))
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end; figures are medians of the rounds\n")
    report(results, args)


def report(results: dict[tuple[str, str, int], dict[str, float]], args: argparse.Namespace) -> None:
    print_table(results, bool(args.postgres))
    for server in ["ours", "ours-postgres"] if args.postgres else ["ours"]:
        if args.langgraph:
            print_ratios(results, server, "langgraph", f"{server} / LangGraph")
        print_ratios(results, server, "floor", f"{server} / FastAPI floor")
    print()
    print_versus_in_process(results, "ours", "in-process")
    if args.postgres:
        print_versus_in_process(results, "ours-postgres", "in-process-pg")
    dropped = sum(int(figures["dropped"]) for figures in results.values())
    if dropped:
        print(f"{dropped} request(s) lost their connection and are not counted")


async def measure_all(folder: Path, args: argparse.Namespace) -> dict[tuple[str, str, int], dict[str, float]]:
    """
    Every measurement, ``args.rounds`` times; the median of each figure. Each round starts every server afresh:
    LangGraph's in-memory queue scans every run it holds at each poll, so its cost per run grows with its history.
    """
    seen: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    names: list[str] = []
    began = time.perf_counter()
    for number in range(args.rounds):
        with contextlib.ExitStack() as stack:
            servers, agents = start_round(folder / f"round-{number + 1}", stack, args)
            if number == 0:
                print(f"servers ready in {time.perf_counter() - began:.1f} s:")
                describe(servers, args.langgraph)
                names = [server.name for server in servers] + list(agents)
            await measure_round(number, servers, agents, seen, args)
        print(f"round {number + 1} of {args.rounds} done ({time.perf_counter() - began:.0f} s)", flush=True)
    order_of = {"wait": 0, "stream": 1, "ok": 2, "run_async": 3}
    keys = sorted(seen, key=lambda k: (order_of[k[0]], k[2], names.index(k[1])))
    return {key: median_figures(seen[key]) for key in keys}


def start_round(
    folder: Path, stack: contextlib.ExitStack, args: argparse.Namespace
) -> tuple[list[Server], dict[str, Agent]]:
    """The servers of one round, ready (stopped when ``stack`` closes), and the in-process agents."""
    folder.mkdir()
    servers = [start_ours(folder, str(folder / "server.db"), "sqlite")]
    stack.callback(servers[0].stop)
    direct = stack.enter_context(contextlib.closing(SQLiteCheckpointer(folder / "direct.db")))
    agents = {"in-process": make_agent(direct)}
    if args.postgres:
        from haystack_state.persistence.postgres import PostgresCheckpointer

        schema = f"bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        stack.callback(drop_schema, args.postgres, schema)
        stack.callback(drop_schema, args.postgres, f"{schema}_direct")
        servers.append(start_ours(folder, args.postgres, "postgres", schema))
        stack.callback(servers[-1].stop)
        direct_pg = stack.enter_context(
            contextlib.closing(PostgresCheckpointer(args.postgres, schema=f"{schema}_direct"))
        )
        agents["in-process-pg"] = make_agent(direct_pg)
    servers.append(start_floor(folder))
    stack.callback(servers[-1].stop)
    if args.langgraph:
        servers.append(start_langgraph(folder, args.langgraph))
        stack.callback(servers[-1].stop)
    for server in servers:
        wait_ready(server)
    return servers, agents


def describe(servers: list[Server], langgraph: str | None) -> None:
    ours = event_loop_of(sys.executable)
    for server in servers:
        runtime = event_loop_of(interpreter_of(langgraph)) if server.name == "langgraph" and langgraph else ours
        info = httpx.get(f"{server.url}/info", timeout=5) if server.name != "floor" else None
        version = info.json().get("version", "?") if info is not None and info.status_code == 200 else "-"
        print(f"  {server.name:<15} {runtime:<17} version {version}")


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def measure_round(
    number: int,
    servers: list[Server],
    agents: dict[str, Agent],
    seen: dict[tuple[str, str, int], list[dict[str, float]]],
    args: argparse.Namespace,
) -> None:
    """One round: every measurement once, the servers' order rotating from round to round."""
    from langgraph_sdk import get_client

    for server in servers:  # made once: an SDK client takes a while to make (its SSL context)
        server.sdks = [get_client(url=server.url, api_key=None) for _ in range(max(args.concurrencies))]
    try:
        for server in servers:  # warm up: imports, connections, first runs
            for operation in ("wait", "stream"):
                await through_sdk(server, operation, 2, 4)
        for agent in agents.values():
            await in_process(agent, 2, 4, False)
        order = servers[number % len(servers) :] + servers[: number % len(servers)]
        for clients in args.concurrencies:
            runs = runs_for(clients, args.quick, args.runs)
            for operation in ("wait", "stream", "ok"):
                for server in order:
                    window = await through_sdk(server, operation, clients, runs)
                    seen.setdefault((operation, server.name, clients), []).append(window.figures())
            for name, agent in agents.items():
                window = await in_process(agent, clients, runs, name.endswith("-pg"))
                seen.setdefault(("run_async", name, clients), []).append(window.figures())
    finally:
        await asyncio.gather(*(sdk.aclose() for server in servers for sdk in server.sdks))


if __name__ == "__main__":
    main()
