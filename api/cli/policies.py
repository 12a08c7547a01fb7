"""``dpgov policies``: list, show, apply (with a review and what-if) and export."""

from __future__ import annotations

import functools
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from dp_governor.budget import Ledger
    from dp_governor.budget.reporting.views import WhatIf
    from dp_governor.policies import Policy, PolicyCreate
    from dp_governor.policies.device import DeviceBudgetCreate

from dp_governor.api.cli.common import (
    Access,
    DatabaseOption,
    load_settings,
    open_ledger,
    path_argument,
    refuse,
)

app = typer.Typer(help="List, show, apply and export use-case policies.", no_args_is_help=True)


@app.command("list")
def policies_list(database_url: DatabaseOption = None) -> None:
    """The current policies, one line each."""
    from dp_governor.api._handles import policy_store

    ledger = open_ledger(load_settings(database_url))
    print(
        f"{'use case':<24} {'mech':<5} {'eps/rep':>7} {'rep/day':>7} {'eps/day':>7}"
        f" {'window':>6}  budget"
    )
    for p in policy_store(ledger).list():
        print(
            f"{p.name:<24} {p.mechanism:<5} {p.epsilon_per_report:>7g} {p.max_reports_per_day:>7}"
            f" {p.epsilon_per_report * p.max_reports_per_day:>7g} {p.retention_days:>5}d"
            f"  {p.budget_group or p.name}"
        )


@app.command("show")
def policies_show(
    name: Annotated[str, typer.Argument(help="The use case.")], database_url: DatabaseOption = None
) -> None:
    """One policy as YAML, with its version."""
    from dp_governor.api._handles import policy_store
    from dp_governor.budget import UnknownUseCase
    from dp_governor.policies import dump_policies

    ledger = open_ledger(load_settings(database_url))
    try:
        policy = policy_store(ledger).get(name)
    except UnknownUseCase:
        refuse(f"unknown use case {name!r} (`dpgov policies list` names them)")
    print(f"# version {policy.version}, {policy.created_at:%Y-%m-%d %H:%M} UTC by {policy.actor}")
    print(dump_policies([policy]), end="")


@app.command("apply")
def policies_apply(
    file: Annotated[Path, path_argument(help="A .yaml, .yml or .toml file of policies.")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each change and its what-if; write nothing.")
    ] = False,
    allow_loosen: Annotated[
        bool,
        typer.Option(
            "--allow-loosen",
            help="Allow a change that lets some device spend more than the policies before it.",
        ),
    ] = False,
    shard: Annotated[
        list[str] | None,
        typer.Option(
            help="With --dry-run: a shard's database URL (repeat for each shard of a ledger"
            " sharded by device key); the what-if counts every shard's devices.",
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Shards read at once (default: the CPUs).")
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Count every device for the what-ifs instead of bringing each stored what-if"
            " up to date (the figures are the same; with --shard every device's routing is"
            " checked).",
        ),
    ] = False,
    database_url: DatabaseOption = None,
) -> None:
    """Create or update every policy of a complete file, as one change; review it first.

    Prints each policy's diff and what-if, and what the change loosens: a change that lets
    some device spend more than the policies before it (a larger epsilon, delta, cap or filter
    target, a smaller group or batch, caps that stop counting spend they counted, a group's
    shared terms raised) needs --allow-loosen. The file is written in one transaction, so a
    budget group's members may change their shared terms together; nothing is written unless
    every check passes, and --dry-run runs them all and writes nothing.
    """
    from dp_governor.api._handles import policy_store
    from dp_governor.budget import PolicyConflict, SystemClock
    from dp_governor.budget.reporting.views import what_if, what_if_device_budget
    from dp_governor.policies import PolicyFileError, load_device_budget, load_policies

    try:
        policies = load_policies(file)
        device = load_device_budget(file)
    except PolicyFileError as exc:  # names the file: one line, exit 2 (what was given is wrong)
        refuse(str(exc))
    if shard:
        if not dry_run:
            refuse("--shard needs --dry-run: write the policies to each shard's database")
        if database_url is not None:
            refuse("give --shard URLs or --database-url, not both")
        _sharded_dry_run(
            shard, workers, file, policies, device, allow_loosen=allow_loosen, full=full
        )
        return
    if workers is not None:
        refuse("--workers needs --shard")
    ledger = open_ledger(load_settings(database_url), Access.READ if dry_run else Access.WRITE)
    try:
        now = SystemClock().now()
        what_if_of = functools.partial(what_if, ledger, full=full)
        problems, loosening, changed = _review(ledger, policies, now=now, what_if_of=what_if_of)
        refused_of = functools.partial(what_if_device_budget, ledger, full=full)
        device_changed = device is not None and _review_device_budget(
            ledger, device, loosening, now=now, refused_of=refused_of
        )
        if loosening:
            print("this change loosens:")
            for item in loosening:
                print(f"  {item}")
        if loosening and not allow_loosen:  # reported with every other problem, at once
            problems.append(f"{len(loosening)} loosening(s) above need --allow-loosen")
        if problems:
            refuse(f"{file}: " + "; ".join(problems), 1)
        if dry_run or not (changed or device_changed):
            count = len(changed) + int(device_changed)
            print(f"{'dry run: ' if dry_run else ''}{count} change(s), nothing written")
            return
        if device is not None and device_changed:
            version = ledger.set_device_budget(device, actor="cli", allow_loosen=allow_loosen)
            print(f"device_budget: version {version.version} written")
        try:
            stored = policy_store(ledger).write_all(changed, actor="cli", allow_loosen=allow_loosen)
        except PolicyConflict as exc:  # a concurrent change since the review
            refuse(str(exc), 1)
        for row in stored:
            print(f"{row.name}: version {row.version} written")
    finally:
        ledger.close()


