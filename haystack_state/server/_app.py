"""
``create_app``: the Agent Protocol server as an ASGI application (FastAPI), with its limits, its auth dependency and
error handlers that answer in the spec's shapes (``{"detail": "..."}``; a 422 names the field at fault).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from haystack_state.agent import Agent
from haystack_state.errors import (
    CheckpointNotFoundError,
    CodecError,
    StateTypeError,
    ThreadConflictError,
    ThreadNotFoundError,
    UnknownStateKeyError,
)
from haystack_state.persistence.base import Checkpointer
from haystack_state.server._assistants import Assistants
from haystack_state.server._context import Auth, Limits, Server
from haystack_state.server._cors import Cors, add_cors, cors_origins
from haystack_state.server._database import database_for
from haystack_state.server._executor import AgentExecutor
from haystack_state.server._records import IdempotencyConflict, QueueFull, ThreadBusy
from haystack_state.server._responses import Info, Ok, json_answer
from haystack_state.server._routers import assistants as assistants_router
from haystack_state.server._routers import runs as runs_router
from haystack_state.server._routers import store as store_router
from haystack_state.server._routers import threads as threads_router
from haystack_state.server._runs import AtCapacity, RunManager
from haystack_state.server._storage import ServerStorage
from haystack_state.server._stores import store_for
from haystack_state.server._wire import WireError
from haystack_state.store.base import Store

__all__ = ["Auth", "Limits", "Server", "create_app"]

STATIC = Path(__file__).resolve().parent / "static"
try:
    VERSION = importlib.metadata.version("haystack-state")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was not installed
    VERSION = "0+unknown"


def create_app(
    agents: Agent | Mapping[str, Agent],
    *,
    checkpointer: Checkpointer | None = None,
    store: Store | None = None,
    auth: Auth | None = None,
    limits: Limits | None = None,
    database: str | None = None,
    poll_interval: float = 0.2,
    lease_seconds: float = 30.0,
    max_attempts: int = 3,
    cors: Cors | None = None,
    wire_system_prompt: bool = False,
) -> FastAPI:
    """
    The Agent Protocol server for one or more agents, as an ASGI app (run it with uvicorn, or ``haystack-state
    serve``).

    ```python
    app = create_app({"assistant": agent})  # uvicorn.run(app, host="127.0.0.1", port=8123)
    ```

    :param agents: The agents to serve, each an *assistant*: ``{"name": agent}``, or one agent (served as
        ``"agent"``). Every agent needs a checkpointer, the same one.
    :param checkpointer: The agents' checkpointer (they must use it); found from the agents if None.
    :param store: The long-term memory store served at ``/store``; by default a store on the checkpointer's
        database (or ``database``), closed with the app. With ``auth``, each user's items live under
        ``("owners", <user>, ...)`` and no user sees another's.
    :param auth: Maps a request to its user's id (sync or async), or refuses it (``None`` gives 401; or raise
        ``HTTPException``). Threads and runs belong to the user who created them: another user gets 404. Without
        it, every request is the same anonymous user; bind the server to 127.0.0.1 then.
    :param limits: Request and run limits (see :class:`Limits`).
    :param database: Where the server keeps its own tables (threads, runs), when the checkpointer's database cannot
        be found from its settings: a SQLite path or a ``postgresql://`` URL naming the same database.
    :param poll_interval: How often (seconds) workers look for queued runs.
    :param lease_seconds: How long a run claimed by a worker that stopped stays claimed; then any live process
        resumes it from its thread's last checkpoint.
    :param max_attempts: How many times a run is started (its first attempt and its resumptions after a worker
        stopped) before it is failed.
    :param cors: The browser origins that may call the server (CORS): ``"*"`` for any, an origin such as
        ``"http://localhost:3000"``, or a list of them. None (the default): no CORS headers, so browsers refuse
        pages of other origins. Preflights are answered on every route, before auth; ``Content-Location`` and
        ``Location`` are exposed.
    :param wire_system_prompt: Whether ``values.messages`` on the wire starts with the Agent's own system prompt
        (stored either way); by default it is left out, so chat UIs do not draw it as a message.
    :returns: The app.
    :raises ValueError: For no agents, agents without (or with different) checkpointers, or a ``cors`` value that
        is not an origin.
    """
    origins = cors_origins(cors)  # checked before anything opens
    named = {"agent": agents} if isinstance(agents, Agent) else dict(agents)
    registry = Assistants(named, checkpointer, wire_system_prompt=wire_system_prompt)
    limits = limits or Limits()
    storage = ServerStorage(database_for(registry.checkpointer, database))
    manager = RunManager(
        storage,
        registry,
        AgentExecutor(limits.max_concurrent_runs),
        max_concurrent_runs=limits.max_concurrent_runs,
        max_pending_runs=limits.max_pending_runs,
        poll_interval=poll_interval,
        lease_seconds=lease_seconds,
        max_attempts=max_attempts,
    )
    owns_store = store is None
    if store is None:
        store = store_for(registry.checkpointer, database)
    server = Server(registry, storage, manager, limits, auth, store)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        manager.ensure_started()
        try:
            yield
        finally:
            await manager.stop()
            await storage.database.aclose_loop()
            if owns_store:
                await store.aclose()

    app = FastAPI(title="haystack-state", summary="The Agent Protocol for haystack-state agents", lifespan=lifespan)
    app.state.server = server

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/ok", tags=["System"], response_model=Ok)
    async def ok() -> Response:
        """The health check: ``{"ok": true}`` while the server answers."""
        return json_answer({"ok": True})

    @app.get("/info", tags=["System"], response_model=Info)
    async def info() -> Response:
        """The server's version and what it supports, in the shape of LangGraph's ``/info`` (its UIs read it)."""
        return json_answer(
            {
                "version": VERSION,
                "langgraph_py_version": None,
                "flags": {"assistants": True, "crons": False, "langsmith": False, "langsmith_tracing_replicas": False},
                "host": {"kind": "self-hosted", "project_id": None, "host_revision_id": None, "revision_id": None},
                "haystack_state": {"version": VERSION},
            }
        )

    # The runs router first, then threads: FastAPI matches a request against the routes in order, and these are the
    # busiest (no path of one router matches another's).
    for router in (runs_router.router, threads_router.router, assistants_router.router, store_router.router):
        app.include_router(router)
    app.mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui")

    _error_handlers(app)
    app.add_middleware(JsonBody)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    add_cors(app, origins)  # the outermost: a refusal (413) carries CORS headers too
    return app


def _field(loc: Iterable[object]) -> str:
    parts = [str(part) for part in loc if part not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def _error_handlers(app: FastAPI) -> None:
    def detail(status: int, message: str, **extra: object) -> JSONResponse:
        return JSONResponse({"detail": message, **extra}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": _field(item.get("loc", ())), "message": str(item.get("msg", "")).removeprefix("Value error, ")}
            for item in error.errors()
        ]
        text = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "invalid request"
        return detail(422, text, param=errors[0]["field"] if errors else None, errors=errors)

    @app.exception_handler(WireError)
    async def bad_wire(_: Request, error: WireError) -> JSONResponse:
        return detail(422, str(error), param=error.field, errors=[{"field": error.field, "message": error.reason}])

    @app.exception_handler(StateTypeError)
    @app.exception_handler(UnknownStateKeyError)
    async def bad_value(_: Request, error: Exception) -> JSONResponse:
        key = getattr(error, "key", None)
        field = f"input.{key}" if key else "input"
        return detail(422, str(error), param=field, errors=[{"field": field, "message": str(error)}])

    @app.exception_handler(store_router.FieldError)
    async def bad_store_field(_: Request, error: store_router.FieldError) -> JSONResponse:
        return store_router.unprocessable_response(error)

    # The errors answered with their message alone: (status, the errors, the answer's headers).
    plain: list[tuple[int, tuple[type[Exception], ...], dict[str, str] | None]] = [
        (422, (CodecError,), None),
        (404, (ThreadNotFoundError, CheckpointNotFoundError), None),
        (409, (ThreadBusy, IdempotencyConflict, ThreadConflictError), None),
        (429, (AtCapacity, QueueFull), {"Retry-After": "1"}),
    ]
    for status, kinds, headers in plain:
        for kind in kinds:
            app.add_exception_handler(kind, _plain_handler(status, headers))


def _plain_handler(
    status: int, headers: dict[str, str] | None
) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """An exception handler that answers ``status`` with the error's message as the ``detail``."""

    async def handle(_: Request, error: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=status, headers=headers)

    return handle


class JsonBody:
    """
    Reads every request body as JSON, whatever its content type (or with none): some clients send JSON as
    ``text/plain`` (a browser's simple request, avoiding a preflight) or drop the header (a proxy that forwards the
    body as it is). A body that is not JSON stays a clear 422. Multipart and form bodies are left alone.

    :param app: The wrapped app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH", "DELETE"):
            headers = [(name, value) for name, value in scope.get("headers") or [] if name != b"content-type"]
            given = dict(scope.get("headers") or []).get(b"content-type", b"")
            kind = given.split(b";")[0].strip().lower()
            kept = kind == b"application/x-www-form-urlencoded" or kind.startswith(b"multipart/")
            if not (kind == b"application/json" or kind.endswith(b"+json") or kept):
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class BodyLimit:
    """
    Refuses request bodies larger than ``max_bytes`` with HTTP 413, before the app reads them (by ``Content-Length``)
    or as soon as a streamed body passes the limit.

    :param app: The wrapped app.
    :param max_bytes: The limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, limited, send)

    def _message(self) -> str:
        return f"The request body is larger than this server accepts ({self.max_bytes} bytes)."

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await JSONResponse({"detail": self._message()}, status_code=413)(scope, receive, send)
