"""
Token counting for context policies: haystack's token counters, a per-message count cache, and the default counter.

A policy runs before every model call, on threads that may hold tens of thousands of messages, so it never counts
the whole conversation: it counts one message at a time, walking from the end, and the count of each message is
cached by the message's identity (stored messages are never changed in place) for as long as the message lives.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable
from typing import Generic, TypeVar

from haystack import logging
from haystack.dataclasses import ChatMessage
from haystack.token_counters import ApproximateTokenCounter, TokenCounter
from haystack.tools.tool import Tool

__all__ = [
    "APPROXIMATE_COUNTER",
    "IdentityCache",
    "TokenMeter",
    "default_token_counter",
    "load_token_counter",
    "token_meter",
]

logger = logging.getLogger(__name__)

V = TypeVar("V")

#: The counter a view uses when it is given none: haystack's ``ApproximateTokenCounter`` (four characters a token).
APPROXIMATE_COUNTER: TokenCounter = ApproximateTokenCounter()


class _KeyedRef(weakref.ref):  # type: ignore[type-arg]
    __slots__ = ("key",)
    key: int


class IdentityCache(Generic[V]):
    """
    Values kept per object, by identity, for as long as the object lives (a weak reference drops the entry).

    It works for unhashable objects (``ChatMessage``, ``Tool``), and never keeps an object alive. An object that
    cannot be weakly referenced is simply not cached.
    """

    def __init__(self) -> None:
        """Create an empty cache."""
        self._entries: dict[int, tuple[_KeyedRef, V]] = {}

    def get(self, obj: object) -> V | None:
        """
        The value cached for this very object, or None.

        :param obj: The object.
        :returns: Its value, or None.
        """
        entry = self._entries.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        return None

    def put(self, obj: object, value: V) -> None:
        """
        Cache a value for an object until the object dies.

        :param obj: The object.
        :param value: Its value.
        """
        try:
            ref = _KeyedRef(obj, self._drop)
        except TypeError:  # not weakly referenceable: not cached
            return
        ref.key = id(obj)
        self._entries[ref.key] = (ref, value)

    def _drop(self, ref: _KeyedRef) -> None:
        entry = self._entries.get(ref.key)
        if entry is not None and entry[0] is ref:
            self._entries.pop(ref.key, None)

    def __len__(self) -> int:
        return len(self._entries)


class TokenMeter:
    """
    A token counter with a cache: the tokens of each message (and each tool's schema), counted once per message.

    The size of a list of messages is taken as the sum of its messages' sizes (plus the tools'), so it can be
    summed from the end without counting what is not sent. Get the meter of a counter with :func:`token_meter`.

    :param counter: The haystack ``TokenCounter`` that counts.
    """

    def __init__(self, counter: TokenCounter) -> None:
        """
        Create a meter.

        :param counter: The haystack ``TokenCounter`` to count with.
        """
        self.counter = counter
        self._messages: IdentityCache[int] = IdentityCache()
        self._tools: IdentityCache[int] = IdentityCache()

    def message(self, message: ChatMessage) -> int:
        """
        The tokens of one message.

        :param message: The message.
        :returns: Its token count.
        """
        tokens = self._messages.get(message)
        if tokens is None:
            tokens = self.counter.count([message])
            self._messages.put(message, tokens)
        return tokens

    def messages(self, messages: Iterable[ChatMessage]) -> int:
        """
        The tokens of several messages (the sum of each one's).

        :param messages: The messages.
        :returns: Their token count.
        """
        return sum(self.message(m) for m in messages)

    def tools(self, tools: Iterable[Tool]) -> int:
        """
        The tokens of the tools' schemas, as they are sent beside the messages.

        :param tools: The tools.
        :returns: Their token count.
        """
        total = 0
        for tool in tools:
            tokens = self._tools.get(tool)
            if tokens is None:
                tokens = self.counter.count([], tools=[tool])
                self._tools.put(tool, tokens)
            total += tokens
        return total

    def total(self, messages: Iterable[ChatMessage], tools: Iterable[Tool] = ()) -> int:
        """
        The tokens of messages and the tools sent with them.

        :param messages: The messages.
        :param tools: The tools.
        :returns: The token count.
        """
        return self.messages(messages) + self.tools(tools)


_METER_ATTRIBUTE = "_haystack_state_token_meter"
_meters_lock = threading.Lock()


def token_meter(counter: TokenCounter) -> TokenMeter:
    """
    The meter of a counter: one per counter object (kept on the counter), so every policy counting with it shares
    its cache, for as long as the counter lives. A counter that takes no attributes gets a new meter each time.

    :param counter: A haystack ``TokenCounter``.
    :returns: Its ``TokenMeter``.
    """
    meter = getattr(counter, _METER_ATTRIBUTE, None)
    if isinstance(meter, TokenMeter) and meter.counter is counter:
        return meter
    with _meters_lock:
        meter = getattr(counter, _METER_ATTRIBUTE, None)
        if isinstance(meter, TokenMeter) and meter.counter is counter:
            return meter
        meter = TokenMeter(counter)
        with contextlib.suppress(AttributeError, TypeError):
            setattr(counter, _METER_ATTRIBUTE, meter)
        return meter


def load_token_counter(encoding: str = "o200k_base", *, timeout: float = 5.0) -> TokenCounter:
    """
    A ``TiktokenCounter`` if ``tiktoken`` is installed and its encoding loads, else an ``ApproximateTokenCounter``.

    ``tiktoken`` downloads an encoding the first time and caches it; with no network and no cached copy, loading
    fails, or hangs until the connection times out. The encoding is therefore loaded here, in a background thread
    given ``timeout`` seconds; if it does not load, a warning says why and the approximate counter is returned.
    Without ``tiktoken`` installed, the approximate counter is returned silently.

    :param encoding: The ``tiktoken`` encoding (``o200k_base`` is what current OpenAI models use).
    :param timeout: Seconds to wait for the encoding to load.
    :returns: The counter.
    """
    try:
        import tiktoken  # noqa: F401  (only checks that it is installed)
        from haystack.token_counters import TiktokenCounter
    except ImportError:
        return ApproximateTokenCounter()
    counter = TiktokenCounter(encoding=encoding)
    failure: list[BaseException] = []

    def warm_up() -> None:
        try:
            counter.warm_up()
        except BaseException as exc:  # reported by the caller
            failure.append(exc)

    loader = threading.Thread(target=warm_up, name=f"tiktoken-{encoding}", daemon=True)
    loader.start()
    loader.join(timeout)
    if not loader.is_alive() and not failure:
        return counter
    reason = f"{type(failure[0]).__name__}: {failure[0]}" if failure else f"it did not load within {timeout:g} seconds"
    logger.warning(
        "Could not load the tiktoken encoding '{encoding}' ({reason}); counting tokens approximately "
        "(4 characters a token) instead. Put the encoding in tiktoken's cache (TIKTOKEN_CACHE_DIR) to count exactly.",
        encoding=encoding,
        reason=reason,
    )
    return ApproximateTokenCounter()


_defaults: dict[str, TokenCounter] = {}
_defaults_lock = threading.Lock()


def default_token_counter(encoding: str = "o200k_base") -> TokenCounter:
    """
    The process-wide default counter: :func:`load_token_counter` once per encoding (so a fallback warns once).

    :param encoding: The ``tiktoken`` encoding.
    :returns: The counter, the same object on every call.
    """
    with _defaults_lock:
        counter = _defaults.get(encoding)
        if counter is None:
            counter = _defaults[encoding] = load_token_counter(encoding)
        return counter
