"""The dashboard at ``/``: one server-rendered HTML page with inline SVG charts, no build step.

It shows the policies, the effective-epsilon report, cumulative epsilon over the window per use
case (the most-spent and the p99 device), the population histogram per use case, the audit
chain's status and, for admins only (the estimate routes' protection), the latest estimates with
95% error bars (SFP discoveries, and any dictionary passed in the URL). Every dynamic string is
HTML-escaped; the page runs no script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from budget.audit_log import Verification
from budget.central import PRECONDITIONS, CentralLine, CentralLoss
from budget.reporting.report import EffectiveEpsilonReport, LossSpread
from budget.reporting.views import CumulativeSeries, Distribution
from policies import Policy, budget_key

__all__ = ["EstimatePanel", "render_dashboard"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2430;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d8dde3;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#eef1f5}
.grid{display:flex;flex-wrap:wrap;gap:12px}.card{background:#fff;border:1px solid #d8dde3;
padding:8px}.ok{color:#0a7d32}.bad{color:#b3261e}.muted{color:#65707d}
svg text{font:11px system-ui,sans-serif;fill:#444}
"""
_EMPTY = '<p class="muted">no charges in the window</p>'
_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"]


@dataclass(frozen=True, slots=True)
class EstimatePanel:
    """Estimates of one use case to draw: ``(item, count, stderr)`` rows, largest first."""

    use_case: str
    title: str
    n: int
    rows: Sequence[tuple[str, float, float]]


def _num(value: float | None) -> str:
    if value is None:
        return "none"
    return f"{value:,.6g}"


def _line_chart(series: CumulativeSeries, color: str) -> str:
    """Max (solid) and p99 (dashed) cumulative epsilon over the window's days."""
    width, height, pad = 300, 150, 34
    top = max([*series.max, *series.p99, 1e-9])
    n = len(series.days)

    def points(values: Sequence[float]) -> str:
        out = []
        for i, v in enumerate(values):
            x = pad + (width - pad - 6) * (i / max(n - 1, 1))
            y = height - 20 - (height - 30) * (v / top)
            out.append(f"{x:.1f},{y:.1f}")
        return " ".join(out)

    return (
        f'<svg width="{width}" height="{height}" role="img"'
        f' aria-label="cumulative epsilon of {escape(series.use_case)}">'
        f'<line x1="{pad}" y1="{height - 20}" x2="{width - 6}" y2="{height - 20}" stroke="#999"/>'
        f'<line x1="{pad}" y1="10" x2="{pad}" y2="{height - 20}" stroke="#999"/>'
        f'<text x="2" y="14">{_num(top)}</text><text x="2" y="{height - 20}">0</text>'
        f'<text x="{pad}" y="{height - 4}">{escape(series.days[0])}</text>'
        f'<text x="{width - 70}" y="{height - 4}">{escape(series.days[-1])}</text>'
        f'<polyline fill="none" stroke="{color}" stroke-width="2"'
        f' points="{points(series.max)}"/>'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" stroke-dasharray="4 3"'
        f' points="{points(series.p99)}"/></svg>'
    )


