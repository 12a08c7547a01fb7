"""Which policy edits loosen: what some device could spend under the new book and not the old.

A change of policies (one version or many at once) loosens when, for a use case active after
it and defined before it (active, or retired and now re-created: a re-creation is an edit of
the version it had), the guarantee its budget states gets weaker in any of its terms:

- **per report**: a larger epsilon per report (or an SFP part's; another mechanism's report
  protects each part at its whole epsilon), a larger delta, a smaller group the figures
  protect (``group_size``), a smaller shuffled batch (``min_batch_devices``);
- **what the caps allow one device** over 1 day, over the old and the new window and over a
  year (the worst case of every schedule the budget's caps accept, for an individual:
  :func:`dp_governor.budget.privacy.allowance.allowance`), and over its lifetime (the lifetime
  cap; none is unbounded); **each cap on its own** (the daily count, the window cap, the lifetime
  cap raised or removed: a device's spend was charged at the epsilons of its time, so a cap that
  held it can rise while the allowance at today's epsilons falls); and a window cap's window
  shortened at all, since spend charged before
  the edit then stops counting in full (a device at the old cap is admitted again at once, however
  the new cap is scaled);
- **the filters**: a window or lifetime ``(epsilon, delta)`` target removed, or admitting a
  total it did not (a larger epsilon or ``V*``, or a shorter window);
- **what the caps count**: a budget's caps count its members' whole history and every charge
  made under it (:meth:`dp_governor.budget.rule.state.AccountState.counted`); a change after which
  the use case's caps no longer count something they counted (a use case leaving its group, a member
  re-created outside it) lets some device spend again what it already spent.

Each term holds for every state a device could be in, now or later, so the answer does not
depend on today's ledger. Only the use cases whose terms the change can move are compared: the
ones it writes, and the members of every budget they leave or join. Creating a use case that
never existed is not an edit; retiring one never loosens. Pure code.
"""

from __future__ import annotations

from collections.abc import Iterator

from dp_governor.budget.privacy.allowance import Caps, allowance
from dp_governor.budget.rule.book import PolicyBook, Terms
from dp_governor.policies.model import Policy, budget_key, from_micro, to_micro

__all__ = ["loosenings"]

YEAR = 365
_PARTS = ("epsilon_word", "epsilon_fragment")


def loosenings(before: PolicyBook, after: PolicyBook) -> list[str]:
    """What the change from ``before`` to ``after`` loosens, one phrase each (empty: nothing)."""
    out: list[str] = []
    for name in sorted(_affected(before, after)):
        out.extend(f"{name}: {x}" for x in _weaker(before, after, name))
    return out


def _affected(before: PolicyBook, after: PolicyBook) -> set[str]:
    """The use cases to compare: active after, defined before, and touched by the change."""
    written = {
        name
        for name, p in after.latest.items()
        if name not in before.latest or before.latest[name].version != p.version
    }
    touched: set[str] = set()
    for name in written:
        for book in (before, after):
            if name in book.latest:
                touched |= book.members.get(budget_key(book.latest[name]), frozenset())
    return {n for n in written | touched if n in after.terms and n in before.latest}


def _weaker(before: PolicyBook, after: PolicyBook, name: str) -> Iterator[str]:
    """Every term of ``name``'s guarantee that ``after`` states more weakly than ``before``."""
    old, new = before.latest[name], after.latest[name]
    for field in ("epsilon_per_report", *_PARTS, "delta"):
        was, now = _term(old, field), _term(new, field)
        if now > was:
            yield f"`{field}` raised from {was:g} to {now:g}"
    if new.group_size < old.group_size:
        yield f"`group_size` lowered from {old.group_size} to {new.group_size}"
    if new.min_batch_devices < old.min_batch_devices:
        yield (
            f"`min_batch_devices` lowered from {old.min_batch_devices} to"
            f" {new.min_batch_devices} (smaller shuffled batches hide each report)"
        )
    rises = []
    for days in sorted({1, old.retention_days, new.retention_days, YEAR}):
        was_micro, now_micro = _allowed(before, name, days), _allowed(after, name, days)
        if now_micro > was_micro:
            span = "a day" if days == 1 else f"any {days} days"
            rises.append(f"{span} {from_micro(was_micro):g} -> {from_micro(now_micro):g}")
    if rises:
        yield f"what one device may spend on budget {budget_key(new)!r} rises: {', '.join(rises)}"
    yield from _caps_raised(old, new)
    if old.window_epsilon_cap is not None and new.retention_days < old.retention_days:
        yield (
            f"the window cap's window shortens from {old.retention_days} to"
            f" {new.retention_days} days (spend before the edit no longer counts in full)"
        )
    yield from _filters(before.terms_of(name), after.terms[name])
    counted_after = _counted(after.terms[name])
    for use_case, budget in sorted(_counted(before.terms_of(name)) - counted_after):
        if budget != "*" and (use_case, "*") in counted_after:
            continue  # its whole history still counts
        what = f"{use_case}'s spend" if budget == "*" else f"{use_case}'s spend under {budget!r}"
        yield f"its caps no longer count {what}"


