"""
The thread inspector at ``/ui`` in a real headless browser (Playwright driving Debian's chromium): the thread list
and its search, each thread's title, assistant and live ``running`` badge, a conversation, the state key by key (a
long value clipped, with a toggle), the history with a fork drawn as a branch, the diff of two checkpoints, approving
an interrupted tool call with edited arguments, answering a tool's ``interrupt()`` question, sending a message (Send
off while a run streams), a thread's runs going to its own assistant, and finishing or closing the calls a crashed or
cancelled run left stopped. Each view is screenshotted (into ``HAYSTACK_STATE_SCREENSHOTS`` if set, else the test's
temporary folder).

Skipped, saying why, where chromium or Playwright is missing (``.ci/run`` installs chromium).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage

from haystack_state import Agent, interrupt, tool
from haystack_state.persistence import Checkpointer
from haystack_state.server import create_app
from haystack_state.testing import ScriptedChatGenerator
from server.agents import make_agent
from server.conftest import Backend, LiveServer, Served

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

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("backend", ["sqlite"], indirect=True)]


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text}]}


@pytest.fixture
def page() -> Iterator[Page]:
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


# --- a second assistant, whose tools ask a human with interrupt() ----------------------------------------------------


@tool
def ask_budget(topic: str) -> str:
    """Plan, once a human gives the budget."""
    return f"budget for {topic}: {interrupt('What is the budget?')}"


@tool
def ask_room(size: int) -> str:
    """Book a room, once a human picks one."""
    answer = interrupt({"question": "Which room?", "choices": ["red", "blue"], "size": size})
    return f"room: {json.dumps(answer)}"


@tool
def book(room: str) -> str:
    """Book a room (a human reviews the call first: interrupt_before)."""
    return f"booked {room}"


def ask_policy(messages: list[ChatMessage], tools: list[Any]) -> Any:
    """
    ``plan TOPIC`` asks the budget, ``room SIZE`` asks a room, ``trip`` asks the budget and books (reviewed) at once;
    anything else is heard.
    """
    last = messages[-1]
    if last.tool_call_result is not None:
        return f"Noted: {last.tool_call_result.result}"
    text = last.text or ""
    word, _, rest = text.partition(" ")
    if word == "plan":
        return [("ask_budget", {"topic": rest})]
    if word == "room":
        return [("ask_room", {"size": int(rest or "2")})]
    if word == "trip":
        return [("ask_budget", {"topic": "the trip"}), ("book", {"room": "red"})]
    return f"asker heard: {text}"


def make_asker(checkpointer: Checkpointer) -> Agent:
    """The second assistant, on ``checkpointer``: its tools ask a human, and ``book`` is reviewed before it runs."""
    return Agent(
        ScriptedChatGenerator(policy=ask_policy),
        tools=[ask_budget, ask_room, book],
        checkpointer=checkpointer,
        interrupt_before=["book"],
        system_prompt="You ask before you plan.",
    )


@pytest.fixture
def two(backend: Backend) -> Iterator[Served]:
    """A server of two assistants on one checkpointer: the test agent as ``agent`` (listed first), and ``asker``."""
    checkpointer = backend.checkpointer()
    agent = make_agent(checkpointer)
    app = create_app({"agent": agent, "asker": make_asker(checkpointer)}, poll_interval=0.05)
    with contextlib.ExitStack() as stack:
        live = stack.enter_context(LiveServer(app))
        yield Served(live.url, agent, app, stack)


def test_a_tool_question_is_answered_in_the_page(two: Served, page: Page, shots: Path) -> None:
    client = two.client()
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "asker", input=human("plan a trip"))
    assert client.threads.get(thread_id)["status"] == "interrupted"
    page.goto(f"{two.url}/ui/?thread={thread_id}")
    messages = page.locator("#messages .message")

    # The question, with an answer box; a new message cannot go while the thread waits.
    question = page.locator("#interrupt .question")
    expect(question).to_have_count(1)
    expect(question.locator(".ask")).to_have_text("What is the budget?")
    expect(page.locator("#interrupt .action")).to_have_count(0)  # no tool call to approve
    expect(page.locator("#resume")).to_have_text("Send")
    expect(page.locator("#send-button")).to_be_disabled()
    expect(page.locator("#thread-status-badge")).to_have_text("interrupted")
    question.locator("textarea.answer").fill("500 euros")
    page.screenshot(path=shots / "inspector-question.png")
    page.click("#resume")

    # The run goes on with the answer (as text).
    expect(messages.last).to_have_text("aiNoted: budget for a trip: 500 euros")
    expect(page.locator("#interrupt")).to_be_hidden()
    expect(page.locator("#thread-status-badge")).to_have_text("idle")
    expect(page.locator("#send-button")).to_be_enabled()

    # A question that is not text shows as JSON; an answer that is a JSON object goes as JSON, and Ctrl+Enter sends.
    page.fill("#send-input", "room 3")
    page.click("#send-button")
    expect(question.locator("pre.ask")).to_contain_text('"choices": [')
    expect(question.locator("pre.ask")).to_contain_text('"size": 3')
    question.locator("textarea.answer").fill('{"room": "blue", "nights": 2}')
    page.screenshot(path=shots / "inspector-question-json.png")
    question.locator("textarea.answer").press("Control+Enter")
    expect(messages.last).to_have_text('aiNoted: room: {"room": "blue", "nights": 2}')
    values = client.threads.get_state(thread_id)["values"]
    assert values["messages"][-1]["content"] == 'Noted: room: {"room": "blue", "nights": 2}'


def test_a_question_and_a_review_at_once(two: Served, page: Page, shots: Path) -> None:
    client = two.client()
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "asker", input=human("trip"))
    page.goto(f"{two.url}/ui/?thread={thread_id}")
    question = page.locator("#interrupt .question")

    # One box, one Submit: the question's answer and the call's decision go together.
    expect(question.locator(".ask")).to_have_text("What is the budget?")
    expect(page.locator("#interrupt .action")).to_contain_text("book")
    expect(page.locator("#resume")).to_have_text("Submit")
    page.locator("#interrupt .action input[value='edit']").check()
    page.locator("#interrupt .action textarea").fill('{"room": "green"}')
    page.click("#resume")
    expect(page.locator("#error")).to_contain_text("Type an answer")  # the question is not answered yet
    question.locator("textarea.answer").fill("300")
    page.screenshot(path=shots / "inspector-question-and-review.png")
    page.click("#resume")
    expect(page.locator("#interrupt")).to_be_hidden()
    expect(page.locator("#messages .message.tool")).to_have_count(2)
    results = [m["content"] for m in client.threads.get_state(thread_id)["values"]["messages"] if m["type"] == "tool"]
    assert results == ["budget for the trip: 300", "booked green"]


def test_the_thread_list_shows_titles_assistants_and_a_live_running_badge(two: Served, page: Page, shots: Path) -> None:
    client = two.client()
    long_text = "note " + "a very long first message that goes on " * 4
    noted = client.threads.create()["thread_id"]
    client.runs.wait(noted, "agent", input=human(long_text))
    asked = client.threads.create()["thread_id"]
    client.runs.wait(asked, "asker", input=human("hello asker"))
    fresh = client.threads.create()["thread_id"]  # no run: no title, no assistant
    slow = client.threads.create()["thread_id"]
    client.runs.create(slow, "agent", input=human("sleep 3"))
    page.goto(f"{two.url}/ui/")

    item = {
        thread_id: page.locator(f"#thread-list li[data-thread-id='{thread_id}']")
        for thread_id in (noted, asked, fresh, slow)
    }
    expect(item[slow].locator(".badge")).to_have_text("running")
    expect(item[slow].locator(".title")).to_have_text("sleep 3")
    expect(item[asked].locator(".title")).to_have_text("hello asker")
    expect(item[asked].locator(".assistant")).to_have_text("asker")
    expect(item[noted].locator(".assistant")).to_have_text("agent")
    expect(item[noted].locator(".title")).to_have_attribute("title", long_text)  # all of it, on hover
    shown = item[noted].locator(".title").inner_text()
    assert shown.endswith("…") and len(shown) == 60 and long_text.startswith(shown[:-1])
    expect(item[fresh].locator(".title")).to_have_text("(no messages yet)")
    expect(item[fresh].locator(".assistant")).to_have_text("")
    expect(item[fresh].locator(".badge")).to_have_text("idle")

    # The running thread, opened: it runs elsewhere, so Send waits; the page follows it to its end, unreloaded.
    item[slow].click()
    expect(page.locator("#thread-status-badge")).to_have_text("running")
    expect(page.locator("#thread-assistant")).to_have_text("assistant: agent")
    expect(page.locator("#send-button")).to_be_disabled()
    expect(page.locator("#run-status")).to_contain_text("A run is going on this thread")
    page.screenshot(path=shots / "inspector-badges.png")
    expect(item[slow].locator(".badge")).to_have_text("idle")
    expect(page.locator("#thread-status-badge")).to_have_text("idle")
    expect(page.locator("#messages .message").last).to_have_text("aislept 3")
    expect(page.locator("#send-button")).to_be_enabled()
    expect(page.locator("#run-status")).to_have_text("")


def test_send_is_disabled_while_a_run_streams(served: Served, page: Page, shots: Path) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    page.goto(f"{served.url}/ui/?thread={thread_id}")
    send = page.locator("#send-button")
    expect(send).to_be_enabled()

    page.fill("#send-input", "drip a slow and careful answer")
    send.click()
    expect(page.locator("#messages .message.streaming")).to_have_count(1)
    expect(send).to_be_disabled()
    expect(page.locator(f"#thread-list li[data-thread-id='{thread_id}'] .badge")).to_have_text("running")
    page.fill("#send-input", "too soon")
    page.locator("#send-input").press("Control+Enter")  # submits the form, but sends nothing while the run streams
    page.screenshot(path=shots / "inspector-streaming.png")
    expect(page.locator("#messages .message").last).to_have_text("aidripped: a slow and careful answer")
    expect(send).to_be_enabled()
    expect(page.locator("#send-input")).to_have_value("too soon")
    expect(page.locator(f"#thread-list li[data-thread-id='{thread_id}'] .badge")).to_have_text("idle")
    assert len(client.runs.list(thread_id)) == 1

    # A run that fails: Send comes back at its error.
    page.fill("#send-input", "fail")
    send.click()
    expect(page.locator("#error")).to_contain_text("the model is down")
    expect(send).to_be_enabled()
    expect(page.locator("#run-status")).to_have_text("")


def test_a_thread_runs_with_its_own_assistant(two: Served, page: Page, shots: Path) -> None:
    client = two.client()
    asked = client.threads.create()["thread_id"]
    client.runs.wait(asked, "asker", input=human("hello"))
    page.goto(f"{two.url}/ui/?thread={asked}")
    messages = page.locator("#messages .message")
    expect(page.locator("#assistant")).to_have_value(client.assistants.search(graph_id="agent")[0]["assistant_id"])

    # A thread of the second assistant: its runs go there, whatever is picked for new threads (no 409).
    expect(page.locator("#thread-assistant")).to_have_text("assistant: asker")
    page.fill("#send-input", "are you there?")
    page.click("#send-button")
    expect(messages.last).to_have_text("aiasker heard: are you there?")
    expect(page.locator("#error")).to_be_hidden()
    page.screenshot(path=shots / "inspector-own-assistant.png")

    # A new thread runs with the assistant picked when it was made, and keeps it.
    page.select_option("#assistant", label="asker")
    page.click("#new-thread")
    expect(page.locator("#thread-assistant")).to_have_text("assistant: asker")
    page.select_option("#assistant", label="agent")
    page.fill("#send-input", "hi")
    page.click("#send-button")
    expect(messages.last).to_have_text("aiasker heard: hi")
    fresh = page.locator("#thread-id").inner_text()
    assert fresh != asked
    assert client.threads.get(fresh)["metadata"]["graph_id"] == "asker"

    # A thread made elsewhere, with no run: the assistant picked for new threads.
    bare = client.threads.create()["thread_id"]
    page.goto(f"{two.url}/ui/?thread={bare}")
    expect(page.locator("#thread-assistant")).to_have_text("assistant: agent (picked for new threads)")
    page.select_option("#assistant", label="asker")
    expect(page.locator("#thread-assistant")).to_have_text("assistant: asker (picked for new threads)")
    page.fill("#send-input", "who runs this?")
    page.click("#send-button")
    expect(messages.last).to_have_text("aiasker heard: who runs this?")
    expect(page.locator("#thread-assistant")).to_have_text("assistant: asker")


def test_a_long_state_value_expands(served: Served, page: Page, shots: Path) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    topic = "\n".join(f"line {i}: the topic goes on and on" for i in range(40))
    client.runs.wait(thread_id, "agent", input={**human("note short"), "topic": topic})
    page.goto(f"{served.url}/ui/?thread={thread_id}")
    page.click(".tabs button[data-view='state']")

    row = page.locator("#state-table tr[data-key='topic']")
    cell, toggle = row.locator("td.clip"), row.locator("button.more")
    expect(toggle).to_have_text("more")
    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(row.locator("pre")).to_contain_text("line 39")  # all of it is there, clipped
    expect(page.locator("#state-table tr[data-key='notes'] button.more")).to_have_count(0)  # short: whole
    clipped = row.locator("pre").bounding_box()
    assert clipped is not None and clipped["height"] < 200
    page.screenshot(path=shots / "inspector-long-value.png")

    toggle.click()
    expect(cell).to_have_class("clip open")
    expect(toggle).to_have_text("less")
    opened = row.locator("pre").bounding_box()
    assert opened is not None and opened["height"] > 3 * clipped["height"]
    page.screenshot(path=shots / "inspector-long-value-open.png", full_page=True)

    # It stays open when the thread reloads (a run elsewhere), and closes with "less".
    client.runs.wait(thread_id, "agent", input=human("hello"))
    page.click(f"#thread-list li[data-thread-id='{thread_id}']")
    expect(row.locator("pre")).to_contain_text("line 39")
    expect(toggle).to_have_text("less")
    toggle.click()
    expect(cell).to_have_class("clip")
    expect(toggle).to_have_text("more")
