"""
A local OpenAI-compatible HTTP server for tests (standard library only).

Tests point haystack's real ``OpenAIChatGenerator`` at it over real HTTP::

    with FakeOpenAIServer(script=["Hello!", [("search", {"query": "x"})]]) as server:
        generator = OpenAIChatGenerator(api_key=Secret.from_token("test"), api_base_url=server.base_url)
        ...
        assert server.requests[0].body["messages"][0]["content"] == "hi"

A reply is a ``str`` (text), a list of ``(tool_name, arguments)`` tool calls (or one such pair), a dict
``{"text": ..., "tool_calls": [...]}``, or an ``HTTPErrorReply`` to answer with an HTTP error. Replies come from
``script`` in order, or from ``policy(body)`` given the parsed request body. ``"stream": true`` is answered with
server-sent events, including streamed tool calls and a final usage chunk when ``stream_options.include_usage`` is set.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass(frozen=True)
class HTTPErrorReply:
    """
    Answer a request with an HTTP error instead of a completion.

    :param status: The HTTP status code.
    :param message: The error message, returned in OpenAI's ``{"error": {...}}`` format.
    :param error_type: The ``error.type`` field.
    :param retry: The ``x-should-retry`` header: ``False`` stops the openai client from retrying.
    """

    status: int = 500
    message: str = "Scripted server error"
    error_type: str = "server_error"
    retry: bool = False


@dataclass(frozen=True)
class FakeReply:
    """A normalized completion reply: text and/or ``(tool_name, arguments)`` tool calls."""

    text: str | None = None
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()


Reply = FakeReply | HTTPErrorReply


@dataclass
class RecordedRequest:
    """
    One request the server received.

    :param method: The HTTP method.
    :param path: The request path.
    :param headers: The request headers, names lower-cased.
    :param body: The parsed JSON body (``None`` if the body was not JSON).
    :param status: The HTTP status answered.
    :param response: The completion (or error) returned; for a stream, the equivalent non-streamed completion.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0
    response: dict[str, Any] = field(default_factory=dict)


def _tool_call(value: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
        return value[0], value[1]
    raise TypeError(f"A tool call must be a (tool_name, arguments_dict) pair, got {value!r}.")


def parse_reply(value: Any) -> Reply:
    """
    Normalize a scripted reply.

    :param value: A ``str``, tool calls, a ``{"text", "tool_calls"}`` dict, a ``FakeReply`` or an ``HTTPErrorReply``.
    :returns: The normalized reply.
    """
    if isinstance(value, FakeReply | HTTPErrorReply):
        return value
    if isinstance(value, str):
        return FakeReply(text=value)
    if isinstance(value, dict):
        return FakeReply(value.get("text"), tuple(_tool_call(c) for c in value.get("tool_calls") or []))
    if isinstance(value, tuple | list):
        if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict):
            return FakeReply(tool_calls=(_tool_call(value),))
        return FakeReply(tool_calls=tuple(_tool_call(c) for c in value))
    raise TypeError(f"Unsupported reply: {value!r}")


