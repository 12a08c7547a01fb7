"""Report ingestion: validate a report against its use case's mechanism, charge, enqueue.

The charge and the inbox row commit together (the gate's ``on_accept``), so an acknowledged
report always has both, and a refused or failed one has neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from api.tables import InboxRow
from budget import Decision, Ledger
from budget.batch import BatchItem, charge_batch
from budget.errors import BudgetError, IdempotencyConflict, InvalidRequest
from mechanisms import CMS, HCMS, SFP, InvalidReport
from policies import Policy, mechanism_for
from policies.errors import PolicyError

__all__ = ["Ingestor", "ItemResult", "PolicyChanged", "SubmitRequest", "params_hash"]

_INBOX = InboxRow.__table__  # type: ignore[attr-defined]
Mechanism = CMS | HCMS | SFP


class PolicyChanged(BudgetError):
    """The policy changed between validation and charge; the client may retry at once."""

    def __init__(self, use_case: str) -> None:
        super().__init__(f"the policy of {use_case!r} changed during the request; retry")
        self.use_case = use_case


def params_hash(mechanism: Mechanism) -> str:
    """A stable fingerprint of a mechanism's parameters (sketches of equal hashes add)."""
    fields = {f.name: getattr(mechanism, f.name) for f in dataclasses.fields(mechanism)}
    fields["hash_family"] = mechanism.hash_family.to_dict()
    fields["mechanism"] = mechanism.name
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One device's submission, as the HTTP route received it."""

    use_case: str
    device_id: str
    body: Any
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class ItemResult:
    """The outcome of one item of a batch: a decision, or an error naming a field."""

    decision: Decision | None = None
    status: int = 202
    error: str | None = None
    field: str | None = None


