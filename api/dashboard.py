"""The dashboard at ``/``: one server-rendered HTML page with inline SVG charts, no build step.

It shows the audit chain's status and age, the policies with their caps, reports accepted per
day and refusals per day by reason (a trend over the last days), the effective-epsilon report,
cumulative epsilon over the window per use case (the most-spent and the p99 device), the
population histogram per use case and, for admins only (the estimate routes' protection), the
latest estimates with 95% error bars (SFP discoveries, and any dictionary passed in the URL).
Everything else is public: counts and spreads, never a device. Every dynamic string is
HTML-escaped; the page runs no script. A browser signs in with the admin token through a
form (:func:`render_sign_in`, :mod:`dp_governor.api._session`) to see the estimates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

from dp_governor.api._session import SESSION_SECONDS
from dp_governor.api._verdict_text import checked_entries
from dp_governor.budget.audit.log import Verification
from dp_governor.budget.privacy.display import fmt_up
from dp_governor.budget.reporting.activity import Activity
from dp_governor.budget.reporting.central import PRECONDITIONS, CentralLine, CentralLoss
from dp_governor.budget.reporting.report import EffectiveEpsilonReport, LossSpread
from dp_governor.budget.reporting.series import CumulativeSeries
from dp_governor.budget.reporting.views import Distribution
from dp_governor.pipeline.health import HealthLine
from dp_governor.policies import Policy

__all__ = ["EstimatePanel", "render_dashboard", "render_sign_in"]

_CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:24px;color:#1d2430;background:#fafbfc}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:30px 0 8px}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d8dde3;padding:5px 9px;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#eef1f5}
.grid{display:flex;flex-wrap:wrap;gap:14px}.card{background:#fff;border:1px solid #d8dde3;
padding:10px 12px}.ok{color:#0a7d32;font-weight:600}.bad{color:#b3261e;font-weight:600}
.muted{color:#65707d}.key{display:inline-block;margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}
svg text{font:12px system-ui,sans-serif;fill:#3d4550}.grid-line{stroke:#e3e7ec}
"""
_HEALTH_ALERT = 0.01  # an implausible share above this is shown in red: far above chance (2e-9)
_EMPTY = '<p class="muted">no charges in the window</p>'
_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"]
_REASON_COLORS = {
    "daily_cap": "#ea580c",
    "window_cap": "#9333ea",
    "lifetime_cap": "#b3261e",
    "window_filter": "#0d9488",
    "lifetime_filter": "#1d4ed8",
    "clock_behind": "#4b5563",
}
_W, _H = 560, 250  # every chart's size: readable at a glance on a laptop screen
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 14, 12, 34


@dataclass(frozen=True, slots=True)
class EstimatePanel:
    """Estimates of one use case to draw: ``(item, count, stderr)`` rows, largest first."""

    use_case: str
    title: str
    n: int
    rows: Sequence[tuple[str, float, float]]


def _num(value: float | None) -> str:
    """A figure with six significant digits, rounded up (an epsilon printed is a bound)."""
    if value is None:
        return "none"
    return fmt_up(value)


def _age(seconds: float) -> str:
    """A duration as people read it: ``42 s``, ``5 min``, ``3 h 5 min``, ``2 days``."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
    return f"{seconds / 86400:.1f} days"


def _nice_top(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (an axis top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(float(m * power) for m in (1, 2, 2.5, 5, 10) if m * power >= value * (1 - 1e-12))


def _axes(top: float, labels: Sequence[str], aria: str) -> tuple[str, Any, Any]:
    """An SVG's frame: y gridlines with values, x labels; returns (head, x(i), y(value))."""
    n = len(labels)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(i: float) -> float:
        return _LEFT + plot_w * (i / max(n - 1, 1))

    def y(v: float) -> float:
        return _TOP + plot_h * (1 - v / top)

    parts = [f'<svg width="{_W}" height="{_H}" role="img" aria-label="{escape(aria)}">']
    for k in range(5):
        v = top * k / 4
        parts.append(
            f'<line class="grid-line" x1="{_LEFT}" y1="{y(v):.1f}" x2="{_W - _RIGHT}"'
            f' y2="{y(v):.1f}"/><text x="{_LEFT - 6}" y="{y(v) + 4:.1f}"'
            f' text-anchor="end">{_num(v)}</text>'
        )
    parts.append(
        f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_W - _RIGHT}" y2="{_TOP + plot_h}"'
        f' stroke="#8a94a0"/>'
    )
    step = max(1, math.ceil(n / 7))  # at most about eight labels, the last day always
    shown = [i for i in range(0, n, step) if n - 1 - i >= step] + ([n - 1] if n else [])
    for i in shown:
        anchor = "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle"
        parts.append(
            f'<text x="{x(i):.1f}" y="{_H - 12}" text-anchor="{anchor}">'
            f"{escape(labels[i][5:] if len(labels[i]) == 10 else labels[i])}</text>"
        )
    return "".join(parts), x, y


