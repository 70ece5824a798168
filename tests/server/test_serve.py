"""
``haystack-state serve`` as processes: several server processes on one PostgreSQL database share the background
runs (each run by exactly one of them), a run outlives its stream's client, and the command's errors are clear.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client

from haystack_state.persistence import InMemoryCheckpointer
from haystack_state.server.cli import ServeError, add_serve_command, load_agents, main
from server.conftest import Backend, ServeProcess


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_two_processes_share_the_runs_of_one_postgres_database(backend: Backend) -> None:
    args = ["server.agents:serve_agents", *backend.serve_args, "--max-concurrent-runs", "1", "--poll-interval", "0.05"]
    first, second = ServeProcess(*args), ServeProcess(*args)
    try:
        first.wait_ready()
        second.wait_ready()
        with get_sync_client(url=first.url, api_key=None) as a, get_sync_client(url=second.url, api_key=None) as b:
            threads = [a.threads.create()["thread_id"] for _ in range(6)]
            runs = [a.runs.create(t, "agent", input=human("sleep 0.3")) for t in threads]
            for thread_id, run in zip(threads, runs, strict=True):  # each joined through the other process
                values = b.runs.join(thread_id, run["run_id"])
                assert values["messages"][-1]["content"] == "slept 0.3"
            assert {b.runs.get(t, r["run_id"])["status"] for t, r in zip(threads, runs, strict=True)} == {"success"}
            assert [
                t["thread_id"] for t in b.threads.search(limit=10, sort_by="created_at", sort_order="asc")
            ] == threads
        import psycopg

        with psycopg.connect(str(backend.dsn)) as conn:
            workers = conn.execute(
                f'SELECT worker, COUNT(*) FROM "{backend.schema}".haystack_state_server_runs GROUP BY worker'
            ).fetchall()
        # One run at a time per process and six runs of 0.3 s: both processes took some.
        assert len(workers) == 2 and sum(count for _, count in workers) == 6, workers
    finally:
        first.stop()
        second.stop()


def contents(values: dict[str, Any]) -> list[Any]:
    return [m["content"] for m in values["messages"] if m["type"] != "system"]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_two_processes_stream_cancel_and_resume(backend: Backend) -> None:
    """Streams, joins, cancels and resumes across two server processes on one PostgreSQL database."""
    args = ["server.agents:serve_agents", *backend.serve_args, "--poll-interval", "0.05"]
    first, second = ServeProcess(*args), ServeProcess(*args)
    try:
        first.wait_ready()
        second.wait_ready()
        with get_sync_client(url=first.url, api_key=None) as a, get_sync_client(url=second.url, api_key=None) as b:
            # Several modes at once, from the process that runs the stream.
            thread_id = a.threads.create()["thread_id"]
            modes = ["values", "updates", "messages-tuple"]
            parts = list(a.runs.stream(thread_id, "agent", input=human("note tea"), stream_mode=modes))
            assert {p.event for p in parts} == {"metadata", "values", "updates", "messages"}
            assert parts[-1].event == "values" and parts[-1].data == b.threads.get_state(thread_id)["values"]

            # A streamed run on the first process, its client gone, joined through the second: every event, from
            # the first (relayed through the database).
            thread_id = a.threads.create()["thread_id"]
            with (
                httpx.Client(base_url=first.url, timeout=30) as http,
                http.stream(
                    "POST",
                    f"/threads/{thread_id}/runs/stream",
                    json={"assistant_id": "agent", "input": human("sleep 2"), "stream_mode": modes},
                ) as response,
            ):
                run_id = response.headers["content-location"].rsplit("/", 1)[1]
                assert next(response.iter_lines()) == "event: metadata"
            joined = list(b.runs.join_stream(thread_id, run_id))
            events = [p.event for p in joined]
            assert events[:3] == ["metadata", "updates", "values"], joined
            assert events[-2:] == ["updates", "values"], joined[-2:]  # (an error event carries its message)
            assert contents(joined[2].data) == ["sleep 2"] and contents(joined[-1].data) == ["sleep 2", "slept 2"]
            assert "".join(p.data[0]["content"] for p in joined if p.event == "messages") == "slept 2"
            assert b.runs.get(thread_id, run_id)["status"] == "success"
            only_updates = list(b.runs.join_stream(thread_id, run_id, stream_mode="updates"))  # a finished run
            assert [p.event for p in only_updates] == ["metadata", "updates", "updates"]

            # A run executing in the first process, cancelled through the second.
            thread_id = a.threads.create()["thread_id"]
            stream = a.runs.stream(thread_id, "agent", input=human("sleep 30"), stream_mode=["values"])
            run_id = next(stream).data["run_id"]
            assert contents(next(stream).data) == ["sleep 30"]  # the input is committed; the model is thinking
            b.runs.cancel(thread_id, run_id)
            assert list(stream) == []  # the first process stopped it
            assert b.runs.get(thread_id, run_id)["status"] == "interrupted"
            assert contents(b.runs.join(thread_id, run_id)) == ["sleep 30"]
            assert contents(b.runs.wait(thread_id, "agent", input=human("hi")))[-1] == "echo: hi"

            # Interrupted through one process, resumed through the other (run by either).
            values = a.runs.wait(thread_id, "agent", input=human("email ada@ex.org"))
            assert values["__interrupt__"] == b.threads.get_state(thread_id)["interrupts"]
            run = b.runs.create(thread_id, "agent", command={"resume": "approve"})
            assert contents(a.runs.join(thread_id, run["run_id"]))[-1] == "Done: sent to ada@ex.org"
    finally:
        first.stop()
        second.stop()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_run_outlives_its_streams_client_and_can_be_joined(backend: Backend) -> None:
    server = ServeProcess("server.agents:serve_agents", *backend.serve_args).wait_ready()
    try:
        with get_sync_client(url=server.url, api_key=None) as client:
            thread_id = client.threads.create()["thread_id"]
            with (
                httpx.Client(base_url=server.url, timeout=30) as http,
                http.stream(
                    "POST",
                    f"/threads/{thread_id}/runs/stream",
                    json={"assistant_id": "agent", "input": human("sleep 0.5")},
                ) as response,
            ):
                run_path = response.headers["content-location"]
                first_line = next(response.iter_lines())
                assert first_line == "event: metadata"
            # The client hung up; the run goes on.
            run_id = run_path.rsplit("/", 1)[1]
            parts = list(client.runs.join_stream(thread_id, run_id))  # every event, from the run's start
            assert [p.event for p in parts] == ["metadata", "values", "values"]
            assert [m["content"] for m in parts[1].data["messages"]] == ["sleep 0.5"]
            assert parts[2].data["messages"][-1]["content"] == "slept 0.5"
            assert client.runs.get(thread_id, run_id)["status"] == "success"
    finally:
        server.stop()


@pytest.mark.slow
def test_the_serve_command_on_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "threads.db"
    server = ServeProcess("server.agents:make_agent", "--db", str(db)).wait_ready()
    try:
        with get_sync_client(url=server.url, api_key=None) as client:
            thread_id = client.threads.create()["thread_id"]
            assert client.runs.wait(thread_id, "make_agent", input=human("hi"))["messages"][-1]["content"] == "echo: hi"
    finally:
        out, _ = server.stop()
    assert f"Serving make_agent at http://127.0.0.1:{server.port}" in out
    assert db.exists()


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (["nonexistent_module_xyz:agent"], "cannot import nonexistent_module_xyz"),
        (["server.agents"], "a target is module:attribute"),
        (["server.agents:missing"], "has no attribute 'missing'"),
        (["server.agents:SCHEMA"], "is not an Agent"),
        (["server.agents:make_agent", "server.agents:make_agent"], "two agents are named 'make_agent'"),
    ],
)
def test_bad_targets_are_clear_errors(targets: list[str], message: str) -> None:
    with pytest.raises(ServeError, match=message):
        load_agents(targets, InMemoryCheckpointer())


def test_an_agent_with_its_own_checkpointer_and_db() -> None:
    import server.agents as agents

    agents.OWN = agents.make_agent(InMemoryCheckpointer())  # type: ignore[attr-defined]
    try:
        with pytest.raises(ServeError, match="has a checkpointer of its own"):
            load_agents(["server.agents:OWN"], InMemoryCheckpointer())
        assert load_agents(["server.agents:OWN"], None) == {"OWN": agents.OWN}  # type: ignore[attr-defined]
    finally:
        del agents.OWN  # type: ignore[attr-defined]


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="haystack-state")
    add_serve_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "m:a", "--db", "x.db"])
    assert (args.host, args.port, args.db, args.targets) == ("127.0.0.1", 8123, "x.db", ["m:a"])
    assert (args.lease_seconds, args.max_attempts, args.auth_keys, args.cors_origin) == (30.0, 3, None, None)
    assert main(["serve", "server.agents:missing"]) == 1
    assert "has no attribute 'missing'" in capsys.readouterr().err
    assert main(["serve", "server.agents:make_agent", "--db", "/nonexistent-dir/x.db"]) == 1
    assert "--db /nonexistent-dir/x.db" in capsys.readouterr().err


@pytest.mark.slow
def test_without_the_server_extra_the_error_names_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['fastapi'] = None  # as if the server extra were not installed\n"
        "import haystack_state.server.cli  # the command still loads\n"
        "try:\n"
        "    from haystack_state.server import create_app\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"},
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "haystack-state[server]"' in result.stdout
