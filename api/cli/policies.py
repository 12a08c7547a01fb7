"""``dpgov policies``: list, show, apply (with a review and what-if) and export."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from budget import Ledger
    from policies import Policy, PolicyBase, PolicyCreate
    from policies.device import DeviceBudgetCreate

from api.cli.common import Access, DatabaseOption, load_settings, open_ledger, refuse

app = typer.Typer(help="List, show, apply and export use-case policies.", no_args_is_help=True)


@app.command("list")
def policies_list(database_url: DatabaseOption = None) -> None:
    """The current policies, one line each."""
    ledger = open_ledger(load_settings(database_url))
    print(
        f"{'use case':<24} {'mech':<5} {'eps':>5} {'/day':>4} {'eps/day':>7} {'window':>6}  budget"
    )
    for p in ledger.policies.list():
        print(
            f"{p.name:<24} {p.mechanism:<5} {p.epsilon_per_report:>5g} {p.max_reports_per_day:>4}"
            f" {p.epsilon_per_report * p.max_reports_per_day:>7g} {p.retention_days:>5}d"
            f"  {p.budget_group or p.name}"
        )


@app.command("show")
def policies_show(
    name: Annotated[str, typer.Argument(help="The use case.")], database_url: DatabaseOption = None
) -> None:
    """One policy as YAML, with its version."""
    from budget import UnknownUseCase
    from policies import dump_policies

    ledger = open_ledger(load_settings(database_url))
    try:
        policy = ledger.policies.get(name)
    except UnknownUseCase:
        typer.echo(f"Error: unknown use case {name!r}", err=True)
        raise typer.Exit(1) from None
    print(f"# version {policy.version}, {policy.created_at:%Y-%m-%d %H:%M} UTC by {policy.actor}")
    print(dump_policies([policy]), end="")


@app.command("apply")
def policies_apply(
    file: Annotated[Path, typer.Argument(help="A .yaml, .yml or .toml file of policies.")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each change and its what-if; write nothing.")
    ] = False,
    allow_loosen: Annotated[
        bool,
        typer.Option(
            "--allow-loosen",
            help="Allow raising or removing a cap or a filter target, raising epsilon or"
            " shortening retention.",
        ),
    ] = False,
    database_url: DatabaseOption = None,
) -> None:
    """Create or update every policy of a complete file; print each change and its what-if first.

    Loosening (a daily, window or lifetime cap or a filter target raised or removed, an epsilon
    raised, retention shortened) needs --allow-loosen. Nothing is written unless every check
    passes; --dry-run runs them all and writes nothing.
    """
    from budget import PolicyConflict, SystemClock
    from policies import PolicyFileError, load_device_budget, load_policies

    try:
        policies = load_policies(file)
        device = load_device_budget(file)
    except PolicyFileError as exc:
        refuse(f"{file}: {exc}", 1)
    ledger = open_ledger(load_settings(database_url), Access.READ if dry_run else Access.WRITE)
    try:
        now = SystemClock().now()
        problems, loosening, changed = _review(ledger, policies, now=now)
        device_changed = device is not None and _review_device_budget(
            ledger, device, loosening, now=now
        )
        if loosening and not allow_loosen:  # reported with every other problem, at once
            problems.append(
                f"these changes loosen a policy and need --allow-loosen: {'; '.join(loosening)}"
            )
        if problems:
            refuse("; ".join(problems), 1)
        if dry_run or not (changed or device_changed):
            count = len(changed) + int(device_changed)
            print(f"{'dry run: ' if dry_run else ''}{count} change(s), nothing written")
            return
        if device is not None and device_changed:
            version = ledger.set_device_budget(device, actor="cli")
            print(f"device_budget: version {version.version} written")
        for policy in changed:
            try:
                stored = ledger.policies.apply(policy, actor="cli")
            except PolicyConflict as exc:  # a concurrent change since the review
                refuse(f"{policy.name}: {exc}", 1)
            print(f"{stored.name}: version {stored.version} written")
    finally:
        ledger.engine.dispose()


def _review_device_budget(
    ledger: Ledger, device: DeviceBudgetCreate, loosening: list[str], *, now: datetime
) -> bool:
    """Print whether the file's device-wide budget changes and its what-if; add its loosenings."""
    from budget.reporting.views import what_if_device_budget
    from policies.device import device_budget_versions
    from policies.device import loosening as device_loosening

    with ledger.engine.connect() as conn:
        held = device_budget_versions(conn)
    old = held[-1].body() if held else None
    changed = old != device
    print(f"device_budget: {'changed' if changed else 'unchanged'}")
    if changed:
        refused = what_if_device_budget(ledger, device, now=now)
        for name, sides in refused.items():
            if sides["current"] != sides["proposed"]:
                before, after = sides["current"], sides["proposed"]
                print(f"  {name}: devices refused next report {before} -> {after}")
        loosening.extend(device_loosening(old, device))
    return changed