def _trend(
    days: Sequence[str], series: dict[str, list[int]], colors: dict[str, str], aria: str
) -> str:
    """Daily counts as lines with a dot per day (hover: the day and the count) and a key."""
    top = _nice_top(max((v for values in series.values() for v in values), default=0))
    head, x, y = _axes(top, days, aria)
    lines = []
    for name, values in series.items():
        color = colors[name]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        dots = "".join(
            f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="{color}">'
            f"<title>{escape(name)} {escape(days[i])}: {v:,d}</title></circle>"
            for i, v in enumerate(values)
        )
        lines.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2.5" points="{points}"/>{dots}'
        )
    key = "".join(
        f'<span class="key"><i style="background:{colors[name]}"></i>{escape(name)}:'
        f" {sum(values):,d}</span>"
        for name, values in series.items()
    )
    return f"{head}{''.join(lines)}</svg><br>{key}"


def _line_chart(series: CumulativeSeries, color: str) -> str:
    """Max (solid) and p99 (dashed) cumulative epsilon over the window's days."""
    top = _nice_top(max([*series.max, *series.p99, 0.0]))
    head, x, y = _axes(top, series.days, f"cumulative epsilon of {series.use_case}")

    def points(values: Sequence[float]) -> str:
        return " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))

    return (
        f'{head}<polyline fill="none" stroke="{color}" stroke-width="2.5"'
        f' points="{points(series.max)}"/>'
        f'<polyline fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="6 4"'
        f' points="{points(series.p99)}"/></svg>'
    )


def _histogram(dist: Distribution, color: str) -> str:
    if not dist.counts:
        return _EMPTY
    top = _nice_top(max(dist.counts))
    edges = [_num(e) for e in dist.bin_edges]
    head, _, y = _axes(top, [], f"histogram of {dist.use_case}")
    plot_w = _W - _LEFT - _RIGHT
    bar = plot_w / len(dist.counts)
    bars = "".join(
        f'<rect x="{_LEFT + i * bar:.1f}" y="{y(c):.1f}" width="{max(bar - 1, 1):.1f}"'
        f' height="{y(0) - y(c):.1f}" fill="{color}">'
        f"<title>{edges[i]}-{edges[i + 1]}: {c:,d} devices</title></rect>"
        for i, c in enumerate(dist.counts)
    )
    return (
        f"{head}{bars}"
        f'<text x="{_LEFT}" y="{_H - 12}">{edges[0]}</text>'
        f'<text x="{_W - _RIGHT}" y="{_H - 12}" text-anchor="end">{edges[-1]}</text></svg>'
    )


def _error_bars(panel: EstimatePanel) -> str:
    rows = list(panel.rows)[:15]
    if not rows:
        return '<p class="muted">nothing above the publication threshold yet</p>'
    width, row_h, label_w = 540, 20, 150
    top = max(c + 1.96 * s for _, c, s in rows) or 1.0
    scale = (width - label_w - 130) / top
    parts = []
    for i, (item, count, stderr) in enumerate(rows):
        y = 6 + i * row_h
        lo, hi = max(count - 1.96 * stderr, 0.0), count + 1.96 * stderr
        parts.append(
            f'<text x="2" y="{y + 12}">{escape(item[:24])}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{max(count, 0) * scale:.1f}" height="10"'
            f' fill="#93c5fd"/>'
            f'<line x1="{label_w + lo * scale:.1f}" y1="{y + 8}" x2="{label_w + hi * scale:.1f}"'
            f' y2="{y + 8}" stroke="#1e3a8a"/>'
            f'<text x="{label_w + hi * scale + 4:.1f}" y="{y + 12}">{_num(round(count))}'
            f" &#177; {_num(round(1.96 * stderr))}</text>"
        )
    height = 10 + row_h * len(rows)
    return (
        f'<svg width="{width}" height="{height}" role="img"'
        f' aria-label="estimates of {escape(panel.use_case)}">{"".join(parts)}</svg>'
    )


