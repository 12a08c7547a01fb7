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
from budget.errors import BudgetError
from mechanisms import CMS, HCMS, SFP, InvalidReport
from policies import Policy, mechanism_for

__all__ = ["Ingestor", "ItemResult", "PolicyChanged", "params_hash"]

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

        Raises:
            InvalidReport: the body does not fit the mechanism (nothing charged or stored).
            UnknownUseCase, InvalidRequest, IdempotencyConflict: from the gate.
            PolicyChanged: the policy changed under the request.
        """
        policy = self.ledger.policies.get(use_case)
        mech, params = self.mechanism(policy)
        report = mech.parse_report(body)
        payload = json.dumps(report.to_dict(), separators=(",", ":"), sort_keys=True)
        request_hash = hashlib.sha256(f"{use_case}\n{payload}".encode()).hexdigest()

        def enqueue(conn: Connection, decision: Decision) -> None:
            if decision.policy_version != policy.version:
                raise PolicyChanged(use_case)
            conn.execute(
                _INBOX.insert().values(
                    use_case=use_case, params=params, day=decision.day, payload=payload
                )
            )

        return self.ledger.charge(
            device_id,
            use_case,
            now=now,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            on_accept=enqueue,
        )

    def submit_many(
        self, use_case: str, items: list[dict[str, Any]], *, now: datetime
    ) -> list[ItemResult]:
        """Submit a relay's batch item by item; one item's failure never affects another."""
        from budget.errors import IdempotencyConflict, InvalidRequest

        out: list[ItemResult] = []
        for i, item in enumerate(items):
            prefix = f"items[{i}]."
            if not isinstance(item, dict):
                out.append(ItemResult(None, 422, "must be an object", f"items[{i}]"))
                continue
            extra = set(item) - {"device_id", "report", "idempotency_key"}
            if extra:
                field = prefix + sorted(extra)[0]
                out.append(ItemResult(None, 422, "is not a field of a batch item", field))
                continue
            try:
                decision = self.submit(
                    use_case,
                    item.get("device_id"),  # type: ignore[arg-type]
                    item.get("report"),
                    now=now,
                    idempotency_key=item.get("idempotency_key"),
                )
            except InvalidReport as exc:
                out.append(ItemResult(None, 422, exc.reason, prefix + "report." + exc.field))
            except InvalidRequest as exc:
                out.append(ItemResult(None, 422, exc.reason, prefix + exc.field))
            except IdempotencyConflict as exc:
                out.append(ItemResult(None, 409, str(exc), prefix + "idempotency_key"))
            except PolicyChanged as exc:
                out.append(ItemResult(None, 409, str(exc), None))
            else:
                out.append(ItemResult(decision, 202 if decision.accepted else 429))
        return out
