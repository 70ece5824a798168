"""
The agents the server tests serve: a scripted model that decides from the last user message (no API key), tools
that write state, and an ``interrupt_before`` tool.

- ``"email ADDRESS"``: calls ``send_email`` (the run stops before it: interrupt);
- ``"note TEXT"``: calls ``remember`` (writes ``notes``), then answers;
- ``"sleep SECONDS"``: the model takes that long to answer;
- ``"drip TEXT"``: answers ``"dripped: TEXT"``, streaming it slowly (0.3 s between chunks);
- ``"work N"``: calls ``slow_work`` (it takes ``HAYSTACK_STATE_TEST_WORK_SECONDS``, 1 s by default, and appends a
  line to the file ``HAYSTACK_STATE_TEST_TOOL_LOG`` names, so a test counts the calls made in every process), then
  answers ``"Done: worked N"``;
- ``"fail"``: the model raises;
- anything else: ``"echo: TEXT"``.

``make_agent(checkpointer)`` is the factory that ``haystack-state serve tests.server.agents:make_agent`` (or, from
``tests/``, ``server.agents:make_agent``) calls.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from haystack import component
from haystack.dataclasses import ChatMessage

from haystack_state import Agent, tool
from haystack_state.persistence import Checkpointer
from haystack_state.testing import ScriptedChatGenerator


@tool
def send_email(to: str, body: str = "") -> str:
    """Send an email."""
    return f"sent to {to}"


@tool
def slow_work(n: str) -> str:
    """Do slow work."""
    log = os.environ.get("HAYSTACK_STATE_TEST_TOOL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as file:
            file.write(f"{n} {os.getpid()}\n")
    time.sleep(float(os.environ.get("HAYSTACK_STATE_TEST_WORK_SECONDS", "1")))
    return f"worked {n}"


@tool(outputs_to_state={"notes": {"source": "note"}})
def remember(text: str) -> dict[str, Any]:
    """Write a note."""
    return {"note": text}


def policy(messages: list[ChatMessage], tools: list[Any]) -> Any:
    """Decide the reply from the conversation."""
    last = messages[-1]
    if last.tool_call_result is not None:
        return f"Done: {last.tool_call_result.result}"
    text = last.text or ""
    word, _, rest = text.partition(" ")
    if word == "email":
        return [("send_email", {"to": rest or "bob@example.com"})]
    if word == "note":
        return [("remember", {"text": rest})]
    if word == "work":
        return [("slow_work", {"n": rest})]
    if word == "drip":  # TestModel streams this reply slowly
        return f"dripped: {rest}"
    if word == "sleep":  # TestModel waits before asking
        return f"slept {rest}"
    if word == "fail":
        raise RuntimeError("the model is down")
    return f"echo: {text}"


def _drips(messages: list[ChatMessage]) -> bool:
    last = messages[-1]
    return last.is_from("user") and (last.text or "").startswith("drip ")


def _delay(messages: list[ChatMessage]) -> float:
    last = messages[-1]
    word, _, rest = (last.text or "").partition(" ")
    return float(rest or "0.5") if word == "sleep" and last.is_from("user") else 0.0


@component
class TestModel:
    """
    The scripted model, slow on ``"sleep SECONDS"`` (awaiting in ``run_async``, as a real async client does); it
    streams its replies in chunks to a streaming callback.
    """

    def __init__(self) -> None:
        self.scripted = ScriptedChatGenerator(policy=policy)

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None, streaming_callback: Any = None) -> dict[str, Any]:
        time.sleep(_delay(messages))
        if streaming_callback is not None and _drips(messages):
            inner = streaming_callback

            def streaming_callback(chunk: Any) -> None:
                inner(chunk)
                time.sleep(0.3)

        return self.scripted.run(messages, tools=tools, streaming_callback=streaming_callback)  # type: ignore[no-any-return]

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], tools: Any = None, streaming_callback: Any = None
    ) -> dict[str, Any]:
        await asyncio.sleep(_delay(messages))
        if streaming_callback is not None and _drips(messages):
            inner = streaming_callback

            async def streaming_callback(chunk: Any) -> None:
                await inner(chunk)
                await asyncio.sleep(0.3)

        return await self.scripted.run_async(  # type: ignore[no-any-return]
            messages, tools=tools, streaming_callback=streaming_callback
        )


SCHEMA = {"notes": {"type": list[str]}, "topic": {"type": str}}


def make_agent(checkpointer: Checkpointer | None) -> Agent:
    """The test agent, on ``checkpointer``."""
    return Agent(
        TestModel(),
        tools=[send_email, remember, slow_work],
        state_schema=SCHEMA,
        checkpointer=checkpointer,
        interrupt_before=["send_email"],
        system_prompt="You are a test assistant.",
    )


def serve_agents(checkpointer: Checkpointer | None) -> dict[str, Agent]:
    """The factory the ``serve`` processes use: the test agent, served as ``agent``."""
    return {"agent": make_agent(checkpointer)}
