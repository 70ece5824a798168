"""A ready-made ``auth`` for :func:`~haystack_state.server.create_app`: API keys mapped to users."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from fastapi import Request

__all__ = ["api_key_auth"]


def api_key_auth(keys: Mapping[str, str], *, header: str = "x-api-key") -> Callable[[Request], str | None]:
    """
    An ``auth`` callable that maps API keys to user ids. The key comes in the ``x-api-key`` header (as LangGraph's
    SDK sends ``api_key``), or as ``Authorization: Bearer KEY``; a request without a known key is refused (401).

    ```python
    app = create_app({"agent": agent}, auth=api_key_auth({"key-of-alice": "alice", "key-of-bob": "bob"}))
    ```

    :param keys: API key -> user id.
    :param header: The header that carries the key.
    :returns: The callable.
    :raises ValueError: For an empty key or user id.
    """
    table = dict(keys)
    if any(not key or not user for key, user in table.items()):
        raise ValueError("api_key_auth: every API key and user id must be a non-empty string.")

    def authenticate(request: Request) -> str | None:
        given = request.headers.get(header)
        if given is None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            given = token if scheme.lower() == "bearer" else None
        if not given:
            return None
        for key, user in table.items():  # compare every key in constant time
            if hmac.compare_digest(key.encode(), given.encode()):
                return user
        return None

    return authenticate
