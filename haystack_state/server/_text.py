"""
Text is checked at the edge: a request carrying text that the server could not store, query or send back is refused
with HTTP 422 naming the field, before anything is read or written.

:func:`check_request` is a dependency of every router (after the user's authentication). It refuses:

- in the JSON body, however deep, in keys and values: a lone surrogate (JSON's ``"\\ud800"`` escape without its
  pair; no database stores it, and no response could carry it) and ``NaN``/``Infinity`` (not JSON numbers; Python's
  parser accepts them);
- in the path and the query string: a NUL character (they hold ids and names, which the databases store as text and
  PostgreSQL refuses NUL in).

Thread metadata, which the databases query as JSON, may not hold NUL characters either; the request models check it
(see :mod:`haystack_state.server._models`), with the same function, :func:`haystack_state._text.find_bad_text`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from haystack_state._text import find_bad_text, text_problem
from haystack_state.server._context import Caller, Server, UserDep
from haystack_state.server._wire import WireError

__all__ = ["CallerDep", "check_request", "check_text", "checked_caller"]

_HINT = "text must be valid Unicode: a \\uD800-\\uDFFF escape only as half of a surrogate pair"


async def check_request(request: Request, _: UserDep) -> None:
    """
    Refuse a request whose text cannot be stored or queried (see the module docstring).

    :raises WireError: HTTP 422 naming the field (``input.messages.0.content``; the path or query parameter).
    """
    await check_text(request)


async def checked_caller(request: Request) -> Caller:
    """
    The request's server and user, its text checked: :func:`check_request` and the user in one dependency (each
    dependency costs FastAPI some work per request; the runs router, the busiest, takes this one only).

    :raises HTTPException: 401 if the server's ``auth`` refuses the request.
    :raises WireError: As :func:`check_request`.
    """
    server: Server = request.app.state.server
    user = await server.user(request)
    await check_text(request)
    return Caller(server, user)


CallerDep = Annotated[Caller, Depends(checked_caller)]


async def check_text(request: Request) -> None:
    """The checks of :func:`check_request`."""
    for name, value in (*request.path_params.items(), *request.query_params.multi_items()):
        problem = text_problem(value, nul=True) if isinstance(value, str) else None
        if problem is not None:
            raise WireError(name, problem)
    if not await request.body():
        return
    try:
        data = await request.json()  # parsed once: FastAPI reads the same cached body
    except ValueError:
        return  # not JSON: the route's own validation answers
    found = find_bad_text(data, finite=True)
    if found is not None:
        hint = "" if found.problem.endswith("JSON number") else f"; {_HINT}"
        raise WireError(found.wire_path("") or "body", found.problem + hint)
