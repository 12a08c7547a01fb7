"""The dashboard's sign-in: a browser proves the admin token once and keeps a session cookie.

A browser cannot send ``Authorization: Bearer``, so the dashboard (and only the dashboard: the
API's admin routes still take the header alone, which no other site can make a browser send)
accepts a cookie set by its sign-in form. The cookie holds no token: it is an expiry time and
an HMAC-SHA256 of that time under a key derived from the admin token, so changing the token
ends every session, and a cookie cannot be forged or extended without the token. It is
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's link or form sends
it), ``Secure`` over HTTPS, and lasts :data:`SESSION_SECONDS`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Final
from urllib.parse import urlsplit

from fastapi import Request, Response

__all__ = [
    "COOKIE",
    "SESSION_SECONDS",
    "clear_session",
    "issue",
    "local_path",
    "same_origin",
    "set_session",
    "signed_in",
    "valid",
]

COOKIE: Final = "dpgov_dashboard"
SESSION_SECONDS: Final = 8 * 3600  # a working day, then the token again
_PURPOSE: Final = b"dp-governor dashboard session v1"


def _key(token: bytes) -> bytes:
    """The session key: the admin token never signs anything else directly."""
    return hmac.new(token, _PURPOSE, hashlib.sha256).digest()


def issue(token: bytes, now: float) -> str:
    """A session value valid until ``now + SESSION_SECONDS``: ``expiry.mac``.

    >>> value = issue(b"t" * 32, 1000.0)
    >>> value.split(".")[0], valid(b"t" * 32, value, 1000.0), valid(b"u" * 32, value, 1000.0)
    ('29800', True, False)
    """
    expires = int(now) + SESSION_SECONDS
    mac = hmac.new(_key(token), str(expires).encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}"


def valid(token: bytes, value: str, now: float) -> bool:
    """Whether ``value`` was issued under ``token`` and has not expired (constant-time)."""
    expires, _, mac = value.partition(".")
    if not token or not expires.isdigit() or len(expires) > 12 or int(expires) <= now:
        return False
    expected = hmac.new(_key(token), expires.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac.encode(), expected.encode())


def signed_in(request: Request) -> bool:
    """Whether the request carries a valid dashboard session for this server's admin token."""
    value = request.cookies.get(COOKIE)
    expected = request.app.state.settings.admin_token
    if not value or expected is None:
        return False
    return valid(expected.get_secret_value().encode(), value, time.time())


def set_session(response: Response, request: Request, token: bytes) -> None:
    """Give the browser a new session cookie."""
    response.set_cookie(
        COOKIE,
        issue(token, time.time()),
        max_age=SESSION_SECONDS,
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def clear_session(response: Response, request: Request) -> None:
    """End the browser's session (its cookie expires now)."""
    response.delete_cookie(
        COOKIE, path="/", secure=request.url.scheme == "https", httponly=True, samesite="strict"
    )


def local_path(target: str | None) -> str:
    """``target`` if it is a path on this server (where to go after signing in), else ``/``.

    Never another site (``//evil.example``, ``https://...``, a backslash after the slash):
    that would be an open redirect.

    >>> local_path("/?estimate=emoji"), local_path("//evil.example/"), local_path(None)
    ('/?estimate=emoji', '/', '/')
    """
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or any(c in target for c in "\r\n"):
        return "/"
    return target


def same_origin(request: Request) -> bool:
    """False when the browser says the form was posted from another site (``Origin``).

    A form on another site could otherwise sign a browser in under the attacker's token.
    No ``Origin`` (an old browser, a command-line client) is let through: the token decides.
    """
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    parts = urlsplit(origin)
    return origin != "null" and parts.netloc == host
