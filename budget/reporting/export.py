"""Export the ledger (JSON Lines or CSV) so that its report can be recomputed offline.

One record per line, each with a ``kind``: ``meta`` (format, as-of day, the audit head), ``policy``
(every version), ``charge`` (every charge still held: device key, use case, budget, policy version,
micro-epsilon, UTC day), ``lifetime`` (the purge-proof lifetime multiset, with the group size and
budget each count was charged under) and ``horizon`` (per use case, the last day a retention purge
removed: a charge on or before it no longer counts in any window). Device keys are the ledger's
pseudonyms; no device id or report is exported. CSV carries the same records with one column per
field (``json`` holds meta and policy records).

:func:`report_from_export` runs :func:`dp_governor.budget.reporting.report.build_report` on an
export read back into memory (:func:`read_export`), and :func:`recompute` computes the same report
from the file in memory bounded by a bucket of it, exactly as
:func:`dp_governor.budget.reporting.loss.effective_epsilon` does on the live tables: a charge counts
in its use case's window when ``horizon < day`` and ``as_of - retention < day <= as_of`` (the
retention of the use case's latest version), with the group size of the policy version it was
charged under; a window that reaches back past its use case's horizon also counts what the lifetime
multiset holds and no charge does (:meth:`dp_governor.budget.rule.state.AccountState.unheld`);
retired use cases count in the device totals.
"""

from __future__ import annotations

import csv
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, Literal, TextIO

import orjson

from dp_governor.budget.clock import utc_day
from dp_governor.budget.privacy.accountant import Accountant
from dp_governor.budget.reporting.loss import lifetime_rows
from dp_governor.budget.reporting.population import SpendPass
from dp_governor.budget.reporting.report import (
    EffectiveEpsilonReport,
    Row,
    basis_of,
    build_report,
    finish_report,
)
from dp_governor.budget.rule.book import NO_HORIZON, PolicyBook
from dp_governor.budget.rule.state import ANY_BUDGET
from dp_governor.policies.model import Policy

__all__ = [
    "FORMAT",
    "LedgerExport",
    "export_ledger",
    "read_export",
    "recompute",
    "report_from_export",
]

FORMAT = "dp-governor ledger export v3"
# v1 lifetime records had no group size: read back with their use case's latest one, as v1's
# report counted them; v1 and v2 lifetime records had no budget: every budget their use case
# ever drew from counts them, as the ledger's slots of that time
READABLE = (FORMAT, "dp-governor ledger export v2", "dp-governor ledger export v1")
Format = Literal["jsonl", "csv"]
BUCKET_BYTES: Final = 64 << 20  # export text a bucket of the streamed recompute
MAX_BUCKETS: Final = 1024  # open files at once
CSV_FIELDS = [
    "kind",
    "device_key",
    "use_case",
    "budget",
    "policy_version",
    "epsilon_micro",
    "day",
    "group_size",
    "count",
    "through_day",
    "json",
]


def records(ledger: Any, *, now: datetime) -> Iterator[dict[str, Any]]:
    """Every record of the export, streamed (``ledger`` is a :class:`budget.ledger.Ledger`)."""
    seq, head = ledger.audit.head()
    yield {
        "kind": "meta",
        "format": FORMAT,
        "as_of": now.isoformat(),
        "as_of_day": utc_day(now),
        "audit_head": {"seq": seq, "hash": head},
    }
    for policy in ledger.book().versions:
        yield {"kind": "policy", **policy.model_dump(mode="json")}
    for dk, use_case, budget, version, eps, day in ledger.charge_rows():
        yield {
            "kind": "charge",
            "device_key": dk,
            "use_case": use_case,
            "budget": budget,
            "policy_version": version,
            "epsilon_micro": eps,
            "day": day,
        }
    for dk, use_case, eps, group_size, count, budget in lifetime_rows(ledger):
        yield {
            "kind": "lifetime",
            "device_key": dk,
            "use_case": use_case,
            "epsilon_micro": eps,
            "group_size": group_size,
            "count": count,
            "budget": budget,
        }
    for use_case, through_day in sorted(ledger.book().horizons.items()):  # as of the end
        yield {"kind": "horizon", "use_case": use_case, "through_day": through_day}


def export_ledger(ledger: Any, out: TextIO, *, fmt: Format, now: datetime) -> int:
    """Write the export to ``out``; returns the number of records."""
    n = 0
    if fmt == "jsonl":
        for record in records(ledger, now=now):
            out.write(orjson.dumps(record).decode())
            out.write("\n")
            n += 1
        return n
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for record in records(ledger, now=now):
        if record["kind"] in ("meta", "policy"):
            row = {"kind": record["kind"], "json": orjson.dumps(record).decode()}
        else:
            row = {k: record.get(k, "") for k in CSV_FIELDS}
        writer.writerow(row)
        n += 1
    return n