def render_dashboard(
    *,
    policies: Sequence[Policy],
    report: EffectiveEpsilonReport,
    series: Sequence[CumulativeSeries],
    distributions: Sequence[Distribution],
    estimates: Sequence[EstimatePanel],
    activity: Activity,
    chain: Verification | None,
    verified_at: datetime | None,
    figures_at: datetime,
    now: datetime,
    hint: str,
    health: Sequence[HealthLine] = (),
    admin: bool = False,
) -> str:
    """The whole page; ``verified_at``: when ``chain`` was checked, ``now``: the page's time.

    ``chain`` None: no scheduled verification yet. ``figures_at``: when the figures were
    computed (the ``dashboard`` job's snapshot), stated with their age.

    ``admin``: the page with estimates, which offers to sign out; else the public page, which
    offers to sign in.
    """
    accepted, refused, refusal_table = _activity(activity)
    report_rows, totals = _report(report)
    charts, hists, panels = _cards(series, distributions, estimates)
    chain_panel = _chain_panel(chain, verified_at, now)
    policy_rows = _policy_rows(policies)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dp-governor</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><style>{_CSS}</style></head><body>
<h1>dp-governor</h1>
{_SIGN_OUT if admin else _SIGN_IN_LINK}
<p class="muted" id="figures">Privacy accounting as of {escape(report.as_of)},
computed at <span id="figures-at">{figures_at:%Y-%m-%d %H:%M:%S} UTC</span>,
{_age((now - figures_at).total_seconds())} ago, by the scheduled <code>dashboard</code> job.</p>
{chain_panel}
<h2>Policies</h2>
<table id="policies"><tr><th>use case</th><th>mechanism</th><th>&#949;/report</th>
<th>daily cap (reports)</th><th>window cap (&#949;)</th><th>lifetime cap (&#949;)</th>
<th>budget group</th><th>k</th><th>m</th><th>window (days)</th><th>group size</th>
<th>threshold</th><th>version</th></tr>{policy_rows}</table>
<p class="muted">A cap of "none" does not bound that spend. Use cases of one budget group
share its caps; a use case in no group has a budget of its own.</p>
<h2>Reports per day, last {len(activity.days)} days (UTC)</h2>
<div class="grid"><div class="card" id="accepted-trend"><b>accepted, by use case</b><br>
{accepted}</div><div class="card" id="refusals-trend"><b>refused by a cap, by reason</b><br>
{refused}</div><div class="card"><b>refusals by use case</b><br>{refusal_table}</div></div>
<h2>Effective epsilon (Tang et al. 2017)</h2>
<table id="effective-epsilon"><tr><th>use case</th><th>&#949;/report</th><th>/day</th>
<th>&#949;/day</th><th>&#949;/window</th><th>&#949;/year</th><th>group</th>
<th>group &#949;/day</th><th>lifetime bounded</th><th>spent in window max / p99 / median</th>
<th>lifetime max / p99 / median</th><th>devices</th></tr>{report_rows}</table>
{totals}
<p class="muted">Computed by {escape(str(report.provenance["accountant"]))}.</p>
{central_section(report.central)}
{health_section(health)}
<h2>Cumulative epsilon over the window (solid: most-spent device, dashed: p99 device)</h2>
<div class="grid" id="cumulative">{charts}</div>
<h2>Devices by epsilon spent in the window</h2>
<div class="grid" id="histograms">{hists}</div>
<h2>Latest estimates (95% error bars)</h2>
<div class="grid" id="estimates">{panels}</div>
<p class="muted">{escape(hint)}</p>
</body></html>
"""


_SIGN_IN_LINK = (
    '<p id="account"><a href="/sign-in">Sign in with the admin token</a> to see the estimates.</p>'
)
_SIGN_OUT = (
    '<form id="account" method="post" action="/sign-out"><span class="muted">Signed in as'
    ' admin: estimates shown.</span> <button type="submit">Sign out</button></form>'
)


def render_sign_in(*, next_path: str, problem: str | None = None) -> str:
    """The sign-in page: a form that posts the admin token, and why the last try failed.

    ``next_path`` (a local path, :func:`dp_governor.api._session.local_path`) is where the
    browser goes once signed in: the page it asked for.
    """
    error = "" if problem is None else f'<p class="bad" id="problem">{escape(problem)}</p>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dp-governor: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><style>{_CSS}</style></head><body>
<h1>dp-governor</h1>
<h2>Sign in</h2>
<p>The estimates are for admins, as on the API. Enter the admin token
(<code>DPGOV_ADMIN_TOKEN</code>); this browser then keeps a session for
{SESSION_SECONDS // 3600} hours, which ends when you sign out or the token changes.</p>
{error}
<form id="sign-in" method="post" action="/sign-in">
<input type="hidden" name="next" value="{escape(next_path)}">
<p><label for="token">Admin token</label><br>
<input id="token" name="token" type="password" autocomplete="current-password" required
size="48"></p>
<p><button type="submit">Sign in</button> <a href="/">the public dashboard</a></p>
</form>
</body></html>
"""


def render_pending(*, detail: str, retry_after: int) -> str:
    """The page shown while the figures are computed for the policies in force (HTTP 503).

    It reloads itself after ``retry_after`` seconds; no figure computed under other policies
    is shown meanwhile.
    """
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dp-governor: computing</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{int(retry_after)}">
<link rel="icon" href="data:,"><style>{_CSS}</style></head><body>
<h1>dp-governor</h1>
<h2>The figures are being computed</h2>
<p id="pending">{escape(detail)}.</p>
<p>This page reloads itself in {int(retry_after)} s.</p>
</body></html>
"""


def _policy_rows(policies: Sequence[Policy]) -> str:
    """The policies table's rows."""
    return "".join(
        f"<tr><td>{escape(p.name)}</td><td>{escape(p.mechanism)}</td>"
        f"<td>{_num(p.epsilon_per_report)}</td><td>{p.max_reports_per_day}</td>"
        f"<td>{_num(p.window_epsilon_cap)}</td><td>{_num(p.lifetime_epsilon_cap)}</td>"
        f"<td>{escape(p.budget_group or 'none')}</td>"
        f"<td>{p.k}</td><td>{p.m}</td><td>{p.retention_days}</td><td>{p.group_size}</td>"
        f"<td>{_num(p.publish_threshold)}</td><td>{p.version}</td></tr>"
        for p in policies
    )


def _activity(activity: Activity) -> tuple[str, str, str]:
    """The accepted and refused trends and the refusals-by-use-case table."""
    colors = {name: _COLORS[i % len(_COLORS)] for i, name in enumerate(activity.accepted)}
    accepted = (
        _trend(activity.days, activity.accepted, colors, "accepted reports per day")
        if activity.accepted
        else '<p class="muted">no report accepted in these days</p>'
    )
    reason_colors = {r: _REASON_COLORS.get(r, "#4b5563") for r in activity.refused}
    refused = _trend(activity.days, activity.refused, reason_colors, "refusals per day by reason")
    refusal_rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{sum(values):,d}</td><td>{values[-1]:,d}</td></tr>"
        for name, values in activity.refused_by_use_case.items()
    )
    refusal_table = (
        '<table id="refusals-by-use-case"><tr><th>use case / reason</th>'
        f"<th>{len(activity.days)} days</th><th>today</th></tr>{refusal_rows}</table>"
        if refusal_rows
        else '<p class="muted" id="refusals-by-use-case">no refusal in these days</p>'
    )
    return accepted, refused, refusal_table


