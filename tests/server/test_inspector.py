"""
The thread inspector at ``/ui`` in a real headless browser (Playwright driving Debian's chromium): the thread list
and its search, a conversation, the state key by key, the history with a fork drawn as a branch, the diff of two
checkpoints, approving an interrupted tool call with edited arguments, sending a message, and finishing or closing
the calls a crashed or cancelled run left stopped. Each view is screenshotted (into ``HAYSTACK_STATE_SCREENSHOTS`` if
set, else the test's temporary folder).

Skipped, saying why, where chromium or Playwright is missing (``.ci/run`` installs chromium).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage

from server.conftest import Served

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the installed extras
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)
if not Path(CHROMIUM).exists():
    pytest.skip(f"no browser at {CHROMIUM} (apt-get install chromium; .ci/run does it)", allow_module_level=True)

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


@pytest.fixture
def page(served: Served) -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 820})
        page = context.new_page()
        page.set_default_timeout(15000)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        yield page
        browser.close()
        assert errors == []


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("HAYSTACK_STATE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def seed(served: Served) -> tuple[str, str]:
    """A thread with a conversation, notes and a fork; and an interrupted thread."""
    client = served.client()
    research = client.threads.create(metadata={"team": "blue"})["thread_id"]
    client.runs.wait(research, "agent", input=human("note green tea"))
    client.runs.wait(research, "agent", input={**human("hello there"), "topic": "tea"})
    history = client.threads.get_history(research, limit=100)
    after_note = next(  # the end of the first run
        h
        for h in history
        if h["values"].get("notes") == ["green tea"]
        and "topic" not in h["values"]
        and h["metadata"]["source"] == "model"
    )
    client.runs.wait(
        research, "agent", input=human("note oolong"), checkpoint_id=after_note["checkpoint"]["checkpoint_id"]
    )
    waiting = client.threads.create(metadata={"team": "red"})["thread_id"]
    client.runs.wait(waiting, "agent", input=human("email ada@example.com"))
    return research, waiting


def test_the_inspector(served: Served, page: Page, shots: Path) -> None:
    research, waiting = seed(served)
    page.goto(f"{served.url}/ui/")

    # The thread list, and its search by metadata.
    expect(page.locator("#thread-list li")).to_have_count(2)
    page.fill("#thread-search", "team=red")
    expect(page.locator("#thread-list li")).to_have_count(1)
    expect(page.locator("#thread-list li")).to_have_attribute("data-thread-id", waiting)
    page.fill("#thread-search", research[:6])
    expect(page.locator("#thread-list li")).to_have_count(1)
    page.fill("#thread-search", "")
    expect(page.locator("#thread-list li")).to_have_count(2)
    page.screenshot(path=shots / "inspector-threads.png")

    # The conversation (of the fork: the head's branch).
    page.click(f"#thread-list li[data-thread-id='{research}']")
    messages = page.locator("#messages .message")
    expect(messages.last).to_contain_text('Done: {"note": "oolong"}')
    expect(page.locator("#messages .message.tool")).to_have_count(2)
    expect(page.locator("#messages .call").first).to_contain_text('remember({"text":"green tea"})')
    page.screenshot(path=shots / "inspector-conversation.png")

    # The state, key by key.
    page.click(".tabs button[data-view='state']")
    expect(page.locator("#state-table tr[data-key='notes'] pre")).to_contain_text("oolong")
    expect(page.locator("#state-table tr[data-key='notes'] td").nth(1)).to_have_text("list[2]")
    expect(page.locator("#state-table tr[data-key='messages']")).to_be_visible()
    page.screenshot(path=shots / "inspector-state.png")

    # The history: the fork is a branch of its own lane.
    page.click(".tabs button[data-view='history']")
    nodes = page.locator("#history .node")
    total = len(served.agent.get_history(research))
    expect(nodes).to_have_count(total)
    assert page.locator("#history .node[data-lane='1']").count() > 0  # the abandoned branch
    expect(page.locator("#history .lane.fork")).to_have_count(1)  # its fork point
    expect(page.locator("#history .node.head")).to_have_count(1)
    page.screenshot(path=shots / "inspector-history.png")

    # The diff of two checkpoints picked on the timeline: the root and the head.
    nodes.last.locator("input[name='pick-A']").check()
    nodes.first.locator("input[name='pick-B']").check()
    page.click(".tabs button[data-view='diff']")
    page.click("#diff-run")
    expect(page.locator("#diff-result .change[data-key='notes'] h4")).to_contain_text("added")
    expect(page.locator("#diff-result .change[data-key='messages'] h4")).to_contain_text("appended")
    expect(page.locator("#diff-result .change[data-key='topic']")).to_have_count(0)  # not on this branch
    page.screenshot(path=shots / "inspector-diff.png")

    # The interrupted thread: edit the call's arguments, approve, and see the run go on.
    page.click(".tabs button[data-view='conversation']")
    page.click(f"#thread-list li[data-thread-id='{waiting}']")
    action = page.locator("#interrupt .action")
    expect(action).to_have_count(1)
    expect(page.locator("#send-button")).to_be_disabled()
    action.locator("input[value='edit']").check()
    action.locator("textarea").fill('{"to": "grace@example.com"}')
    page.screenshot(path=shots / "inspector-interrupt.png")
    page.click("#resume")
    expect(messages.last).to_have_text("aiDone: sent to grace@example.com")
    expect(page.locator("#interrupt")).to_be_hidden()
    expect(page.locator("#thread-status-badge")).to_have_text("idle")

    # The send box: the reply's tokens grow in place, then the values stream shows the committed reply.
    page.fill("#send-input", "drip a slow and careful answer")
    page.click("#send-button")
    streaming = page.locator("#messages .message.streaming")
    expect(streaming).to_have_count(1)
    expect(streaming).not_to_have_text("aidripped: a slow and careful answer")  # a part of it, so far
    expect(messages.last).to_have_text("aidripped: a slow and careful answer")
    expect(streaming).to_have_count(0)
    page.fill("#send-input", "how are you?")
    page.click("#send-button")
    expect(messages.last).to_have_text("aiecho: how are you?")
    page.screenshot(path=shots / "inspector-send.png")
    assert served.agent.get_state(waiting).values["messages"][-1].text == "echo: how are you?"


def test_a_new_thread_from_the_page_and_an_api_key(serve: Any, shots: Path) -> None:
    from haystack_state.server import api_key_auth

    served = serve(auth=api_key_auth({"secret": "ada"}))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.set_default_timeout(15000)
        page.goto(f"{served.url}/ui/")
        expect(page.locator("#error")).to_contain_text("Not authenticated")
        page.fill("#api-key", "secret")
        page.dispatch_event("#api-key", "change")
        expect(page.locator("#assistant option")).to_have_count(1)
        page.click("#new-thread")
        expect(page.locator("#thread-list li")).to_have_count(1)
        page.fill("#send-input", "note from the page")
        page.keyboard.press("Control+Enter")
        expect(page.locator("#messages .message").last).to_have_text('aiDone: {"note": "from the page"}')
        thread_id = page.locator("#thread-list li").get_attribute("data-thread-id")
        browser.close()
    assert served.agent.get_state(str(thread_id)).values["notes"] == ["from the page"]


def calls_of(log: Path) -> list[str]:
    """The ``slow_work`` calls made so far (their ``n``), from the test agent's tool log."""
    return [line.split()[0] for line in log.read_text().splitlines() if line] if log.exists() else []