def _caps_raised(old: Policy, new: Policy) -> Iterator[str]:
    """Each cap on its own: one raised frees a device it held, whatever the others now hold.

    A device's counted spend was charged at the epsilons of its time, so the allowance at
    today's epsilons can fall while a cap that bound this device rises (a device at the daily
    count cap with cheap reports is admitted under a larger count and a new window cap).
    """
    if new.max_reports_per_day > old.max_reports_per_day:
        yield (
            f"`max_reports_per_day` raised from {old.max_reports_per_day} to"
            f" {new.max_reports_per_day}"
        )
    for field in ("window_epsilon_cap", "lifetime_epsilon_cap"):
        was, now = getattr(old, field), getattr(new, field)
        if was is not None and (now is None or now > was):
            change = "removed" if now is None else f"raised to {now:g}"
            yield f"`{field}` {change} (was {was:g})"


def _term(policy: Policy, field: str) -> float:
    """A per-report term; a report of another mechanism protects each SFP part at its whole."""
    value = getattr(policy, field)
    if value is None:  # not SFP: the word and the fragment are the whole report
        value = policy.epsilon_per_report
    return float(value)


def _allowed(book: PolicyBook, name: str, days: int) -> int:
    """The most one device may spend on ``name``'s budget in ``days`` days (per individual).

    Not group-scaled: a larger ``group_size`` states a guarantee for larger groups, which is
    stronger, not looser; a smaller one is caught on its own.
    """
    policy = book.latest[name]
    members = [book.latest[m] for m in sorted(book.members[budget_key(policy)])]
    costs = tuple(
        (to_micro(p.epsilon_per_report), to_micro(p.epsilon_per_report))
        for p in members
        if p.active or p.name == name
    )
    return allowance(costs, _caps(policy), days).value_micro


def _caps(policy: Policy) -> Caps:
    window, lifetime = policy.window_epsilon_cap, policy.lifetime_epsilon_cap
    return Caps(
        policy.max_reports_per_day,
        policy.retention_days,
        None if window is None else to_micro(window),
        None if lifetime is None else to_micro(lifetime),
    )


def _filters(old: Terms, new: Terms) -> Iterator[str]:
    """A filter removed, or admitting totals it refused (a larger target or a shorter window)."""
    was, now = old.filters, new.filters
    if was is None:
        return
    for kind in ("window", "lifetime"):
        before = getattr(was, kind)
        after = None if now is None else getattr(now, kind)
        if before is None:
            continue
        if after is None:
            yield f"the {kind} filter removed"
        elif after.epsilon_micro > before.epsilon_micro or after.cap_sq > before.cap_sq:
            yield (
                f"the {kind} filter's target raised from ({from_micro(before.epsilon_micro):g},"
                f" {before.delta:g}) to ({from_micro(after.epsilon_micro):g}, {after.delta:g})"
            )
        elif kind == "window" and now is not None and now.window_days < was.window_days:
            yield (
                f"the window filter's window shortened from {was.window_days} to"
                f" {now.window_days} days"
            )


def _counted(terms: Terms) -> set[tuple[str, str]]:
    """What a budget's caps count: ``(use case, "*")`` all of it, ``(use case, budget)`` part."""
    return {(u, "*") for u in terms.members} | {(u, terms.budget) for u in terms.ever_members}
