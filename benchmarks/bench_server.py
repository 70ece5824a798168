"""
What the Agent Protocol server costs: runs per second and per-run latency through HTTP (``POST
/threads/{id}/runs/wait`` from 50 concurrent clients, LangGraph's SDK's endpoint) next to calling
``Agent.run_async`` directly in-process with the same concurrency, on the same agent and the same SQLite database;
and the same runs through ``runs/stream`` with the ``values``, ``updates`` and ``messages-tuple`` modes (the client
reads every event; the model streams its reply in chunks).

The model answers in text after 50 ms (``asyncio.sleep`` in ``run_async``, ``time.sleep`` in ``run``), so a run is
one model call and two checkpoint commits (the input, the reply). The server runs in a process of its own (as
``haystack-state serve`` would), the clients in this one; each client runs on a thread of its own, created
beforehand. Overhead = HTTP latency - direct latency, at the median and the 99th percentile.

Usage::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_server.py           # 1,000 runs
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_server.py --quick   # 200 runs, a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import httpx
from haystack import component
from haystack.dataclasses import ChatMessage, StreamingChunk

from haystack_state import Agent
from haystack_state.persistence import SQLiteCheckpointer

LATENCY = 0.05
CLIENTS = 50
DROPPED: list[int] = []  # requests whose connection dropped (reported, not counted)


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


def make_agent(db: str) -> Agent:
    return Agent(SlowChatGenerator(), checkpointer=SQLiteCheckpointer(db))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def direct(agent: Agent, runs: int) -> tuple[float, list[float]]:
    """``Agent.run_async`` with ``CLIENTS`` runs at a time, each on a thread of its own."""
    latencies: list[float] = []
    queue = list(range(runs))

    async def client(number: int) -> None:
        while queue:
            index = queue.pop()
            started = time.perf_counter()
            await agent.run_async([ChatMessage.from_user(f"hello {index}")], thread_id=f"direct-{number}-{index}")
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    return time.perf_counter() - started, latencies


async def through_http(url: str, runs: int) -> tuple[float, list[float]]:
    """``runs/wait`` with ``CLIENTS`` concurrent clients, each on a thread of its own."""
    latencies: list[float] = []
    queue = list(range(runs))
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        threads = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(CLIENTS)]

        async def client(number: int) -> None:
            while queue:
                index = queue.pop()
                body = {"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": f"hi {index}"}]}}
                started = time.perf_counter()
                try:
                    response = await http.post(f"/threads/{threads[number]}/runs/wait", json=body)
                except (httpx.ReadError, httpx.RemoteProtocolError):  # a kept-alive connection closed under us
                    DROPPED.append(index)
                    continue
                latencies.append(time.perf_counter() - started)
                response.raise_for_status()
                assert response.json()["messages"][-1]["content"] == "ok"

        started = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    return time.perf_counter() - started, latencies


async def through_http_stream(url: str, runs: int) -> tuple[float, list[float]]:
    """``runs/stream`` (values, updates, messages-tuple) with ``CLIENTS`` concurrent clients, reading every event."""
    latencies: list[float] = []
    queue = list(range(runs))
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        threads = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(CLIENTS)]

        async def client(number: int) -> None:
            while queue:
                index = queue.pop()
                body = {
                    "assistant_id": "agent",
                    "input": {"messages": [{"type": "human", "content": f"hi {index}"}]},
                    "stream_mode": ["values", "updates", "messages-tuple"],
                }
                started = time.perf_counter()
                try:
                    async with http.stream("POST", f"/threads/{threads[number]}/runs/stream", json=body) as response:
                        response.raise_for_status()
                        names = [line async for line in response.aiter_lines() if line.startswith("event: ")]
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    DROPPED.append(index)
                    continue
                latencies.append(time.perf_counter() - started)
                # metadata; the input's update and values; two chunks; the reply's update and values
                assert len(names) == 7 and names[-1] == "event: values", names

        started = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    return time.perf_counter() - started, latencies


async def http_floor(url: str, requests: int) -> tuple[float, list[float]]:
    """``GET /ok`` (no work at all) with the same clients: what HTTP itself costs on this machine."""
    latencies: list[float] = []
    queue = list(range(requests))
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

        async def client() -> None:
            while queue:
                queue.pop()
                started = time.perf_counter()
                (await http.get("/ok")).raise_for_status()
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return time.perf_counter() - started, latencies


def serve(port: int, db: str) -> None:
    """The server process: the agent served on ``port``."""
    import uvicorn

    from haystack_state.server import Limits, create_app

    app = create_app({"agent": make_agent(db)}, limits=Limits(max_concurrent_runs=64))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=60)


def start_server(db: str) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(port), db], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.1)


def report(name: str, seconds: float, latencies: list[float]) -> dict[str, float]:
    figures = {
        "runs/s": len(latencies) / seconds,
        "p50": percentile(latencies, 0.5) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
        "mean": statistics.fmean(latencies) * 1000,
    }
    print(
        f"{name:<34} {figures['runs/s']:8.1f} runs/s   p50 {figures['p50']:7.1f} ms   p99 {figures['p99']:7.1f} ms   "
        f"mean {figures['mean']:7.1f} ms"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 runs instead of 1,000")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    runs = args.runs or (200 if args.quick else 1000)
    print(f"{runs} runs, {CLIENTS} concurrent clients, model latency {LATENCY * 1000:.0f} ms, SQLite")
    with tempfile.TemporaryDirectory() as folder:
        agent = make_agent(str(Path(folder) / "direct.db"))
        asyncio.run(direct(agent, CLIENTS))  # warm up
        base = report("Agent.run_async in-process", *asyncio.run(direct(agent, runs)))
        process, url = start_server(str(Path(folder) / "server.db"))
        try:
            asyncio.run(through_http(url, CLIENTS))  # warm up
            served = report("HTTP POST /threads/{id}/runs/wait", *asyncio.run(through_http(url, runs)))
            streamed = report("HTTP runs/stream (3 modes)", *asyncio.run(through_http_stream(url, runs)))
            floor = report("HTTP GET /ok (the HTTP floor)", *asyncio.run(http_floor(url, runs)))
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(
        f"overhead per run: p50 {served['p50'] - base['p50']:+.1f} ms, p99 {served['p99'] - base['p99']:+.1f} ms; "
        f"throughput {served['runs/s'] / base['runs/s']:.2f}x of in-process"
    )
    print(
        f"streamed (values, updates, messages-tuple): p50 {streamed['p50'] - base['p50']:+.1f} ms, "
        f"p99 {streamed['p99'] - base['p99']:+.1f} ms over in-process; "
        f"throughput {streamed['runs/s'] / base['runs/s']:.2f}x of in-process"
    )
    if DROPPED:
        print(f"{len(DROPPED)} request(s) lost their connection and are not counted")
    print(f"of which HTTP itself (client and server, no work): p50 {floor['p50']:.1f} ms, p99 {floor['p99']:.1f} ms")


if __name__ == "__main__":
    main()
