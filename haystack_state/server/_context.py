"""
What every request of one app shares (:class:`Server`, reached as ``request.app.state.server``), the server's
:class:`Limits`, and the FastAPI dependencies that give routers the server and the request's user.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, NamedTuple

from fastapi import Depends, HTTPException, Request

from haystack_state.server._assistants import Assistants
from haystack_state.server._runs import RunManager
from haystack_state.server._storage import ServerStorage
from haystack_state.store.base import Store

__all__ = ["Auth", "Caller", "Limits", "Server", "ServerDep", "UserDep", "get_server", "get_user"]

Auth = Callable[[Request], "str | Awaitable[str | None] | None"]
"""Maps a request to its user's id, or refuses it (``None``: 401; or raise ``HTTPException``)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """
    What one request, and the server, may ask for. Every limit answers in the spec's error shape.

    :param max_body_bytes: The largest request body (HTTP 413 beyond it).
    :param max_messages: The most messages one request may send (HTTP 422 naming ``input.messages``).
    :param max_concurrent_runs: How many runs this process executes at once; a ``runs/wait`` or ``runs/stream``
        beyond it gets HTTP 429 (background runs wait in the queue instead).
    :param max_pending_runs: How many runs may wait in the queue (HTTP 429 beyond it).
    """

    max_body_bytes: int = 1024 * 1024
    max_messages: int = 100
    max_concurrent_runs: int = 32
    max_pending_runs: int = 1000

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{field.name} must be a positive integer, got {value!r}.")


@dataclasses.dataclass
class Server:
    """
    What the routers work with, shared by every request of one app (``request.app.state.server``).

    :param assistants: The served agents.
    :param storage: Thread records and the run queue.
    :param runs: Submits, executes and follows runs.
    :param limits: The limits.
    :param auth: The auth callable, or None (one anonymous user).
    :param store: The long-term memory store served at ``/store``, or None.
    """

    assistants: Assistants
    storage: ServerStorage
    runs: RunManager
    limits: Limits
    auth: Auth | None
    store: Store | None = None

    async def user(self, request: Request) -> str:
        """
        The request's user ("" without ``auth``).

        :raises HTTPException: 401 if ``auth`` refuses the request.
        """
        if self.auth is None:
            return ""
        user = self.auth(request)
        if inspect.isawaitable(user):
            user = await user
        if user is None:
            raise HTTPException(401, "Not authenticated: this server needs credentials (for example an x-api-key).")
        if not isinstance(user, str) or not user:
            raise TypeError(f"The auth callable must return a user id (a non-empty str) or None, got {user!r}.")
        return user


async def get_server(request: Request) -> Server:
    """The app's :class:`Server` (async: FastAPI runs a plain function dependency in a worker thread)."""
    server: Server = request.app.state.server
    return server


async def get_user(request: Request) -> str:
    """The request's user (see :meth:`Server.user`)."""
    server: Server = request.app.state.server
    return await server.user(request)


class Caller(NamedTuple):
    """What a request of the runs router works with: the server, and the request's user."""

    server: Server
    user: str


ServerDep = Annotated[Server, Depends(get_server)]
UserDep = Annotated[str, Depends(get_user)]
