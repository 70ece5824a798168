"""
Fixtures of the server tests: a real uvicorn server on a free port of 127.0.0.1 (in a thread of the test process,
or as ``haystack-state serve`` processes), on SQLite and on PostgreSQL (a fresh schema per test, skipped without a
server unless ``HAYSTACK_STATE_REQUIRE_POSTGRES=1``), and LangGraph's own SDK as the client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from persistence.harness import POSTGRES_DSN, postgres_dsn, postgres_schema

from haystack_state import Agent
from haystack_state.persistence import Checkpointer, SQLiteCheckpointer
from haystack_state.server import create_app
from server.agents import make_agent

__all__ = ["POSTGRES_DSN", "Backend", "LiveServer", "ServeProcess", "postgres_dsn", "postgres_schema"]

TESTS_DIR = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Backend:
    """Where a test's threads live: a SQLite file or a PostgreSQL schema."""

    name: str
    path: Path | None = None
    dsn: str | None = None
    schema: str | None = None
    opened: list[Checkpointer] = dataclasses.field(default_factory=list)

    def checkpointer(self) -> Checkpointer:
        if self.name == "sqlite":
            assert self.path is not None
            made: Checkpointer = SQLiteCheckpointer(self.path)
        else:
            from haystack_state.persistence.postgres import PostgresCheckpointer

            made = PostgresCheckpointer(self.dsn, schema=self.schema or "public")
        self.opened.append(made)
        return made

    @property
    def serve_args(self) -> list[str]:
        """The ``serve`` options that name this database."""
        if self.name == "sqlite":
            return ["--db", str(self.path)]
        return ["--db", str(self.dsn), "--schema", str(self.schema)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A SQLite file or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        made = Backend("sqlite", path=tmp_path / "threads.db")
    else:
        made = Backend(
            "postgres", dsn=request.getfixturevalue("postgres_dsn"), schema=request.getfixturevalue("postgres_schema")
        )
    yield made
    for checkpointer in made.opened:
        checkpointer.close()


class LiveServer:
    """
    A uvicorn server in a thread of this process, on a free port of 127.0.0.1.

    :param app: The ASGI app.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("the server did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@dataclasses.dataclass
class Served:
    """A running server and what it serves."""

    url: str
    agent: Agent
    app: Any
    stack: contextlib.ExitStack

    def client(self, api_key: str | None = None) -> SyncLangGraphClient:
        """LangGraph's SDK client on this server (closed after the test)."""
        return self.stack.enter_context(get_sync_client(url=self.url, api_key=api_key))

    def http(self, **kwargs: Any) -> httpx.Client:
        """A plain HTTP client on this server (closed after the test)."""
        return self.stack.enter_context(httpx.Client(base_url=self.url, timeout=30, **kwargs))


@pytest.fixture
def serve(backend: Backend) -> Iterator[Callable[..., Served]]:
    """Start servers of the test agent on the backend: ``serve(**create_app_kwargs)``."""
    with contextlib.ExitStack() as stack:

        def start(**kwargs: Any) -> Served:
            agent = make_agent(backend.checkpointer())
            app = create_app({"agent": agent}, poll_interval=0.05, **kwargs)
            live = stack.enter_context(LiveServer(app))
            return Served(live.url, agent, app, stack)

        yield start


@pytest.fixture
def served(serve: Callable[..., Served]) -> Served:
    """A server of the test agent on the backend."""
    return serve()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """
    A ``haystack-state serve`` process (``python -m haystack_state.server.cli serve``), bounded in time and stopped
    on exit.

    :param args: The arguments after ``serve``.
    :param env: More environment variables for the process.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "HAYSTACK_TELEMETRY_ENABLED": "False",
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)]),
            **(env or {}),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "haystack_state.server.cli", "serve", *args, "--port", str(self.port)],
            cwd=TESTS_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                out, err = self.process.communicate()
                raise AssertionError(f"serve exited ({self.process.returncode}):\n{out}\n{err}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=1).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                raise AssertionError("serve did not answer in time")
            time.sleep(0.1)

    def stop(self) -> tuple[str, str]:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.communicate()
