"""
Retrying a failed model or tool call: a :class:`RetryPolicy` says how many attempts a call gets, how long to wait
between them (exponential backoff, with jitter) and which errors are worth another attempt. By default
(:func:`transient_error`) those are the errors of a service that may answer next time: a lost connection, a timeout
of the model client, a rate limit, a 5xx reply; never a programming error such as a ``TypeError`` or a
``ValueError``, which would fail the same way again.

``Agent(retry_policy=...)`` takes one policy for both its model and its tool calls, or one per kind:
``{"model": RetryPolicy(...), "tools": RetryPolicy(...)}`` (a kind left out, or None, is not retried). Every call
has a budget of its own: a policy of 3 attempts gives each model call and each tool call up to 3.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

from haystack import logging
from haystack.utils import deserialize_callable, serialize_callable

from haystack_state._text import replace_surrogates
from haystack_state.errors import ToolTimeoutError

__all__ = [
    "RETRY_KINDS",
    "RetryOn",
    "RetryPolicy",
    "error_text",
    "retry_policies",
    "retry_policy_from_dict",
    "retry_policy_to_dict",
    "transient_error",
]

logger = logging.getLogger(__name__)

#: What ``retry_on`` may be: an exception type, a tuple (or list) of them, or a predicate taking the error.
RetryOn = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]

#: The kinds of calls an Agent's ``retry_policy`` mapping may name.
RETRY_KINDS = ("model", "tools")

#: HTTP statuses that a later attempt may not get: request timeout, too early, too many requests (any 5xx too).
_TRANSIENT_STATUSES = frozenset({408, 425, 429})

#: Transient errors of HTTP and model client libraries, by top-level package and class name (matched along the
#: error's class hierarchy, so that no library has to be imported to recognize its errors).
_TRANSIENT_CLASSES = frozenset(
    {
        ("openai", "APIConnectionError"),  # and APITimeoutError, its subclass
        ("anthropic", "APIConnectionError"),
        ("httpx", "TransportError"),  # ConnectError, ReadTimeout, RemoteProtocolError, ...
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
        ("aiohttp", "ClientConnectionError"),
        ("urllib3", "TimeoutError"),
        ("urllib3", "ProtocolError"),
        ("urllib", "URLError"),  # (an HTTPError, its subclass, has a status: decided by it)
    }
)


def _status(error: BaseException) -> int | None:
    """
    The HTTP status of an error that has one: its ``status_code``, ``status`` or ``code`` (openai, anthropic,
    aiohttp, urllib, google-genai), or its ``response``'s (httpx, requests); a number from 100 to 599.
    """
    try:
        response = getattr(error, "response", None)
    except Exception:  # a property that raises (no response attached)
        response = None
    for holder in (error, response):
        for name in ("status_code", "status", "code"):
            try:
                status = getattr(holder, name, None)
            except Exception:
                continue
            if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
                return status
    return None


def transient_error(error: BaseException) -> bool:
    """
    The default ``retry_on``: whether an error is transient, so that another attempt may succeed.

    True for a lost or refused connection (``ConnectionError``), a ``TimeoutError``, the connection and timeout
    errors of the model and HTTP clients (openai, anthropic, httpx, requests, aiohttp, urllib3, urllib), and errors
    that carry an HTTP status of 408, 425, 429 or 5xx (rate limits, overloaded or failing servers). False for
    everything else, programming errors (``TypeError``, ``ValueError``, ``KeyError``, ...) and a tool's
    ``ToolTimeoutError`` included: a tool that overran its timeout is not called again unless ``retry_on`` names
    ``ToolTimeoutError`` (a sync tool over time is abandoned, not stopped, so another attempt would run beside it).

    :param error: The error of the failed attempt.
    :returns: Whether to try again.
    """
    if isinstance(error, ToolTimeoutError):
        return False
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    status = _status(error)
    if status is not None:
        return status in _TRANSIENT_STATUSES or 500 <= status <= 599
    return any((cls.__module__.partition(".")[0], cls.__name__) in _TRANSIENT_CLASSES for cls in type(error).__mro__)


def _is_error_type(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """
    How a failed call is retried: up to ``max_attempts`` attempts in all, waiting ``initial_interval`` seconds after
    the first failure, then ``backoff_factor`` times longer after each next one, at most ``max_interval``.

    ```python
    from haystack_state import RetryPolicy

    policy = RetryPolicy(4, initial_interval=0.5, backoff_factor=2.0, jitter=False)
    print([policy.delay(attempt) for attempt in (1, 2, 3)])  # Output: [0.5, 1.0, 2.0]
    print(policy.retries(ConnectionError("reset")), policy.retries(ValueError("bad")))  # Output: True False
    ```

    :param max_attempts: How many times a call is made at most, the first included (1: never retried).
    :param initial_interval: Seconds to wait after the first failed attempt.
    :param backoff_factor: How much longer each next wait is (at least 1).
    :param max_interval: The longest wait, in seconds.
    :param jitter: Wait a random 50-100% of each interval, so that runs failing together do not retry together.
    :param retry_on: Which errors are retried: an exception type, a tuple (or list) of them, or a predicate taking
        the error. :func:`transient_error` (the default) retries connection errors, timeouts of the model client,
        rate limits and 5xx replies. For a tool call, the error is the one the tool raised (not haystack's
        ``ToolInvocationError`` wrapper), or a ``ToolTimeoutError`` if it overran its timeout.
    :raises ValueError: For a ``max_attempts`` below 1, a negative or non-finite interval, a ``backoff_factor`` below
        1, or a ``retry_on`` that is neither exception types nor callable.
    """

    max_attempts: int = 3
    _: dataclasses.KW_ONLY
    initial_interval: float = 0.5
    backoff_factor: float = 2.0
    max_interval: float = 30.0
    jitter: bool = True
    retry_on: RetryOn = transient_error

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"RetryPolicy max_attempts must be an int of at least 1, got {attempts!r}.")
        for name in ("initial_interval", "max_interval", "backoff_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RetryPolicy {name} must be a finite number of at least 0, got {value!r}.")
            object.__setattr__(self, name, float(value))
        if self.backoff_factor < 1:
            raise ValueError(f"RetryPolicy backoff_factor must be at least 1, got {self.backoff_factor!r}.")
        retry_on: Any = self.retry_on
        if isinstance(retry_on, list | tuple):
            if not retry_on or not all(_is_error_type(kind) for kind in retry_on):
                raise ValueError(f"RetryPolicy retry_on must list exception types, got {retry_on!r}.")
            object.__setattr__(self, "retry_on", tuple(retry_on))
        elif _is_error_type(retry_on):
            object.__setattr__(self, "retry_on", (retry_on,))
        elif not callable(retry_on):
            raise ValueError(
                f"RetryPolicy retry_on must be an exception type, a tuple of them or a predicate, got {retry_on!r}."
            )

    def retries(self, error: BaseException) -> bool:
        """
        Whether ``retry_on`` matches an error (the budget is not considered). A predicate that raises matches
        nothing (a warning is logged).

        :param error: The error of a failed attempt.
        :returns: Whether it is worth another attempt.
        """
        retry_on = self.retry_on
        if isinstance(retry_on, tuple):
            return isinstance(error, retry_on)
        try:
            return bool(retry_on(error))
        except Exception as exc:
            logger.warning(
                "RetryPolicy: retry_on raised {error_type}: {error}; the call is not retried.",
                error_type=type(exc).__name__,
                error=exc,
            )
            return False

    def delay(self, attempt: int) -> float:
        """
        How long to wait after the failed attempt ``attempt`` (from 1) before the next one.

        :param attempt: The attempt that failed.
        :returns: Seconds: ``initial_interval * backoff_factor ** (attempt - 1)``, at most ``max_interval``; with
            ``jitter``, a random 50-100% of that.
        """
        interval = min(self.max_interval, self.initial_interval * self.backoff_factor ** max(0, attempt - 1))
        if self.jitter:
            interval *= random.uniform(0.5, 1.0)
        return interval

    def next_delay(self, attempt: int, error: BaseException) -> float | None:
        """
        The wait before another attempt after the failed attempt ``attempt``, or None if the call is not retried
        (the error is not retryable, or the budget is spent).

        :param attempt: The attempt that failed, from 1.
        :param error: Its error.
        :returns: Seconds, or None.
        """
        if attempt >= self.max_attempts or not self.retries(error):
            return None
        return self.delay(attempt)

    def to_dict(self) -> dict[str, Any]:
        """
        The policy as JSON-ready data: ``retry_on`` exception types as import paths, a predicate as its import path
        (the default is left out).

        :returns: The dict.
        :raises SerializationError: For a ``retry_on`` predicate that is a lambda or a nested function.
        """
        data: dict[str, Any] = {
            "max_attempts": self.max_attempts,
            "initial_interval": self.initial_interval,
            "backoff_factor": self.backoff_factor,
            "max_interval": self.max_interval,
            "jitter": self.jitter,
        }
        retry_on = self.retry_on
        if isinstance(retry_on, tuple):
            data["retry_on"] = [f"{kind.__module__}.{kind.__qualname__}" for kind in retry_on]
        elif retry_on is not transient_error:
            data["retry_on"] = serialize_callable(retry_on)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetryPolicy:
        """
        Rebuild a policy from :meth:`to_dict` output. Exception types and predicates are imported with haystack's
        ``deserialize_callable``, so their modules must be on haystack's deserialization allowlist (``builtins`` and
        ``haystack_state`` are).

        :param data: The dict.
        :returns: The policy.
        :raises DeserializationError: If a ``retry_on`` path cannot be imported (or is not allowed).
        :raises ValueError: If an imported ``retry_on`` type is not an exception type.
        """
        params = dict(data)
        retry_on = params.pop("retry_on", None)
        if isinstance(retry_on, list):
            params["retry_on"] = tuple(deserialize_callable(path) for path in retry_on)
        elif isinstance(retry_on, str):
            params["retry_on"] = deserialize_callable(retry_on)
        return cls(**params)


def retry_policies(value: object, what: str) -> tuple[RetryPolicy | None, RetryPolicy | None]:
    """
    Validate an Agent's ``retry_policy``: a :class:`RetryPolicy` (for model and tool calls), a mapping of
    ``"model"`` and/or ``"tools"`` to a policy (or None), or None.

    :param value: The given value.
    :param what: Who was given it, for the message.
    :returns: The policy of the model calls and the one of the tool calls (None: not retried).
    :raises ValueError: For anything else, or a mapping with other keys.
    """
    if value is None:
        return None, None
    if isinstance(value, RetryPolicy):
        return value, value
    if isinstance(value, Mapping):
        unknown = sorted(str(key) for key in value if key not in RETRY_KINDS)
        wrong = [key for key in RETRY_KINDS if value.get(key) is not None and not isinstance(value[key], RetryPolicy)]
        if not unknown and not wrong:
            return value.get("model"), value.get("tools")
        if unknown:
            raise ValueError(
                f"{what} retry_policy maps {unknown}: its keys are 'model' and 'tools' (a RetryPolicy or None each)."
            )
    raise ValueError(
        f"{what} retry_policy must be a RetryPolicy, a mapping of 'model' and/or 'tools' to a RetryPolicy (or None), "
        f"or None; got {value!r}."
    )


def retry_policy_to_dict(value: Any) -> dict[str, Any] | None:
    """
    Serialize an Agent's ``retry_policy`` (see :func:`retry_policies`).

    :param value: The policy, the mapping, or None.
    :returns: The policy's dict, ``{"model": ..., "tools": ...}`` for a mapping, or None.
    """
    if value is None:
        return None
    if isinstance(value, RetryPolicy):
        return value.to_dict()
    return {kind: (value[kind].to_dict() if value.get(kind) is not None else None) for kind in RETRY_KINDS}


def retry_policy_from_dict(data: Mapping[str, Any] | None) -> RetryPolicy | dict[str, RetryPolicy | None] | None:
    """
    Rebuild an Agent's ``retry_policy`` from :func:`retry_policy_to_dict` output.

    :param data: The dict, or None.
    :returns: The policy, the mapping, or None.
    """
    if data is None:
        return None
    if any(kind in data for kind in RETRY_KINDS):
        return {
            kind: (RetryPolicy.from_dict(data[kind]) if data.get(kind) is not None else None) for kind in RETRY_KINDS
        }
    return RetryPolicy.from_dict(data)


def error_text(error: BaseException, limit: int = 300) -> str:
    """
    An error as recorded in a checkpoint's ``retries`` metadata: ``"Type: message"``, storable (lone surrogates
    replaced) and at most ``limit`` characters.

    :param error: The error.
    :param limit: The longest text.
    :returns: The text.
    """
    text = replace_surrogates(f"{type(error).__name__}: {error}")
    return text if len(text) <= limit else text[: limit - 3] + "..."
