"""
The offline research assistant behind ``haystack-state demo``: an Agent with two tools (``search`` and
``take_note``) on a durable thread (of a SQLite file or a PostgreSQL schema), driven by a ``ScriptedChatGenerator``
policy that decides each tool call from the conversation. After every turn it prints what each checkpoint changed in
the state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from haystack.dataclasses import ChatMessage
from haystack.tools.tool import Tool

from haystack_state._cli_text import plural
from haystack_state._display import summarize
from haystack_state.agent import Agent
from haystack_state.handlers import unique
from haystack_state.persistence.base import Checkpointer
from haystack_state.state import State
from haystack_state.testing import ScriptedChatGenerator, ScriptReply
from haystack_state.tools import tool

__all__ = [
    "QUESTIONS",
    "SCHEMA",
    "DemoResult",
    "describe_change",
    "item_summary",
    "research_agent",
    "research_policy",
    "run_demo",
]

#: The library the ``search`` tool looks in.
CORPUS: tuple[dict[str, str], ...] = (
    {
        "id": "bees-1",
        "title": "The waggle dance",
        "text": "Honeybees tell each other where flowers are with a waggle dance. The angle of the dance gives the "
        "direction relative to the sun, and its length gives the distance.",
    },
    {
        "id": "bees-2",
        "title": "The round dance",
        "text": "For flowers within about 50 metres of the hive, bees do a round dance instead. It tells the others "
        "to search nearby.",
    },
    {
        "id": "bees-3",
        "title": "How far bees fly for food",
        "text": "Honeybees usually fly 1 to 3 kilometres from the hive to find food. When food is scarce they fly up "
        "to 10 kilometres.",
    },
    {
        "id": "bees-4",
        "title": "The winter cluster",
        "text": "In winter, bees form a tight cluster around the queen and shiver to keep warm. The centre of the "
        "cluster stays near 35 degrees.",
    },
    {
        "id": "bees-5",
        "title": "Life in the colony",
        "text": "A colony has one queen and tens of thousands of workers. In summer it also has a few hundred drones.",
    },
)

#: The user's questions, one per turn.
QUESTIONS: tuple[str, ...] = (
    "How do honeybees tell each other where the flowers are?",
    "How far do they fly to find food?",
    "What do they do in winter?",
    "Summarize what you have found so far.",
)

SCHEMA: dict[str, dict[str, Any]] = {
    "sources": {"type": list[dict[str, str]], "handler": unique, "description": "the documents the searches found"},
    "notes": {"type": list[str], "description": "the facts the assistant wrote down, with their source"},
    "searches": {"type": list[str], "scope": "run", "description": "this turn's search queries"},
}

#: The demo's thread, or the first free one of ``research-2``, ``research-3``, ...
DEFAULT_THREAD = "research"

SYSTEM_PROMPT = (
    "You are a research assistant. Search the library before you answer, write down each fact you use with "
    "take_note, and answer from your notes."
)

_STOPWORD_TEXT = (
    "a an and are at do does each for how i in is it of on other so the they their them to what when where which who "
    "why you your"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _words(text: str) -> list[str]:
    """Lower-case words without punctuation, with a plural ``s`` dropped (``flowers`` matches ``flower``)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words]


def _keywords(question: str) -> str:
    return " ".join(w for w in re.findall(r"[a-z0-9]+", question.lower()) if w not in _STOPWORDS)


@tool(outputs_to_state={"sources": {"source": "documents"}, "searches": {"source": "query"}})
def search(query: Annotated[str, "keywords to look for"]) -> dict[str, Any]:
    """Search the library; returns the two best matching documents."""
    wanted = set(_words(query))
    scored = [(len(wanted & set(_words(doc["title"] + " " + doc["text"]))), doc) for doc in CORPUS]
    found = [dict(doc) for score, doc in sorted(scored, key=lambda pair: -pair[0]) if score > 0][:2]
    return {"query": query, "documents": found}


@tool(outputs_to_state={"notes": {"source": "note"}})
def take_note(
    text: Annotated[str, "the fact, in one sentence"], source: Annotated[str, "the id of the document it comes from"]
) -> dict[str, str]:
    """Write down a fact to use in the answer."""
    return {"note": f"{text} [{source}]"}


def _notes_in(messages: list[ChatMessage]) -> list[str]:
    notes = []
    for message in messages:
        result = message.tool_call_result
        if result is not None and result.origin.tool_name == "take_note" and not result.error:
            notes.append(json.loads(str(result.result))["note"])
    return notes


