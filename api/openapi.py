"""The OpenAPI document's examples and descriptions, the admin security scheme, offline /docs.

The routes and :mod:`dp_governor.api.schemas` describe themselves; what this module adds to the
generated document is what they cannot carry:

- a description for each field of the domain types the API returns (:mod:`budget` dataclasses,
  :class:`dp_governor.policies.PolicyPublic`, FastAPI's validation error): those packages know
  nothing of HTTP, so the service describes them where it publishes them (:data:`DOMAIN_FIELDS`);
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
    "candidates": ["😂", "❤️"],
    "from": "2026-11-01",
    "to": "2026-11-23",
    "delta": 1e-9,
    "scope": "window",
    "bins": 20,
    "allow_loosen": False,
    "group": "safari-domains",
}

# Operations a device (its own id in X-Device-Id) or an admin may call: the lock is optional.
_DEVICE_OR_ADMIN = {
    ("get", "/v1/devices/{device_id}/budget"),
    ("get", "/v1/audit/devices/{device_id}"),
}

_LOSS = {
    "events": "Charges composed.",
    "epsilon_basic": "The plain sum of the charges' epsilons (a valid bound at delta 0).",
    "epsilon": "The smaller valid epsilon at `delta` (see `bound`).",
    "delta": "The delta `epsilon` holds at (0 for the basic sum).",
    "method": "How `epsilon` was composed (`basic`, `rdp`, `pld`...).",
    "group_size": "Group-privacy factor applied (devices per person).",
    "accountant": "The accountant and library version that computed it.",
    "bound": "What `epsilon` is: `basic sum` or the tight bound's name.",
    "kind": "`running total` (what was actually sent) or `worst case` (the caps' schedule).",
    "note": "In a sentence, what the figure guarantees and what it does not.",
}
DOMAIN_FIELDS: dict[str, dict[str, str]] = {
    "DeviceWide": {
        "version": "The device-wide budget version in force.",
        "figure": "What the figures are: basic composition of epsilon x group size (delta 0).",
        "epsilon_per_day": "Epsilon a device may spend per UTC day across use cases; null: none.",
        "window_days": "Length of the device-wide window in days; null: no window limit.",
        "window_epsilon": "Epsilon a device may spend per window; null: no window limit.",
        "lifetime_epsilon": "Epsilon a device may spend over its lifetime; null: no limit.",
        "epsilon_today": "Epsilon this device spent today, all use cases.",
        "epsilon_window": "Epsilon it spent in the device-wide window, all use cases.",
        "epsilon_lifetime": "Epsilon it spent over its lifetime, all use cases.",
        "today_remaining": "Epsilon left today; null without a daily limit.",
        "window_remaining": "Epsilon left in the window; null without a window limit.",
        "lifetime_remaining": "Epsilon left for the lifetime; null without a lifetime limit.",
        "use_cases": "Each use case's spend against its quota of the device-wide budget.",
        "window_filter_epsilon": "Window (epsilon, delta) filter target: epsilon; null: none.",
        "window_filter_delta": "Window (epsilon, delta) filter target: delta; null: none.",
        "lifetime_filter_epsilon": "Lifetime (epsilon, delta) filter target: epsilon; null: none.",
        "lifetime_filter_delta": "Lifetime (epsilon, delta) filter target: delta; null: none.",
    },
    "QuotaStatus": {
        "use_case": "The use case.",
        "share": "Its quota: the share of each device-wide limit it may use; null: no quota.",
        "epsilon_today": "Epsilon it spent today.",
        "epsilon_window": "Epsilon it spent in the device-wide window.",
        "epsilon_lifetime": "Epsilon it spent over the device's lifetime.",
        "today_remaining": "Epsilon left today within its quota; null: no limit.",
        "window_remaining": "Epsilon left in the window within its quota; null: no limit.",
        "lifetime_remaining": "Epsilon left for the lifetime within its quota; null: no limit.",
    },
    "DeviceOdometer": {
        "reports": "Reports the device sent over its lifetime.",
        "basic_epsilon": "Sum of each report's epsilon x group size (pure, delta 0).",
        "odometer_epsilon": "The mixture odometer's running epsilon at `delta`, valid under"
        " fully adaptive composition at every time at once (never above the basic sum).",
        "delta": "The delta the odometer's epsilon holds at.",
        "figure": "What the two figures are, in words.",
    },
    "BudgetStatus": {
        "use_case": "The use case.",
        "budget": "The budget its caps count against (its budget group, else itself).",
        "policy_version": "The policy version in force.",
        "epsilon_per_report": "Epsilon charged for one report.",
        "max_reports_per_day": "The daily cap: reports a device may send per UTC day.",
        "reports_today": "Reports this device sent today (UTC) against this budget.",
        "reports_left_today": "Reports it may still send today.",
        "epsilon_today": "Epsilon it spent today against this budget.",
        "epsilon_window": "Epsilon it spent in the retention window (basic sum).",
        "epsilon_lifetime": "Epsilon it spent over its lifetime (basic sum).",
        "window_cap": "Epsilon the budget allows per window; null: no window cap.",
        "window_remaining": "Epsilon left in the window; null without a window cap.",
        "lifetime_cap": "Epsilon the budget allows per lifetime; null: no lifetime cap.",
        "lifetime_remaining": "Epsilon left for the lifetime; null without a lifetime cap.",
        "next_reset": "When the daily count starts again (next UTC midnight).",
    },
    "DeviceLoss": {
        "window": "Per use case, the loss over the retention window.",
        "lifetime": "Per use case, the loss over the device's lifetime.",
        "window_total": "All use cases composed, over the window; null without charges.",
        "lifetime_total": "All use cases composed, over the lifetime; null without charges.",
    },
    "DeviceTotals": {
        "allowed_per_day": "What the caps allow one device per day, all use cases composed.",
        "allowed_per_window": "What the caps allow one device per window, composed.",
        "allowed_per_year": "What the caps allow one device per year, composed.",
        "spent_window": "What devices actually spent in the window, all use cases (basic sums).",
        "spent_lifetime": "What devices actually spent over their lifetimes (basic sums).",
        "device_bound_window": "Each device's own tight bound over the window; null if none.",
        "device_bound_lifetime": "Each device's own tight bound over its lifetime; null if none.",
    },
    "Distribution": {
        "use_case": "The use case.",
        "scope": "`window` (the retention window) or `lifetime`.",
        "devices": "Devices with at least one charge in the scope.",
        "quantiles": "p50, p90, p99 and max of per-device epsilon.",
        "bin_edges": "Histogram bin edges (epsilon), one more than `counts`.",
        "counts": "Devices per bin.",
    },
    "EffectiveEpsilonReport": {
        "as_of": "The UTC day the report is for.",
        "use_cases": "One line per active use case.",
        "totals": "Across all use cases, per device.",
        "provenance": "How it was computed: accountant, library versions, delta, settings.",
        "central": "Per use case, the central epsilon of its shuffled batches.",
        "computed_at": "When its figures were read from the ledger (UTC, ISO 8601).",
    },
    "LossSpread": {
        "devices": "Devices counted.",
        "distinct_ledgers": "Distinct charge histories composed (devices alike share one).",
        "delta": "The delta each device's bound holds at.",
        "max": "The largest device's epsilon at `delta`.",
        "p99": "The 99th percentile device's epsilon at `delta`.",
        "median": "The median device's epsilon at `delta`.",
        "basic_max": "The largest basic sum, for comparison.",
        "bounds": "Devices by what their figure is (the bound's name).",
        "kind": _LOSS["kind"],
        "note": _LOSS["note"],
    },
    "PrivacyLoss": _LOSS,
    "Series": {
        "reports": "Reports charged per day.",
        "epsilon": "Epsilon charged per day.",
        "window": "Epsilon in the retention window ending each day (cumulative).",
        "lifetime": "Lifetime epsilon at the end of each day (cumulative).",
    },
    "Spread": {
        "devices": "Devices counted.",
        "max": "The largest per-device sum.",
        "p99": "The 99th percentile per-device sum.",
        "median": "The median per-device sum.",
        "bound": _LOSS["bound"],
        "kind": _LOSS["kind"],
        "note": _LOSS["note"],
    },
    "Timeline": {
        "days": "The UTC days (ISO dates), oldest first; every series is aligned with them.",
        "use_cases": "Per use case, its daily series.",
        "total": "All use cases summed per day.",
        "loss": "The device's composed loss, per use case and in total, as for a schedule fixed"
        " in advance.",
        "odometer": "Its lifetime running total valid however its reports were chosen: the"
        " basic sum and the odometer reading (docs/odometer.md says which to quote when).",
        "central": "Per use case, the central epsilon of the shuffled batches it was in.",
    },
    "EpsilonAdvice": {
        "use_case": "The use case.",
        "mechanism": "`cms`, `hcms` or `sfp`.",
        "epsilon_per_report": "Local epsilon per report.",
        "sketches": "Each sketch the use case publishes (SFP: word and fragment).",
        "epsilon_same_accuracy": "The epsilon at which the best known frequency oracle is as"
        " accurate (summed over the sketches).",
        "wasted_fraction": "1 - epsilon_same_accuracy / epsilon_per_report.",
        "warning": "Set when more than a quarter of the epsilon is wasted.",
        "reference": "The oracle compared against, and its variance.",
    },
    "SketchAdvice": {
        "part": "`report`, or SFP's `word` or `fragment`.",
        "mechanism": "`cms` or `hcms`.",
        "epsilon": "The sketch's epsilon per report.",
        "variance": "Exact per-report variance of a rare item's estimate (mechanisms.variance).",
        "optimal_variance": "The best known oracle's per-report variance at the same epsilon.",
        "ratio": "variance / optimal_variance.",
        "epsilon_same_accuracy": "The epsilon at which the best known oracle matches it.",
    },
    "UseCaseLine": {
        "epsilon_advice": "The mechanism against the best known frequency oracle at equal"
        " epsilon, and the epsilon that would give the same accuracy.",
        "use_case": "The use case.",
        "policy_version": "The policy version in force.",
        "mechanism": "`cms`, `hcms` or `sfp`.",
        "budget": "The budget its caps count against.",
        "shares_budget_with": "The other use cases of its budget group.",
        "epsilon_per_report": "Epsilon charged per report.",
        "reports_per_day": "The daily cap (reports per device and UTC day).",
        "retention_days": "The retention window, in days.",
        "group_size": "Group-privacy factor (devices per person).",
        "epsilon_per_day": "Epsilon one device may spend per day under the caps.",
        "epsilon_per_window": "Epsilon one device may spend per window under the caps.",
        "epsilon_per_year": "Epsilon one device may spend per year under the caps.",
        "group_epsilon_per_day": "Per day for a person with `group_size` devices.",
        "window_cap": "The window epsilon cap; null: none.",
        "lifetime_cap": "The lifetime epsilon cap; null: none.",
        "lifetime_bounded": "Whether a cap bounds a device's lifetime spend.",
        "lifetime_note": "What bounds (or fails to bound) the lifetime spend, in a sentence.",
        "lifetime_bound": "The lifetime loss bound stated: the larger of the lifetime cap and"
        " the most any device spent on what the budget counts (null: none).",
        "spent_window": "What devices actually spent in the window.",
        "spent_lifetime": "What devices actually spent over their lifetimes.",
        "spent_budget_lifetime_max": "The most any device spent on what its budget's caps count"
        " (its members' history and every charge made under it).",
        "devices_over_lifetime_cap": "Devices that spent more than the lifetime cap before it"
        " was lowered: it admits nothing more to them.",
        "spent_budget_window_max": "The most any device holds in the window on what its"
        " budget's caps count.",
        "devices_over_window_cap": "Devices whose window holds more than the window cap (spent"
        " before it was lowered): it admits nothing more to them until enough leaves.",
        "window_note": "Empty, or why some devices hold more than the window cap, in a sentence.",
    },
    "WhatIf": {
        "use_case": "The use case.",
        "current_version": "The policy version the proposal is compared with.",
        "devices_in_window": "Devices with charges in the window, current and proposed.",
        "refused_next_report_today": "Devices whose next report today would be refused.",
        "over_window_cap": "Devices over the window cap, current and proposed.",
        "over_lifetime_cap": "Devices over the lifetime cap, current and proposed.",
        "effective_epsilon": "The use case's report line, current and proposed.",
        "totals_allowed_per_day": "All use cases composed per day, current and proposed.",
        "loosens": "What writing the proposal would loosen (it then needs `allow_loosen`).",
    },
    "PolicyPublic": {
        "description": "What the use case collects, in a sentence.",
        "epsilon_per_report": "Epsilon charged per report (CMS, HCMS; SFP: word + fragment).",
        "max_reports_per_day": "The daily cap: reports per device and UTC day.",
        "retention_days": "Days the data and charges are kept: the window of the window cap and"
        " of the window filter.",
        "group_size": "Group-privacy factor: devices per person.",
        "delta": "The delta the tight bounds are computed at.",
        "version": "The policy version (a new one at each change).",
        "active": "False once the use case is retired.",
        "created_at": "When this version was made (UTC).",
        "actor": "Who made it (`admin`, `defaults`, `policy-file`...).",
    },
    "CentralLoss": {
        "epsilon": "The central epsilon after shuffling, at `delta`.",
        "delta": "The delta it holds at.",
        "sub_batches": "Sub-batches composed (one report per device each).",
        "reports_per_device": "The reports per device the figure covers.",
        "method": "How the sub-batches were composed.",
        "note": _LOSS["note"],
        "kind": "What the figure is: `one batch`, `fixed schedule` (the smallest sub-batches"
        " composed as a schedule fixed in advance), `running total` (the same for one device's"
        " own reports) or `valid under adaptive choices`.",
    },
    "BatchFigure": {
        "published": "When the batch was published (UTC).",
        "first_day": "The first UTC day its reports were charged on.",
        "last_day": "The last UTC day its reports were charged on.",
        "devices": "Distinct devices in the batch.",
        "reports": "Reports in the batch.",
        "max_per_device": "The most reports one device has in it.",
        "layers": "Devices with at least 1, 2, ... reports in it (the sub-batch sizes).",
        "untagged": "Reports queued with no device pseudonym (each counted unamplified).",
        "epsilon_per_report": "The largest local epsilon of its reports.",
        "min_batch_devices": "The policy's least devices per published batch.",
        "central": "The batch's own central bound; null when none holds.",
    },
    "DayFigure": {
        "day": "The UTC day the batches were published.",
        "published": "Batches published that day.",
        "devices": "Devices summed over those batches.",
        "reports": "Reports summed over those batches.",
        "batches": "The smallest batches of the day (those bound the figure).",
        "composed": "The day's batches composed for one device; null when none holds.",
    },
    "CentralLine": {
        "use_case": "The use case.",
        "epsilon_per_report": "Local epsilon per report.",
        "reports_per_day": "The daily cap (reports per device and UTC day).",
        "min_batch_devices": "The policy's least devices per published batch.",
        "delta": "The delta of the central figures.",
        "days": "Per UTC day with published batches, its figures.",
        "window": "Composed over the retention window; null when none holds.",
        "year": "Composed over a year; null when none holds.",
        "preconditions": "What the central figures assume (the shuffler's trust model).",
        "notes": "Why a figure is missing or weaker, when it is.",
        "window_adaptive": "Over the retention window, valid however batches, policies and"
        " reports are chosen after seeing earlier outputs; null when none holds.",
        "year_adaptive": "Over a year, valid under adaptive choices; null when none holds.",
    },
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
            if (method, path) in _DEVICE_OR_ADMIN:
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
