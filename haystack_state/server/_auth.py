"""
A ready-made ``auth`` for :func:`~haystack_state.server.create_app`: API keys mapped to users, and the ``key=user``
lines that ``haystack-state serve --auth-keys`` reads them from.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from fastapi import Request

__all__ = ["api_key_auth", "parse_api_keys"]


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


def parse_api_keys(text: str, *, source: str = "API keys") -> dict[str, str]:
    """
    Read API keys from ``key=user`` lines: the user id follows the last ``=`` (a key may end in base64's ``=``
    padding). Blank lines and lines starting with ``#`` are skipped; a comment cannot follow a key on its line. One
    user may have several keys (to rotate them); a key names one user.

    ```python
    keys = parse_api_keys(Path("keys.txt").read_text(), source="keys.txt")
    app = create_app({"agent": agent}, auth=api_key_auth(keys))
    ```

    :param text: The lines.
    :param source: What the lines come from, to name it in errors.
    :returns: API key -> user id.
    :raises ValueError: Naming the source and the line (never the key), for a line that is not ``key=user``, an
        empty key or user, whitespace inside one, a key given twice, or no keys at all.
    """
    keys: dict[str, str] = {}
    lines_of: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, user = line.rpartition("=")
        where = f"{source} line {number}"
        if not equals:
            raise ValueError(f"{where}: not a key=user line")
        key, user = key.strip(), user.strip()
        if not key:
            raise ValueError(f"{where}: the key before '=' is empty")
        if not user:
            raise ValueError(f"{where}: the user after the last '=' is empty")
        if any(char.isspace() for char in key + user):
            raise ValueError(f"{where}: the key or the user contains whitespace (a comment needs a line of its own)")
        if key in keys:
            raise ValueError(f"{where}: the same key as line {lines_of[key]}")
        keys[key], lines_of[key] = user, number
    if not keys:
        raise ValueError(f"{source} has no key=user line")
    return keys
