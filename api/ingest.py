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

from budget import Decision, Ledger
from budget.batch import BatchItem, charge_batch
from budget.db import placeholder
from budget.errors import BudgetError, IdempotencyConflict, InvalidRequest
from mechanisms import CMS, HCMS, SFP, InvalidReport
from policies import Policy, mechanism_for
from policies.errors import PolicyError

__all__ = ["Ingestor", "ItemResult", "PolicyChanged", "SubmitRequest", "params_hash"]

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
        ph = placeholder(ledger.engine)
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
        """A relay's batch for one use case: item shapes checked, then :meth:`submit_group`.

        Each item is judged on its own (an invalid one gets an error naming
        ``items[i].field``, the others go on), in order, exactly as one-by-one submissions.
        """
        self.ledger.policies.get(use_case)  # an unknown use case fails the whole batch
        out: list[ItemResult | None] = [None] * len(items)
        requests: list[SubmitRequest] = []
        positions: list[int] = []
        for i, item in enumerate(items):
            prefix = f"items[{i}]."
            if not isinstance(item, dict):
                out[i] = ItemResult(None, 422, "must be an object", f"items[{i}]")
                continue
            extra = set(item) - {"device_id", "report", "idempotency_key"}
            if extra:
                field = prefix + sorted(extra)[0]
                out[i] = ItemResult(None, 422, "is not a field of a batch item", field)
                continue
            if "device_id" not in item:
                out[i] = ItemResult(None, 422, "is required", prefix + "device_id")
                continue
            requests.append(
                SubmitRequest(
                    use_case, item["device_id"], item.get("report"), item.get("idempotency_key")
                )
            )
            positions.append(i)
        results = self.submit_group(requests, now=now) if requests else []
        for i, result in zip(positions, results, strict=True):
            prefix = f"items[{i}]."
            if isinstance(result, Decision):
                out[i] = ItemResult(result, 202 if result.accepted else 429)
            elif isinstance(result, InvalidReport):
                out[i] = ItemResult(None, 422, result.reason, prefix + "report." + result.field)
            elif isinstance(result, InvalidRequest):
                out[i] = ItemResult(None, 422, result.reason, prefix + result.field)
            elif isinstance(result, IdempotencyConflict):
                out[i] = ItemResult(None, 409, str(result), prefix + "idempotency_key")
            else:
                out[i] = ItemResult(None, 404, str(result), None)
        final: list[ItemResult] = []
        for r in out:
            assert r is not None
            final.append(r)
        return final
