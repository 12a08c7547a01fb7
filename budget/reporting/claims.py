"""The server's privacy claims as audit entries (so transparency-log leaves) anyone can recompute.

Once a UTC day is over, :func:`publish_claims` appends one ``claim.day`` entry per use case that
had charges or published batches that day. A claim carries its *inputs* (the policy terms, every
batch of the retention window as published: sizes, layers, local epsilon, days; the
accountant's name and version), its *figures* (each batch published that day with its own
central ``(epsilon, delta)``, the day's batches composed, the retention window's figures under
a fixed schedule and under adaptive choices) and the day's *local* epsilon distribution across
devices (how many devices spent each daily total). No device identifier: population figures.

:func:`claim_figures` is the one function that turns inputs into figures (the server's and the
verifier's), pure and database-free (:func:`dp_governor.budget.reporting.central.central_line`,
FMT21 per sub-batch composed with dp-accounting PLD). :func:`check_claims` checks a log's claims
from its leaves alone: each claim's figures recomputed from its inputs, its local distribution
recounted from the charge leaves of its day (:class:`DayTotals`), its batches matched with the
``batch.publish`` leaves; and regenerates each day's transparency report
(:func:`render_report`), byte for byte what the server publishes when the claim holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from importlib.metadata import version
from typing import Any, Final

import orjson
from sqlalchemy import Connection, text
from sqlalchemy.orm import configure_mappers

from dp_governor.budget.audit.log import Entry
from dp_governor.budget.clock import day_date
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.central import (
    ADAPTIVE,
    DAYS_PER_YEAR,
    PRECONDITIONS,
    CentralLoss,
    batch_central,
    central_line,
    read_batches,
)
from dp_governor.budget.rule.book import NO_HORIZON
from dp_governor.budget.storage.db import placeholder, raw_cursor, write_step
from dp_governor.budget.storage.tables import CLAIM_LEAF_PREDICATE, ShuffledBatch
from dp_governor.policies.model import Policy, from_micro

__all__ = [
    "ACTOR",
    "CLAIM_ACTION",
    "ClaimCheck",
    "DayTotals",
    "accountant",
    "build_claim",
    "check_claims",
    "claim_figures",
    "logged_claim",
    "publish_claims",
    "render_report",
]

CLAIM_ACTION: Final = "claim.day"
# The claims' reads, through the partial index ``ix_audit_log_claims`` (revision 0014): the
# action is written as a literal, as the index's predicate is, or SQLite would not use it.
NEWEST_CLAIM: Final = (
    f"SELECT body FROM audit_log WHERE action = '{CLAIM_ACTION}' ORDER BY at DESC, seq DESC LIMIT 1"
)
CLAIMS_SINCE: Final = (
    f"SELECT body FROM audit_log WHERE action = '{CLAIM_ACTION}' AND at >= :since ORDER BY at, seq"
)
CLAIM_LEAVES: Final = f"SELECT data FROM tlog_leaves WHERE {CLAIM_LEAF_PREDICATE} ORDER BY idx"
ARCHIVED_CLAIMS: Final = "SELECT max(claimed_through) FROM audit_archives"
ACTOR: Final = "job:claims"
_BATCH_FIELDS: Final = (
    "first_day",
    "last_day",
    "devices",
    "reports",
    "max_per_device",
    "layers",
    "untagged",
    "epsilon_micro",
    "min_batch_devices",
)


def accountant() -> dict[str, str]:
    """The accountant that computes the central figures: its name, version and method."""
    return {
        "name": "dp-accounting",
        "version": version("dp-accounting"),
        "method": "FMT21 amplification by shuffling per sub-batch, composed with PLD;"
        " sub-batch sizes rounded down to a 2^(1/8) grid",
    }


# -- inputs to figures (pure) -------------------------------------------------------------------


def _batch_input(b: ShuffledBatch) -> dict[str, Any]:
    return {
        "id": b.id,
        "published": b.day,
        **{f: getattr(b, f) for f in _BATCH_FIELDS if f != "layers"},
        "layers": orjson.loads(b.layers),
        "split": b.split,
    }


def _batch_of(use_case: str, data: Mapping[str, Any]) -> ShuffledBatch:
    """A claim's batch input as the record :mod:`.central` reads (no database)."""
    fields: dict[str, Any] = {f: int(data[f]) for f in _BATCH_FIELDS if f != "layers"}
    return ShuffledBatch.model_construct(
        id=int(data["id"]),
        use_case=use_case,
        day=int(data["published"]),
        layers=orjson.dumps([int(n) for n in data["layers"]]).decode(),
        split=bool(data["split"]),
        **fields,
    )