def research_policy(messages: list[ChatMessage], tools: list[Tool]) -> ScriptReply:
    """
    The scripted model: a question is searched, the best document noted, the note given as the answer; asked for a
    summary, it lists every note in the conversation.

    :param messages: The conversation so far.
    :param tools: The tools offered (unused: the policy knows them).
    :returns: The reply, as ``ScriptedChatGenerator`` takes it.
    """
    last = messages[-1]
    result = last.tool_call_result
    if result is None:  # a new question
        question = last.text or ""
        if "summar" in question.lower():
            notes = _notes_in(messages)
            if not notes:
                return "I have not written anything down yet."
            return "So far I found:\n" + "\n".join(f"- {note}" for note in notes)
        return [("search", {"query": _keywords(question)})]
    if result.error:
        return f"Sorry, the {result.origin.tool_name} tool failed: {result.result}"
    if result.origin.tool_name == "search":
        documents = json.loads(str(result.result))["documents"]
        if not documents:
            return "I found nothing about that in the library."
        best = documents[0]
        return [("take_note", {"text": best["text"].split(". ")[0] + ".", "source": best["id"]})]
    note = json.loads(str(result.result))["note"]
    return f"Here is what I found: {note}"


def research_agent(checkpointer: Checkpointer) -> Agent:
    """
    The demo's agent: the scripted research policy, ``search`` and ``take_note``, and the demo's state schema.

    :param checkpointer: Where the thread is kept.
    :returns: The agent.
    """
    return Agent(
        ScriptedChatGenerator(policy=research_policy),
        tools=[search, take_note],
        system_prompt=SYSTEM_PROMPT,
        state_schema=SCHEMA,
        checkpointer=checkpointer,
    )


@dataclass
class DemoResult:
    """
    What a demo run did.

    :param thread_id: The thread it ran on.
    :param turns: Per turn: the question, the answer and the checkpoints committed (each with its step, source,
        tools and changes).
    :param checkpoints: How many checkpoints the thread holds.
    :param sizes: The final state's bytes per key (``State.size()``).
    """

    thread_id: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: int = 0
    sizes: dict[str, int] = field(default_factory=dict)


def item_summary(value: object) -> str:
    """One appended item in a line: a message as ``role: text`` or its tool calls, a document by its title."""
    if isinstance(value, ChatMessage):
        if value.tool_calls:
            calls = ", ".join(
                f"{c.tool_name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in value.tool_calls
            )
            text = f"calls {calls}"
        elif value.tool_call_result is not None:
            text = f"{value.tool_call_result.origin.tool_name} returned {value.tool_call_result.result}"
        else:
            text = value.text or ""
        return _short(f"{value.role.value}: {text}")
    if isinstance(value, dict) and "title" in value:
        return _short(str(value["title"]))
    return _short(value if isinstance(value, str) else summarize(value, 60))


def _short(text: str, width: int = 72) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    text = repr(value)
    return text if len(text) <= 40 else summarize(value, 40)


def describe_change(before: object, after: object) -> tuple[str, list[object] | None]:
    """
    Describe how a stored value changed: ``("+2 items", [the two items])`` when a list (or an unset key) was
    appended to, otherwise ``("'Ann' -> 'Bob'", None)``, with long values summarized (``3 items -> 1 item``).

    :param before: The earlier value; None if unset.
    :param after: The later value; None if unset.
    :returns: The description, and the appended items if the change was an append.
    """
    kept = [] if before is None else before
    if isinstance(kept, list) and isinstance(after, list) and after and after[: len(kept)] == kept:
        added = list(after[len(kept) :])
        return f"+{len(added)} item{'' if len(added) == 1 else 's'}", added
    return f"{_shown(before)} -> {_shown(after)}", None


def _changes(before: State, after: State) -> list[dict[str, Any]]:
    """What changed from one checkpoint's state to the next, ``messages`` first."""
    diff = before.diff(after)
    changes = []
    for key in sorted(diff, key=lambda name: name != "messages"):
        text, added = describe_change(*diff[key])
        change: dict[str, Any] = {"key": key, "change": text}
        if added is not None:
            change["added"] = [item_summary(item) for item in added]
        elif diff[key][1] is None and SCHEMA.get(key, {}).get("scope") == "run":
            change["change"] += "  (reset: its scope is the run)"
        changes.append(change)
    return changes