def _histogram(dist: Distribution, color: str) -> str:
    width, height = 300, 120
    if not dist.counts:
        return _EMPTY
    most = max(dist.counts)
    bar = (width - 10) / len(dist.counts)
    bars = "".join(
        f'<rect x="{5 + i * bar:.1f}" y="{height - 20 - (height - 30) * c / most:.1f}"'
        f' width="{max(bar - 1, 1):.1f}" height="{(height - 30) * c / most:.1f}" fill="{color}">'
        f"<title>{_num(dist.bin_edges[i])}-{_num(dist.bin_edges[i + 1])}: {c}</title></rect>"
        for i, c in enumerate(dist.counts)
    )
    return (
        f'<svg width="{width}" height="{height}" role="img"'
        f' aria-label="histogram of {escape(dist.use_case)}">{bars}'
        f'<text x="5" y="{height - 4}">{_num(dist.bin_edges[0])}</text>'
        f'<text x="{width - 50}" y="{height - 4}">{_num(dist.bin_edges[-1])}</text></svg>'
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
    chain: Verification,
    hint: str,
) -> str:
    """The whole page."""
    policy_rows = "".join(
        f"<tr><td>{escape(p.name)}</td><td>{escape(p.mechanism)}</td>"
        f"<td>{_num(p.epsilon_per_report)}</td><td>{p.max_reports_per_day}</td>"
        f"<td>{p.k}</td><td>{p.m}</td><td>{p.retention_days}</td>"
        f"<td>{escape(budget_key(p))}</td><td>{p.group_size}</td>"
        f"<td>{_num(p.publish_threshold)}</td><td>{p.version}</td></tr>"
        for p in policies
    )
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
    status = (
        '<span class="ok" id="chain-status">verified</span>'
        if chain.ok
        else f'<span class="bad" id="chain-status">FAILED at entry {chain.first_bad}:'
        f" {escape(str(chain.problem))}</span>"
    )
    checkpoint = (
        f"latest signed checkpoint: entry {chain.latest_checkpoint_seq} at"
        f" {escape(str(chain.latest_checkpoint_at))}"
        if chain.latest_checkpoint_seq is not None
        else "no checkpoint yet"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dp-governor</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><style>{_CSS}</style></head><body>
<h1>dp-governor</h1>
<p class="muted">Privacy accounting as of {escape(report.as_of)}. Audit chain: {status}
({chain.entries} entries, {escape(checkpoint)}).</p>
<h2>Policies</h2>
<table id="policies"><tr><th>use case</th><th>mechanism</th><th>&#949;/report</th><th>/day</th>
<th>k</th><th>m</th><th>window (days)</th><th>budget</th><th>group</th><th>threshold</th>
<th>version</th></tr>{policy_rows}</table>
<h2>Effective epsilon (Tang et al. 2017)</h2>
<table id="effective-epsilon"><tr><th>use case</th><th>&#949;/report</th><th>/day</th>
<th>&#949;/day</th><th>&#949;/window</th><th>&#949;/year</th><th>group</th>
<th>group &#949;/day</th><th>lifetime bounded</th><th>spent in window max / p99 / median</th>
<th>lifetime max / p99 / median</th><th>devices</th></tr>{report_rows}</table>
{totals}
<p class="muted">Computed by {escape(str(report.provenance["accountant"]))}.</p>
{central_section(report.central)}
<h2>Cumulative epsilon over the window (solid: most-spent device, dashed: p99)</h2>
<div class="grid" id="cumulative">{charts}</div>
<h2>Devices by epsilon spent in the window</h2>
<div class="grid" id="histograms">{hists}</div>
<h2>Latest estimates (95% error bars)</h2>
<div class="grid" id="estimates">{panels}</div>
<p class="muted">{escape(hint)}</p>
</body></html>
"""


def _central_loss(loss: CentralLoss | None) -> str:
    return "&#8212;" if loss is None else f"{_num(loss.epsilon)} at &#948;={loss.delta:g}"


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
        f"<td>{_central_loss(line.year)}</td></tr>"
        for line in lines
        for day in line.days
    )
    methods = sorted({x.method for line in lines for x in (line.window, line.year) if x})
    return (
        "<h2>Central &#949; after shuffling</h2>"
        '<table id="central"><tr><th>use case</th><th>published</th><th>&#949;/report</th>'
        "<th>batches: devices / reports / most per device</th><th>central per batch</th>"
        "<th>day, composed</th><th>window, composed</th><th>year, composed</th></tr>"
        f'{rows}</table><p class="muted">Per batch: FMT21 Theorem 3.2 (numerical) per'
        f" sub-batch; composed with {escape('; '.join(methods) or 'dp-accounting PLD')}."
        f" {escape(PRECONDITIONS)}</p>"
    )
