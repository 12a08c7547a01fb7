"""Report ingestion: validate a report against its use case's mechanism, charge, enqueue.

The charge and the inbox row commit together (the gate's ``on_accept``), so an acknowledged
report always has both, and a refused or failed one has neither. The inbox row's report and
device pseudonym are sealed to the shuffler key (:mod:`dp_governor.pipeline.seal`): what
commits with the charge is ciphertext that nobody reading the database can open.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Connection

from dp_governor.budget import Decision, Ledger
from dp_governor.budget.errors import (
    BudgetError,
    IdempotencyConflict,
    InvalidRequest,
    UnknownUseCase,
)
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.budget.keyed import KeyedHash
from dp_governor.budget.rule.book import Terms
from dp_governor.budget.storage.db import placeholder, raw_cursor
from dp_governor.mechanisms import InvalidReport, Mechanism
from dp_governor.mechanisms.published import FAMILY_FIELD
from dp_governor.pipeline._family_mismatch import mismatch_reason
from dp_governor.pipeline.health import ReportHealth
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import Policy, mechanism_for
from dp_governor.policies.errors import PolicyError

__all__ = ["Ingestor", "ItemResult", "SubmitRequest"]

INBOX_PSEUDONYM_LABEL = b"\0dp-governor/inbox-pseudonym"
RECEIPT_LABEL = b"\0dp-governor/receipt/v2\0"  # a NUL: no device id (printable) hashes to it


class _StalePolicies(Exception):
    """Raised inside a group's transaction: these use cases' policies changed since validation."""

    def __init__(self, use_cases: set[str]) -> None:
        super().__init__(", ".join(sorted(use_cases)))
        self.use_cases = use_cases


_BOOK_WIDE = frozenset({"version", "members", "horizons", "device"})


def _own_terms(terms: Terms) -> tuple[Any, ...]:
    """A policy version's own terms, comparable across versions (its number left out).

    The budget's members, the horizons and the device-wide budget are the book's, the same
    for every version read from it.
    """
    return tuple(
        getattr(terms, f.name) for f in dataclasses.fields(terms) if f.name not in _BOOK_WIDE
    )


class SubmitRequest(NamedTuple):
    """One device's submission, as the HTTP route received it (a named tuple: one per report)."""

    use_case: str
    device_id: str
    body: Any
    idempotency_key: str | None = None


class PolicyChanged(BudgetError):
    """The policy changed between validation and charge; the client may retry at once."""

    def __init__(self, use_case: str) -> None:
        super().__init__(f"the policy of {use_case!r} changed during the request; retry")
        self.use_case = use_case


class ItemResult(NamedTuple):
    """The outcome of one item of a batch: a decision, or the domain error and the field at fault.

    The service maps ``problem`` to its HTTP status; the pipeline knows no HTTP.
    """

    decision: Decision | None = None
    problem: BudgetError | InvalidReport | None = None
    error: str | None = None
    field: str | None = None


