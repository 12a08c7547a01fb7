"""Witnesses against split views: consistency checked, forks and rollbacks refused, quorums.

Two ledgers under one audit key (so one log key and origin) with different histories are a
forked log: a witness that cosigned one refuses the other. ``dpgov witness`` runs against a
real server.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dp_governor.api.client.witness import Fork, WitnessState, cosign_checkpoint
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.storage.schema import init_db
from dp_governor.mechanisms.signed_note import (
    COSIGNATURE,
    Checkpoint,
    NoteError,
    Signer,
    Verifier,
)
from dp_governor.policies import PolicyUpdate
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T, _report
from tests.live import serve

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)
KEY = AUDIT_KEY.encode()


def _ledger(path: Path) -> tuple[Ledger, Engine]:
    engine = create_db_engine(f"sqlite:///{path}")
    init_db(engine)
    ledger = Ledger(engine, SECRET.encode(), audit_key=KEY)
    ledger.policies.ensure_defaults()
    return ledger, engine


def _witness() -> Signer:
    return Signer("witness.example/w1", bytes([7] * 32), kind=COSIGNATURE)


def test_a_witness_cosigns_extensions_and_refuses_a_fork(tmp_path: Path) -> None:
    honest, e1 = _ledger(tmp_path / "a.sqlite")
    forked, e2 = _ledger(tmp_path / "b.sqlite")
    try:
        for ledger in (honest, forked):
            ledger.charge("phone", "emoji", now=NOW)
        honest.charge("tablet", "emoji", now=NOW)
        forked.charge("laptop", "emoji", now=NOW)  # same size, another history
        first = honest.tlog.sync()
        split = forked.tlog.sync()
        assert first is not None and split is not None and first.size == split.size
        assert first.root != split.root
        witness = _witness()
        log = honest.tlog.verifier
        note, state = cosign_checkpoint(
            first.note, log, WitnessState(log.name), honest.tlog.consistency, witness, now=1
        )
        point, cosigned = Checkpoint.open(note, log, witnesses=[witness.verifier], quorum=1)
        assert point.size == first.size and cosigned == {witness.name: 1}
        with pytest.raises(Fork, match="forked"):  # the split view: same size, another root
            cosign_checkpoint(split.note, log, state, forked.tlog.consistency, witness, now=2)
        forked.policies.update("emoji", PolicyUpdate(group_size=2))
        later = forked.tlog.sync()
        assert later is not None
        with pytest.raises(Fork, match="forked"):  # the fork grown: no proof joins it
            cosign_checkpoint(later.note, log, state, forked.tlog.consistency, witness, now=3)
        honest.policies.update("emoji", PolicyUpdate(group_size=2))
        grown = honest.tlog.sync()
        assert grown is not None
        note, state = cosign_checkpoint(
            grown.note, log, state, honest.tlog.consistency, witness, now=4
        )
        assert state.size == grown.size
        with pytest.raises(Fork, match="rolled back"):
            cosign_checkpoint(first.note, log, state, honest.tlog.consistency, witness, now=5)
        with pytest.raises(NoteError, match="quorum is 2"):
            Checkpoint.open(note, log, witnesses=[witness.verifier], quorum=2)
    finally:
        e1.dispose()
        e2.dispose()


def _dpgov(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "witness", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=T,
    )


def test_the_witness_command_follows_a_live_log(tmp_path: Path) -> None:
    import httpx

    from dp_governor.budget.audit.tlog import TransparencyLog

    key_file = tmp_path / "witness.key"
    made = _dpgov("key", "--name", "witness.example/w1", "--key-file", str(key_file))
    assert made.returncode == 0, made.stderr
    wkey = made.stdout.strip()
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    again = _dpgov("key", "--name", "witness.example/w1", "--key-file", str(key_file))
    assert again.returncode == 2 and "never overwritten" in again.stderr
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        base = served.base
        engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        vkey = TransparencyLog(engine, KEY).verifier.vkey()
        engine.dispose()
        admin = {"Authorization": "Bearer live-admin-token-live-admin-token-live-admin"}
        args = [
            "run", "--log-url", base, "--log-key", vkey, "--name", "witness.example/w1",
            "--key-file", str(key_file), "--state-file", str(tmp_path / "state.json"),
        ]  # fmt: skip
        none = _dpgov(*args)
        assert none.returncode == 1 and "no checkpoint" in none.stderr
        for _ in range(2):
            httpx.post(
                f"{base}/v1/use-cases/emoji/reports",
                json=_report(base, "emoji"),
                headers={"X-Device-Id": f"d{_}"},
                timeout=T,
            )
            httpx.post(f"{base}/v1/admin/jobs/checkpoint:run", headers=admin, timeout=T)
            run = _dpgov(*args)
            assert run.returncode == 0, run.stderr
            point, cosigned = Checkpoint.open(
                run.stdout, Verifier.parse(vkey), witnesses=[Verifier.parse(wkey)], quorum=1
            )
            assert list(cosigned) == ["witness.example/w1"] and point.size >= 2 * _ + 1
        bad = _dpgov(*[a if a != vkey else wkey for a in args])
        assert bad.returncode == 1 and "refused" in bad.stderr
