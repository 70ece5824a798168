"""
Many concurrent async runs in one event loop: does checkpointing block the loop?

Workload: ``--runs`` (100) concurrent ``Agent.run_async`` calls on threads of their own, each ``--steps`` (10) steps of
one tool call, then a final text reply; the model awaits ``--latency`` (10 ms) per reply, so a run that never waits on
anything else takes (steps + 1) x latency. Every step commits checkpoints (the model's reply, the tool's result).

Contenders, each on the same workload in the same process:

- ours with ``InMemoryCheckpointer`` (no I/O at all: the ideal for our own code);
- ours with ``SQLiteCheckpointer`` (async methods on a dedicated thread pool) and ``PostgresCheckpointer``
  (psycopg's ``AsyncConnectionPool``);
- LangGraph: a two-node ``StateGraph`` (model -> tools -> model ...) with the same model latency and steps, on
  ``AsyncSqliteSaver`` (langgraph-checkpoint-sqlite) and ``AsyncPostgresSaver`` (langgraph-checkpoint-postgres, on a
  psycopg ``AsyncConnectionPool`` of the same size as ours).

Reported: wall time of the whole batch, and its ratio to the theoretical ideal ((steps + 1) x latency) and to ours in
memory. The contenders run in ``--repeat`` rounds, one batch each per round, and each one's best batch is compared (the
medians are printed beside). Target: ours on SQLite and on PostgreSQL within 1.5x of ours in memory.

Usage::

    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_async.py
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_async.py --quick       # 20 runs, a smoke run
    HAYSTACK_TELEMETRY_ENABLED=False python benchmarks/bench_async.py --no-postgres

PostgreSQL: ``HAYSTACK_STATE_POSTGRES_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``); each contender
uses a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import component
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_state import Agent, tool
from haystack_state.persistence import Checkpointer, InMemoryCheckpointer, SQLiteCheckpointer

try:  # the comparison needs pip install -e ".[bench]"; its type hints are read at run time, so import here
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
except ImportError:  # pragma: no cover - runs without LangGraph: --no-langgraph
    pass

DSN = os.environ.get("HAYSTACK_STATE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TARGET_RATIO = 1.5
POOL_SIZE = 8


@component
class SlowChatGenerator:
    """
    A model that awaits ``latency`` seconds per reply: ``steps`` replies calling the ``lookup`` tool, then a text.

    :param steps: Tool-calling replies per run.
    :param latency: Seconds per reply.
    """

    def __init__(self, steps: int, latency: float) -> None:
        self.steps = steps
        self.latency = latency

    def _reply(self, messages: list[ChatMessage]) -> ChatMessage:
        done = sum(1 for m in messages if m.is_from("assistant"))
        if done >= self.steps:
            return ChatMessage.from_assistant("Done.")
        call = ToolCall(tool_name="lookup", arguments={"page": done}, id=f"call-{done}")
        return ChatMessage.from_assistant(tool_calls=[call])

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, list[ChatMessage]]:
        time.sleep(self.latency)
        return {"replies": [self._reply(messages)]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, list[ChatMessage]]:
        await asyncio.sleep(self.latency)
        return {"replies": [self._reply(messages)]}


@tool(outputs_to_state={"pages": {"source": "page"}})
def lookup(page: int) -> dict[str, Any]:
    """
    Look a page up.

    :param page: The page.
    """
    return {"page": page, "text": f"page {page}: " + "lorem ipsum " * 20}


async def batch(runs: int, start: Callable[[int], Awaitable[Any]]) -> float:
    """Start ``runs`` runs at once; return the wall time until the last one ends."""
    begin = time.perf_counter()
    await asyncio.gather(*(start(index) for index in range(runs)))
    return time.perf_counter() - begin


def ours(checkpointer: Checkpointer, runs: int, steps: int, latency: float) -> float:
    agent = Agent(
        SlowChatGenerator(steps, latency),
        tools=[lookup],
        state_schema={"pages": {"type": list[int]}},
        checkpointer=checkpointer,
        max_agent_steps=steps + 2,
    )
    prefix = uuid.uuid4().hex[:8]

    async def start(index: int) -> None:
        result = await agent.run_async([ChatMessage.from_user("go")], thread_id=f"{prefix}-{index}")
        assert result["pages"] == list(range(steps)), result["pages"]

    async def main() -> float:
        await start(-1)  # warm up: connections, pools, caches
        return await batch(runs, start)

    return asyncio.run(main())


def langgraph_graph(steps: int, latency: float) -> Any:
    async def model(state: MessagesState) -> dict[str, Any]:
        await asyncio.sleep(latency)
        done = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        if done >= steps:
            return {"messages": [AIMessage(content="Done.")]}
        call = {"name": "lookup", "args": {"page": done}, "id": f"call-{done}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    async def tools(state: MessagesState) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        page = call["args"]["page"]
        return {"messages": [ToolMessage(content=f"page {page}: " + "lorem ipsum " * 20, tool_call_id=call["id"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph


def langgraph(saver_factory: Any, runs: int, steps: int, latency: float) -> float:
    async def main() -> float:
        async with saver_factory() as saver:
            app = langgraph_graph(steps, latency).compile(checkpointer=saver)
            prefix = uuid.uuid4().hex[:8]

            async def start(index: int) -> None:
                config = {"configurable": {"thread_id": f"{prefix}-{index}"}, "recursion_limit": 4 * steps + 10}
                result = await app.ainvoke({"messages": [HumanMessage(content="go")]}, config)
                assert len(result["messages"]) == 2 * steps + 2

            await start(-1)
            return await batch(runs, start)

    return asyncio.run(main())


def postgres_schema() -> str:
    import psycopg
    from psycopg import sql

    name = f"bench_async_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    return name


def drop_schema(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.010)
    parser.add_argument(
        "--repeat", type=int, default=5, help="rounds (a batch of every contender each); the best batch is reported"
    )
    parser.add_argument("--quick", action="store_true", help="20 runs, one batch")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-langgraph", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.repeat = 20, 1
    runs, steps, latency = args.runs, args.steps, args.latency
    folder = Path(tempfile.mkdtemp(prefix="bench-async-"))
    contenders: dict[str, Callable[[], float]] = {}

    def measure(name: str, once: Callable[[], float]) -> None:
        contenders[name] = once

    def with_checkpointer(make: Callable[[], Checkpointer]) -> Callable[[], float]:
        def once() -> float:
            with make() as checkpointer:
                return ours(checkpointer, runs, steps, latency)

        return once

    measure("ours, in memory", with_checkpointer(InMemoryCheckpointer))
    counter = iter(range(10**6))
    measure("ours, SQLite", with_checkpointer(lambda: SQLiteCheckpointer(folder / f"ours-{next(counter)}.sqlite")))
    schemas: list[str] = []
    if not args.no_postgres:
        from haystack_state.persistence.postgres import PostgresCheckpointer

        def make_postgres() -> Checkpointer:
            schemas.append(postgres_schema())
            return PostgresCheckpointer(DSN, schema=schemas[-1], max_connections=POOL_SIZE)

        measure("ours, PostgreSQL", with_checkpointer(make_postgres))
    if not args.no_langgraph and "StateGraph" not in globals():
        print("LangGraph: skipped (langgraph is not installed: pip install -e '.[bench]')")
    elif not args.no_langgraph:
        from contextlib import asynccontextmanager

        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        measure(
            "LangGraph, AsyncSqliteSaver",
            lambda: langgraph(
                lambda: AsyncSqliteSaver.from_conn_string(str(folder / f"lg-{next(counter)}.sqlite")),
                runs,
                steps,
                latency,
            ),
        )
        if not args.no_postgres:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            @asynccontextmanager
            async def postgres_saver() -> Any:
                schemas.append(postgres_schema())
                kwargs = {
                    "autocommit": True,
                    "prepare_threshold": 0,
                    "row_factory": dict_row,
                    "options": f"-c search_path={schemas[-1]}",
                }
                async with AsyncConnectionPool(DSN, max_size=POOL_SIZE, kwargs=kwargs) as pool:
                    saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
                    await saver.setup()
                    yield saver

            measure("LangGraph, AsyncPostgresSaver", lambda: langgraph(postgres_saver, runs, steps, latency))
    # Rounds, each running every contender once, so that a slow spell of this shared machine falls on all of them
    # alike; each contender's best batch is compared (the in-memory baseline alone varied 0.76-1.28 s between
    # batches run one after the other).
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(args.repeat):
        for name, once in contenders.items():
            times[name].append(once())
            print(f"  round {round_ + 1}, {name}: {times[name][-1] * 1000:.0f} ms", file=sys.stderr)
    results = {name: min(seconds) for name, seconds in times.items()}
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    for name in schemas:
        drop_schema(name)

    ideal = (steps + 1) * latency
    memory = results["ours, in memory"]
    print(
        f"\n{runs} concurrent run_async calls x {steps} steps (a tool call each, then a text reply), "
        f"model latency {latency * 1000:.0f} ms; best of {args.repeat} rounds (contenders interleaved); load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n"
    )
    print(f"{'contender':32} {'wall time':>10} {'/ theory':>9} {'/ ours in memory':>17} {'median':>9} {'/ median':>9}")
    print(f"{'theory: (steps + 1) x latency':32} {ideal * 1000:>8.0f} ms {1:>9.2f} {ideal / memory:>17.2f}")
    for name, seconds in results.items():
        print(
            f"{name:32} {seconds * 1000:>8.0f} ms {seconds / ideal:>9.2f} {seconds / memory:>17.2f} "
            f"{medians[name] * 1000:>6.0f} ms {medians[name] / medians['ours, in memory']:>9.2f}"
        )
    missed = [
        name
        for name in ("ours, SQLite", "ours, PostgreSQL")
        if name in results and results[name] > TARGET_RATIO * memory
    ]
    print(f"\ntarget: ours on SQLite and PostgreSQL within {TARGET_RATIO}x of ours in memory: ", end="")
    print("met" if not missed else f"missed by {', '.join(missed)}")
    return 1 if missed and not args.quick else 0


if __name__ == "__main__":
    sys.exit(main())