def _report(report: EffectiveEpsilonReport) -> tuple[str, str]:
    """The effective-epsilon table's rows and the totals paragraph."""
    report_rows = "".join(
        f"<tr><td>{escape(u.use_case)}</td><td>{_num(u.epsilon_per_report)}</td>"
        f"<td>{u.reports_per_day}</td><td>{_num(u.epsilon_per_day)}</td>"
        f"<td>{_num(u.epsilon_per_window)}</td><td>{_num(u.epsilon_per_year)}</td>"
        f"<td>{u.group_size}</td><td>{_num(u.group_epsilon_per_day)}</td>"
        f"<td>{'yes' if u.lifetime_bounded else 'NO'}</td>"
        f"<td>{_num(u.spent_window.max)} / {_num(u.spent_window.p99)} /"
        f" {_num(u.spent_window.median)}</td>"
        f"<td>{_num(u.spent_lifetime.max)} / {_num(u.spent_lifetime.p99)} /"
        f" {_num(u.spent_lifetime.median)}</td><td>{u.spent_window.devices}</td></tr>"
        for u in report.use_cases
    )
    t = report.totals

    def loss_cell(p: Any) -> str:
        if p.bound == "basic sum":
            return f"{_num(p.epsilon)} (basic sum)"
        return (
            f"{_num(p.epsilon_basic)} (basic sum), {_num(p.epsilon)} at &#948;={p.delta:g}"
            f" ({escape(p.bound)})"
        )

    def spread_cell(label: str, s: LossSpread | None) -> str:
        if s is None:
            return ""
        return (
            f" Each device's own (&#949;, &#948;={s.delta:g}) {label}, max / p99 / median:"
            f" {_num(s.max)} / {_num(s.p99)} / {_num(s.median)} ({s.devices} devices;"
            f" {escape(s.kind)}: {escape(s.note)})."
        )

    totals = (
        f'<p id="allowed">Across all use cases the caps allow one device (a schedule fixed in'
        f" advance) per day {loss_cell(t.allowed_per_day)}, per window"
        f" {loss_cell(t.allowed_per_window)}, per year {loss_cell(t.allowed_per_year)}.</p>"
        f'<p id="spent">Devices spent in the window at most {_num(t.spent_window.max)} (basic'
        f" sum; p99 {_num(t.spent_window.p99)}, median {_num(t.spent_window.median)},"
        f" {t.spent_window.devices} devices), over their lifetimes at most"
        f" {_num(t.spent_lifetime.max)} (basic sum)."
        f"{spread_cell('in the window', t.device_bound_window)}"
        f"{spread_cell('over lifetimes', t.device_bound_lifetime)}</p>"
    )
    return report_rows, totals