def _loss(loss: CentralLoss | None) -> dict[str, Any] | None:
    return None if loss is None else asdict(loss)


def claim_figures(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a claim's inputs give: each batch of the day, the day composed, the window.

    Raises ``KeyError``, ``TypeError`` or ``ValueError`` on malformed inputs.
    """
    # a table model's attributes read through its mapper: a verifier that never opened a
    # database has to configure them before it builds one (idempotent, cheap once done)
    configure_mappers()
    terms = inputs["policy"]
    use_case, day = str(inputs["use_case"]), int(inputs["day"])
    policy = Policy.model_construct(
        name=use_case,
        epsilon_per_report=float(terms["epsilon_per_report"]),
        max_reports_per_day=int(terms["max_reports_per_day"]),
        retention_days=int(terms["retention_days"]),
        min_batch_devices=int(terms["min_batch_devices"]),
        delta=float(terms["delta"]),
    )
    batches = [_batch_of(use_case, b) for b in inputs["batches"]]
    line = central_line(policy, [], batches, day)
    today = [d for d in line.days if d.day == day_date(day).isoformat()]
    return {
        "batches": [
            {"id": b.id, "central": _loss(batch_central(b, policy.delta))}
            for b in batches
            if b.day == day
        ],
        "day": _loss(today[0].composed) if today else None,
        "window": _loss(line.window),
        "window_adaptive": _loss(line.window_adaptive),
    }


def build_claim(
    policy: Policy,
    versions: Sequence[Policy],
    batches: Sequence[ShuffledBatch],
    day: int,
    local: Mapping[int, int],
) -> dict[str, Any]:
    """The claim of ``policy``'s use case on ``day``: inputs, figures, local distribution.

    ``batches`` are the use case's batches (those of the retention window ending on ``day``
    are its inputs); ``local`` maps a device's daily micro-epsilon to the number of devices.
    """
    per_day = max(v.max_reports_per_day for v in [policy, *versions])
    window = [
        b
        for b in batches
        if b.use_case == policy.name and day - policy.retention_days < b.day <= day
    ]
    inputs = {
        "use_case": policy.name,
        "day": day,
        "policy": {
            "version": policy.version,
            "mechanism": policy.mechanism,
            "epsilon_per_report": policy.epsilon_per_report,
            "max_reports_per_day": per_day,
            "retention_days": policy.retention_days,
            "min_batch_devices": policy.min_batch_devices,
            "delta": policy.delta,
        },
        "accountant": accountant(),
        "batches": [_batch_input(b) for b in sorted(window, key=lambda b: (b.day, b.id or 0))],
    }
    return {
        "inputs": inputs,
        "figures": claim_figures(inputs),
        "local": [[int(e), int(n)] for e, n in sorted(local.items())],
    }


# -- the report ---------------------------------------------------------------------------------


def _show(loss: Mapping[str, Any] | None) -> str:
    if loss is None:
        return "none (no batch counted its devices)"
    return f"epsilon {loss['epsilon']!r}, delta {loss['delta']!r} [{loss['method']}]"


def render_report(claim: Mapping[str, Any]) -> str:
    """The daily transparency report of one use case, as text (a pure function of the claim)."""
    inputs, figures = claim["inputs"], claim["figures"]
    terms, acc = inputs["policy"], inputs["accountant"]
    day = int(inputs["day"])
    devices = sum(n for _, n in claim["local"])
    out = [
        f"dp-governor transparency report: {inputs['use_case']}, {day_date(day).isoformat()}",
        f"policy version {terms['version']} ({terms['mechanism']}): local epsilon"
        f" {terms['epsilon_per_report']!r} per report, at most {terms['max_reports_per_day']}"
        f" reports a day, delta {terms['delta']!r}, retention {terms['retention_days']} days,"
        f" batches of at least {terms['min_batch_devices']} devices",
        f"accountant: {acc['name']} {acc['version']} ({acc['method']})",
        "",
        f"local epsilon spent this day, per device ({devices} devices):",
    ]
    out += [f"  {from_micro(e)!r}: {n} devices" for e, n in claim["local"]]
    by_id = {int(b["id"]): b for b in inputs["batches"]}
    out += ["", f"batches published this day ({len(figures['batches'])}):"]
    for fig in figures["batches"]:
        b = by_id[int(fig["id"])]
        first, last = day_date(int(b["first_day"])), day_date(int(b["last_day"]))
        local = from_micro(int(b["epsilon_micro"]))
        out.append(
            f"  batch {fig['id']}: {b['devices']} devices, {b['reports']} reports, layers"
            f" {b['layers']}, untagged {b['untagged']}, charged {first}..{last},"
            f" local epsilon {local!r}; central {_show(fig['central'])}"
        )
    out += [
        "",
        f"this day's batches composed: {_show(figures['day'])}",
        f"retention window ({terms['retention_days']} days, {len(inputs['batches'])} batches):"
        f" {_show(figures['window'])}",
        f"retention window, {ADAPTIVE}: {_show(figures['window_adaptive'])}",
        "",
        PRECONDITIONS,
    ]
    return "\n".join(out) + "\n"


# -- publishing (the server) --------------------------------------------------------------------


def _last_claimed(conn: Connection) -> int | None:
    """The latest day claimed: the newest claim entry (one entry of the claims' index, 0014).

    Once archived, a claim is no longer in the log: ``audit_archives`` records the newest day
    the archived entries claimed, so a day is never claimed twice.
    """
    body = conn.execute(text(NEWEST_CLAIM)).scalar()
    if body is None:  # none in the log: the newest an archive moved out, if any
        archived = conn.execute(text(ARCHIVED_CLAIMS)).scalar()
        return None if archived is None else int(archived)
    return int(orjson.loads(body)["data"]["inputs"]["day"])


def _local(conn: Connection, use_case: str, day: int) -> dict[int, int]:
    """How many devices spent each daily micro-epsilon total on ``use_case`` on ``day``."""
    ph = placeholder(conn.engine)
    cur = raw_cursor(conn)
    cur.execute(
        f"SELECT sum(epsilon_micro) FROM charges WHERE use_case = {ph} AND day = {ph}"
        " GROUP BY device_key",
        (use_case, day),
    )
    return dict(Counter(int(r[0]) for r in cur.fetchall()))


def _charged(conn: Connection, day: int) -> set[str]:
    rows = conn.execute(
        text("SELECT DISTINCT use_case FROM charges WHERE day = :d"), {"d": day}
    ).all()
    return {str(r[0]) for r in rows}


def publish_claims(ledger: Ledger, *, today: int, now: datetime) -> int:
    """Append the claims of every day after the last claimed one and before ``today``.

    Idempotent: a day is claimed once (the newest claim's day is where the next run starts, at
    most a year back); each day's claims are one transaction. A use case's days on or before
    its retention horizon are not claimed (their charges, the local distribution's source, are
    deleted). Returns the claims appended.
    """
    book = ledger.book()
    by_name: dict[str, list[Policy]] = {}
    for p in book.versions:
        by_name.setdefault(p.name, []).append(p)
    with ledger.connect() as conn:
        last = _last_claimed(conn)
    start = today - DAYS_PER_YEAR if last is None else last + 1
    if start >= today:
        return 0
    longest = max((p.retention_days for p in book.versions), default=1)
    batches = read_batches(ledger.engine, start - longest)
    with ledger.connect() as conn:
        charged = conn.execute(
            text("SELECT DISTINCT day FROM charges WHERE day >= :a AND day < :b"),
            {"a": start, "b": today},
        ).all()
    days = {int(r[0]) for r in charged} | {b.day for b in batches if start <= b.day < today}
    appended = 0
    for day in sorted(days):
        with write_step(ledger.engine) as conn:
            claimed = _last_claimed(conn)
            if claimed is not None and claimed >= day:
                continue  # another run claimed it
            names = _charged(conn, day) | {b.use_case for b in batches if b.day == day}
            entries = []
            for name in sorted(names):
                if day <= book.horizons.get(name, NO_HORIZON):
                    continue  # its charges are deleted: no local distribution to claim
                known = by_name.get(name, [])
                versions = [p for p in known if p.created_at.date() <= day_date(day)] or known
                if not versions:
                    continue
                policy = max(versions, key=lambda p: p.version)
                claim = build_claim(policy, versions, batches, day, _local(conn, name, day))
                entries.append(Entry(ACTOR, CLAIM_ACTION, claim))
            if entries:
                ledger.audit.append(conn, entries, now=now)
                appended += len(entries)
    return appended


def logged_claim(ledger: Ledger, use_case: str, day: int) -> dict[str, Any] | None:
    """The claim the log holds for ``use_case`` on ``day`` (what the server published).

    Reads the claims' index (revision 0014) from the day's start, in the order they were
    written, and stops at the first that matches: a day is claimed after it ends, so its claims
    come first unless the job was catching up on earlier days. A claim an archive moved out
    of the log (a day up to the archives' ``claimed_through``) is read from its transparency
    log leaf, which holds the entry's data in full (the leaves' claims index, revision 0016).
    """
    with ledger.connect() as conn:
        rows = conn.execute(text(CLAIMS_SINCE), {"since": day_date(day).isoformat()})
        for (body,) in rows:
            data: dict[str, Any] = orjson.loads(body)["data"]
            if data["inputs"]["use_case"] == use_case and int(data["inputs"]["day"]) == day:
                return data
        archived = conn.execute(text(ARCHIVED_CLAIMS)).scalar()
        if archived is None or day > int(archived):
            return None
        for (leaf,) in conn.execute(text(CLAIM_LEAVES)):  # archived: its public leaf holds it
            data = orjson.loads(leaf)["data"]
            if data["inputs"]["use_case"] == use_case and int(data["inputs"]["day"]) == day:
                return data
    return None


# -- checking (anyone, from the leaves) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimCheck:
    """One claim checked: where it is, what it covers, what disagreed, the regenerated report."""

    index: int
    use_case: str
    day: int
    problems: tuple[str, ...]
    report: str

    @property
    def ok(self) -> bool:
        """Whether every figure of the claim was reproduced exactly."""
        return not self.problems


def _differences(claimed: Mapping[str, Any], recomputed: Mapping[str, Any]) -> list[str]:
    out = []
    for key in ("day", "window", "window_adaptive"):
        if claimed.get(key) != recomputed[key]:
            out.append(
                f"{key}: claimed {_show(claimed.get(key))}, recomputed {_show(recomputed[key])}"
            )
    mine = {int(b["id"]): b["central"] for b in recomputed["batches"]}
    theirs = {int(b["id"]): b.get("central") for b in claimed.get("batches", [])}
    for bid in sorted(mine.keys() | theirs.keys()):
        if mine.get(bid) != theirs.get(bid):
            out.append(
                f"batch {bid}: claimed {_show(theirs.get(bid))}, recomputed {_show(mine.get(bid))}"
            )
    return out


def _published(inputs: Mapping[str, Any]) -> dict[int, Counter[bytes]]:
    """The claim's batches by the day they were published, as comparable figures."""
    out: dict[int, Counter[bytes]] = {}
    for b in inputs["batches"]:
        figures = orjson.dumps({f: b[f] for f in _BATCH_FIELDS}, option=orjson.OPT_SORT_KEYS)
        out.setdefault(int(b["published"]), Counter())[figures] += 1
    return out


def _window_days(inputs: Mapping[str, Any]) -> range:
    day = int(inputs["day"])
    return range(day - int(inputs["policy"]["retention_days"]) + 1, day + 1)


class DayTotals:
    """How many devices spent each daily total on a use case, recounted from unlinked leaves.

    A version 2 charge leaf carries its device's micro-epsilon on the use case that day after
    the charge (``spent``), so every device's charges make a chain ``s_1 < s_2 < ... < s_N``
    whose last link is its daily total: each leaf adds one device at ``spent`` and, unless it
    is the device's first of the day (``spent - epsilon_micro > 0``), takes one away at
    ``spent - epsilon_micro``, its previous link. What remains is one device at each device's
    total, with no leaf linked to another. Version 1 leaves (written before per-charge labels)
    share one label per device and day, and add a device at their label's sum: a device whose
    day holds both kinds is one device, as its first version 2 leaf takes away its version 1
    sum.
    """

    __slots__ = ("_by_label", "_net")

    def __init__(self) -> None:
        self._net: Counter[int] = Counter()
        self._by_label: Counter[str] = Counter()

    def add(self, leaf: Mapping[str, Any]) -> None:
        """Count one charge leaf of the day and use case."""
        eps = int(leaf["epsilon_micro"])
        if leaf.get("v") == 2:
            spent = int(leaf["spent"])
            self._net[spent] += 1
            if spent - eps > 0:
                self._net[spent - eps] -= 1
        else:
            self._by_label[str(leaf["label"])] += eps

    def distribution(self) -> list[list[int]]:
        """``[[micro-epsilon, devices], ...]`` in ascending total, as a claim writes its local."""
        net = self._net.copy()
        net.update(self._by_label.values())
        return [[e, n] for e, n in sorted(net.items()) if n]


def check_claims(leaves: Iterable[bytes]) -> list[ClaimCheck]:
    """Check every claim among a log's leaves (see the module docstring), in log order."""
    spent: dict[tuple[str, int], DayTotals] = {}
    batches: dict[tuple[str, int], Counter[bytes]] = {}
    checks = []
    for index, raw in enumerate(leaves):
        leaf = orjson.loads(raw)
        kind = leaf.get("kind")
        if kind == "charge":
            key = (str(leaf["use_case"]), int(leaf["day"]))
            totals = spent.get(key)
            if totals is None:
                totals = spent[key] = DayTotals()
            totals.add(leaf)
        elif kind == "batch.publish":
            data = leaf["data"]
            key = (str(data["use_case"]), int(data["day"]))
            figures = {f: data.get(f) for f in _BATCH_FIELDS}
            batches.setdefault(key, Counter())[
                orjson.dumps(figures, option=orjson.OPT_SORT_KEYS)
            ] += 1
        elif kind == CLAIM_ACTION:
            checks.append(_check(index, leaf["data"], spent, batches))
    return checks


def _check(
    index: int,
    claim: Mapping[str, Any],
    spent: Mapping[tuple[str, int], DayTotals],
    batches: Mapping[tuple[str, int], Counter[bytes]],
) -> ClaimCheck:
    inputs = claim.get("inputs", {})
    use_case, day = str(inputs.get("use_case")), -1
    try:
        day = int(inputs["day"])
        recomputed = claim_figures(inputs)
        published = _published(inputs)
        _window_days(inputs)
    except (KeyError, TypeError, ValueError) as exc:
        return ClaimCheck(index, use_case, day, (f"the claim's inputs are malformed: {exc!r}",), "")
    problems = _differences(claim.get("figures", {}), recomputed)
    acc = inputs.get("accountant", {})
    if problems and acc.get("version") != accountant()["version"]:
        problems.append(
            f"the claim was computed with {acc.get('name')} {acc.get('version')}, this verifier"
            f" runs {accountant()['version']}"
        )
    totals = spent.get((use_case, day))
    counted = [] if totals is None else totals.distribution()
    if claim.get("local") != counted:
        problems.append(
            f"local epsilon distribution: claimed {claim.get('local')}, the day's charge leaves"
            f" give {counted} ([micro-epsilon, devices])"
        )
    for d in _window_days(inputs):
        mine, logged = published.get(d, Counter()), batches.get((use_case, d), Counter())
        if mine != logged:
            problems.append(
                f"batches published {day_date(d).isoformat()}: the claim's {sum(mine.values())}"
                f" differ from the {sum(logged.values())} batch.publish leaves of that day"
            )
    report = render_report({**claim, "figures": recomputed, "local": counted})
    return ClaimCheck(index, use_case, day, tuple(problems), report)