def _print_checkpoint(entry: dict[str, Any], echo: Callable[[str], None]) -> None:
    label = f"  step {entry['step']:>2} {entry['source']:<5}"
    lines = []
    for change in entry["changes"]:
        if "added" in change:
            lines += [f"{change['key']:<9} + {item}" for item in change["added"]]
        else:
            lines.append(f"{change['key']:<9} {change['change']}")
    for line in lines or ["(no changes)"]:
        echo(f"{label} {line}")
        label = " " * len(label)


def _free_thread_id(checkpointer: Checkpointer, base: str = DEFAULT_THREAD) -> str:
    taken = {info.thread_id for info in checkpointer.list_threads()}
    number = 1
    while (thread_id := base if number == 1 else f"{base}-{number}") in taken:
        number += 1
    return thread_id


def run_demo(
    checkpointer: Checkpointer,
    turns: int = len(QUESTIONS),
    echo: Callable[[str], None] | None = None,
    *,
    thread_id: str | None = None,
    where: str = "the checkpointer",
) -> DemoResult:
    """
    Run the research assistant for ``turns`` questions on a new thread.

    :param checkpointer: Where the thread is kept (a SQLite file's, a PostgreSQL schema's).
    :param turns: How many of :data:`QUESTIONS` to ask, from 1 to ``len(QUESTIONS)``.
    :param echo: Called with each line of the step-by-step report; nothing is printed if None.
    :param thread_id: The thread to write, which must not exist yet. None takes ``research``, or if a thread has
        that id, the next free one (``research-2``, ...): a thread already there is left alone.
    :param where: The database, as the report names it.
    :returns: The thread id, each turn's checkpoints and changes, and the final sizes.
    :raises ValueError: If ``turns`` is out of range, or the thread ``thread_id`` exists.
    """
    if not 1 <= turns <= len(QUESTIONS):
        raise ValueError(f"turns must be between 1 and {len(QUESTIONS)}, got {turns}.")
    if thread_id is not None and checkpointer.head(thread_id) is not None:
        raise ValueError(f"The thread '{thread_id}' already exists; the demo writes a new thread.")
    say = echo or (lambda line: None)
    agent = research_agent(checkpointer)
    thread_id = thread_id if thread_id is not None else _free_thread_id(checkpointer)
    result = DemoResult(thread_id=thread_id)
    say(f"Research assistant on thread '{thread_id}' in {where} (offline: a scripted model decides the calls)")
    if thread_id.startswith(f"{DEFAULT_THREAD}-"):
        say(f"(a thread '{DEFAULT_THREAD}' is there already: each run writes a new thread; --thread NAME names it)")
    previous = State(SCHEMA)
    seen: set[str] = set()
    for number, question in enumerate(QUESTIONS[:turns], start=1):
        say("")
        say(f"Turn {number}. user: {question}")
        output = agent.run([ChatMessage.from_user(question)], thread_id=thread_id)
        new = [meta for meta in reversed(agent.get_history(thread_id)) if meta.checkpoint_id not in seen]
        committed = []
        for meta in new:
            seen.add(meta.checkpoint_id)
            current = State(SCHEMA, agent.get_state(thread_id, meta.checkpoint_id).values)
            entry = {
                "checkpoint_id": meta.checkpoint_id,
                "step": meta.step,
                "source": meta.source,
                "tools": list(meta.tool_names),
                "changed_keys": list(meta.changed_keys),
                "changes": _changes(previous, current),
            }
            _print_checkpoint(entry, say)
            committed.append(entry)
            previous = current
        answer = output["last_message"].text or ""
        say("  assistant: " + answer.replace("\n", "\n             "))
        result.turns.append({"question": question, "answer": answer, "checkpoints": committed})
    result.checkpoints = len(agent.get_history(thread_id))
    result.sizes = previous.size()
    by_source: dict[str, int] = {}
    for turn in result.turns:
        for entry in turn["checkpoints"]:
            by_source[entry["source"]] = by_source.get(entry["source"], 0) + 1
    counts = ", ".join(f"{count} {source}" for source, count in by_source.items())
    say("")
    say(f"Thread '{thread_id}': {plural(result.checkpoints, 'checkpoint')} ({counts}).")
    say("State size, in bytes of JSON per key:")
    for key, size in result.sizes.items():
        say(f"  {key:<9} {size:>7,}")
    say("")
    return result