@dataclass
class LedgerExport:
    """An export read back."""

    meta: dict[str, Any]
    policies: list[Policy] = field(default_factory=list)
    # device key, use case, policy version, micro-epsilon, day, budget
    charges: list[tuple[str, str, int, int, int, str]] = field(default_factory=list)
    lifetime: list[Row] = field(default_factory=list)
    horizons: dict[str, int] = field(default_factory=dict)  # use case -> last purged day

    def current_policies(self) -> list[Policy]:
        """The latest version of every use case (retired ones included, ``active=False``)."""
        latest: dict[str, Policy] = {}
        for p in sorted(self.policies, key=lambda p: (p.name, p.version)):
            latest[p.name] = p
        return list(latest.values())


def _parse(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8", newline="") as handle:
        first = handle.readline()
        handle.seek(0)
        if first.startswith("kind,"):
            for row in csv.DictReader(handle):
                if row["json"]:
                    yield orjson.loads(row["json"])
                else:
                    yield {k: v for k, v in row.items() if v != "" and k != "json"}
        else:
            for line in handle:
                if line.strip():
                    yield orjson.loads(line)


Charge = tuple[str, str, int, int, int, str]  # device, use case, version, micro-eps, day, budget


def _typed(path: Path, export: LedgerExport) -> Iterator[tuple[str, Charge]]:
    """The export's charge and lifetime records, typed; fills ``export``'s other parts as read.

    Raises ``ValueError`` naming a bad record's number and problem.
    """
    started = False
    for n, record in enumerate(_parse(path), start=1):
        kind = record.get("kind")
        if not started:
            if kind != "meta" or record.get("format") not in READABLE:
                raise ValueError(f"{path}: not a {FORMAT!r} file (line 1)")
            export.meta = record
            started = True
            continue
        try:
            if kind == "policy":
                data = {k: v for k, v in record.items() if k != "kind"}
                export.policies.append(Policy.model_validate(data))
            elif kind == "charge":
                yield (
                    "charge",
                    (
                        str(record["device_key"]),
                        str(record["use_case"]),
                        int(record["policy_version"]),
                        int(record["epsilon_micro"]),
                        int(record["day"]),
                        str(record.get("budget", ANY_BUDGET)),
                    ),
                )
            elif kind == "lifetime":
                group = int(record.get("group_size", 0))  # 0: v1, filled in by _grouped
                if group == 0 and export.meta["format"] != READABLE[-1]:  # only v1 lacks it
                    raise ValueError("a lifetime record has no group_size")
                yield (
                    "lifetime",
                    (
                        str(record["device_key"]),
                        str(record["use_case"]),
                        int(record["epsilon_micro"]),
                        group,
                        int(record["count"]),
                        str(record.get("budget", ANY_BUDGET)),
                    ),
                )
            elif kind == "horizon":
                export.horizons[str(record["use_case"])] = int(record["through_day"])
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: record {n}: {exc}") from None
    if not started:
        raise ValueError(f"{path}: empty export")


def _grouped(export: LedgerExport, lifetime: list[Row]) -> list[Row]:
    """``lifetime`` with a v1 record's missing group size: its use case's latest one."""
    if all(row[3] for row in lifetime):
        return lifetime
    latest = {p.name: p.group_size for p in export.current_policies()}
    return [
        (dk, uc, eps, group or latest.get(uc, 1), n, b) for dk, uc, eps, group, n, b in lifetime
    ]


def read_export(path: Path) -> LedgerExport:
    """Read a JSON Lines or CSV export into memory; raises ``ValueError`` naming a bad record."""
    export = LedgerExport(meta={})
    for kind, row in _typed(path, export):
        if kind == "charge":
            export.charges.append(row)
        else:
            export.lifetime.append(row)
    export.lifetime = _grouped(export, export.lifetime)
    return export


def _spend(export: LedgerExport, charges: Iterable[Charge], lifetime: Iterable[Row]) -> list[Row]:
    """The window rows of the devices whose charges and lifetime records are given, by device.

    Every record of a device must be given (any set of whole devices: a bucket of
    :func:`recompute` or the whole export). Raises ``ValueError`` naming a charge whose policy
    version the export does not hold.
    """
    day = int(export.meta["as_of_day"])
    retention = PolicyBook.build(export.policies, export.horizons).retention()
    group_size = {(p.name, p.version): p.group_size for p in export.policies}
    window: dict[tuple[str, str, int, int, str], int] = defaultdict(int)
    held: dict[tuple[str, str, int, int, str], int] = defaultdict(int)
    held_all: dict[tuple[str, str, int, int], int] = defaultdict(int)
    for dk, use_case, policy_version, eps, charge_day, budget in charges:
        group = group_size.get((use_case, policy_version))
        if group is None:
            raise ValueError(
                f"charge of {use_case!r} under policy version {policy_version}: the export"
                " holds no such policy version"
            )
        if charge_day <= export.horizons.get(use_case, NO_HORIZON):
            continue  # purged from the live ledger's windows
        held[(dk, use_case, eps, group, budget)] += 1
        held_all[(dk, use_case, eps, group)] += 1
        if day - retention[use_case] < charge_day <= day:
            window[(dk, use_case, eps, group, budget)] += 1
    ever: dict[tuple[str, str, int, int, str], int] = defaultdict(int)
    own: dict[tuple[str, str, int, int], int] = defaultdict(int)  # held in a budget's own slot
    for dk, use_case, eps, group, n, budget in lifetime:
        ever[(dk, use_case, eps, group, budget)] += n
        if budget != ANY_BUDGET:
            own[(dk, use_case, eps, group)] += held.get((dk, use_case, eps, group, budget), 0)
    for slot, n in ever.items():  # a slot: its spend keeps the budget it was charged under
        use_case = slot[1]
        horizon = export.horizons.get(use_case, NO_HORIZON)
        if use_case in retention and day - retention[use_case] < horizon <= day:
            # charges made before slots recorded their budget (revision 0007) are held in the
            # slot of any budget, whatever budget their row names, as the live ledger's days
            mine = (
                held.get(slot, 0) if slot[4] != ANY_BUDGET else held_all[slot[:4]] - own[slot[:4]]
            )
            missing = n - max(0, mine)
            if missing > 0:  # the window reaches back past the horizon: undated spend
                window[slot] += missing
    return [(dk, uc, eps, g, n, b) for (dk, uc, eps, g, b), n in sorted(window.items())]


def report_from_export(
    export: LedgerExport, *, accountant: Accountant | None = None, delta: float | None = None
) -> EffectiveEpsilonReport:
    """The effective-epsilon report of an export held in memory, as of its own day.

    Raises ``ValueError`` naming a charge whose policy version the export does not hold.
    """
    return build_report(
        PolicyBook.build(export.policies, export.horizons),
        int(export.meta["as_of_day"]),
        _spend(export, export.charges, export.lifetime),
        export.lifetime,
        accountant=accountant or Accountant(),
        delta=delta,
        computed_at=export.meta.get("as_of"),
    )


def recompute(
    path: Path,
    *,
    accountant: Accountant | None = None,
    delta: float | None = None,
    bucket_bytes: int = BUCKET_BYTES,
) -> EffectiveEpsilonReport:
    """The report of the export at ``path``, equal to :func:`report_from_export`'s, streamed.

    One read of the file splits the charge and lifetime records by a hash of the device key
    into temporary files of about ``bucket_bytes`` of export each (at most :data:`MAX_BUCKETS`),
    so every device's records land in one bucket; each bucket is then read alone and folded into
    its own passes (:class:`dp_governor.budget.reporting.population.SpendPass`), which merge
    exactly. Memory is one bucket's, not the export's. Raises ``ValueError`` as
    :func:`read_export` and :func:`report_from_export` do.
    """
    size = path.stat().st_size
    buckets = max(1, min(MAX_BUCKETS, -(-size // bucket_bytes)))
    export = LedgerExport(meta={})
    with tempfile.TemporaryDirectory(prefix="dpgov-recompute-") as tmp:  # mode 0700
        files = [(Path(tmp) / f"{i:04d}").open("wb") for i in range(buckets)]
        try:
            for kind, row in _typed(path, export):
                files[zlib.crc32(row[0].encode()) % buckets].write(
                    orjson.dumps([kind == "charge", row]) + b"\n"
                )
        finally:
            for handle in files:
                handle.close()
        book = PolicyBook.build(export.policies, export.horizons)
        window, ever = SpendPass(book), SpendPass(book)
        for i in range(buckets):
            charges: list[Charge] = []
            lifetime: list[Row] = []
            with (Path(tmp) / f"{i:04d}").open("rb") as part:
                for line in part:
                    is_charge, row = orjson.loads(line)
                    (charges if is_charge else lifetime).append(tuple(row))
            rows = _spend(export, charges, lifetime)
            lifetime = sorted(_grouped(export, lifetime), key=itemgetter(0))
            window.merge(SpendPass(book).add(rows).finish())
            ever.merge(SpendPass(book).add(lifetime).finish())
            del charges, lifetime, rows
    basis = basis_of(
        book,
        int(export.meta["as_of_day"]),
        window.finish(),
        ever.finish(),
        computed_at=export.meta.get("as_of"),
    )
    return finish_report(basis, accountant=accountant or Accountant(), delta=delta)
