"""
Server-Sent Events as the runs router streams them: each event framed once, in the bytes ``sse-starlette`` writes
(``id``, ``event``, ``data`` lines ending in CRLF, then an empty line), and the events ready at one moment joined
into one write (:class:`EventStream`): a write to the socket costs more than framing an event, and a run's events
come in bursts (the updates and values of one step, a model's chunks).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.event import ensure_bytes
from starlette.types import Receive, Scope, Send

from haystack_state.server._live import Sent

__all__ = ["EventStream", "frame", "frames"]

logger = logging.getLogger(__name__)


def frame(number: str | None, event: str, data: object) -> bytes:
    """
    One event as sent: its id (if any), its name and its data as compact JSON (which holds no line break: JSON
    escapes them), each on a line of its own.
    """
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    if number is None:
        return f"event: {event}\r\ndata: {text}\r\n\r\n".encode()
    return f"id: {number}\r\nevent: {event}\r\ndata: {text}\r\n\r\n".encode()


async def frames(
    run_id: str, batches: AsyncIterator[list[Sent]], *, attempt: int = 1, resumed: bool = False
) -> AsyncIterator[bytes]:
    """
    A run's stream as chunks to write: ``metadata`` first (unless the client resumes a stream), then each batch of
    events as one chunk. The first batch comes at once, so ``metadata`` goes out at once, with the events ready then.
    """
    head = b"" if resumed else frame(None, "metadata", {"run_id": run_id, "attempt": attempt})
    async for batch in batches:
        chunk = head + b"".join([frame(*sent) for sent in batch])
        head = b""
        if chunk:
            yield chunk
    if head:
        yield head


class _Stop:
    """Registered with ``sse-starlette``'s shutdown watcher, which calls :meth:`set`: the stream stops."""

    __slots__ = ("stop",)

    def __init__(self, stop: Callable[[], None]) -> None:
        self.stop = stop

    def set(self) -> None:
        self.stop()


class EventStream(EventSourceResponse):
    """
    ``sse-starlette``'s response, in its bytes and behaviour (its headers; a keep-alive comment every 15 seconds of
    silence; the stream stops when the client disconnects or the server shuts down), served by one task and one
    watcher instead of a task group of four, with no timer per write: each chunk of ``content`` (bytes, see
    :func:`frames`) is written as it comes. On an ``sse-starlette`` without the hooks it uses, it is
    ``EventSourceResponse`` itself.

    :param content: The chunks.
    :param headers: More response headers.
    """

    def __init__(self, content: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> None:
        super().__init__(content, headers=headers)
        self._lock = asyncio.Lock()  # one write at a time: a chunk, or a keep-alive comment

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if _shutdown_state is None or scope["type"] != "http" or scope["method"].upper() == "HEAD":
            await super().__call__(scope, receive, send)
            return
        main = asyncio.current_task()
        assert main is not None
        stopped = finished = False

        def stop() -> None:
            nonlocal stopped
            if not stopped and not finished:
                stopped = True
                self.active = False
                main.cancel()

        registered = _Stop(stop)
        state = _shutdown_state()
        state.events.add(registered)
        watcher = asyncio.get_running_loop().create_task(self._watch(receive, send, stop))
        try:
            if _should_exit():  # shutting down already: an empty stream
                self.active = False
            else:
                _start_shutdown_watcher()
            await self._stream_response(send)
        except asyncio.CancelledError:
            if not stopped:
                raise
            main.uncancel()  # (our own cancel: the stream ends quietly, as sse-starlette's does)
        finally:
            finished = True
            self.active = False
            state.events.discard(registered)
            watcher.cancel()
        if self.background is not None:
            await self.background()

    async def _watch(self, receive: Receive, send: Send, stop: Callable[[], None]) -> None:
        """Stop the stream when the client disconnects; send a keep-alive comment every ``ping_interval``."""
        interval = self.ping_interval or None
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=interval)
            except TimeoutError:
                ping = ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=self.sep)
                async with self._lock:
                    if self.active:
                        body = ensure_bytes(ping, self.sep)
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                continue
            if message["type"] == "http.disconnect":
                stop()
                return

    async def _stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        body = self.body_iterator
        async for chunk in body:
            if not self.active:  # the server shuts down
                break
            try:
                async with self._lock:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except BaseException:
                # Close the iterator (its cleanup runs) before the error escapes, as sse-starlette does.
                aclose = getattr(body, "aclose", None)
                if aclose is not None:
                    with anyio.move_on_after(30.0, shield=True):
                        try:
                            await aclose()
                        except Exception:
                            logger.exception("Error closing the event stream after a failed write")
                raise
        async with self._lock:
            self.active = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _sse_hooks() -> tuple[Callable[[], Any] | None, Callable[[], None], Callable[[], bool]]:
    """``sse-starlette``'s shutdown hooks (its shared watcher and the events it sets), if this version has them."""
    try:
        from sse_starlette.sse import AppStatus, _ensure_watcher_started_on_this_loop, _get_shutdown_state
    except ImportError:  # pragma: no cover - another sse-starlette
        return None, lambda: None, lambda: False
    return _get_shutdown_state, _ensure_watcher_started_on_this_loop, lambda: bool(AppStatus.should_exit)


_shutdown_state, _start_shutdown_watcher, _should_exit = _sse_hooks()
