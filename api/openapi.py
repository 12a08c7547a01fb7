"""The OpenAPI document's examples and descriptions, the admin security scheme, offline /docs.

The routes and :mod:`dp_governor.api.schemas` describe themselves; what this module adds to the
generated document is what they cannot carry:

- a description for each field of FastAPI's validation error (:data:`DOMAIN_FIELDS`); every
  other model describes its own fields (:mod:`dp_governor.api.schemas`);
- an example response for every operation and an example body for every error status, recorded
  from a real server (``openapi_examples.json``; a test checks each against its schema);
- an example value for every path, query and header parameter (the routes describe them);
- the report body's schema, one of ``HcmsReportBody``, ``CmsReportBody`` and ``SfpReportBody``,
  each its mechanism's own description (``BODY_SHAPE``, beside its ``parse_report``): the route
  reads its body as plain JSON, which the ingestor checks against the use case's policy;
- error answers as JSON with :class:`dp_governor.api.schemas.ErrorBody`, on every route
(``/metrics``
  answers its metrics as text, but its errors as JSON like every other route's);
- the admin operations' ``adminToken`` bearer scheme comes from
:data:`dp_governor.api.deps.ADMIN_BEARER`;
  the two routes a device or an admin may call say that either is accepted.

``/docs`` and ``/redoc`` serve Swagger UI and ReDoc from the ``fastapi-offline`` package's
files (mounted at ``/docs-assets``): the pages load nothing from the internet.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from dp_governor.api.schemas import REPORT_BODY_SCHEMAS

__all__ = ["ASSETS", "DOMAIN_FIELDS", "PARAMETER_EXAMPLES", "install_docs", "install_openapi"]

ASSETS = "/docs-assets"
_EXAMPLES: dict[str, Any] = json.loads(
    files("dp_governor.api").joinpath("openapi_examples.json").read_text(encoding="utf-8")
)
_ERROR_TEXT = {
    400: "400: a header sent twice",
    401: "401: no credentials",
    403: "403: a wrong admin token",
    404: "404: an unknown use case",
    409: "409: an idempotency key reused for another report",
    413: "413: a batch over the item limit",
    422: "422: a field that is wrong, named",
    429: "429: a cap reached (`Retry-After` says when to retry)",
}

PARAMETER_EXAMPLES: dict[str, Any] = {
    "name": "emoji",
    "device_id": "device-000000",
    "X-Device-Id": "device-000000",
    "Idempotency-Key": "2026-11-23-emoji-1",
    "job": "aggregate",
    "force": False,
    "wait": 60.0,
    "candidates": ["😂", "❤️"],
    "from": "2026-11-01",
    "to": "2026-11-23",
    "delta": 1e-9,
    "scope": "window",
    "bins": 20,
    "allow_loosen": False,
    "group": "safari-domains",
    "start": 0,
    "end": 2,
    "old": 1,
    "new": 4,
    "day": "2026-11-23",
}

# Operations whose lock is optional: a device (its own id in X-Device-Id) or an admin may call
# the first three; the report is public, and at another `delta` admin only.
_OPTIONAL_LOCK = {
    ("get", "/v1/devices/{device_id}/budget"),
    ("get", "/v1/audit/devices/{device_id}"),
    ("get", "/v1/devices/{device_id}/tlog"),
    ("get", "/v1/audit/effective-epsilon"),
}

DOMAIN_FIELDS: dict[str, dict[str, str]] = {
    "HTTPValidationError": {"detail": "The field errors."},
    "ValidationError": {
        "loc": "Where the error is: `body`, `query`, `path` or `header`, then the field.",
        "msg": "What is wrong.",
        "type": "The error's kind.",
        "input": "The value refused.",
        "ctx": "The constraint's parameters.",
    },
}


def _document(app: FastAPI) -> dict[str, Any]:
    """The generated document with the examples, descriptions and optional locks added."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(REPORT_BODY_SCHEMAS)  # the report route reads its body as plain JSON
    for name, fields in DOMAIN_FIELDS.items():
        props = schemas.get(name, {}).get("properties", {})
        for field, text in fields.items():
            if field in props:
                props[field].setdefault("description", text)
    recorded: dict[str, dict[str, Any]] = _EXAMPLES["responses"]
    errors: dict[str, Any] = _EXAMPLES["errors"]
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                if param["name"] in PARAMETER_EXAMPLES:
                    param.setdefault("example", PARAMETER_EXAMPLES[param["name"]])
            if (method, path) in _OPTIONAL_LOCK:
                op["security"] = [{}, {"adminToken": []}]
            for status, body in recorded.get(f"{method} {path}", {}).items():
                content = op["responses"].setdefault(status, {"description": "OK"})
                kind = "text/plain" if isinstance(body, str) else "application/json"
                content.setdefault("content", {}).setdefault(kind, {})["example"] = body
            for status, response in op["responses"].items():
                if status in errors:  # always JSON, whatever the route answers when it succeeds
                    media = response.get("content", {}).get("application/json", {})
                    media.setdefault("schema", {"$ref": "#/components/schemas/ErrorBody"})
                    media.setdefault("example", errors[status])
                    response["content"] = {"application/json": media}
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`_document` as ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_docs(app: FastAPI) -> None:
    """``/docs`` and ``/redoc`` from packaged files (create the app with docs_url=None)."""
    static = files("fastapi_offline").joinpath("static")
    app.mount(ASSETS, StaticFiles(directory=str(static)), name="docs-assets")
    oauth = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - API reference",
            oauth2_redirect_url=oauth,
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        )

    @app.get(oauth, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - API reference",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