def _cards(
    series: Sequence[CumulativeSeries],
    distributions: Sequence[Distribution],
    estimates: Sequence[EstimatePanel],
) -> tuple[str, str, str]:
    """The cumulative charts, the histograms and the estimate panels."""
    charts = "".join(
        f'<div class="card"><b>{escape(s.use_case)}</b> <span class="muted">'
        f"{s.devices} devices{'' if s.sampled == s.devices else f', p99 of {s.sampled}'}"
        f"</span><br>{_line_chart(s, _COLORS[i % len(_COLORS)]) if s.devices else _EMPTY}</div>"
        for i, s in enumerate(series)
    )
    hists = "".join(
        f'<div class="card"><b>{escape(d.use_case)}</b> <span class="muted">{d.devices}'
        f" devices</span><br>{_histogram(d, _COLORS[i % len(_COLORS)])}</div>"
        for i, d in enumerate(distributions)
    )
    panels = "".join(
        f'<div class="card"><b>{escape(p.title)}</b> <span class="muted">n = {p.n}</span><br>'
        f"{_error_bars(p)}</div>"
        for p in estimates
    )
    return charts, hists, panels


def _chain_panel(chain: Verification | None, verified_at: datetime | None, now: datetime) -> str:
    """The audit chain's status line, as the last scheduled verification found it."""
    if chain is None or verified_at is None:
        return (
            '<p id="chain">Audit chain: <span class="muted" id="chain-status">not verified'
            " yet</span>; the scheduled <code>verify</code> job records its first verification"
            " here.</p>"
        )
    status = (
        '<span class="ok" id="chain-status">verified</span>'
        if chain.ok
        else f'<span class="bad" id="chain-status">FAILED at entry {chain.first_bad}:'
        f" {escape(str(chain.problem))}</span>"
    )
    if chain.latest_checkpoint_at is not None:
        at = datetime.fromisoformat(chain.latest_checkpoint_at)
        checkpoint = (
            f"latest signed checkpoint: entry {chain.latest_checkpoint_seq} at"
            f" {at:%Y-%m-%d %H:%M} UTC, {_age((now - at).total_seconds())} ago"
        )
    else:
        checkpoint = "no signed checkpoint yet (the checkpoint job writes one)"
    behind = chain.head_seq - (chain.latest_checkpoint_seq or 0)
    note = "" if not chain.note else f'; <span id="chain-note">note: {escape(chain.note)}</span>'
    return (
        f'<p id="chain">Audit chain: {status}, <span id="chain-entries">'
        f"{escape(checked_entries(chain))}</span>,"
        f" {_age((now - verified_at).total_seconds())} ago"
        f' (<span id="chain-verified-at">{verified_at:%Y-%m-%d %H:%M:%S} UTC</span>);'
        f' <span id="chain-checkpoint">{escape(checkpoint)}</span>'
        f"{f'; {behind:,d} entries since it' if chain.latest_checkpoint_at else ''}{note}.</p>"
    )