def _tokens(value: Any) -> int:
    """A deterministic token estimate: one token per four characters of the JSON text, rounded up."""
    return (len(json.dumps(value, sort_keys=True)) + 3) // 4


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # join handler threads on close, so nothing outlives the server
    block_on_close = True
    fake: FakeOpenAIServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._record(None)
        self._send_json(404, {"error": {"message": f"No route GET {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body: Any = None
        with contextlib.suppress(json.JSONDecodeError):
            body = json.loads(raw) if raw else None
        record = self._record(body)
        fake = self.server.fake
        if self.path.split("?")[0] not in CHAT_PATHS:
            self._send_json(404, {"error": {"message": f"No route POST {self.path}", "type": "not_found"}}, record)
            return
        try:
            reply = fake.next_reply(body)
        except Exception as exc:  # a broken script is reported to the client (and kept for the test)
            fake.errors.append(exc)
            reply = HTTPErrorReply(500, f"FakeOpenAIServer: {type(exc).__name__}: {exc}")
        if isinstance(reply, HTTPErrorReply):
            error = {"error": {"message": reply.message, "type": reply.error_type, "code": None, "param": None}}
            headers = {"x-should-retry": "true" if reply.retry else "false"}
            self._send_json(reply.status, error, record, headers)
            return
        completion = fake.completion(reply, body)
        if body.get("stream"):
            record.status, record.response = 200, completion
            self._send_stream(fake.stream_events(completion, body))
        else:
            self._send_json(200, completion, record)

    def _record(self, body: Any) -> RecordedRequest:
        headers = {k.lower(): v for k, v in self.headers.items()}
        record = RecordedRequest(self.command, self.path, headers, body)
        with self.server.fake.lock:
            self.server.fake.requests.append(record)
        return record

    def _send_json(
        self, status: int, payload: dict[str, Any], record: RecordedRequest | None = None, headers: Any = None
    ) -> None:
        data = json.dumps(payload).encode()
        if record is not None:
            record.status, record.response = status, payload
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _send_stream(self, events: list[str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            data = f"data: {event}\n\n".encode()
            self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


class FakeOpenAIServer:
    """
    An OpenAI-compatible chat-completions server on 127.0.0.1, for tests. Use it as a context manager.

    :param script: The replies, one per chat-completion request, in order.
    :param policy: Instead of a script: a callable given the parsed request body, returning a reply.
    :param chunk_size: Characters per streamed text (and tool-arguments) delta.
    :param validate_tools: Answer 500 when a reply calls a tool that the request did not declare in ``tools``.
    """

    def __init__(
        self,
        script: Sequence[Any] | None = None,
        policy: Callable[[dict[str, Any]], Any] | None = None,
        *,
        chunk_size: int = 8,
        validate_tools: bool = True,
    ) -> None:
        if (script is None) == (policy is None):
            raise ValueError("FakeOpenAIServer needs exactly one of `script` and `policy`.")
        self.script = [parse_reply(r) for r in script or []]
        self.policy = policy
        self.chunk_size = chunk_size
        self.validate_tools = validate_tools
        self.requests: list[RecordedRequest] = []
        self.errors: list[Exception] = []
        self.lock = threading.Lock()
        self._pending_errors: list[HTTPErrorReply] = []
        self._position = 0
        self._ids = itertools.count(1)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        """Start serving on an OS-chosen port. Returns the server itself."""
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the socket (idempotent)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        if self._httpd is None:
            raise RuntimeError("FakeOpenAIServer is not running; use it as a context manager or call start().")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """The ``api_base_url`` to give the OpenAI client, e.g. ``http://127.0.0.1:54321/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def bodies(self) -> list[Any]:
        """The parsed JSON bodies of the chat-completion requests, in order."""
        return [r.body for r in self.requests if r.path.split("?")[0] in CHAT_PATHS]

    def fail_next(self, status: int = 500, message: str = "Scripted server error", times: int = 1) -> None:
        """
        Answer the next ``times`` chat-completion requests with an HTTP error, before resuming the script.

        :param status: The HTTP status code.
        :param message: The error message.
        :param times: How many requests fail.
        """
        with self.lock:
            self._pending_errors += [HTTPErrorReply(status, message)] * times

    # --- replies ------------------------------------------------------------------------------------

    def next_reply(self, body: Any) -> Reply:
        """Pick the reply to a request (called by the request handler)."""
        if not isinstance(body, dict) or "messages" not in body:
            return HTTPErrorReply(400, "Request body must be a JSON object with 'messages'.", "invalid_request_error")
        with self.lock:
            if self._pending_errors:
                return self._pending_errors.pop(0)
            if self.policy is not None:
                reply = parse_reply(self.policy(body))
            elif self._position >= len(self.script):
                number = len(self.bodies)
                raise RuntimeError(
                    f"script exhausted: it has {len(self.script)} replies, and request {number} asked for one more."
                )
            else:
                reply = self.script[self._position]
                self._position += 1
        if isinstance(reply, FakeReply) and self.validate_tools:
            declared = [t.get("function", {}).get("name") for t in body.get("tools") or []]
            for name, _ in reply.tool_calls:
                if name not in declared:
                    raise LookupError(f"reply calls tool '{name}', which the request did not declare: {declared}.")
        return reply

    def completion(self, reply: FakeReply, body: dict[str, Any]) -> dict[str, Any]:
        """Build the ``chat.completion`` object for a reply."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{next(self._ids)}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for name, args in reply.tool_calls
            ]
        prompt = _tokens(body.get("messages")) + (_tokens(body["tools"]) if body.get("tools") else 0)
        completion = (_tokens(reply.text) if reply.text else 0) + (
            _tokens(message["tool_calls"]) if reply.tool_calls else 0
        )
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }

    def stream_events(self, completion: dict[str, Any], body: dict[str, Any]) -> list[str]:
        """Split a completion into the ``data:`` payloads of a ``chat.completion.chunk`` stream, ending in [DONE]."""
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {k: completion[k] for k in ("id", "created", "model")}
        choice = completion["choices"][0]
        message, size = choice["message"], self.chunk_size

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            payload: dict[str, Any] = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
            }
            if include_usage:
                payload["usage"] = None
            return json.dumps(payload)

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        text = message["content"] or ""
        events += [chunk({"content": text[i : i + size]}) for i in range(0, len(text), size)]
        for index, call in enumerate(message.get("tool_calls") or []):
            args = call["function"]["arguments"]
            head = {"index": index, "id": call["id"], "type": "function"}
            head["function"] = {"name": call["function"]["name"], "arguments": ""}
            events.append(chunk({"tool_calls": [head]}))
            for i in range(0, len(args), size):
                events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + size]}}]}))
        events.append(chunk({}, choice["finish_reason"]))
        if include_usage:
            usage = completion["usage"]
            events.append(json.dumps({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
        events.append("[DONE]")
        return events
