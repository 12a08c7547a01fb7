"""The log pushes its checkpoints to witnesses and serves their cosignatures (real servers).

A real ``dpgov serve`` configured with two ``dpgov witness serve`` processes: the checkpoint
job submits to both, one of them down at first; the served checkpoint carries the cosignatures,
and a client's quorum check accepts or refuses it with no other call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from dp_governor.api.client import verify_record
from dp_governor.api.schemas import DeviceRecord
from dp_governor.api.server import free_port
from dp_governor.budget import create_db_engine
from dp_governor.budget.audit.tlog import TransparencyLog
from dp_governor.mechanisms.signed_note import (
    COSIGNATURE,
    Checkpoint,
    NoteError,
    Signer,
    Verifier,
)
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T, _report
from tests.api.test_witness import submission, witness_service
from tests.live import ADMIN_TOKEN, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _wkey(name: str, seed: int) -> str:
    return Signer(name, bytes([seed] * 32), kind=COSIGNATURE).verifier.vkey()


def _checkpoint_job(base: str) -> dict[str, str]:
    ran = httpx.post(f"{base}/v1/admin/jobs/checkpoint:run", headers=ADMIN, timeout=T)
    assert ran.status_code == 200, ran.text
    witnesses: dict[str, str] = ran.json()["result"]["witnesses"]
    return witnesses


def test_the_log_gets_its_checkpoint_cosigned_and_serves_the_cosignatures(
    tmp_path: Path,
) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'offline.sqlite'}")
    log = TransparencyLog(engine, AUDIT_KEY.encode()).verifier
    engine.dispose()
    w1, w2 = _wkey("witness.example/w1", 7), _wkey("witness.example/w2", 8)
    down = free_port()  # w2 is down at first: nothing listens there
    with witness_service(tmp_path, log.vkey()) as url1:
        entries = [f"{url1} {w1}", f"http://127.0.0.1:{down} {w2}"]
        settings = {"device_key_secret": SECRET, "audit_key": AUDIT_KEY}
        with serve(tmp_path, **settings, witnesses=json.dumps(entries)) as served:
            base = served.base
            for device in ("d1", "d2"):
                sent = httpx.post(
                    f"{base}/v1/use-cases/emoji/reports",
                    json=_report(base, "emoji"),
                    headers={"X-Device-Id": device},
                    timeout=T,
                )
                assert sent.status_code in (200, 202), sent.text
            outcome = _checkpoint_job(base)
            assert outcome["witness.example/w1"] == "cosigned"
            assert outcome["witness.example/w2"].startswith("failed: ")  # the job still ran
            note = httpx.get(f"{base}/v1/tlog/checkpoint", timeout=T).json()["note"]
            keys = [w1, w2]
            point, cosigned = Checkpoint.open(note, log, witnesses=_parse(keys), quorum=1)
            assert list(cosigned) == ["witness.example/w1"]
            try:
                Checkpoint.open(note, log, witnesses=_parse(keys), quorum=2)
                raise AssertionError("a quorum of 2 was met by one cosignature")
            except NoteError as exc:
                assert "quorum is 2" in str(exc)
            record = _device_record(base, "d1")
            assert verify_record(record, log, witnesses=keys, quorum=1).ok
            refused = verify_record(record, log, witnesses=keys, quorum=2)
            assert not refused.ok and "quorum is 2" in (refused.problem or "")
            metrics = httpx.get(f"{base}/metrics", timeout=T).text
            assert 'dpgov_witness_failures_total{witness="witness.example/w2"} 1.0' in metrics

            with witness_service(
                tmp_path, log.vkey(), name="witness.example/w2", seed=8, port=down
            ) as url2:
                # w2 already holds this checkpoint (a lost answer): the log's first submission
                # from size 0 gets 409 with w2's size and is made again from there
                held = httpx.post(
                    f"{url2}/add-checkpoint", content=submission(0, [], note), timeout=T
                )
                assert held.status_code == 200, held.text
                outcome = _checkpoint_job(base)  # no new leaf: the same checkpoint again
                assert outcome == {
                    "witness.example/w1": "held",
                    "witness.example/w2": "cosigned",
                }, outcome
                served_note = httpx.get(f"{base}/v1/tlog/checkpoint", timeout=T).json()["note"]
                again, both = Checkpoint.open(served_note, log, witnesses=_parse(keys), quorum=2)
                assert again == point
                assert sorted(both) == ["witness.example/w1", "witness.example/w2"]
                record = _device_record(base, "d2")
                assert verify_record(record, log, witnesses=keys, quorum=2).ok
        db = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        try:
            with db.connect() as conn:
                rows = conn.execute(text("SELECT size, witness FROM tlog_cosignatures")).all()
            names = ["witness.example/w1", "witness.example/w2"]
            assert sorted(rows) == [(point.size, name) for name in names]
        finally:
            db.dispose()


def _parse(keys: list[str]) -> list[Verifier]:
    return [Verifier.parse(k) for k in keys]


def _device_record(base: str, device: str) -> DeviceRecord:
    """The device's record of the day its charges were made (read from the log's leaves)."""
    leaves = httpx.get(f"{base}/v1/tlog/leaves", params={"start": 0, "end": 100}, timeout=T)
    days = {json.loads(leaf)["day"] for leaf in leaves.json() if '"charge"' in leaf}
    day = (date(1970, 1, 1) + timedelta(days=max(days))).isoformat()
    got = httpx.get(
        f"{base}/v1/devices/{device}/tlog",
        params={"day": day},
        headers={"X-Device-Id": device},
        timeout=T,
    )
    assert got.status_code == 200, got.text
    return DeviceRecord.model_validate(got.json())


def test_a_witnesses_setting_that_is_not_url_and_key_is_refused_naming_it() -> None:
    from pydantic import ValidationError

    from dp_governor.api.settings import Settings

    log_key = Signer("log.example/log", bytes(32)).verifier.vkey()  # not a cosignature key
    for entry, words in (
        ("https://w1.example", "<http(s) URL> <witness vkey>"),
        (f"ftp://w1.example {_wkey('w1', 1)}", "<http(s) URL> <witness vkey>"),
        ("https://w1.example w1+00000000+BAAA", "an Ed25519 public key is 32 bytes"),
        (f"https://w1.example {log_key}", "not a witness (cosignature) key"),
    ):
        with pytest.raises(ValidationError, match="witnesses") as caught:
            Settings(witnesses=[entry])
        assert words in str(caught.value)
    assert Settings(witnesses=[f"https://w1.example/ {_wkey('w1', 1)}"]).witnesses


@pytest.mark.parametrize("value", ["not json", '"https://w1.example KEY"'])
def test_a_witnesses_variable_that_is_no_json_list_is_one_line_naming_it(
    value: str, tmp_path: Path
) -> None:
    env = {**os.environ, "DPGOV_WITNESSES": value, "DPGOV_DATABASE_URL": "sqlite:///x.sqlite"}
    done = subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "audit", "verify"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "witnesses" in done.stderr.lower(), done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
