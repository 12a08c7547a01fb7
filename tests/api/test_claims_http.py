"""Over real HTTP: ``dpgov audit recompute --log URL`` reproduces the server's claims and reports.

A ledger with two days of reports and flushed batches, claimed by the claims job (built with
the real pipeline on a SQLite file), served by a real ``dpgov serve``. The verifier reads only
the public routes, with the log key computed offline as the operator publishes it: the tree
matches the signed checkpoint, every claim is reproduced exactly, and each regenerated daily
report is byte for byte the one the server publishes. A saved copy with one claim's epsilon
altered, or a batch size, fails; so does the log under another key.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from dp_governor.api.cli import app
from dp_governor.budget import create_db_engine
from dp_governor.budget.audit.tlog import TransparencyLog
from dp_governor.budget.clock import day_date
from dp_governor.budget.reporting.claims import CLAIM_ACTION
from dp_governor.budget.storage.db import key_fingerprint, record_fingerprints
from tests.budget.reporting.test_claims import FIRST, SECRET, build
from tests.live import serve

AUDIT_KEY = "claims-audit-key-claims-audit-key-claims-audit"
T = 120.0  # a busy machine answers slowly; no test depends on speed
runner = CliRunner()


def _log_key(folder: Path, audit_key: str) -> str:
    """A log's verifier key, as its operator publishes it (computed offline, never fetched)."""
    engine = create_db_engine(f"sqlite:///{folder / 'keys.sqlite'}")
    try:
        return TransparencyLog(engine, audit_key.encode()).verifier.vkey()
    finally:
        engine.dispose()


@pytest.fixture
def served(tmp_path: Path) -> str:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        build(engine, audit_key=AUDIT_KEY.encode())
        keys = {"device_key_secret": SECRET, "audit_key": AUDIT_KEY.encode()}
        # as a database's first start records them: the server then adopts its secrets
        record_fingerprints(
            engine, {f"fingerprint.{k}": key_fingerprint(v) for k, v in keys.items()}
        )
    finally:
        engine.dispose()
    return str(tmp_path)


def _tamper(copy: Path, out: Path, field: str) -> None:
    data = orjson.loads(copy.read_bytes())
    leaves = []
    for raw in data["leaves"]:
        leaf = orjson.loads(raw)
        if leaf["kind"] == CLAIM_ACTION and leaf["data"]["inputs"]["day"] == FIRST:
            if field == "epsilon":
                leaf["data"]["figures"]["batches"][0]["central"]["epsilon"] /= 2
            else:
                leaf["data"]["inputs"]["batches"][0]["reports"] += 1
            raw = orjson.dumps(leaf, option=orjson.OPT_SORT_KEYS).decode()
        leaves.append(raw)
    out.write_bytes(orjson.dumps({**data, "leaves": leaves}))


def test_recompute_reproduces_the_published_claims_over_http(served: str, tmp_path: Path) -> None:
    folder = Path(served)
    vkey = _log_key(tmp_path, AUDIT_KEY)
    copy, reports = tmp_path / "log.json", tmp_path / "reports"
    with serve(folder, device_key_secret=SECRET.decode(), audit_key=AUDIT_KEY) as live:
        args = ["audit", "recompute", "--log", live.base, "--log-key", vkey]
        result = runner.invoke(app, [*args, "--save", str(copy), "--reports", str(reports)])
        assert result.exit_code == 0, result.output
        assert "2 claims, 2 reproduced exactly" in result.output
        for day in (FIRST, FIRST + 1):
            iso = day_date(day).isoformat()
            published = httpx.get(f"{live.base}/v1/tlog/reports/emoji/{iso}", timeout=T)
            assert published.status_code == 200, published.text
            assert published.content == (reports / f"emoji-{iso}.txt").read_bytes()
        missing = httpx.get(f"{live.base}/v1/tlog/reports/emoji/2020-01-01", timeout=T)
        assert missing.status_code == 404 and "2020-01-01" in missing.text
        other = runner.invoke(app, [*args[:-1], _log_key(tmp_path, "another-audit-key-" * 3)])
        assert other.exit_code == 1 and "checkpoint is refused" in other.output, other.output
        # a quorum of witnesses: the served checkpoint carries no cosignature, a witness's does
        wkey = tmp_path / "w1.key"
        made = runner.invoke(
            app, ["witness", "key", "--name", "w.example/w1", "--key-file", str(wkey)]
        )
        assert made.exit_code == 0, made.output
        witness = ["--witness", made.output.strip(), "--quorum", "1"]
        alone = runner.invoke(app, [*args, *witness])
        assert alone.exit_code == 1 and "cosigned by 0" in alone.output, alone.output
        cosigned = tmp_path / "cosigned.txt"
        state = tmp_path / "w1.json"
        follow = ["witness", "run", "--log-url", live.base, "--log-key", vkey]
        files = ["--key-file", str(wkey), "--state-file", str(state), "--output", str(cosigned)]
        ran = runner.invoke(app, [*follow, "--name", "w.example/w1", *files])
        assert ran.exit_code == 0, ran.output
        quorum = runner.invoke(app, [*args, *witness, "--checkpoint", str(cosigned)])
        assert quorum.exit_code == 0 and "2 reproduced exactly" in quorum.output, quorum.output
    # offline, in a process that never opened a database
    cli = [sys.executable, "-m", "dp_governor.api.cli", "audit", "recompute"]
    offline = subprocess.run(
        [*cli, "--log", str(copy), "--log-key", vkey],
        capture_output=True,
        text=True,
        check=False,
    )
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert "2 claims, 2 reproduced exactly" in offline.stdout
    for field in ("epsilon", "reports"):
        bad = tmp_path / f"{field}.json"
        _tamper(copy, bad, field)
        result = runner.invoke(app, ["audit", "recompute", "--log", str(bad), "--log-key", vkey])
        assert result.exit_code == 1, result.output
        assert "a leaf was altered" in result.output  # the signed root no longer matches
        assert "MISMATCH" in result.output and "1 reproduced exactly" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log", "missing.json"], "--log: missing.json: not a saved log copy"),
        (["export.jsonl", "--log", "x.json"], "not both"),
        ([], "give an export FILE"),
        (["--log", "{copy}", "--log-key", "not-a-key"], "--log-key"),
        (["--log", "{copy}", "--witness", "bad"], "--witness"),
    ],
)
def test_recompute_refuses_bad_input_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    copy = tmp_path / "copy.json"
    copy.write_text('{"vkey": "x", "note": "x", "size": 0, "leaves": []}', encoding="utf-8")
    argv = [a.replace("{copy}", str(copy)) for a in args]
    result = runner.invoke(app, ["audit", "recompute", *argv])
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output
