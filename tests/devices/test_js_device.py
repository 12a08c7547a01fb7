"""The JavaScript device of ``devices/js``, written from docs/device.md, against the server.

Its own suite passes, and its reports sent to a real server give calibrated estimates. Both
need Node.js (``node``, 18 or newer); ``.ci/run`` installs Debian's ``nodejs`` where it is
missing. The package has no dependencies, so nothing is installed for it.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from dp_governor.api.client import Client
from tests.live import ADMIN_TOKEN, serve

ROOT: Final = Path(__file__).resolve().parents[2]
JS: Final = ROOT / "devices" / "js"
Z: Final = 5.0  # each estimate must lie within Z of its stated standard errors of the truth
MIN_NODE: Final = 18  # Debian 12's nodejs


def _find_node() -> tuple[str | None, str]:
    """The ``node`` on the PATH if it is recent enough, else ``None`` and why."""
    node = shutil.which("node")
    if node is None:
        return None, "Node.js (`node`) is not installed; .ci/run installs Debian's nodejs"
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    major = int(version.lstrip("v").split(".")[0]) if version.startswith("v") else 0
    if major < MIN_NODE:
        return None, f"Node.js {version or '?'} is older than {MIN_NODE}"
    return node, ""


NODE, WHY = _find_node()
needs_node = pytest.mark.skipif(NODE is None, reason=WHY)

# Small sketches and a few thousand devices: the whole check takes seconds on two cores.
USE_CASES: Final[dict[str, tuple[dict[str, Any], dict[str, int]]]] = {
    "js-cms": (
        {"mechanism": "cms", "k": 32, "m": 128, "epsilon_per_report": 4.0},
        {"😂": 1000, "❤️": 600, "www.example.com": 300, "e\u0301": 100, "🙈": 0},
    ),
    "js-hcms": (
        {"mechanism": "hcms", "k": 32, "m": 128, "epsilon_per_report": 4.0},
        {"a.example": 1000, "b.example": 600, "ünïcødé.example": 300, "": 100, "z.example": 0},
    ),
    "js-sfp": (
        {
            "mechanism": "sfp",
            "k": 32,
            "m": 128,
            "k_fragment": 32,
            "m_fragment": 128,
            "epsilon_word": 4.0,
            "epsilon_fragment": 4.0,
            "epsilon_per_report": 8.0,
        },
        {"bae": 1000, "despacito": 600, "ünïcødé": 300, "😂😂": 100, "nope": 0},
    ),
}


def _node() -> str:
    assert NODE is not None
    return NODE


def test_the_js_package_depends_on_nothing_but_the_platform() -> None:
    package = json.loads((JS / "package.json").read_text(encoding="utf-8"))
    lock = json.loads((JS / "package-lock.json").read_text(encoding="utf-8"))
    assert not {"dependencies", "devDependencies", "optionalDependencies"} & set(package)
    assert list(lock["packages"]) == [""], "the lock file holds packages"
    assert lock["packages"][""]["version"] == package["version"]


@needs_node
def test_the_js_device_suite_passes() -> None:
    """``node --test`` in devices/js: BLAKE2b, the shared vectors, validation, HTTP."""
    proc = subprocess.run(
        [_node(), "--test"], cwd=JS, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout


def _fleet(base: str, use_case: str, counts: dict[str, int]) -> dict[str, Any]:
    """Run devices/js/bin/fleet.js: one device per report, the platform's CSPRNG."""
    job = {
        "url": base,
        "use_case": use_case,
        "prefix": f"{use_case}-device-",
        "values": [[value, n] for value, n in counts.items() if n],
        "concurrency": 8,
    }
    return _node_json([str(JS / "bin" / "fleet.js")], job)


def _node_json(args: list[str], given: dict[str, Any]) -> dict[str, Any]:
    """Run node in devices/js with ``given`` as JSON on stdin; its stdout parsed as JSON."""
    proc = subprocess.run(
        [_node(), *args],
        cwd=JS,
        input=json.dumps(given),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


@needs_node
def test_reports_from_the_js_device_give_calibrated_estimates(tmp_path: Path) -> None:
    """6,000 devices privatize with their CSPRNG; each estimate is within Z standard errors.

    The coins are the platform's, not seeded: with 15 estimates at ``Z = 5`` a correct device
    fails with probability about 1e-5, while a wrong key, hash or bit layout moves the largest
    estimates by tens of standard errors.
    """
    admin_headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with (
        serve(tmp_path, require_report_family=None) as served,
        Client(served.base, admin_token=ADMIN_TOKEN) as admin,
    ):
        for name, (fields, _) in USE_CASES.items():
            body = {**fields, "max_reports_per_day": 1, "description": "The JavaScript device."}
            put = httpx.put(
                f"{served.base}/v1/use-cases/{name}", json=body, headers=admin_headers, timeout=60
            )
            assert put.status_code in (200, 201), put.text
        for name, (_, counts) in USE_CASES.items():
            summary = _fleet(served.base, name, counts)
            assert summary["statuses"] == {"202": sum(counts.values())}, summary
            assert summary["family"] == admin.policy(name).randomizer.family_id

        moved = admin.run_job("aggregate").result
        total = sum(sum(counts.values()) for _, counts in USE_CASES.values())
        assert moved["folded"] == total, moved

        for name, (_, counts) in USE_CASES.items():
            est = admin.estimates(name, list(counts))
            assert est.n == sum(counts.values())
            published = {e.item: e for e in est.estimates}
            for item, truth in counts.items():
                e = published.get(item)
                if e is None:  # below the publication threshold (0): only a rare value may be
                    assert truth < Z * max(p.stderr for p in est.estimates), (name, item)
                    continue
                assert math.isfinite(e.stderr) and e.stderr > 0
                z = (e.count - truth) / e.stderr
                assert abs(z) < Z, (name, item, truth, e.count, e.stderr, z)

        # The JS device checks the server's record of its spend against the signed log.
        admin.run_job("checkpoint")
        log_key = admin.tlog_checkpoint().vkey  # the key a device is configured with
        today = datetime.now(UTC).date()
        record = admin.tlog_record("js-cms-device-0", today)  # what the device's GET returns
        assert record.leaves, record
        honest = _verify_in_node(record.model_dump(), log_key)
        assert honest == {"ok": True, "problem": None, "totals": {"js-cms": [1, 4_000_000]}}
        shown = record.model_dump()
        shown["gate"][0]["reports"] += 1  # a server that claims a charge the log lacks
        lying = _verify_in_node(shown, log_key)
        assert not lying["ok"] and "the gate's totals for 'js-cms'" in lying["problem"], lying


_VERIFY = """
import { verifyRecord } from "./src/index.js";
let input = "";
for await (const chunk of process.stdin) input += chunk;
const { record, key } = JSON.parse(input);
const check = await verifyRecord(record, key);
console.log(JSON.stringify({ ok: check.ok, problem: check.problem, totals: check.totals }));
"""


def _verify_in_node(record: dict[str, Any], log_key: str) -> dict[str, Any]:
    """``verifyRecord`` of devices/js over a record the server returned."""
    return _node_json(["--input-type=module", "-e", _VERIFY], {"record": record, "key": log_key})