def _sharded_dry_run(
    urls: list[str],
    workers: int | None,
    file: Path,
    policies: list[PolicyCreate],
    device: DeviceBudgetCreate | None,
    *,
    allow_loosen: bool,
    full: bool,
) -> None:
    """``apply --dry-run --shard ...``: the review on shard 0, each what-if over every shard.

    Each shard's stored what-if is brought up to date, or (``full``, or when due) the shard
    read whole. The review is printed once every what-if is in: a shard found holding another's
    devices (:class:`~dp_governor.budget.reporting.routing.ShardMisrouted`) refuses it with one
    line and nothing on stdout, as the report over shards does; so does a worker's refusal.
    """
    import contextlib
    import io
    import os

    from dp_governor.api.cli._sharded import open_shards, refuse_misrouted, refuse_other_policies
    from dp_governor.api.cli.common import Refused
    from dp_governor.budget import SystemClock
    from dp_governor.budget.reporting.sharded import (
        ShardMisrouted,
        ShardPoliciesDiffer,
        same_policies,
    )
    from dp_governor.budget.reporting.sharded_what_if import (
        sharded_what_if,
        sharded_what_if_device_budget,
    )

    opened: list[tuple[Ledger, Callable[[], Ledger]]] = []
    review = io.StringIO()
    try:
        open_shards(urls, opened)
        ledgers, openers = [x for x, _ in opened], [o for _, o in opened]
        try:
            same_policies(ledgers)
        except ShardPoliciesDiffer as exc:
            refuse_other_policies(urls, exc.shard)
        at_once = workers or os.cpu_count() or 1
        now = SystemClock().now()
        what_if_of = functools.partial(
            sharded_what_if, ledgers, openers, workers=at_once, full=full
        )
        refused_of = functools.partial(
            sharded_what_if_device_budget, ledgers, openers, workers=at_once, full=full
        )
        try:
            with contextlib.redirect_stdout(review):
                problems, loosening, changed = _review(
                    ledgers[0], policies, now=now, what_if_of=what_if_of
                )
                device_changed = device is not None and _review_device_budget(
                    ledgers[0], device, loosening, now=now, refused_of=refused_of
                )
        except ShardMisrouted as exc:
            refuse_misrouted(urls, exc)
        except Refused as exc:  # a worker's, opening its shard
            refuse(exc.message, exc.code)
        print(review.getvalue(), end="")
        if loosening:
            print("this change loosens:")
            for item in loosening:
                print(f"  {item}")
        if loosening and not allow_loosen:  # as without --shard: reported with the others
            problems.append(f"{len(loosening)} loosening(s) above need --allow-loosen")
        if problems:
            refuse(f"{file}: " + "; ".join(problems), 1)
        count = len(changed) + int(device_changed)
        print(f"dry run over {len(urls)} shards: {count} change(s), nothing written")
    finally:
        for ledger, _ in opened:
            ledger.close()


def _review_device_budget(
    ledger: Ledger,
    device: DeviceBudgetCreate,
    loosening: list[str],
    *,
    now: datetime,
    refused_of: Callable[..., dict[str, dict[str, dict[str, int]]]] | None = None,
) -> bool:
    """Print whether the file's device-wide budget changes and its what-if; add its loosenings.

    ``refused_of(device, now=...)`` counts the devices refused (default: this ledger's).
    """
    from dp_governor.budget.reporting.views import what_if_device_budget
    from dp_governor.policies.device import device_budget_versions
    from dp_governor.policies.device import loosening as device_loosening

    with ledger.connect() as conn:
        held = device_budget_versions(conn)
    old = held[-1].body() if held else None
    changed = old != device
    print(f"device_budget: {'changed' if changed else 'unchanged'}")
    if changed:
        count = refused_of or functools.partial(what_if_device_budget, ledger)
        refused = count(device, now=now)
        for name, sides in refused.items():
            if sides["current"] != sides["proposed"]:
                before, after = sides["current"], sides["proposed"]
                print(f"  {name}: devices refused next report {before} -> {after}")
        loosening.extend(device_loosening(old, device))
    return changed