def _central_loss(loss: CentralLoss | None) -> str:
    if loss is None:
        return "&#8212;"
    return f"{_num(loss.epsilon)} at &#948;={loss.delta:g} ({escape(loss.kind)})"


def health_section(lines: Sequence[HealthLine]) -> str:
    """Each use case's share of reports implausible under its policy (``pipeline.health``)."""
    rows = "".join(
        f"<tr><td>{escape(h.use_case)}</td><td>{h.checked:,d}</td><td>{h.implausible:,d}</td>"
        f'<td class="{"bad" if h.share > _HEALTH_ALERT else "ok"}">{100 * h.share:.2f}%</td></tr>'
        for h in lines
    )
    table = (
        '<table id="health"><tr><th>use case</th><th>reports checked</th><th>implausible</th>'
        f"<th>share</th></tr>{rows}</table>"
        if lines
        else '<p class="muted" id="health">No CMS or SFP report received since this worker'
        " started.</p>"
    )
    return (
        "<h2>Report health</h2>"
        f'{table}<p class="muted">Reports whose count of +1 coordinates is implausible under'
        " the policy's epsilon (outside 6 standard deviations): near 0% from correct devices,"
        " near 100% from a fleet built with another epsilon. Counted by this worker since it"
        " started; HCMS reports (one bit) are not checked. docs/operations.md, the dashboard.</p>"
    )


def central_section(lines: Sequence[CentralLine]) -> str:
    """Central (epsilon, delta) after shuffling per use case and day, and its preconditions."""
    if not lines:
        return (
            '<h2>Central &#949; after shuffling</h2><p class="muted" id="central">No shuffled'
            " batch published in the last year.</p>"
        )
    rows = "".join(
        f"<tr><td>{escape(line.use_case)}</td><td>{escape(day.day)}</td>"
        f"<td>{_num(line.epsilon_per_report)}</td>"
        f"<td>{'; '.join(f'{b.devices} / {b.reports} / {b.max_per_device}' for b in day.batches)}"
        f"</td><td>{'; '.join(_central_loss(b.central) for b in day.batches)}</td>"
        f"<td>{_central_loss(day.composed)}</td><td>{_central_loss(line.window)}</td>"
        f"<td>{_central_loss(line.year)}</td><td>{_central_loss(line.window_adaptive)}</td>"
        f"<td>{_central_loss(line.year_adaptive)}</td></tr>"
        for line in lines
        for day in line.days
    )
    methods = sorted({x.method for line in lines for x in (line.window, line.year) if x})
    return (
        "<h2>Central &#949; after shuffling</h2>"
        '<table id="central"><tr><th>use case</th><th>published</th><th>&#949;/report</th>'
        "<th>batches: devices / reports / most per device</th><th>central per batch</th>"
        "<th>day, composed</th><th>window, composed</th><th>year, composed</th>"
        "<th>window, adaptive</th><th>year, adaptive</th></tr>"
        f'{rows}</table><p class="muted">Per batch: FMT21 Theorem 3.2 (numerical) per'
        f" sub-batch; composed with {escape('; '.join(methods) or 'dp-accounting PLD')}."
        f" {escape(PRECONDITIONS)}</p>"
    )
