"""
A deterministic summarizer for the ``Summarize`` context policy: ``ScriptedChatGenerator.summarizer()`` uses it.
"""

from typing import Any

from haystack.dataclasses import ChatMessage
from haystack.tools.tool import Tool

from haystack_state.agent.context._summary import MESSAGES_CLOSE, MESSAGES_OPEN, PREVIOUS_CLOSE, PREVIOUS_OPEN

__all__ = ["SUMMARY_MAX_LINES", "fold_summary"]

SUMMARY_MAX_LINES = 40
"""The most lines a summary by :func:`fold_summary` keeps; older lines are dropped (and counted)."""


def _between(text: str, opening: str, closing: str) -> str:
    start = text.find(opening)
    end = text.find(closing, start + 1)
    return text[start + len(opening) : end].strip("\n") if start >= 0 and end >= 0 else ""


def fold_summary(messages: list[ChatMessage], tools: list[Tool]) -> str:
    """
    A summarizer policy: the previous summary's lines, then one line per turn of the messages to fold in.

    It reads the transcript the ``Summarize`` context policy sends (``<previous_summary>`` and ``<messages>``), and
    writes ``- <question> (tools: <names>) -> <answer>`` for each turn, keeping at most :data:`SUMMARY_MAX_LINES`.

    :param messages: The summarizer's prompt.
    :param tools: Unused.
    :returns: The summary.
    """
    transcript = (messages[-1].text or "") if messages else ""
    lines = [line for line in _between(transcript, PREVIOUS_OPEN, PREVIOUS_CLOSE).splitlines() if line.strip()]
    turns: list[dict[str, Any]] = []
    for line in _between(transcript, MESSAGES_OPEN, MESSAGES_CLOSE).splitlines():
        if line.startswith("[user] ") or not turns:
            turns.append(
                {"asked": line[7:] if line.startswith("[user] ") else "(continued)", "tools": [], "answer": ""}
            )
        if line.startswith("[assistant calls "):
            turns[-1]["tools"].append(line[17:].split(" ", 1)[0].rstrip("]"))
        elif line.startswith("[assistant] "):
            turns[-1]["answer"] = line[12:]
    for turn in turns:
        used = f" (tools: {', '.join(turn['tools'])})" if turn["tools"] else ""
        answer = f" -> {turn['answer'][:60]}" if turn["answer"] else ""
        lines.append(f"- {turn['asked'][:60]}{used}{answer}")
    if len(lines) > SUMMARY_MAX_LINES:
        dropped = len(lines) - SUMMARY_MAX_LINES + 1
        if lines[0].startswith("- (") and lines[0].endswith(" earlier lines dropped)"):
            dropped += int(lines[0][3:].split(" ", 1)[0]) - 1
        lines = [f"- ({dropped} earlier lines dropped)", *lines[-(SUMMARY_MAX_LINES - 1) :]]
    return "\n".join(lines)
