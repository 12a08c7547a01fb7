"""Over real HTTP: a device simulator checks the server's record of its spend.

A real ``dpgov serve`` on a SQLite file. The device submits reports through the client, keeps
its own count from the receipts (two reports of one use case among them: two leaves, two
labels), and after the checkpoint job verifies its record with the log's key configured out of
band (derived here from the audit key, as the operator would publish it): proofs, labels,
running totals, the gate's totals and its own count agree. Then a database writer
drops one of its charges from the public log, or alters one: the device's check fails naming
what disagrees.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from dp_governor.budget import create_db_engine
from dp_governor.budget.audit.tlog import TransparencyLog
from dp_governor.client import Client, Receipt, verify_record
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T, _report
from tests.live import ADMIN_TOKEN, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _log_key(folder: Path) -> str:
    """The log's verifier key, as the operator publishes it (computed offline, not fetched)."""
    engine = create_db_engine(f"sqlite:///{folder / 'ledger.sqlite'}")
    try:
        return TransparencyLog(engine, AUDIT_KEY.encode()).verifier.vkey()
    finally:
        engine.dispose()


def _tamper(folder: Path, table: str, statement: str) -> None:
    engine = create_db_engine(f"sqlite:///{folder / 'ledger.sqlite'}")
    try:
        with engine.begin() as conn:
            for op in ("update", "delete"):
                conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_no_{op}"))
            conn.execute(text(statement))
    finally:
        engine.dispose()


@pytest.mark.parametrize("edit", ["none", "dropped", "altered"])
def test_a_device_checks_its_spend_against_the_public_log(tmp_path: Path, edit: str) -> None:
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        base = served.base
        client = Client(base, admin_token=ADMIN_TOKEN, timeout=T)
        sent: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for use_case in ("emoji", "lookup-hints", "lookup-hints", "emoji"):
            result = client.submit(use_case, "phone", _report(base, use_case))
            if isinstance(result, Receipt):
                sent[use_case][0] += 1
                sent[use_case][1] += round(result.epsilon * 1_000_000)
        client.submit("emoji", "tablet", _report(base, "emoji"))
        ran = httpx.post(f"{base}/v1/admin/jobs/checkpoint:run", headers=ADMIN, timeout=T)
        assert ran.status_code == 200, ran.text
        assert ran.json()["result"]["tlog"]["size"] >= 4
        today = datetime.now(UTC).date()
        vkey = _log_key(tmp_path)
        assert client.tlog_checkpoint().vkey == vkey
        if edit == "dropped":  # the server hides one of the device's charges from the log
            _tamper(
                tmp_path,
                "tlog_leaves",
                "DELETE FROM tlog_leaves WHERE idx = (SELECT min(idx) FROM tlog_leaves"
                ' WHERE data LIKE \'%"kind":"charge"%\')',
            )
        elif edit == "altered":  # ... or rewrites what it says
            _tamper(
                tmp_path,
                "tlog_leaves",
                "UPDATE tlog_leaves SET data = replace(data, '\"epsilon_micro\"', '\"eps\"') "
                'WHERE data LIKE \'%"kind":"charge"%\'',
            )
        record = client.tlog_record("phone", today)
        mine = {uc: (n, e) for uc, (n, e) in sent.items()}
        check = verify_record(record, vkey, sent=mine)
        client.close()
    if edit == "none":
        assert check.ok, check.problem
        assert mine["lookup-hints"][0] == 2  # two charges of one use case, two labels
        assert check.totals == mine and len(record.leaves) == sum(n for n, _ in mine.values())
    elif edit == "dropped":
        assert not check.ok and "gate's totals" in (check.problem or ""), check.problem
    else:
        assert not check.ok and "not in the signed tree" in (check.problem or ""), check.problem


def test_a_device_reads_only_its_own_record(tmp_path: Path) -> None:
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        url = f"{served.base}/v1/devices/phone/tlog"
        other = httpx.get(
            url, params={"day": "2026-11-22"}, headers={"X-Device-Id": "x"}, timeout=T
        )
        assert other.status_code == 403
        bad = httpx.get(
            url, params={"day": "yesterday"}, headers={"X-Device-Id": "phone"}, timeout=T
        )
        assert bad.status_code == 422 and "day" in bad.text
        empty = httpx.get(
            url, params={"day": "2026-11-22"}, headers={"X-Device-Id": "phone"}, timeout=T
        )
        assert empty.status_code == 200 and empty.json()["leaves"] == []
        leaves = httpx.get(
            f"{served.base}/v1/tlog/leaves", params={"start": 0, "end": 5000}, timeout=T
        )
        assert leaves.status_code == 422 and "`end`" in leaves.text
        proof = httpx.get(
            f"{served.base}/v1/tlog/consistency", params={"old": 3, "new": 9}, timeout=T
        )
        assert proof.status_code == 422 and "`new`" in proof.text