def stop_calls(served: Served, monkeypatch: pytest.MonkeyPatch, log: Path) -> tuple[str, str]:
    """
    Two threads whose last run stopped between the model's tool call and its result: one as a crash leaves it (the
    run stopped right after the model's reply was committed), one cancelled over HTTP while its tool ran.
    """
    client = served.client()
    crashed = client.threads.create(metadata={"team": "crash"})["thread_id"]
    with contextlib.closing(served.agent.stream([ChatMessage.from_user("work one")], thread_id=crashed)) as events:
        for event in events:
            data = event.to_dict()
            if data["type"] == "checkpoint_committed" and data["source"] == "model":
                break  # the model's call is committed; its tool never starts
    monkeypatch.setenv("HAYSTACK_STATE_TEST_WORK_SECONDS", "2")
    cancelled = client.threads.create(metadata={"team": "cancel"})["thread_id"]
    run = client.runs.create(cancelled, "agent", input=human("work two"))
    deadline = time.monotonic() + 30
    while "two" not in calls_of(log):  # the tool is running now
        assert time.monotonic() < deadline, "the tool call did not start"
        time.sleep(0.02)
    client.runs.cancel(cancelled, run["run_id"], wait=True)
    monkeypatch.setenv("HAYSTACK_STATE_TEST_WORK_SECONDS", "0")
    for thread_id in (crashed, cancelled):
        head = client.threads.get_state(thread_id)
        assert head["next"] == ["tools"] and head["interrupts"] == [], head
    return crashed, cancelled


def test_stopped_calls_are_finished_or_closed(
    served: Served, page: Page, shots: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("HAYSTACK_STATE_TEST_TOOL_LOG", str(log))
    crashed, cancelled = stop_calls(served, monkeypatch, log)
    page.goto(f"{served.url}/ui/?thread={crashed}")
    messages = page.locator("#messages .message")
    stopped = page.locator("#stopped")

    # After a crash: the call, how its run stopped, both ways out, and what a new message would do.
    expect(stopped.locator("h3")).to_contain_text("the run crashed")
    expect(stopped.locator(".action")).to_have_count(1)
    expect(stopped.locator(".action")).to_contain_text("slow_work")
    expect(stopped.locator(".action pre")).to_contain_text('"n": "one"')
    expect(page.locator("#finish-calls")).to_be_visible()
    expect(page.locator("#close-calls")).to_be_visible()
    expect(page.locator("#send-note")).to_be_hidden()
    page.fill("#send-input", "hi")
    expect(page.locator("#send-note")).to_contain_text("finishes the stopped calls first")
    page.screenshot(path=shots / "inspector-stopped.png")
    page.fill("#send-input", "")
    expect(page.locator("#send-note")).to_be_hidden()

    # Finish: the call runs, its result shows, and the model answers.
    page.click("#finish-calls")
    expect(messages.last).to_have_text("aiDone: worked one")
    expect(page.locator("#messages .message.tool")).to_have_text("tool · slow_workworked one")
    expect(stopped).to_be_hidden()
    assert calls_of(log).count("one") == 1

    # After a cancel: Close answers the call with an error result; it does not run again.
    page.click(f"#thread-list li[data-thread-id='{cancelled}']")
    expect(stopped.locator("h3")).to_contain_text("was cancelled")
    expect(stopped.locator(".action pre")).to_contain_text('"n": "two"')
    page.fill("#send-input", "hi")
    expect(page.locator("#send-note")).to_contain_text("closes the stopped calls first")
    page.fill("#send-input", "")
    page.click("#close-calls")
    tool = page.locator("#messages .message.tool")
    expect(tool).to_have_class("message tool failed")
    expect(tool).to_contain_text("was not run")
    expect(messages.last).to_contain_text("aiDone: This tool call was not run")
    expect(stopped).to_be_hidden()
    page.screenshot(path=shots / "inspector-closed.png")
    assert calls_of(log).count("two") == 1
    assert served.agent.get_state(cancelled).pending_tool_calls == []