def _review(
    ledger: Ledger,
    policies: list[PolicyCreate],
    *,
    now: datetime,
    what_if_of: Callable[..., WhatIf] | None = None,
) -> tuple[list[str], list[str], list[PolicyCreate]]:
    """Print each policy's diff and what-if; return the problems, the loosenings and the changes.

    ``what_if_of(use_case, policy, now=..., alongside=...)`` computes a what-if (default:
    :func:`~dp_governor.budget.reporting.views.what_if` on this ledger).

    The file's changed policies are checked and compared as one change (the write's own
    checks, :meth:`dp_governor.policies.repository.PolicyStore.proposed`, and its loosening review,
    :meth:`dp_governor.budget.ledger.Ledger.loosenings`).
    """
    from dp_governor.api._handles import policy_store
    from dp_governor.budget import InvalidRequest, PolicyConflict, UnknownUseCase
    from dp_governor.budget.reporting.views import what_if
    from dp_governor.policies import PolicyBase

    problems: list[str] = []
    changed: list[PolicyCreate] = []
    current: dict[str, Policy] = {}
    for policy in policies:
        try:
            current[policy.name] = policy_store(ledger).get(policy.name)
        except UnknownUseCase:
            changed.append(policy)
            continue
        if any(
            getattr(current[policy.name], f) != getattr(policy, f) for f in PolicyBase.model_fields
        ):
            changed.append(policy)
    try:
        with ledger.connect() as conn:
            rows = policy_store(ledger).proposed(conn, changed)
    except PolicyConflict as exc:
        return [f"{_at(policies, exc.policy)}{exc}"], [], changed
    loosening = ledger.loosenings(rows)
    for policy in policies:
        old = current.get(policy.name)
        if old is None:
            print(f"{policy.name}: new use case")
            for field in PolicyBase.model_fields:
                print(f"  {field}: {_shown(getattr(policy, field))}")
            continue
        diff = [
            (field, getattr(old, field), getattr(policy, field))
            for field in PolicyBase.model_fields
            if getattr(old, field) != getattr(policy, field)
        ]
        if not diff:
            print(f"{policy.name}: unchanged (version {old.version})")
            continue
        print(f"{policy.name}: version {old.version} -> {old.version + 1}")
        for field, was, now_value in diff:
            print(f"  {field}: {_shown(was)} -> {_shown(now_value)}")
        try:
            result = (what_if_of or functools.partial(what_if, ledger))(
                policy.name, policy, now=now, alongside=changed
            )
        except (PolicyConflict, InvalidRequest) as exc:
            problems.append(f"{policy.name}: {exc}")
            continue
        print("  what-if on today's ledger (current -> proposed):")
        for line in _what_if_lines(result.to_dict()):
            print(f"    {line}")
    _unlisted(ledger, policies)
    _print_advice(policies)
    return problems, loosening, changed


def _at(policies: list[PolicyCreate], name: str | None) -> str:
    """Where in the file the policy ``name`` stands (``policies[1] (emoji) ``), or nothing."""
    for i, policy in enumerate(policies):
        if policy.name == name:
            return f"policies[{i}] ({name}) "
    return ""


def _unlisted(ledger: Ledger, policies: list[PolicyCreate]) -> None:
    """Say which use cases in force the file leaves out: they stay as they are, not retired."""
    from dp_governor.api._handles import policy_store

    listed = {p.name for p in policies}
    left = [p.name for p in policy_store(ledger).list() if p.name not in listed]
    if left:
        print(f"not in the file, unchanged: {', '.join(left)}")


def _print_advice(policies: list[PolicyCreate]) -> None:
    """Each policy's mechanism against the best known frequency oracle at equal epsilon."""
    from dp_governor.budget.privacy.epsilon_advisor import REFERENCE, advise, render_advice

    if not policies:
        return
    print(f"epsilon advisor (against {REFERENCE}):")
    for policy in policies:
        print(f"  {render_advice(advise(policy))}")


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
    """A policy field or what-if figure as one short phrase (an epsilon rounded up: a bound)."""
    from dp_governor.budget.privacy.display import fmt_up

    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return fmt_up(value, thousands=False)
    if isinstance(value, dict) and {"epsilon", "delta", "method", "epsilon_basic"} <= set(value):
        return (
            f"{fmt_up(value['epsilon'], thousands=False)} at delta {value['delta']:g}"
            f" ({value['method']}; sum {fmt_up(value['epsilon_basic'], thousands=False)})"
        )
    return str(value)


@app.command("export")
def policies_export(
    fmt: Annotated[str, typer.Option("--format", help="yaml or toml.")] = "yaml",
    database_url: DatabaseOption = None,
) -> None:
    """Print the current policies as a file that `apply` reads."""
    from dp_governor.api._handles import policy_store
    from dp_governor.policies import dump_policies

    if fmt not in ("yaml", "toml"):
        refuse(f"--format must be yaml or toml, got {fmt!r}")
    ledger = open_ledger(load_settings(database_url))
    print(dump_policies(policy_store(ledger).list(), fmt), end="")
