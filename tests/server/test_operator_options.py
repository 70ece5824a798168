"""
The operator's options of ``haystack-state serve``: API keys from a file or the environment, CORS, the run lease and
attempts, and the limits. Real ``serve`` processes with ``langgraph-sdk`` and httpx as clients; the settings that no
quick request shows (the lease, the attempts) are read from the app that ``build_app`` makes of parsed arguments.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from langgraph_sdk import get_sync_client

from haystack_state.cli import main as haystack_state_main
from haystack_state.persistence import SQLiteCheckpointer
from haystack_state.server import create_app
from haystack_state.server._auth import parse_api_keys
from haystack_state.server._cors import cors_for_host, cors_origins, is_loopback
from haystack_state.server.cli import API_KEYS_VARIABLE, ServeError, add_serve_command, build_app
from server.agents import make_agent
from server.conftest import ServeProcess

KEYS_FILE = """\
# the test users: a key ending in base64 padding, and a second key of alice's
alice-key-1=alice

b0b+/key== = bob
alice-key-2=alice
"""

PREFLIGHT = {
    "Origin": "http://localhost:3000",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type,x-api-key",
}


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


def serve_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="haystack-state")
    add_serve_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *extra])


@pytest.fixture(scope="module")
def keys_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A loopback server (no CORS option) with ``--auth-keys`` and one run at a time."""
    folder = tmp_path_factory.mktemp("keys_server")
    (folder / "keys.txt").write_text(KEYS_FILE)
    args = ["--db", str(folder / "threads.db"), "--auth-keys", str(folder / "keys.txt")]
    server = ServeProcess("server.agents:serve_agents", *args, "--max-concurrent-runs", "1", "--poll-interval", "0.05")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def env_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A server with ``$HAYSTACK_STATE_API_KEYS``, one CORS origin, and its own lease and attempts."""
    folder = tmp_path_factory.mktemp("env_server")
    options = ["--cors-origin", "http://a.example", "--lease-seconds", "7.5", "--max-attempts", "5"]
    with pytest.MonkeyPatch.context() as patch:  # the process copies the environment as it starts
        patch.setenv(API_KEYS_VARIABLE, "carol-key=carol\n\ndave-key=dave\n")
        server = ServeProcess("server.agents:serve_agents", "--db", str(folder / "threads.db"), *options)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


# --- API keys --------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_auth_keys_file_users_and_isolation(keys_server: ServeProcess) -> None:
    with httpx.Client(base_url=keys_server.url, timeout=30) as http:
        assert http.post("/threads", json={}).status_code == 401
        assert http.post("/threads", json={}, headers={"x-api-key": "wrong"}).status_code == 401
        bearer = http.post("/threads", json={}, headers={"Authorization": "Bearer b0b+/key=="})
        assert bearer.status_code == 200
    with (
        get_sync_client(url=keys_server.url, api_key="alice-key-1") as alice,
        get_sync_client(url=keys_server.url, api_key="alice-key-2") as alice_again,
        get_sync_client(url=keys_server.url, api_key="b0b+/key==") as bob,
    ):
        thread_id = alice.threads.create()["thread_id"]
        assert alice.runs.wait(thread_id, "agent", input=human("hi"))["messages"][-1]["content"] == "echo: hi"
        assert alice_again.threads.get(thread_id)["thread_id"] == thread_id  # two keys, one user
        with pytest.raises(httpx.HTTPStatusError) as refused:
            bob.threads.get(thread_id)
        assert refused.value.response.status_code == 404
        with pytest.raises(httpx.HTTPStatusError) as refused:
            bob.runs.wait(thread_id, "agent", input=human("mine now"))
        assert refused.value.response.status_code == 404
        assert thread_id not in [t["thread_id"] for t in bob.threads.search(limit=100)]
        assert [m["content"] for m in alice.threads.get_state(thread_id)["values"]["messages"]][-1] == "echo: hi"


@pytest.mark.slow
def test_environment_keys(env_server: ServeProcess) -> None:
    with httpx.Client(base_url=env_server.url, timeout=30) as http:
        assert http.post("/threads/search", json={}).status_code == 401
    with (
        get_sync_client(url=env_server.url, api_key="carol-key") as carol,
        get_sync_client(url=env_server.url, api_key="dave-key") as dave,
    ):
        thread_id = carol.threads.create()["thread_id"]
        assert carol.runs.wait(thread_id, "agent", input=human("hi"))["messages"][-1]["content"] == "echo: hi"
        with pytest.raises(httpx.HTTPStatusError) as refused:
            dave.threads.get_state(thread_id)
        assert refused.value.response.status_code == 404


@pytest.mark.slow
def test_a_malformed_key_file_stops_serve_naming_the_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# users\nsecret-key-1=alice\nsecret-key-2 alice\n")
    server = ServeProcess("server.agents:serve_agents", "--db", str(tmp_path / "t.db"), "--auth-keys", str(keys))
    assert server.process.wait(timeout=60) == 1
    out, err = server.stop()
    assert err.strip() == f"haystack-state: error: --auth-keys {keys} line 3: not a key=user line", err
    assert "secret-key" not in out + err
    assert not (tmp_path / "t.db").exists()  # refused before the database opened


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3cret=alice\ns3cret alice\n", "keys.txt line 2: not a key=user line"),
        ("=alice", "keys.txt line 1: the key before '=' is empty"),
        ("s3cret1=alice\n\ns3cret2=  \n", "keys.txt line 3: the user after the last '=' is empty"),
        ("s3cret=alice # the first", "keys.txt line 1: the key or the user contains whitespace"),
        ("s3cret=alice\n# again:\ns3cret=bob\n", "keys.txt line 3: the same key as line 1"),
        ("# nobody yet\n\n", "keys.txt has no key=user line"),
    ],
)
def test_key_lines_errors_name_the_line_not_the_key(text: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_api_keys(text, source="keys.txt")
    assert str(error.value).startswith(message) and "s3cret" not in str(error.value)


def test_key_lines() -> None:
    text = "# comment\n  k1 = alice \r\nab+/c===bob\nk3=alice\n"
    assert parse_api_keys(text) == {"k1": "alice", "ab+/c==": "bob", "k3": "alice"}


def test_key_sources_file_wins_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = str(tmp_path / "threads.db")
    keys = tmp_path / "keys.txt"
    keys.write_text("\ufefffile-key=fred\n", encoding="utf-8")  # with the BOM of some editors
    monkeypatch.setenv(API_KEYS_VARIABLE, "env-key=eve")
    notices: list[str] = []

    def out(*values: Any, **_: Any) -> None:
        notices.append(" ".join(map(str, values)))

    app = build_app(serve_args("server.agents:serve_agents", "--db", db, "--auth-keys", str(keys)), out)
    assert notices == [f"note: --auth-keys {keys} is used; {API_KEYS_VARIABLE} is ignored"]
    with TestClient(app) as client:
        assert client.post("/threads/search", json={}, headers={"x-api-key": "file-key"}).status_code == 200
        assert client.post("/threads/search", json={}, headers={"x-api-key": "env-key"}).status_code == 401
    app.state.server.storage.close()

    with pytest.raises(ServeError, match=f"^--auth-keys {tmp_path}/missing.txt: cannot read the file: No such file"):
        build_app(serve_args("server.agents:serve_agents", "--auth-keys", str(tmp_path / "missing.txt")), out)
    monkeypatch.setenv(API_KEYS_VARIABLE, "")  # set but empty: refused, not served without auth
    with pytest.raises(ServeError, match=f"^{API_KEYS_VARIABLE} has no key=user line .*for a file, use --auth-keys"):
        build_app(serve_args("server.agents:serve_agents"), out)
    monkeypatch.setenv(API_KEYS_VARIABLE, str(keys))  # a path where the lines belong
    with pytest.raises(ServeError, match=f"^{API_KEYS_VARIABLE} line 1: not a key=user line"):
        build_app(serve_args("server.agents:serve_agents"), out)


# --- CORS ------------------------------------------------------------------------------------------------------------


def test_loopback_default_cors_any_origin_before_auth(keys_server: ServeProcess) -> None:
    with httpx.Client(base_url=keys_server.url, timeout=30) as http:
        for path in ("/threads", "/threads/search", "/runs/wait", "/store/items", "/assistants/agent", "/nowhere"):
            preflight = http.options(path, headers=PREFLIGHT)  # no API key: auth is for the request that follows
            assert preflight.status_code == 200, (path, preflight.text)
            assert preflight.headers["access-control-allow-origin"] == "*"
            assert "x-api-key" in preflight.headers["access-control-allow-headers"]
            assert "POST" in preflight.headers["access-control-allow-methods"]

        origin = {"Origin": "http://localhost:3000"}
        refused = http.post("/threads", json={}, headers=origin)  # a browser can read the 401
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"
        key = {**origin, "x-api-key": "alice-key-1"}
        thread_id = http.post("/threads", json={}, headers=key).json()["thread_id"]
        run = http.post(f"/threads/{thread_id}/runs", json={"assistant_id": "agent", "input": human("hi")}, headers=key)
        assert run.status_code == 200
        assert run.headers["content-location"] == f"/threads/{thread_id}/runs/{run.json()['run_id']}"
        assert run.headers["access-control-allow-origin"] == "*"
        exposed = {name.strip().lower() for name in run.headers["access-control-expose-headers"].split(",")}
        assert {"content-location", "location"} <= exposed


def test_cors_origin_allows_that_origin_only(env_server: ServeProcess) -> None:
    with httpx.Client(base_url=env_server.url, timeout=30) as http:
        allowed = http.options("/threads", headers={**PREFLIGHT, "Origin": "http://a.example"})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "http://a.example"
        other = http.options("/threads", headers=PREFLIGHT)
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        key = {"x-api-key": "carol-key"}
        for origin, expected in [("http://a.example", "http://a.example"), ("http://localhost:3000", None)]:
            answer = http.post("/threads/search", json={}, headers={**key, "Origin": origin})
            assert answer.status_code == 200
            assert answer.headers.get("access-control-allow-origin") == expected


def test_create_app_without_cors_has_none_and_with_cors_keeps_the_body_limit(tmp_path: Path) -> None:
    from haystack_state.server import Limits

    checkpointer = SQLiteCheckpointer(tmp_path / "threads.db")
    try:
        plain = create_app({"agent": make_agent(checkpointer)})
        with TestClient(plain) as client:
            assert client.options("/threads", headers=PREFLIGHT).status_code == 405
            answer = client.get("/ok", headers={"Origin": "http://localhost:3000"})
            assert answer.status_code == 200 and not any(h.startswith("access-control-") for h in answer.headers)
        plain.state.server.storage.close()

        limited = create_app(
            {"agent": make_agent(checkpointer)}, cors=["HTTP://Localhost:3000"], limits=Limits(max_body_bytes=64)
        )
        with TestClient(limited) as client:
            assert client.options("/threads", headers=PREFLIGHT).status_code == 200
            too_big = client.post(
                "/threads", json={"metadata": {"x": "y" * 100}}, headers={"Origin": PREFLIGHT["Origin"]}
            )
            assert too_big.status_code == 413  # the BodyLimit still refuses, and the browser can read why
            assert too_big.headers["access-control-allow-origin"] == "http://localhost:3000"
        limited.state.server.storage.close()

        with pytest.raises(ValueError, match=r"'http://a\.example/' is not an origin.*without a path"):
            create_app({"agent": make_agent(checkpointer)}, cors="http://a.example/")
    finally:
        checkpointer.close()


def test_cors_settings() -> None:
    assert cors_origins(None) == [] and cors_origins([]) == []
    assert cors_origins("*") == ["*"] and cors_origins(["http://a.example", "*"]) == ["*"]
    assert cors_origins("http://a.example") == ["http://a.example"]  # one origin, not its characters
    assert cors_origins(["HTTPS://A.Example:443", "http://a.example:80", "http://[::1]:3000", "tauri://localhost"]) == [
        "https://a.example",
        "http://a.example",
        "http://[::1]:3000",
        "tauri://localhost",
    ]
    for bad in [
        "localhost:3000x",
        "a.example",
        "http://a.example/app",
        "http://user@a.example",
        "null",
        "http://x:99999",
    ]:
        with pytest.raises(ValueError, match="is not an origin"):
            cors_origins([bad])
    assert all(is_loopback(host) for host in ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
    assert not any(is_loopback(host) for host in ["0.0.0.0", "::", "192.168.1.2", "example.com"])
    assert cors_for_host("127.0.0.1", None) == "*" and cors_for_host("0.0.0.0", None) is None
    assert cors_for_host("0.0.0.0", ["http://a.example"]) == ["http://a.example"]
    assert cors_for_host("localhost", ["http://a.example"]) == ["http://a.example"]


# --- the run settings and limits -------------------------------------------------------------------------------------


def test_run_settings_reach_the_run_manager(tmp_path: Path) -> None:
    args = serve_args(
        "server.agents:serve_agents",
        "--db",
        str(tmp_path / "threads.db"),
        "--host",
        "0.0.0.0",
        "--lease-seconds",
        "7.5",
        "--max-attempts",
        "5",
        "--max-concurrent-runs",
        "2",
        "--max-pending-runs",
        "9",
        "--poll-interval",
        "0.5",
    )
    warnings: list[str] = []
    app = build_app(args, lambda *values, **_: warnings.append(" ".join(map(str, values))))
    runs = app.state.server.runs
    assert (runs.lease_seconds, runs.max_attempts, runs.poll_interval) == (7.5, 5, 0.5)
    assert (runs.max_concurrent_runs, runs.max_pending_runs) == (2, 9)
    assert app.state.server.auth is None
    assert warnings == [
        "warning: serving on 0.0.0.0 without --auth-keys: whoever reaches it can read and run every thread"
    ]
    with TestClient(app) as client:  # bound elsewhere than loopback, without --cors-origin: no CORS
        assert client.options("/threads", headers=PREFLIGHT).status_code == 405
    app.state.server.storage.close()


@pytest.mark.slow
def test_max_concurrent_runs_refuses_a_second_waited_run(keys_server: ServeProcess) -> None:
    key = {"x-api-key": "alice-key-1"}
    with httpx.Client(base_url=keys_server.url, timeout=30, headers=key) as http:
        first, second = (http.post("/threads", json={}).json()["thread_id"] for _ in range(2))
        slow, quick = ({"assistant_id": "agent", "input": human(text)} for text in ("sleep 1", "hi"))
        with http.stream("POST", f"/threads/{first}/runs/stream", json=slow) as stream:
            lines = stream.iter_lines()
            assert next(lines) == "event: metadata"  # the one run slot is taken
            busy = http.post(f"/threads/{second}/runs/wait", json=quick)
            assert busy.status_code == 429 and "maximum of 1 concurrent runs" in busy.json()["detail"]
            assert "slept 1" in "".join(lines)  # the first run ends, freeing the slot
        assert http.post(f"/threads/{second}/runs/wait", json=quick).status_code == 200


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--lease-seconds", "0"], "argument --lease-seconds: must be a positive number of seconds, got '0'"),
        (["--lease-seconds", "nan"], "argument --lease-seconds: must be a positive number of seconds, got 'nan'"),
        (["--lease-seconds", "soon"], "argument --lease-seconds: must be a positive number of seconds, got 'soon'"),
        (["--max-attempts", "0"], "argument --max-attempts: must be a positive integer, got '0'"),
        (["--max-attempts", "2.5"], "argument --max-attempts: must be a positive integer, got '2.5'"),
        (["--max-concurrent-runs", "-1"], "argument --max-concurrent-runs: must be a positive integer, got '-1'"),
        (["--poll-interval", "0"], "argument --poll-interval: must be a positive number of seconds, got '0'"),
    ],
)
def test_bad_numbers_are_usage_errors(options: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert haystack_state_main(["serve", "server.agents:serve_agents", *options]) == 2
    assert capsys.readouterr().err.strip().endswith(f"error: {message}")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--lease-seconds", "0.5"],
            "--lease-seconds 0.5 is shorter than 3 polls (--poll-interval 0.2): a worker renews its leases between "
            "polls, so its live runs would be taken from it",
        ),
        (
            ["--cors-origin", "http://localhost:3000/"],
            "--cors-origin: 'http://localhost:3000/' is not an origin: give scheme://host[:port], as in "
            "http://localhost:3000, without a path (a browser's Origin header has none, not even a final '/')",
        ),
    ],
)
def test_refused_settings_are_clear_errors(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert haystack_state_main(["serve", "server.agents:serve_agents", *options]) == 1
    assert capsys.readouterr().err.strip() == f"haystack-state: error: {message}"
