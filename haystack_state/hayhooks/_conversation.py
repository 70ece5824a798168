"""
How an OpenAI-style request maps onto a durable thread, without Hayhooks or a checkpointer: the messages a client
sends, the thread they belong to, what is new in them, and the ids of Responses.

**The thread of a chat completion** is the first of:

1. the request body's ``metadata.thread_id``, ``metadata.conversation_id`` or ``metadata.chat_id``;
2. the ``X-Thread-Id`` header, then Open WebUI's ``X-OpenWebUI-Chat-Id`` (sent when Open WebUI runs with
   ``ENABLE_FORWARD_USER_INFO_HEADERS=true``);
3. ``chat-`` and a hash of who asks and how the conversation starts: the request's ``user`` (or Open WebUI's
   ``X-OpenWebUI-User-Id`` header), the system messages and the first user message. Two users who start with the same
   words get two threads; one user who starts two conversations with the same words gets one.

**What is new** in a request (see :func:`plan_chat_turn`): OpenAI clients send the whole conversation every time,
without the tool calls and results the thread holds. Its user messages are compared, in order, with the thread's:

- all the thread's user messages come first, then more: the further ones are the new turn (the client's copies of
  the agent's replies are not stored again: the thread has the replies, with their tool calls);
- the client sends only user messages that do not start the thread's conversation: they are all new (a client that
  sends only the new message);
- the client re-sends the conversation, or its beginning, up to a user message the thread already answered: that
  answer is made again (a *regenerate*), on a fork of the thread from before it;
- a user message differs from the thread's at the same place (an *edit*): the thread forks from before it, and the
  client's user messages from there on are the new turn.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from haystack.dataclasses import ChatMessage

__all__ = [
    "HEADER_THREAD_KEYS",
    "METADATA_THREAD_KEYS",
    "ClientMessage",
    "TurnPlan",
    "chat_thread_id",
    "client_messages",
    "content_text",
    "explicit_thread_id",
    "header",
    "parse_response_id",
    "plan_chat_turn",
    "response_id",
    "to_chat_messages",
]

#: The keys of the request body's ``metadata`` that name the thread, in order.
METADATA_THREAD_KEYS = ("thread_id", "conversation_id", "chat_id")
#: The headers that name the thread, in order (looked up case-insensitively).
HEADER_THREAD_KEYS = ("x-thread-id", "x-openwebui-chat-id")
#: The header naming the user when the body has no ``user`` (Open WebUI's).
USER_HEADER = "x-openwebui-user-id"
#: The prefix of a Responses API id; the rest is ``<checkpoint id>_<thread id>``.
RESPONSE_PREFIX = "resp_"

_TEXT_PARTS = ("text", "input_text", "output_text")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def content_text(content: Any) -> str:
    """
    The text of an OpenAI message's ``content``: a string as it is, or the text parts of a list of parts joined by
    newlines (images and other parts are left out).

    :param content: The content.
    :returns: The text.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(texts)
    return str(content)


@dataclasses.dataclass(frozen=True)
class ClientMessage:
    """
    A message as the client sent it, reduced to what the thread compares and stores.

    :param role: ``"user"``, ``"assistant"`` or ``"system"`` (a ``developer`` message counts as system).
    :param text: Its text.
    """

    role: str
    text: str

    def to_chat_message(self) -> ChatMessage:
        """The message as a haystack ``ChatMessage``."""
        if self.role == "user":
            return ChatMessage.from_user(self.text)
        if self.role == "assistant":
            return ChatMessage.from_assistant(self.text)
        return ChatMessage.from_system(self.text)


def client_messages(messages: Sequence[Mapping[str, Any]]) -> list[ClientMessage]:
    """
    The user, assistant and system messages of a chat completion's ``messages`` or of a Responses ``input``
    (``{"type": "message", "role": ..., "content": ...}`` items). Tool calls, tool results and other items are left
    out: the agent runs its own tools, and the thread keeps their calls and results.

    :param messages: The messages, as OpenAI dicts.
    :returns: The messages kept, in order.
    """
    kept = []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("type", "message") != "message":
            continue
        role = _ROLES.get(str(message.get("role", "")))
        if role is None:
            continue
        if role == "assistant" and not content_text(message.get("content")) and message.get("tool_calls"):
            continue  # the client's record of a tool call
        kept.append(ClientMessage(role, content_text(message.get("content"))))
    return kept


def to_chat_messages(messages: Sequence[ClientMessage], *, system: bool = False) -> list[ChatMessage]:
    """
    ``ChatMessage``s of the client's messages.

    :param messages: The messages.
    :param system: Whether system messages are kept (they are dropped otherwise).
    :returns: The messages.
    """
    return [message.to_chat_message() for message in messages if system or message.role != "system"]


def header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """
    A header's value, looked up case-insensitively; None if missing or blank.

    :param headers: The request's headers (starlette's ``Headers``, or a plain dict); None for none.
    :param name: The header's name.
    :returns: The value.
    """
    if headers is None:
        return None
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    return value.strip() or None if isinstance(value, str) else None