class Ingestor:
    """Validates, charges and enqueues reports for a ledger."""

    def __init__(self, ledger: Ledger, secret: bytes) -> None:
        self.ledger = ledger
        self._secret = secret
        self._mechanisms: dict[tuple[str, int], tuple[Mechanism, str]] = {}
        ph = "?" if ledger.engine.dialect.paramstyle == "qmark" else "%s"
        self._inbox_sql = (
            f"INSERT INTO inbox (use_case, params, day, payload) VALUES ({ph}, {ph}, {ph}, {ph})"
        )

    def mechanism(self, policy: Policy) -> tuple[Mechanism, str]:
        """The policy's mechanism and its parameter hash (cached per version)."""
        key = (policy.name, policy.version)
        found = self._mechanisms.get(key)
        if found is None:
            mech = mechanism_for(policy)
            found = (mech, params_hash(mech))
            self._mechanisms[key] = found
        return found

    def receipt(self, decision: Decision) -> str:
        """An opaque charge receipt (never the report's id, which does not exist yet)."""
        msg = f"receipt:{decision.use_case}:{decision.charge_id}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()[:32]

    def submit(
        self,
        use_case: str,
        device_id: str,
        body: Any,
        *,
        now: datetime,
        idempotency_key: str | None = None,
    ) -> Decision:
        """Validate ``body`` for ``use_case``, then charge and enqueue it atomically.

        The body is checked against the policy read inside the charge's transaction, so a
        report is always charged under the parameters it was validated against.

        Raises:
            InvalidReport: the body does not fit the mechanism (nothing charged or stored).
            UnknownUseCase, InvalidRequest, IdempotencyConflict: from the gate.
        """
        prepared: dict[str, str] = {}

        def validate(policy: Policy) -> None:
            mech, params = self.mechanism(policy)
            report = mech.parse_report(body)
            prepared["params"] = params
            prepared["payload"] = json.dumps(
                report.to_dict(), separators=(",", ":"), sort_keys=True
            )

        def enqueue(conn: Connection, decision: Decision) -> None:
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cursor.execute(
                self._inbox_sql, (use_case, prepared["params"], decision.day, prepared["payload"])
            )

        # The idempotency fingerprint covers the body as sent (before the policy is known).
        canonical = json.dumps(body, separators=(",", ":"), sort_keys=True, default=str)
        request_hash = hashlib.sha256(f"{use_case}\n{canonical}".encode()).hexdigest()
        return self.ledger.charge(
            device_id,
            use_case,
            now=now,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            on_accept=enqueue,
            validate=validate,
        )

    def submit_group(
        self, requests: list[SubmitRequest], *, now: datetime
    ) -> list[Decision | Exception]:
        """Charge concurrent single submissions together in one transaction (group commit).

        The answers are exactly those of submitting them one by one in this order: each body
        is validated against its use case's current policy, then :func:`charge_batch` decides
        in order; invalid bodies and gate errors come back as exceptions for their request.
        """
        out: list[Decision | Exception | None] = [None] * len(requests)
        policies: dict[str, Policy | Exception] = {}
        batch: list[BatchItem] = []
        payloads: list[tuple[str, str, str]] = []
        positions: list[int] = []
        for i, req in enumerate(requests):
            if req.use_case not in policies:
                try:
                    policies[req.use_case] = self.ledger.policies.get(req.use_case)
                except (BudgetError, PolicyError) as exc:
                    policies[req.use_case] = exc
            policy = policies[req.use_case]
            if isinstance(policy, Exception):
                out[i] = policy
                continue
            mech, params = self.mechanism(policy)
            try:
                report = mech.parse_report(req.body)
            except InvalidReport as exc:
                out[i] = exc
                continue
            payload = json.dumps(report.to_dict(), separators=(",", ":"), sort_keys=True)
            canonical = json.dumps(req.body, separators=(",", ":"), sort_keys=True, default=str)
            request_hash = hashlib.sha256(f"{req.use_case}\n{canonical}".encode()).hexdigest()
            batch.append(BatchItem(req.device_id, req.use_case, req.idempotency_key, request_hash))
            payloads.append((req.use_case, params, payload))
            positions.append(i)

        def enqueue(conn: Connection, accepted: list[tuple[int, Decision]]) -> None:
            for _, d in accepted:
                policy = policies[d.use_case]
                if isinstance(policy, Exception) or d.policy_version != policy.version:
                    raise PolicyChanged(d.use_case)
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cursor.executemany(
                self._inbox_sql,
                [(payloads[n][0], payloads[n][1], d.day, payloads[n][2]) for n, d in accepted],
            )

        if batch:
            results = charge_batch(self.ledger.gate, batch, now=now, on_accept=enqueue)
            for n, result in enumerate(results):
                out[positions[n]] = result
        final: list[Decision | Exception] = []
        for r in out:
            assert r is not None
            final.append(r)
        return final

    def submit_many(self, use_case: str, items: list[Any], *, now: datetime) -> list[ItemResult]:
        """Submit a relay's batch in one transaction (:func:`budget.batch.charge_batch`).

        Each item is validated on its own (an invalid item gets a 422 naming
        ``items[i].field``, the others go on); the valid ones are decided in order, exactly as
        one-by-one submissions would be, and their inbox rows are written with their charges.
        """
        policy = self.ledger.policies.get(use_case)
        mech, params = self.mechanism(policy)
        out: list[ItemResult | None] = [None] * len(items)
        batch: list[BatchItem] = []
        payloads: list[str] = []
        positions: list[int] = []
        for i, item in enumerate(items):
            prefix = f"items[{i}]."
            if not isinstance(item, dict):
                out[i] = ItemResult(None, 422, "must be an object", f"items[{i}]")
                continue
            extra = set(item) - {"device_id", "report", "idempotency_key"}
            if extra:
                out[i] = ItemResult(
                    None, 422, "is not a field of a batch item", prefix + sorted(extra)[0]
                )
                continue
            if "device_id" not in item:
                out[i] = ItemResult(None, 422, "is required", prefix + "device_id")
                continue
            try:
                report = mech.parse_report(item.get("report"))
            except InvalidReport as exc:
                out[i] = ItemResult(None, 422, exc.reason, prefix + "report." + exc.field)
                continue
            payload = json.dumps(report.to_dict(), separators=(",", ":"), sort_keys=True)
            request_hash = hashlib.sha256(f"{use_case}\n{payload}".encode()).hexdigest()
            batch.append(
                BatchItem(item["device_id"], use_case, item.get("idempotency_key"), request_hash)
            )
            payloads.append(payload)
            positions.append(i)
        placeholder = "?" if self.ledger.engine.dialect.paramstyle == "qmark" else "%s"

        def enqueue(conn: Connection, accepted: list[tuple[int, Decision]]) -> None:
            if any(d.policy_version != policy.version for _, d in accepted):
                raise PolicyChanged(use_case)
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cursor.executemany(
                "INSERT INTO inbox (use_case, params, day, payload) VALUES"
                f" ({placeholder}, {placeholder}, {placeholder}, {placeholder})",
                [(use_case, params, d.day, payloads[n]) for n, d in accepted],
            )

        results = charge_batch(self.ledger.gate, batch, now=now, on_accept=enqueue)
        for n, result in enumerate(results):
            i = positions[n]
            if isinstance(result, Decision):
                out[i] = ItemResult(result, 202 if result.accepted else 429)
            elif isinstance(result, InvalidRequest):
                out[i] = ItemResult(None, 422, result.reason, f"items[{i}].{result.field}")
            elif isinstance(result, IdempotencyConflict):
                out[i] = ItemResult(None, 409, str(result), f"items[{i}].idempotency_key")
            else:
                out[i] = ItemResult(None, 404, str(result), None)
        final: list[ItemResult] = []
        for r in out:
            assert r is not None
            final.append(r)
        return final
