"""
The Agent Protocol server: :func:`create_app` serves one or more Agents over HTTP (threads, runs, SSE streams) with
a thread inspector at ``/ui``; ``haystack-state serve module:agent`` runs it.

It needs the ``server`` extra (``pip install "haystack-state[server]"``: FastAPI, uvicorn, sse-starlette). The
names below are imported on first use, so that ``haystack_state.server.cli`` (and the ``haystack-state`` command)
load without the extra; using them without it raises an ``ImportError`` that names the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haystack_state.server._app import create_app as create_app
    from haystack_state.server._auth import api_key_auth as api_key_auth
    from haystack_state.server._context import Limits as Limits

__all__ = ["Limits", "api_key_auth", "create_app"]

EXTRA_HINT = 'The haystack-state server needs the server extra: pip install "haystack-state[server]"'


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from haystack_state.server import _app as app
        from haystack_state.server import _auth as auth
        from haystack_state.server import _context as context
    except ImportError as error:
        if error.name in ("fastapi", "starlette", "uvicorn", "sse_starlette", "anyio"):
            raise ImportError(f"{EXTRA_HINT} ({error})") from error
        raise
    return {"create_app": app.create_app, "api_key_auth": auth.api_key_auth, "Limits": context.Limits}[name]