def explicit_thread_id(body: Mapping[str, Any], headers: Mapping[str, str] | None) -> tuple[str, str] | None:
    """
    The thread a request names: ``metadata.thread_id`` (``conversation_id``, ``chat_id``), then the ``X-Thread-Id``
    and ``X-OpenWebUI-Chat-Id`` headers.

    :param body: The request body.
    :param headers: The request's headers.
    :returns: ``(thread id, where it was found)``, or None.
    """
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        for key in METADATA_THREAD_KEYS:
            value = metadata.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip(), f"metadata.{key}"
    for name in HEADER_THREAD_KEYS:
        value = header(headers, name)
        if value is not None:
            return value, f"header {name}"
    return None


def chat_thread_id(
    body: Mapping[str, Any], headers: Mapping[str, str] | None, messages: Sequence[ClientMessage]
) -> tuple[str, str]:
    """
    The thread of a chat completion request, by the rule of this module's docstring.

    :param body: The request body (``metadata`` and ``user`` are read).
    :param headers: The request's headers; None when Hayhooks passes none.
    :param messages: The request's messages (see :func:`client_messages`).
    :returns: ``(thread id, where it came from)``: ``"metadata.thread_id"``, ``"header x-thread-id"``, ... or
        ``"hash"``.
    """
    named = explicit_thread_id(body, headers)
    if named is not None:
        return named
    user = body.get("user")
    if not isinstance(user, str) or not user:
        user = header(headers, USER_HEADER) or ""
    first_user = next((m.text for m in messages if m.role == "user"), "")
    systems = [m.text for m in messages if m.role == "system"]
    key = json.dumps({"user": user, "system": systems, "first": first_user}, sort_keys=True, ensure_ascii=False)
    return "chat-" + hashlib.sha256(key.encode()).hexdigest()[:32], "hash"


@dataclasses.dataclass(frozen=True)
class TurnPlan:
    """
    What a chat completion does on its thread.

    :param kind: ``"new"`` (the thread does not exist: the client's conversation starts it), ``"append"`` (new user
        messages at the thread's head), ``"regenerate"`` (answer the thread's user message ``index`` again) or
        ``"edit"`` (the client's user message ``index`` differs from the thread's).
    :param messages: ``"new"``: the client's conversation; ``"append"``: the new user messages; ``"edit"``: the
        client's user messages from ``index`` on; ``"regenerate"``: the client's user messages up to ``index``.
    :param index: The position among the user messages where a regenerate or an edit starts.
    """

    kind: Literal["new", "append", "regenerate", "edit"]
    messages: list[ClientMessage]
    index: int = 0


def _same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def plan_chat_turn(thread_users: Sequence[str] | None, messages: Sequence[ClientMessage]) -> TurnPlan:
    """
    Decide what a chat completion request adds to its thread (see this module's docstring).

    :param thread_users: The texts of the thread's user messages, in order; None if the thread does not exist.
    :param messages: The client's messages.
    :returns: The plan.
    :raises ValueError: If the request has no user message.
    """
    users = [m for m in messages if m.role == "user"]
    if not users:
        raise ValueError("The request has no user message.")
    if thread_users is None:
        return TurnPlan("new", list(messages))
    common = 0
    while common < min(len(users), len(thread_users)) and _same(users[common].text, thread_users[common]):
        common += 1
    if common == len(users):  # the client re-sends what the thread has answered: answer its last message again
        return TurnPlan("regenerate", users, len(users) - 1)
    if common == len(thread_users):
        return TurnPlan("append", users[common:])
    if common == 0 and not any(m.role == "assistant" for m in messages):
        return TurnPlan("append", users)  # only new messages: a client that does not send the history
    return TurnPlan("edit", users[common:], common)


def response_id(checkpoint_id: str, thread_id: str) -> str:
    """
    A Responses API id: ``resp_<checkpoint id>_<thread id>``. The checkpoint is the response; the thread is where to
    find it (checkpoints are looked up within their thread).

    :param checkpoint_id: The checkpoint the response's run ended at.
    :param thread_id: Its thread.
    :returns: The id.
    """
    return f"{RESPONSE_PREFIX}{checkpoint_id}_{thread_id}"


def scratch_response_id() -> str:
    """The id of a response that was not stored (``store=false``): no checkpoint answers to it."""
    return f"{RESPONSE_PREFIX}{uuid.uuid4().hex}"


def parse_response_id(value: str) -> tuple[str, str] | None:
    """
    The checkpoint and thread a Responses API id names.

    :param value: The id, as :func:`response_id` made it.
    :returns: ``(checkpoint id, thread id)``, or None if it is not such an id.
    """
    if not value.startswith(RESPONSE_PREFIX):
        return None
    checkpoint_id, separator, thread_id = value[len(RESPONSE_PREFIX) :].partition("_")
    if not separator or not checkpoint_id or not thread_id:
        return None
    return checkpoint_id, thread_id
