"""The dashboard at ``/``: the data it shows, gathered here, drawn by :mod:`api.dashboard`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from dp_governor.api._caches import Caches, FiguresPending
from dp_governor.api._handles import ledger_engine, policy_store
from dp_governor.api._session import signed_in
from dp_governor.api.dashboard import EstimatePanel, render_dashboard, render_pending
from dp_governor.api.deps import AdminCredential, CachesDep, ClockDep, IngestorDep, LedgerDep
from dp_governor.api.errors import UNAUTHORIZED, HttpError
from dp_governor.api.routes.signin import sign_in_page
from dp_governor.budget import Clock, Ledger, UnknownUseCase, utc_day
from dp_governor.mechanisms import Discovering
from dp_governor.pipeline.fold import load_sketch
from dp_governor.pipeline.ingest import Ingestor

__all__ = ["render_page", "router"]

router = APIRouter()


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard(
    request: Request,
    ledger: LedgerDep,
    ingestor: IngestorDep,
    admin: AdminCredential,
    caches: CachesDep,
    clock: ClockDep,
    estimate: Annotated[str | None, Query(max_length=63)] = None,
    candidates: Annotated[list[str] | None, Query(max_length=1000)] = None,
) -> HTMLResponse:
    """The dashboard page (:mod:`dp_governor.api.dashboard`).

    Public: the chain's status as the last ``verify`` job found it, policies and caps,
    accepted and refused reports per day, the effective-epsilon report, cumulative epsilon
    and histograms, as the last ``dashboard`` job computed them (:mod:`dp_governor.api.
    _snapshots`; the page states their age), drawn into one cached page whatever the query:
    no request scans the ledger. Estimates are
    what ``GET .../estimates`` and ``.../discoveries`` protect, so with the admin token only:
    SFP's words, and with
    ``?estimate=NAME&candidates=...`` a dictionary's estimates. A browser proves the token
    through the sign-in form (a session cookie, :mod:`dp_governor.api._session`): asking for
    estimates without it shows that form (401); other clients get the JSON 401. While the
    figures are computed for the policies in force (after a policy edit), a page that says so
    and reloads itself (503).
    """
    try:
        return _dashboard(request, ledger, ingestor, admin, caches, clock, estimate, candidates)
    except FiguresPending as pending:
        page = render_pending(detail=pending.detail, retry_after=pending.retry_after)
        return HTMLResponse(page, status_code=pending.status, headers=pending.headers)


def _dashboard(
    request: Request,
    ledger: Ledger,
    ingestor: Ingestor,
    admin: bool,
    caches: Caches,
    clock: Clock,
    estimate: str | None,
    candidates: list[str] | None,
) -> HTMLResponse:
    """The page for this request: the public one (cached), an admin's, or the sign-in form."""
    admin = admin or signed_in(request)
    if not admin:
        if estimate is not None or candidates:
            if "text/html" in request.headers.get("accept", ""):  # a browser: the form
                where = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return sign_in_page(where, status=UNAUTHORIZED)
            raise HttpError(
                UNAUTHORIZED,
                "estimates on the dashboard need `Authorization: Bearer <admin token>`,"
                " as `GET /v1/use-cases/{name}/estimates` does",
            )
        figures = caches.figures(ledger)
        verified = caches.snapshots.verified(ledger_engine(ledger))
        stamp = (
            figures.computed_at,
            "" if verified is None else verified.at,
            repr(ledger.book_revision()),
        )
        page = caches.public_page(
            stamp, lambda: render_page(ledger, ingestor, caches, clock, None, None)
        )
        return HTMLResponse(page)
    page = render_page(ledger, ingestor, caches, clock, estimate, candidates or [])
    return HTMLResponse(page, headers={"Cache-Control": "private, no-store"})


def render_page(
    ledger: Ledger,
    ingestor: Ingestor,
    caches: Caches,
    clock: Clock,
    estimate: str | None,
    candidates: list[str] | None,
) -> str:
    """The dashboard's HTML; ``candidates`` None: the public page, with no estimates."""
    now = clock.now()
    today = utc_day(now)
    policies = policy_store(ledger).list()
    if estimate is not None and estimate not in {p.name for p in policies}:
        raise UnknownUseCase(estimate)
    panels = []
    for p in policies if candidates is not None else []:
        if p.mechanism != "sfp" and p.name != estimate:
            continue
        sketch, days = load_sketch(ledger, ingestor, p, today - p.retention_days + 1, today)
        if isinstance(sketch, Discovering):
            found = caches.discovery(p, days, sketch)
            rows = [(w.word, w.count, w.stderr) for w in found]
            panels.append(EstimatePanel(p.name, f"{p.name}: discovered words", sketch.n, rows))
        elif candidates:
            est = sketch.estimate(candidates)
            rows = sorted(
                (
                    (str(c), float(n), float(s))
                    for c, n, s in zip(est.candidates, est.counts, est.stderr, strict=True)
                    if n >= p.publish_threshold
                ),
                key=lambda r: -r[1],
            )
            panels.append(EstimatePanel(p.name, f"{p.name}: estimates", est.n, rows))
    hint = (
        "With the admin token, ?estimate=USE_CASE&candidates=a&candidates=b adds a"
        " dictionary's estimates (and SFP's discovered words)."
    )
    figures = caches.figures(ledger)
    verified = caches.snapshots.verified(ledger_engine(ledger))
    return render_dashboard(
        policies=policies,
        report=figures.report,
        series=figures.series,
        distributions=[s.distribution(20) for s in figures.spends if s.scope == "window"],
        estimates=panels,
        activity=figures.activity,
        chain=None if verified is None else verified.verification,
        health=ingestor.health.lines(),
        verified_at=None if verified is None else datetime.fromisoformat(verified.at),
        figures_at=datetime.fromisoformat(figures.computed_at),
        now=now,
        admin=candidates is not None,
        hint=hint + " JSON for all of this: /v1/audit/effective-epsilon, /v1/audit/use-cases/"
        "NAME/distribution, /v1/audit/verify; API documentation at /docs.",
    )
