"""Witnesses against split views: consistency checked, forks and rollbacks refused, quorums.

Two ledgers under one audit key (so one log key and origin) with different histories are a
forked log: a witness that cosigned one refuses the other. ``dpgov witness`` runs against a
real server.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from dp_governor.api.client.witness import Fork, WitnessState, cosign_checkpoint
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.audit.tlog import SignedCheckpoint
from dp_governor.budget.storage.schema import init_db
from dp_governor.mechanisms.signed_note import (
    COSIGNATURE,
    Checkpoint,
    Signer,
    Verifier,
    sign_note,
)
from dp_governor.policies import PolicyUpdate
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T, _report
from tests.live import START, serve

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
        with pytest.raises(ValueError, match="`quorum` must be 1 to 1"):  # never met
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


@contextmanager
def witness_service(
    folder: Path, *log_keys: str, name: str = "witness.example/w1", seed: int = 7, port: int = 0
) -> Iterator[str]:
    """A real ``dpgov witness serve`` following ``log_keys`` (``port`` 0: a free one); its URL.

    The key is ``bytes([seed] * 32)``, the state a SQLite file in ``folder`` named after it.
    """
    tag = name.replace("/", "_")
    key_file = folder / f"{tag}.key"
    key_file.write_text(bytes([seed] * 32).hex() + "\n", encoding="ascii")
    errors = folder / f"{tag}.log"
    keys = [arg for vkey in log_keys for arg in ("--log-key", vkey)]
    command = [
        sys.executable, "-m", "dp_governor.api.cli", "witness", "serve", *keys,
        "--name", name, "--key-file", str(key_file),
        "--state-db", str(folder / f"{tag}.sqlite"), "--port", str(port),
    ]  # fmt: skip
    with errors.open("wb") as sink:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + START
        while "listening on " not in errors.read_text(encoding="utf-8"):
            assert process.poll() is None, errors.read_text(encoding="utf-8")
            assert time.monotonic() < deadline, "the witness did not start"
            time.sleep(0.05)
        line = errors.read_text(encoding="utf-8").split("listening on ", 1)[1]
        yield line.split()[0]
    finally:
        process.terminate()
        process.wait(timeout=T)


def submission(old: int, proof: list[bytes], note: str) -> bytes:
    """An ``add-checkpoint`` body: the old size, the proof lines, a blank line, the note."""
    lines = "".join(base64.b64encode(p).decode() + "\n" for p in proof)
    return f"old {old}\n{lines}\n{note}".encode()


def _post(base: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{base}/add-checkpoint", content=body, timeout=T)


def test_the_witness_service_cosigns_extensions_and_refuses_a_forked_log(tmp_path: Path) -> None:
    honest, e1 = _ledger(tmp_path / "a.sqlite")
    forked, e2 = _ledger(tmp_path / "b.sqlite")
    try:
        for ledger in (honest, forked):
            ledger.charge("phone", "emoji", now=NOW)
        honest.charge("tablet", "emoji", now=NOW)
        forked.charge("laptop", "emoji", now=NOW)
        first, split = honest.tlog.sync(), forked.tlog.sync()
        assert first is not None and split is not None
        log = honest.tlog.verifier
        stranger = Signer("other.example/log", bytes([9] * 32))
        impostor = Signer(log.name, bytes([8] * 32))  # the log's name, another key
        text = Checkpoint(log.name, first.size, first.root).text()
        with witness_service(tmp_path, log.vkey(), stranger.verifier.vkey()) as base:
            witness = _witness().verifier
            assert _post(base, b"old x\n\n" + first.note.encode()).status_code == 400
            assert _post(base, b"old 0\n").status_code == 400
            other = Checkpoint("unknown.example/log", 1, bytes(32)).text()
            unknown = sign_note(other, [Signer("unknown.example/log", bytes(32)).sign(other)])
            assert _post(base, submission(0, [], unknown)).status_code == 404
            forged = sign_note(text, [impostor.sign(text)])
            assert _post(base, submission(0, [], forged)).status_code == 403
            assert _post(base, submission(first.size + 1, [], first.note)).status_code == 400
            got = _post(base, submission(0, [], first.note))
            assert got.status_code == 200, got.text
            assert got.text.startswith("\u2014 witness.example/w1 ") and got.text.count("\n") == 1
            note = first.note + got.text
            point, cosigned = Checkpoint.open(note, log, witnesses=[witness], quorum=1)
            assert point.size == first.size and list(cosigned) == ["witness.example/w1"]
            stale = _post(base, submission(0, [], first.note))  # the log forgot what it sent
            assert stale.status_code == 409 and stale.text == f"{first.size}\n"
            assert stale.headers["content-type"] == "text/x.tlog.size"
            # the fork: the same size, another root
            assert _post(base, submission(first.size, [], split.note)).status_code == 409
            forked.policies.update("emoji", PolicyUpdate(group_size=2))
            grown_fork = forked.tlog.sync()
            assert grown_fork is not None
            steps = forked.tlog.consistency(first.size, grown_fork.size)
            assert _post(base, submission(first.size, steps, grown_fork.note)).status_code == 422
            honest.policies.update("emoji", PolicyUpdate(group_size=2))
            grown = honest.tlog.sync()
            assert grown is not None
            steps = honest.tlog.consistency(first.size, grown.size)
            got = _post(base, submission(first.size, steps, grown.note))
            assert got.status_code == 200, got.text
            Checkpoint.open(grown.note + got.text, log, witnesses=[witness], quorum=1)
            again = _post(base, submission(first.size, steps, grown.note))
            assert again.status_code == 409 and again.text == f"{grown.size}\n"
    finally:
        e1.dispose()
        e2.dispose()


def test_concurrent_add_checkpoint_requests_advance_the_state_once(tmp_path: Path) -> None:
    ledger, engine = _ledger(tmp_path / "a.sqlite")
    try:
        notes = []
        for device in ("a", "b", "c", "d"):
            ledger.charge(device, "emoji", now=NOW)
            point = ledger.tlog.sync()
            assert point is not None
            notes.append(point)
        with witness_service(tmp_path, ledger.tlog.verifier.vkey()) as base:
            start = threading.Barrier(len(notes) * 2)

            def submit(point: SignedCheckpoint) -> httpx.Response:
                start.wait(timeout=T)
                return _post(base, submission(0, [], point.note))

            with ThreadPoolExecutor(len(notes) * 2) as pool:
                answers = list(pool.map(submit, notes * 2))
            won = [i for i, a in enumerate(answers) if a.status_code == 200]
            assert len(won) == 1, [a.status_code for a in answers]
            size = (notes * 2)[won[0]].size
            others = [a for i, a in enumerate(answers) if i != won[0]]
            assert {(a.status_code, a.text) for a in others} == {(409, f"{size}\n")}
            last = notes[-1]
            steps = ledger.tlog.consistency(size, last.size)
            final = _post(base, submission(size, steps, last.note))
            assert final.status_code == 200, final.text  # from the winner's size, it advances
    finally:
        engine.dispose()


def test_two_keys_of_one_log_name_are_refused_at_start(tmp_path: Path) -> None:
    key_file = tmp_path / "w.key"
    key_file.write_text(bytes([7] * 32).hex() + "\n", encoding="ascii")
    a = Signer("dp-governor.invalid/tlog", bytes([1] * 32)).verifier.vkey()
    b = Signer("dp-governor.invalid/tlog", bytes([2] * 32)).verifier.vkey()
    done = _dpgov(
        "serve", "--log-key", a, "--log-key", b, "--name", "w.example/w",
        "--key-file", str(key_file), "--state-db", str(tmp_path / "w.sqlite"),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "two keys name the log 'dp-governor.invalid/tlog'" in done.stderr
