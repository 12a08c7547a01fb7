"""The effective-epsilon report as a plain-text table, as ``dpgov audit report`` prints it."""

from __future__ import annotations

from dp_governor.budget.privacy.accountant import PrivacyLoss
from dp_governor.budget.privacy.display import fmt_up
from dp_governor.budget.privacy.epsilon_advisor import (
    REFERENCE,
    render_advice,
)
from dp_governor.budget.reporting.central import render_central
from dp_governor.budget.reporting.report import EffectiveEpsilonReport, LossSpread

__all__ = ["render_text"]


def _fmt(value: float) -> str:
    return fmt_up(value)


def render_text(report: EffectiveEpsilonReport) -> str:
    """The report as a plain-text table (the CLI's and the demo's)."""
    out = [
        f"Effective epsilon as of {report.as_of} (Tang et al. 2017: per report, per day,"
        f" per window, per year, and what devices spent); computed at {report.computed_at}",
        "",
        f"{'use case':<22} {'eps/rep':>7} {'rep/day':>7} {'eps/day':>8} {'eps/window':>10}"
        f" {'eps/year':>9} {'group':>5}  {'spent in window max/p99/median':>31}"
        f"  {'lifetime max/p99/median':>24}",
    ]
    for line in report.use_cases:
        w, life = line.spent_window, line.spent_lifetime
        out.append(
            f"{line.use_case:<22} {line.epsilon_per_report:>7g} {line.reports_per_day:>7}"
            f" {_fmt(line.epsilon_per_day):>8} {_fmt(line.epsilon_per_window):>10}"
            f" {_fmt(line.epsilon_per_year):>9} {line.group_size:>5}"
            f"  {f'{_fmt(w.max)} / {_fmt(w.p99)} / {_fmt(w.median)}':>31}"
            f"  {f'{_fmt(life.max)} / {_fmt(life.p99)} / {_fmt(life.median)}':>24}"
        )
    out.append("")
    for line in report.use_cases:
        shared = f" (budget {line.budget!r} shared with {', '.join(line.shares_budget_with)})"
        out.append(
            f"- {line.use_case}: {line.lifetime_note}" + (shared if line.shares_budget_with else "")
        )
    advice = [line.epsilon_advice for line in report.use_cases if line.epsilon_advice]
    if advice:
        out += ["", f"Epsilon advisor (each mechanism against {REFERENCE}):"]
        out += [f"  {render_advice(a)}" for a in advice]
    t = report.totals

    def loss(label: str, p: PrivacyLoss) -> str:
        figure = (
            f"basic sum {_fmt(p.epsilon)}"
            if p.bound == "basic sum"
            else f"sum {_fmt(p.epsilon_basic)}; {p.bound} ({_fmt(p.epsilon)}, {p.delta:g})"
        )
        return f"{label}: {figure} [{p.kind}]"

    def spread(label: str, s: LossSpread) -> str:
        kinds = ", ".join(f"{n} {b}" for b, n in s.bounds.items())
        return (
            f"{label}, each device's own (epsilon, {s.delta:g}) bound, max/p99/median over"
            f" {s.devices} devices ({s.distinct_ledgers} distinct ledgers; {kinds}):"
            f" {_fmt(s.max)} / {_fmt(s.p99)} / {_fmt(s.median)} [{s.kind}]"
        )

    out += [
        "",
        "Across all use cases, one device (the caps' worst case, a schedule fixed in advance):",
        "  " + loss("allowed per day", t.allowed_per_day),
        "  " + loss("allowed per window", t.allowed_per_window),
        "  " + loss("allowed per year", t.allowed_per_year),
        "What devices sent (running totals; basic sums are what the gate enforces):",
        f"  spent in the window, basic sum max/p99/median over {t.spent_window.devices} devices:"
        f" {_fmt(t.spent_window.max)} / {_fmt(t.spent_window.p99)} / {_fmt(t.spent_window.median)}",
        f"  spent over lifetimes, basic sum max/p99/median over {t.spent_lifetime.devices}"
        f" devices: {_fmt(t.spent_lifetime.max)} / {_fmt(t.spent_lifetime.p99)}"
        f" / {_fmt(t.spent_lifetime.median)}",
    ]
    if t.device_bound_window is not None:
        out.append("  " + spread("in the window", t.device_bound_window))
    if t.device_bound_lifetime is not None:
        out.append("  " + spread("over lifetimes", t.device_bound_lifetime))
    out += [
        "  (a running total's (epsilon, delta) is not a guarantee against an adaptively chosen"
        " sequence; see docs/accounting.md)",
    ]
    out += render_central(report.central)
    out += [
        "",
        f"Computed by {report.provenance['accountant']}; policy versions"
        f" {report.provenance['policy_versions']}",
    ]
    shards = report.provenance.get("shards")
    if shards is not None:  # a sharded ledger's report (dp_governor.budget.reporting.sharded)
        each = ", ".join(f"{n:,}" for n in shards["devices_per_shard"])
        out += [
            f"Over {shards['shards']} shards, {shards['devices']:,} devices ({each}); central"
            f" figures: {shards['central']}",
        ]
    return "\n".join(out) + "\n"
