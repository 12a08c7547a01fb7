"""Record the OpenAPI reference's response examples from a real, seeded service.

``python -m dp_governor.api.openapi_record --write`` starts the app on a temporary SQLite database
with Apple's default policies, a device-wide budget and a use case published in shuffled batches,
sends reports through the real routes (one of them refused at its cap), runs the inbox flush,
then calls every read operation and writes what it answered into ``api/openapi_examples.json``
(lists cut to two items). Examples that a read cannot produce (writes, discoveries, ``/metrics``
and the 400/413 errors) stay as they are in the file. Without ``--write`` it prints the
operations it would change. A tool for maintainers; the service never imports it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from pydantic import SecretStr

from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.mechanisms import from_published
from dp_governor.policies import PolicyBase
from dp_governor.policies.device import DeviceBudgetCreate

__all__ = ["EXAMPLES", "record"]

EXAMPLES = Path(__file__).with_name("openapi_examples.json")
TOKEN = "example-admin-token-example-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)
DEVICE = "device-000000"
DEVICES = [f"device-{i:06d}" for i in range(3)]


def _trim(value: Any) -> Any:
    """The value with every list cut to its first two items (examples, not data dumps)."""
    if isinstance(value, list):
        return [_trim(v) for v in value[:2]]
    if isinstance(value, dict):
        return {k: _trim(v) for k, v in value.items()}
    return value


def _seed(client: TestClient, examples: dict[str, Any]) -> None:
    """Reports, a refusal, a device-wide budget and a shuffled batch, recording the writes."""
    ledger = client.app.state.ledger  # type: ignore[attr-defined]
    ledger.set_device_budget(
        DeviceBudgetCreate(
            epsilon_per_day=24.0, window_days=30, window_epsilon=300.0, quotas={"emoji": 0.5}
        ),
        actor="admin",
    )
    emoji = client.get("/v1/use-cases/emoji").json()
    fields = {k: v for k, v in emoji.items() if k in PolicyBase.model_fields}
    put = client.put(
        "/v1/use-cases/emoji",
        json={**fields, "min_batch_devices": 2},
        params={"allow_loosen": "true"},
        headers=ADMIN,
    )
    put.raise_for_status()
    examples["responses"]["put /v1/use-cases/{name}"] = {"200": _trim(put.json())}
    group = client.get("/v1/budget-groups/safari-domains").json()["terms"]
    shared = client.put(
        "/v1/budget-groups/safari-domains",
        json={**group, "lifetime_epsilon_cap": 400.0},
        headers=ADMIN,
    )
    shared.raise_for_status()
    examples["responses"]["put /v1/budget-groups/{group}"] = {"200": _trim(shared.json())}
    proposal = client.post(
        "/v1/budget-groups/safari-domains/what-if",
        json={**group, "lifetime_epsilon_cap": 200.0},
        headers=ADMIN,
    )
    proposal.raise_for_status()
    examples["responses"]["post /v1/budget-groups/{group}/what-if"] = {
        "200": _trim(proposal.json())
    }
    mechanism = from_published(put.json()["randomizer"])
    family = put.json()["randomizer"]["family_id"]
    for device in DEVICES:
        body = {**mechanism.privatize_one("😂").to_dict(), "family": family}
        sent = client.post(
            "/v1/use-cases/emoji/reports", json=body, headers={"X-Device-Id": device}
        )
        sent.raise_for_status()
    again = {**mechanism.privatize_one("😂").to_dict(), "family": family}
    refused = client.post(
        "/v1/use-cases/emoji/reports", json=again, headers={"X-Device-Id": DEVICE}
    )
    assert refused.status_code == 429, refused.text
    client.post("/v1/admin/jobs/flush-inbox:run", headers=ADMIN).raise_for_status()
    client.post("/v1/admin/jobs/checkpoint:run", headers=ADMIN).raise_for_status()
    examples["errors"]["429"] = refused.json()


READS: dict[str, tuple[str, dict[str, str]]] = {
    "get /v1/use-cases": ("/v1/use-cases", {}),
    "get /v1/use-cases/{name}": ("/v1/use-cases/emoji", {}),
    "get /v1/use-cases/{name}/versions": ("/v1/use-cases/emoji/versions", {}),
    "get /v1/devices/{device_id}/budget": (f"/v1/devices/{DEVICE}/budget", {"X-Device-Id": DEVICE}),
    "get /v1/device-budget": ("/v1/device-budget", {}),
    "get /v1/budget-groups/{group}": ("/v1/budget-groups/safari-domains", {}),
    "get /v1/audit/effective-epsilon": ("/v1/audit/effective-epsilon", {}),
    "get /v1/audit/devices/{device_id}": (f"/v1/audit/devices/{DEVICE}", ADMIN),
    "get /v1/audit/use-cases/{name}/distribution": (
        "/v1/audit/use-cases/emoji/distribution",
        {},
    ),
    "get /v1/audit/verify": ("/v1/audit/verify", ADMIN),
    "get /healthz": ("/healthz", {}),
    "get /v1/tlog/checkpoint": ("/v1/tlog/checkpoint", {}),
    "get /v1/tlog/leaves": ("/v1/tlog/leaves?start=0&end=2", {}),
    "get /v1/tlog/consistency": ("/v1/tlog/consistency?old=1&new=4", {}),
    "get /v1/devices/{device_id}/tlog": (
        f"/v1/devices/{DEVICE}/tlog?day=2026-11-23",
        {"X-Device-Id": DEVICE},
    ),
}


def record() -> dict[str, Any]:
    """The examples file as a seeded service answers it now."""
    examples: dict[str, Any] = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'examples.sqlite'}",
            secret_file=Path(tmp) / "secret",
            audit_key_file=Path(tmp) / "audit.key",
            shuffler_key_file=Path(tmp) / "shuffler.key",
            admin_token=SecretStr(TOKEN),
            scheduler=False,
            flush_min_batch=1,
        )
        with TestClient(create_app(settings, clock=FixedClock(NOW))) as client:
            _seed(client, examples)
            for key, (path, headers) in READS.items():
                answer = client.get(path, headers=headers)
                answer.raise_for_status()
                examples["responses"][key] = {str(answer.status_code): _trim(answer.json())}
            retired = client.delete("/v1/use-cases/health-types", headers=ADMIN)
            retired.raise_for_status()
            examples["responses"]["delete /v1/use-cases/{name}"] = {"200": _trim(retired.json())}
    return examples


def main() -> None:
    """Print what would change, or write it with ``--write``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write api/openapi_examples.json")
    args = parser.parse_args()
    old = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    new = record()
    changed = [k for k in new["responses"] if new["responses"][k] != old["responses"].get(k)]
    if new["errors"] != old["errors"]:
        changed.append("errors")
    if args.write:
        EXAMPLES.write_text(json.dumps(new, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(("written: " if args.write else "would change: ") + (", ".join(changed) or "nothing"))


if __name__ == "__main__":
    main()