class Ingestor:
    """Validates, charges and enqueues reports for a ledger; ``seal`` seals its inbox rows."""

    def __init__(
        self, ledger: Ledger, secret: bytes, *, seal: InboxSeal, require_family: bool = False
    ) -> None:
        self.ledger = ledger
        self.seal = seal
        self.require_family = require_family
        self.health = ReportHealth()  # implausible reports per use case, for metrics and dashboard
        self._keyed = KeyedHash(secret)
        self._receipt_prefix = RECEIPT_LABEL + ledger.tlog.origin.encode() + b"\0"
        key = hmac.digest(secret, INBOX_PSEUDONYM_LABEL, "sha256")
        self._pseudonym_base = hashlib.blake2b(key=key, digest_size=8)
        self._pseudonym_states: dict[str, Any] = {}  # per use case, its name already hashed
        self._mechanisms: dict[tuple[str, int], tuple[Mechanism, str]] = {}
        self._charging: dict[tuple[str, int], tuple[str, tuple[Any, ...]]] = {}
        self._families: dict[str, str] = {}  # stored parameter key -> published family id
        self._known: set[str] = set()
        ph = placeholder(ledger.engine)
        self._inbox_sql = (
            f"INSERT INTO inbox (id, use_case, params, day, sealed) VALUES ({ph}, {ph}, {ph},"
            f" {ph}, {ph})"
        )

    def _latest(self, use_case: str, *, fresh: bool = True) -> Policy | None:
        """The use case's current policy if it is active, from the gate's policy book.

        The same lookup the charge decides by (one revision query; the book is rebuilt only
        when a version is added or a horizon rises), so validation and charge agree on the
        version unless a policy changes in between, which :meth:`submit_group` detects. Not
        ``fresh``: an active policy of the book the gate last read, with no query (the charge
        reads the revision under its lock and tells a superseded one).
        """
        cached = None if fresh else self.ledger.gate.cached_book()
        if cached is not None:
            policy = cached[1].latest.get(use_case)
            if policy is not None and policy.active:
                return policy
        with self.ledger.engine.connect() as conn:
            if self.ledger.gate.postgres:  # one read needs no transaction: no BEGIN, no ROLLBACK
                conn.execution_options(isolation_level="AUTOCOMMIT")
            policy = self.ledger.gate.book(conn).latest.get(use_case)
        return policy if policy is not None and policy.active else None

    def current(self, use_case: str, *, fresh: bool = True) -> tuple[Mechanism, str, int]:
        """The current policy's mechanism, parameter hash and version (``fresh``: see _latest).

        Policy versions are immutable, so each is parsed into its mechanism once (parsing costs
        more than a small group's charges).
        """
        policy = self._latest(use_case, fresh=fresh)
        if policy is None:
            raise UnknownUseCase(use_case)
        self._known.add(use_case)
        found = self._mechanisms.get((use_case, policy.version))
        if found is None:
            found = self.mechanism(policy)
        return (*found, policy.version)

    def known(self, use_case: str) -> bool:
        """Whether ``use_case`` has been seen as an active use case by this process.

        A set lookup with no I/O, for the report path: names in it are real (policies are never
        hard-deleted), so they bound metric labels and rate-limit keys; :meth:`look_up` adds to it.
        """
        return use_case in self._known

    def look_up(self, use_case: str) -> bool:
        """Whether ``use_case`` is active now (the policy book's lookup); remembered if it is."""
        if self._latest(use_case) is None:
            return False
        self._known.add(use_case)
        return True

    def mechanism(self, policy: Policy) -> tuple[Mechanism, str]:
        """The policy's mechanism and its parameter hash (cached per version)."""
        key = (policy.name, policy.version)
        found = self._mechanisms.get(key)
        if found is None:
            mech: Mechanism = mechanism_for(policy)
            fingerprint = mech.fingerprint
            found = (mech, fingerprint.params)
            self._mechanisms[key] = found
            self._families[found[1]] = fingerprint.family_id
            # what a report is decoded and charged by; the version number itself is neither
            self._charging[key] = (found[1], _own_terms(Terms.of(policy)))
        return found

    def _changes_reports(self, use_case: str, validated: int, charged: Policy | None) -> bool:
        """Whether reports validated under version ``validated`` cannot be charged as ``charged``.

        Only a change of what decodes them (the mechanism's parameters and hash family) or of
        the terms they are charged on (epsilon, caps, window, filters, group size, budget) does:
        a description, a publication threshold, a batch minimum or the reporting delta change
        neither, and reports in flight are charged under the new version.
        """
        if charged is None or not charged.active:
            return True
        self.mechanism(charged)
        return self._charging[(use_case, validated)] != self._charging[(use_case, charged.version)]

    def wrong_family(self, use_case: str, sent: object, params: str) -> InvalidReport:
        """The error of a report whose ``family`` is not the current policy's randomizer.

        Names what differs when the family is one this service published (a misbuilt device's
        reports are refused, so the error path may read every policy version).
        """
        current = next(m for m, p in self._mechanisms.values() if p == params)
        with self.ledger.engine.connect() as conn:
            versions = self.ledger.gate.book(conn).versions
        published = ((v.name, v.version, mechanism_for(v)) for v in reversed(versions))
        return InvalidReport(FAMILY_FIELD, mismatch_reason(sent, use_case, current, published))

    def receipt(self, decision: Decision) -> str:
        """An opaque charge receipt (never the report's id, which does not exist yet).

        ``HMAC-SHA256(device-key secret, label NUL origin NUL use case NUL charge id)``, 128
        bits in hex: charge ids are per database, and the transparency log's origin is each
        database's own name (fixed once it signs, and distinct for every shard of a
        deployment, whose shards share the secret), so receipts are unique across them
        (docs/api.md#receipts).
        """
        if decision.charge_id is None:
            raise ValueError("a refused report has no charge, so no receipt")
        charge = b"%s\0%d" % (decision.use_case.encode(), decision.charge_id)
        return self._keyed.digest(self._receipt_prefix + charge)[:16].hex()

    def inbox_pseudonym(self, use_case: str, device_id: str) -> int:
        """The device's pseudonym in the inbox for one use case (the flush counts distinct ones).

        Keyed BLAKE2b (a PRF) under a key derived from the secret for this purpose alone, so it
        equals no device key, receipt or tag of the ledger; the flush drops it (the store has
        none). 64 bits: two devices that collide are counted as one, which only understates
        ``n`` (a weaker, still valid, central figure). Computed for every report (about 9,000
        instructions, within the report path's guard: docs/performance.md), so every batch
        counts its distinct devices and has a central figure, whatever its policy's
        ``min_batch_devices``; its privacy is argued in docs/pipeline.md.
        """
        state = self._pseudonym_states.get(use_case)
        if state is None:
            state = self._pseudonym_base.copy()
            state.update(use_case.encode() + b"\0")
            self._pseudonym_states[use_case] = state
        tag = state.copy()
        tag.update(device_id.encode())
        return int.from_bytes(tag.digest(), "big", signed=True)

    def store_reports(
        self, conn: Connection, rows: list[tuple[str, str, int, bytes, int | None]]
    ) -> None:
        """Insert ``(use case, params, day, payload, pseudonym)`` inbox rows with the charges.

        Each row gets a random 63-bit id (sequential ids would pair one to one with the
        charges' ids, which the same transaction allocates in the same order), and its report
        and pseudonym are sealed (:meth:`InboxSeal.seal_rows`: the use case, parameter hash and
        day stay in clear, as the charge records them too). The seal authenticates the row
        (AES-GCM under a key held outside the database, bound to the row's id, use case,
        parameters and day): ``verify`` opens it, so it needs no tag of its own.
        """
        cursor = raw_cursor(conn)
        cursor.executemany(self._inbox_sql, self.seal.seal_rows(rows))

    def submit_group(
        self, requests: list[SubmitRequest], *, now: datetime
    ) -> list[Decision | Exception]:
        """Charge submissions together (:meth:`_submit`), validated on the book last read.

        Validation costs no query while the gate's cached book holds the use case; requests
        whose policy the charge found changed are validated again on the book it read and
        charged once more, as a client's immediate retry would be (:class:`PolicyChanged` only
        if it changes again).
        """
        out = self._submit(requests, now=now, fresh=False)
        again = [i for i, r in enumerate(out) if isinstance(r, PolicyChanged)]
        if again:
            redone = self._submit([requests[i] for i in again], now=now, fresh=True)
            for i, result in zip(again, redone, strict=True):
                out[i] = result
        return out

    def _submit(
        self, requests: list[SubmitRequest], *, now: datetime, fresh: bool
    ) -> list[Decision | Exception]:
        """Charge submissions together in one transaction (group commit, or a relay's batch).

        The answers are exactly those of submitting them one by one in this order: each body
        is validated against its use case's current policy, then :func:`charge_batch` decides
        in order; invalid bodies and gate errors come back as exceptions for their request.
        The inbox payload is the report re-encoded canonically (sorted keys, no spaces), and an
        idempotency key is bound to the use case and that payload. A use case whose policy
        changed between validation and charge, in how its reports are decoded or the terms
        they are charged on, gets :class:`PolicyChanged` for its requests only; any other edit
        (a description, say) is charged under the new version.
        """
        out: list[Decision | Exception | None] = [None] * len(requests)
        current: dict[str, tuple[Mechanism, str, int] | Exception] = {}
        batch: list[BatchItem] = []
        payloads: list[tuple[str, str, bytes, int | None]] = []
        positions: list[int] = []
        tallies: dict[str, list[int]] = {}  # use case -> [checked, implausible] (report health)
        for i, req in enumerate(requests):
            found = current.get(req.use_case)
            if found is None:
                try:
                    found = self.current(req.use_case, fresh=fresh)
                except (BudgetError, PolicyError) as exc:
                    found = exc
                current[req.use_case] = found
            if isinstance(found, Exception):
                out[i] = found
                continue
            body = req.body
            if type(body) is dict and FAMILY_FIELD in body:
                body = dict(body)
                sent = body.pop(FAMILY_FIELD)
                if sent != self._families[found[1]]:
                    out[i] = self.wrong_family(req.use_case, sent, found[1])
                    continue
            elif self.require_family and type(body) is dict:
                out[i] = InvalidReport(
                    FAMILY_FIELD,
                    f"is required: {self._families[found[1]]!r}, the `randomizer.family_id`"
                    f" of GET /v1/use-cases/{req.use_case}",
                )
                continue
            try:
                report = found[0].parse_report(body)
            except InvalidReport as exc:
                out[i] = exc
                continue
            test = self.health.test(found[1], found[0])
            if test is not None:
                tally = tallies.get(req.use_case) or tallies.setdefault(req.use_case, [0, 0])
                tally[0] += 1
                tally[1] += not test(report)
            payload = orjson.dumps(report.to_dict(), option=orjson.OPT_SORT_KEYS)
            request_hash = None
            if req.idempotency_key is not None:
                text = req.use_case.encode() + b"\n" + payload
                request_hash = hashlib.sha256(text).hexdigest()
            batch.append(BatchItem(req.device_id, req.use_case, req.idempotency_key, request_hash))
            tag = (  # a device id that is not a string is refused by the charge, unhashed
                self.inbox_pseudonym(req.use_case, req.device_id)
                if isinstance(req.device_id, str)
                else None
            )
            payloads.append((req.use_case, found[1], payload, tag))
            positions.append(i)
        if tallies:
            self.health.add(tallies)

        def enqueue(conn: Connection, accepted: list[tuple[int, Decision]]) -> None:
            stale = set()
            for _, d in accepted:
                found = current[d.use_case]
                if isinstance(found, Exception):
                    stale.add(d.use_case)
                elif d.policy_version != found[2] and d.use_case not in stale:
                    charged = self.ledger.gate.book(conn).latest.get(d.use_case)
                    if charged is not None and charged.version != d.policy_version:
                        charged = None
                    if self._changes_reports(d.use_case, found[2], charged):
                        stale.add(d.use_case)
            if stale:  # rolls the group back; it is charged again without these use cases
                raise _StalePolicies(stale)
            rows = [
                (payloads[n][0], payloads[n][1], d.day, payloads[n][2], payloads[n][3])
                for n, d in accepted
            ]
            self.store_reports(conn, rows)

        # A policy that changed after its reports were validated fails those reports only: the
        # group rolls back and the others are charged again (each round drops a use case).
        while batch:
            try:
                results = charge_batch(self.ledger.gate, batch, now=now, on_accept=enqueue)
            except _StalePolicies as exc:
                keep = [n for n, item in enumerate(batch) if item.use_case not in exc.use_cases]
                for n, item in enumerate(batch):
                    if item.use_case in exc.use_cases:
                        out[positions[n]] = PolicyChanged(item.use_case)
                batch = [batch[n] for n in keep]
                payloads = [payloads[n] for n in keep]
                positions = [positions[n] for n in keep]
                continue
            for n, result in enumerate(results):
                out[positions[n]] = result
            break
        final: list[Decision | Exception] = []
        for r in out:
            assert r is not None
            final.append(r)
        return final

    def submit_many(self, use_case: str, items: list[Any], *, now: datetime) -> list[ItemResult]:
        """A relay's batch for one use case: item shapes checked, then :meth:`submit_group`.

        Each item is judged on its own (an invalid one gets an error naming
        ``items[i].field``, the others go on), in order, exactly as one-by-one submissions.
        """
        self.current(use_case, fresh=False)  # an unknown use case fails the whole batch
        out: list[ItemResult | None] = [None] * len(items)
        requests: list[SubmitRequest] = []
        positions: list[int] = []
        allowed = {"device_id", "report", "idempotency_key"}
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                problem = InvalidRequest(f"items[{i}]", "must be an object")
                out[i] = ItemResult(None, problem, problem.reason, problem.field)
                continue
            if "device_id" not in item or len(item) > 3 or not allowed.issuperset(item):
                extra = sorted(set(item) - allowed)
                if extra:
                    problem = InvalidRequest(
                        f"items[{i}].{extra[0]}", "is not a field of a batch item"
                    )
                else:
                    problem = InvalidRequest(f"items[{i}].device_id", "is required")
                out[i] = ItemResult(None, problem, problem.reason, problem.field)
                continue
            requests.append(
                SubmitRequest(
                    use_case, item["device_id"], item.get("report"), item.get("idempotency_key")
                )
            )
            positions.append(i)
        results = self.submit_group(requests, now=now) if requests else []
        for i, result in zip(positions, results, strict=True):
            if isinstance(result, Decision):
                out[i] = ItemResult(result)
            elif isinstance(result, InvalidReport):
                out[i] = ItemResult(
                    None, result, result.reason, f"items[{i}].report.{result.field}"
                )
            elif isinstance(result, InvalidRequest):
                out[i] = ItemResult(None, result, result.reason, f"items[{i}].{result.field}")
            elif isinstance(result, IdempotencyConflict):
                out[i] = ItemResult(None, result, str(result), f"items[{i}].idempotency_key")
            elif isinstance(result, BudgetError):  # an unknown use case, a policy change
                out[i] = ItemResult(None, result, str(result), None)
            else:
                raise result
        final: list[ItemResult] = []
        for r in out:
            assert r is not None
            final.append(r)
        return final
