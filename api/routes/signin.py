"""The dashboard's sign-in form: a browser enters the admin token and keeps a session cookie.

``GET /sign-in`` shows the form, ``POST /sign-in`` checks the token (bad tokens count toward
the same per-client limit as a bad ``Authorization`` header) and ``POST /sign-out`` ends the
session. The cookie opens the dashboard's estimates only (:mod:`dp_governor.api._session`).
"""

from __future__ import annotations

import hmac
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dp_governor.api._ratelimit import RateLimiter
from dp_governor.api._session import (
    clear_session,
    local_path,
    same_origin,
    set_session,
    signed_in,
)
from dp_governor.api.dashboard import render_sign_in
from dp_governor.api.errors import FORBIDDEN, REFUSED

__all__ = ["router", "sign_in_page"]

router = APIRouter(include_in_schema=False)
SEE_OTHER = 303  # after a form's POST, the browser GETs the next page


def sign_in_page(next_path: str, problem: str | None = None, status: int = 200) -> HTMLResponse:
    """The sign-in form, leading back to ``next_path`` (made local) once signed in."""
    page = render_sign_in(next_path=local_path(next_path), problem=problem)
    return HTMLResponse(page, status_code=status, headers={"Cache-Control": "no-store"})


@router.get("/sign-in", response_class=HTMLResponse)
def sign_in_form(
    request: Request, next_path: Annotated[str | None, Query(alias="next")] = None
) -> Response:
    """The form; a browser already signed in goes straight on."""
    if signed_in(request):
        return RedirectResponse(local_path(next_path), status_code=SEE_OTHER)
    return sign_in_page(next_path or "/")


@router.post("/sign-in", response_class=HTMLResponse)
async def sign_in(request: Request) -> Response:
    """Check the token posted by the form; a session cookie and the next page, or the form."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
    token = (fields.get("token") or [""])[0].strip()
    target = local_path((fields.get("next") or ["/"])[0])
    if not same_origin(request):
        return sign_in_page(target, "the form was sent from another site; sign in here", FORBIDDEN)
    expected = request.app.state.settings.admin_token
    if expected is None:
        problem = (
            "this server has no admin token: set DPGOV_ADMIN_TOKEN to at least 32 characters"
            " and restart it"
        )
        return sign_in_page(target, problem, FORBIDDEN)
    failures: RateLimiter = request.app.state.admin_failures
    client = request.client.host if request.client else "unknown"
    wait = failures.blocked(client)
    if wait:
        page = sign_in_page(target, f"too many bad tokens; try again in {wait} s", REFUSED)
        page.headers["Retry-After"] = str(wait)
        return page
    secret = expected.get_secret_value().encode()
    if not token or not hmac.compare_digest(token.encode(), secret):
        failures.hit(client)
        return sign_in_page(target, "the admin token is not valid", FORBIDDEN)
    response = RedirectResponse(target, status_code=SEE_OTHER)
    set_session(response, request, secret)
    return response


@router.post("/sign-out")
def sign_out(request: Request) -> Response:
    """End the browser's session and show the public dashboard."""
    response = RedirectResponse("/", status_code=SEE_OTHER)
    clear_session(response, request)
    return response