def _review(
    ledger: Ledger, policies: list[PolicyCreate], *, now: datetime
) -> tuple[list[str], list[str], list[PolicyCreate]]:
    """Print each policy's diff and what-if; return the problems, the loosenings and the changes."""
    from budget import InvalidRequest, PolicyConflict, UnknownUseCase
    from budget.reporting.views import what_if
    from policies import PolicyBase

    problems: list[str] = []
    loosening: list[str] = []
    changed: list[PolicyCreate] = []
    for policy in policies:
        try:
            current: Policy | None = ledger.policies.get(policy.name)
        except UnknownUseCase:
            current = None
        if current is None:
            print(f"{policy.name}: new use case")
            for field in PolicyBase.model_fields:
                print(f"  {field}: {_shown(getattr(policy, field))}")
            try:
                with ledger.engine.connect() as conn:
                    ledger.policies.check_group(conn, policy)
            except PolicyConflict as exc:
                problems.append(f"{policy.name}: {exc}")
            changed.append(policy)
            continue
        diff = [
            (field, getattr(current, field), getattr(policy, field))
            for field in PolicyBase.model_fields
            if getattr(current, field) != getattr(policy, field)
        ]
        if not diff:
            print(f"{policy.name}: unchanged (version {current.version})")
            continue
        changed.append(policy)
        looser = _loosening(current, policy)
        loosening.extend(f"{policy.name}: {x}" for x in looser.values())
        print(f"{policy.name}: version {current.version} -> {current.version + 1}")
        for field, old, new in diff:
            mark = "   (loosens)" if field in looser else ""
            print(f"  {field}: {_shown(old)} -> {_shown(new)}{mark}")
        try:
            result = what_if(ledger, policy.name, policy, now=now)
        except (PolicyConflict, InvalidRequest) as exc:
            problems.append(f"{policy.name}: {exc}")
            continue
        print("  what-if on today's ledger (current -> proposed):")
        for line in _what_if_lines(result.to_dict()):
            print(f"    {line}")
    return problems, loosening, changed


def _loosening(old: PolicyBase, new: PolicyBase) -> dict[str, str]:
    """The changes from ``old`` to ``new`` that let a device spend more, by field.

    Removing or raising a cap or a filter target's epsilon or delta loosens.
    """
    from policies.model import FILTER_FIELDS

    out: dict[str, str] = {}
    if new.max_reports_per_day > old.max_reports_per_day:
        out["max_reports_per_day"] = (
            f"daily cap raised from {old.max_reports_per_day} to {new.max_reports_per_day} reports"
        )
    for cap in ("window_epsilon_cap", "lifetime_epsilon_cap", *FILTER_FIELDS):
        was, now = getattr(old, cap), getattr(new, cap)
        if was is not None and now is None:
            out[cap] = f"`{cap}` removed (was {was:g})"
        elif was is not None and now > was:
            out[cap] = f"`{cap}` raised from {was:g} to {now:g}"
    for eps in ("epsilon_per_report", "epsilon_word", "epsilon_fragment"):
        was, now = getattr(old, eps), getattr(new, eps)
        if was is not None and now is not None and now > was:
            out[eps] = f"`{eps}` raised from {was:g} to {now:g}"
    if new.retention_days < old.retention_days:
        out["retention_days"] = (
            f"retention shortened from {old.retention_days} to {new.retention_days} days"
        )
    return out


def _what_if_lines(result: dict[str, Any], prefix: str = "") -> list[str]:
    """``name: current -> proposed`` for every compared figure of a what-if, nested by dots."""
    lines: list[str] = []
    for key, value in result.items():
        if isinstance(value, dict) and set(value) == {"current", "proposed"}:
            lines.append(
                f"{prefix}{key}: {_shown(value['current'])} -> {_shown(value['proposed'])}"
            )
        elif isinstance(value, dict):
            lines.extend(_what_if_lines(value, prefix=f"{prefix}{key}."))
    return lines


def _shown(value: Any) -> str:
    """A policy field or what-if figure as one short phrase."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict) and {"epsilon", "delta", "method", "epsilon_basic"} <= set(value):
        return (
            f"{value['epsilon']:g} at delta {value['delta']:g} ({value['method']};"
            f" sum {value['epsilon_basic']:g})"
        )
    return str(value)


@app.command("export")
def policies_export(
    fmt: Annotated[str, typer.Option("--format", help="yaml or toml.")] = "yaml",
    database_url: DatabaseOption = None,
) -> None:
    """Print the current policies as a file that `apply` reads."""
    from policies import dump_policies

    if fmt not in ("yaml", "toml"):
        typer.echo(f"Error: --format must be yaml or toml, got {fmt!r}", err=True)
        raise typer.Exit(2)
    ledger = open_ledger(load_settings(database_url))
    print(dump_policies(ledger.policies.list(), fmt), end="")
