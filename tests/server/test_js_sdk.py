"""
LangChain's JavaScript SDK (``@langchain/langgraph-sdk`` from npm, installed in ``tests/js``) against a real server,
on SQLite and on PostgreSQL, as its users meet it:

- in node: ``tests/js/client.mjs`` runs a scenario with the SDK's ``Client`` and prints what the SDK returned as JSON,
  which the tests here assert on (threads, ``runs.wait``, ``runs.stream`` in three modes, run ids read from
  ``Content-Location``, ``threads.search`` by the ``graph_id`` every run stamps, state, history, streamed chunks that
  carry their stored message's id, assistants, the graph, and approving an interrupt);
- in a browser page of another origin: ``tests/js/browser/chat.js``, bundled with the SDK by esbuild (the SDK ships
  no single-file browser build, and its ESM files import CommonJS-only packages, so a browser needs it bundled, as a
  web app's bundler does), is served from its own port; Playwright drives it in Debian's chromium against a server
  that allows any origin (CORS): a thread, a reply drawn while it streams, the thread list by ``graph_id``, and an
  interrupt approved with a click.

Skipped, saying why, without node, ``tests/js/node_modules`` (``cd tests/js && npm ci``), Playwright or chromium; under
CI (``CI=true``), where ``.ci/run`` installs them, they fail instead. ``tests/js/package.json`` denies esbuild's
install script: its native binary comes as an optional dependency, which is all the bundling here needs.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from server.conftest import LiveServer, Served

pytestmark = pytest.mark.slow

JS = Path(__file__).resolve().parent.parent / "js"
SDK = JS / "node_modules" / "@langchain" / "langgraph-sdk"
ESBUILD = JS / "node_modules" / ".bin" / "esbuild"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
IN_CI = os.environ.get("CI") == "true"

try:
    from playwright.sync_api import Page, Response, expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the installed extras
    sync_playwright = None


def need(found: bool, reason: str) -> None:
    """Skip without something these tests need; under CI, where ``.ci/run`` installs it, fail."""
    if not found:
        if IN_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def node() -> str:
    """The ``node`` executable, with the SDK installed in ``tests/js``."""
    path = shutil.which("node")
    need(path is not None, "node is not installed")
    need(SDK.is_dir(), "tests/js/node_modules has no @langchain/langgraph-sdk (cd tests/js && npm ci)")
    assert path is not None
    return path


def run_node(node: str, url: str, scenario: str) -> dict[str, Any]:
    """Run a scenario of ``tests/js/client.mjs`` against the server at ``url``: what the SDK returned."""
    done = subprocess.run(
        [node, "client.mjs", url, scenario], cwd=JS, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"node client.mjs {scenario} exited {done.returncode}:\n{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def contents(values: dict[str, Any]) -> list[Any]:
    """The conversation's contents, without the Agent's system prompt."""
    return [m["content"] for m in values["messages"] if m["type"] != "system"]


def assistant_id(served: Served) -> str:
    found: str = served.http().get("/assistants/agent").json()["assistant_id"]
    return found


def test_conversation_in_node(served: Served, node: str) -> None:
    out = run_node(node, served.url, "conversation")
    thread_id = out["thread"]["thread_id"]
    assert out["thread"]["status"] == "idle" and out["thread"]["metadata"] == {"user": "ada"}
    assert contents(out["waited"]) == ["hello", "echo: hello"]

    streams = out["streams"]
    values = streams["values"]
    assert [p["event"] for p in values] == ["metadata", "values", "values"]  # after the input, after the reply
    assert contents(values[1]["data"])[-1] == "hi values"
    assert contents(values[-1]["data"])[-2:] == ["hi values", "echo: hi values"]
    updates = streams["updates"]
    assert [p["event"] for p in updates] == ["metadata", "updates", "updates"]
    assert [next(iter(p["data"])) for p in updates[1:]] == ["input", "model"]
    assert [m["content"] for m in updates[-1]["data"]["model"]["messages"]] == ["echo: hi updates"]
    tuples = streams["messages-tuple"]
    run_id = tuples[0]["data"]["run_id"]
    assert tuples[0]["event"] == "metadata" and {p["event"] for p in tuples[1:]} == {"messages"}
    pairs = [p["data"] for p in tuples[1:]]
    assert len(pairs) > 1  # the reply streams in several chunks
    for chunk, metadata in pairs:
        assert chunk["type"] == "AIMessageChunk"
        assert (metadata["langgraph_node"], metadata["run_id"], metadata["thread_id"]) == ("model", run_id, thread_id)
    assert len({chunk["id"] for chunk, _ in pairs}) == 1
    assert "".join(chunk["content"] for chunk, _ in pairs) == "echo: hi messages-tuple"
    stored = out["state"]["values"]["messages"]
    assert all(m["id"] for m in stored)
    assert {chunk["id"] for chunk, _ in pairs} == {stored[-1]["id"]}  # streamed under the id it is stored with

    # The SDK reads each run's id from its Content-Location header.
    assert set(out["created"]) == {"wait", *streams}
    streamed = {mode: parts[0]["data"]["run_id"] for mode, parts in streams.items()}
    assert {mode: run["run_id"] for mode, run in out["created"].items() if mode != "wait"} == streamed
    assert {run["thread_id"] for run in out["created"].values()} == {thread_id}
    listed = {run["run_id"]: run["status"] for run in out["runs"]}
    assert listed == {run["run_id"]: "success" for run in out["created"].values()}

    # Every run stamps its graph and assistant on the thread; the thread that never ran is not listed.
    stamped = {"user": "ada", "graph_id": "agent", "assistant_id": assistant_id(served)}
    assert [(t["thread_id"], t["metadata"]) for t in out["found"]] == [(thread_id, stamped)]
    assert out["foundElsewhere"] == []
    assert out["thread_after"]["metadata"] == stamped and out["thread_after"]["status"] == "idle"

    state = out["state"]
    assert state["values"] == out["thread_after"]["values"] and state["next"] == []
    assert contents(state["values"])[-2:] == ["hi messages-tuple", "echo: hi messages-tuple"]
    history = out["history"]
    assert len(history) == 8  # four runs, each committing its input and its reply
    assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert history[0]["values"] == state["values"]
    for child, parent in itertools.pairwise(history):
        assert child["parent_checkpoint"]["checkpoint_id"] == parent["checkpoint"]["checkpoint_id"]
    assert history[-1]["parent_checkpoint"] is None and contents(history[-1]["values"]) == ["hello"]
    assert out["missing"]["status"] == 404 and "no-such-thread" in out["missing"]["message"]


def test_assistants_and_graph_in_node(served: Served, node: str) -> None:
    out = run_node(node, served.url, "assistants")
    [assistant] = out["assistants"]
    assert assistant["graph_id"] == "agent" and assistant["assistant_id"] == assistant_id(served)
    assert out["byGraph"] == [assistant] and out["byOtherGraph"] == [] and out["byName"] == assistant
    for graph in (out["graph"], out["xray"]):
        assert [n["id"] for n in graph["nodes"]] == ["__start__", "model", "tools", "__end__"]
        edges = {(e["source"], e["target"]) for e in graph["edges"]}
        assert {("__start__", "model"), ("model", "tools"), ("tools", "model"), ("model", "__end__")} <= edges


def test_interrupt_then_approve_in_node(served: Served, node: str) -> None:
    out = run_node(node, served.url, "interrupt")
    [interrupt] = out["stopped"]["__interrupt__"]
    [request] = interrupt["value"]["action_requests"]
    assert request["name"] == "send_email" and request["args"] == {"to": "ada@example.com"}
    assert out["interrupted"]["status"] == "interrupted"
    assert out["interrupted"]["interrupts"] == {interrupt["id"]: [interrupt]}
    assert out["state"]["next"] == ["tools"] and out["state"]["interrupts"] == [interrupt]
    assert [t["thread_id"] for t in out["listed"]] == [out["thread_id"]]
    assert "__interrupt__" not in out["resumed"]
    assert contents(out["resumed"])[-2:] == ["sent to ada@example.com", "Done: sent to ada@example.com"]
    assert out["after"]["status"] == "idle" and out["after"]["interrupts"] == {}


# In a browser page of another origin.


@pytest.fixture(scope="module")
def site_files(node: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page and its script, bundled with the SDK by esbuild."""
    need(ESBUILD.exists(), "tests/js/node_modules has no esbuild (cd tests/js && npm ci)")
    folder = tmp_path_factory.mktemp("site")
    shutil.copy(JS / "browser" / "index.html", folder / "index.html")
    bundle = [str(ESBUILD), "browser/chat.js", "--bundle", "--format=esm", "--platform=browser"]
    done = subprocess.run(
        [*bundle, f"--outfile={folder / 'chat.js'}", "--log-level=warning"],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"esbuild failed:\n{done.stderr}"
    return folder


@pytest.fixture
def site(site_files: Path) -> Iterator[str]:
    """The page's origin: a static server on a port of its own."""
    with LiveServer(Starlette(routes=[Mount("/", StaticFiles(directory=site_files))])) as live:
        yield live.url


@pytest.fixture
def browser_page() -> Iterator[Page]:
    """A chromium page; it fails the test on any error the page logs or throws."""
    need(sync_playwright is not None, "playwright is not installed (pip install -e '.[dev]')")
    need(Path(CHROMIUM).exists(), f"no browser at {CHROMIUM} (apt-get install chromium; .ci/run does it)")
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.set_default_timeout(20000)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on(
            "console",
            lambda message: (
                errors.append(f"{message.text} ({message.location['url']})") if message.type == "error" else None
            ),
        )
        yield page
        browser.close()
    assert errors == []


def settle(page: Page, runs: int, state: str) -> None:
    """Wait for the page to finish its ``runs``-th run, then check where it stopped."""
    page.wait_for_function(f"() => document.body.dataset.runs === '{runs}' || document.body.dataset.state === 'error'")
    assert page.text_content("#error") == ""
    assert page.get_attribute("body", "data-state") == state


def test_browser_page_of_another_origin(serve: Callable[..., Served], site: str, browser_page: Page) -> None:
    served = serve(cors="*")
    page = browser_page
    allowed: list[str | None] = []  # the CORS header of each answer of the server that the page read

    def answered(response: Response) -> None:
        if response.url.startswith(served.url):
            allowed.append(response.headers.get("access-control-allow-origin"))

    page.on("response", answered)
    assert site.rsplit(":", 1)[1] != served.url.rsplit(":", 1)[1]  # another port: another origin
    page.goto(f"{site}/index.html?api={served.url}")
    page.wait_for_function("() => document.body.dataset.state !== 'loading'")
    assert page.text_content("#error") == ""
    assert page.get_attribute("body", "data-state") == "ready"
    expect(page.locator("#threads li")).to_have_count(0)

    # A new thread, and its reply drawn while it streams.
    page.fill("#prompt", "drip hello there")
    page.click("#send")
    page.wait_for_function(
        "() => document.body.dataset.state === 'streaming' && document.getElementById('reply').textContent !== ''"
    )
    settle(page, 1, "ready")
    thread_id = page.text_content("#thread")
    assert thread_id
    expect(page.locator("#reply")).to_have_text("dripped: hello there")
    assert page.get_attribute("#reply", "data-events") == "metadata values messages"
    run_id = page.get_attribute("#reply", "data-run-id")  # from the metadata event
    assert run_id and page.get_attribute("#reply", "data-created-run-id") == run_id  # from Content-Location
    reply = page.locator("#messages li").last
    expect(reply).to_have_text("dripped: hello there")
    expect(reply).to_have_attribute("data-id", page.get_attribute("#reply", "data-message-id") or "?")
    expect(page.locator("#messages li[data-type='system']")).to_have_count(0)  # no system prompt bubble
    expect(page.locator("#threads li")).to_have_count(1)  # listed by graph_id
    thread_item = page.locator("#threads li").first
    expect(thread_item).to_have_attribute("data-thread-id", thread_id)
    expect(thread_item).to_have_attribute("data-assistant-id", assistant_id(served))

    # An interrupt, approved from the page.
    page.fill("#prompt", "email ada@example.com")
    page.click("#send")
    settle(page, 2, "interrupted")
    expect(page.locator("#interrupt-tool")).to_have_text("send_email")
    assert json.loads(page.text_content("#interrupt-args") or "") == {"to": "ada@example.com"}
    expect(thread_item).to_contain_text("(interrupted)")
    page.click("#approve")
    settle(page, 3, "ready")
    expect(page.locator("#interrupt")).to_be_hidden()
    expect(page.locator("#messages li[data-type='tool']")).to_have_text("sent to ada@example.com")
    expect(page.locator("#messages li").last).to_have_text("Done: sent to ada@example.com")
    expect(page.locator("#messages li").last).to_have_attribute(
        "data-id", page.get_attribute("#reply", "data-message-id") or "?"
    )
    expect(page.locator("#reply")).to_have_text("Done: sent to ada@example.com")
    assert page.get_attribute("#reply", "data-created-run-id") == page.get_attribute("#reply", "data-run-id") != run_id
    expect(thread_item).to_contain_text("(idle)")
    expect(page.locator("#threads li")).to_have_count(1)

    assert allowed and set(allowed) <= {"*", site}
    thread = served.client().threads.get(thread_id)
    assert thread["status"] == "idle" and thread["metadata"]["graph_id"] == "agent"
    assert contents(thread["values"])[-1] == "Done: sent to ada@example.com"
