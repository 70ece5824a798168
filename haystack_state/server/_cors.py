"""
CORS: which browser pages, by origin, may call the server (Starlette's ``CORSMiddleware``), with the headers that
LangGraph's SDKs read exposed to them.

:func:`create_app` takes ``cors="*"`` (any origin), one origin, a list of origins, or None (no CORS headers: browsers
refuse cross-origin calls). ``haystack-state serve`` picks the default from the address it binds: any origin on a
loopback address, as LangGraph's dev server does, none elsewhere until ``--cors-origin`` names some.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

__all__ = ["ANY_ORIGIN", "EXPOSED_HEADERS", "Cors", "add_cors", "cors_for_host", "cors_origins", "is_loopback"]

ANY_ORIGIN = "*"

#: The response headers a cross-origin page may read: the SDKs find a new run's id in ``Content-Location``.
EXPOSED_HEADERS = ("Content-Location", "Location")

Cors = str | Sequence[str]
"""``"*"`` (any origin), one origin such as ``"http://localhost:3000"``, or several."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


def cors_origins(cors: Cors | None) -> list[str]:
    """
    The allowed origins of a ``cors`` setting, checked and in the form browsers send them (lower case, without a
    default port); ``["*"]`` for any origin, ``[]`` for none.

    :param cors: ``"*"``, an origin, a sequence of origins (one of them may be ``"*"``), or None.
    :raises ValueError: For a value that is not an origin (``scheme://host[:port]``, no path, not even ``/``).
    """
    if cors is None:
        return []
    given = [cors] if isinstance(cors, str) else list(cors)
    if ANY_ORIGIN in given:
        return [ANY_ORIGIN]
    origins: list[str] = []
    for origin in given:
        normal = _origin(origin)
        if normal not in origins:
            origins.append(normal)
    return origins


def _origin(value: object) -> str:
    problem = f"cors: {value!r} is not an origin: give scheme://host[:port], as in http://localhost:3000"
    if not isinstance(value, str):
        raise ValueError(problem)
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError as error:
        raise ValueError(f"{problem} ({error})") from error
    if not parts.scheme or not parts.hostname or parts.username is not None or parts.password is not None:
        raise ValueError(problem)
    if parts.path or parts.query or parts.fragment or value.strip().endswith(("?", "#")):
        raise ValueError(f"{problem}, without a path (a browser's Origin header has none, not even a final '/')")
    scheme, host = parts.scheme.lower(), parts.hostname.lower()
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"{scheme}://{host}" if port is None or _DEFAULT_PORTS.get(scheme) == port else f"{scheme}://{host}:{port}"


def add_cors(app: FastAPI, cors: Cors | None) -> None:
    """
    Answer CORS preflights on every route and add CORS headers to the answers, for the origins of ``cors`` (nothing
    for None or no origins). Add it last, outside the other middleware, so that their refusals (a 413) carry the
    headers too and a browser can read them.

    Every method and request header is allowed (``x-api-key`` among them: auth applies to the request that
    follows the preflight, not to the preflight). No credentials (cookies) are allowed: the server does not use
    them. Private network access (a public page calling a server on this machine or network, as the hosted chat UIs
    do) is allowed for the allowed origins.

    :param app: The app.
    :param cors: See :func:`cors_origins`.
    :raises ValueError: For a value that is not an origin.
    """
    origins = cors_origins(cors)
    if not origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins,
        allow_methods=["*"],
        allow_headers=["*"],
        allow_private_network=True,
        expose_headers=list(EXPOSED_HEADERS),
    )


def is_loopback(host: str) -> bool:
    """Whether a bind address is this machine only: ``localhost``, ``127.0.0.0/8`` or ``::1``."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def cors_for_host(host: str, origins: Sequence[str] | None) -> Cors | None:
    """
    The ``cors`` of a server bound to ``host``: the given origins if any, else any origin on a loopback address and
    none elsewhere.
    """
    if origins:
        return list(origins)
    return ANY_ORIGIN if is_loopback(host) else None
