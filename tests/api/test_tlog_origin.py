"""``DPGOV_TLOG_ORIGIN``: a deployment's own C2SP log origin, fixed once a checkpoint is signed.

A server under its origin signs checkpoints, tiles and its vkey under it (a witness can tell two
deployments apart); the default keeps an existing log's vkey; a start under another origin
than the log's checkpoints is refused naming ``tlog_origin``, by the server and every command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from dp_governor.api.app import create_app
from dp_governor.api.settings import KeyRefused, Settings
from dp_governor.budget import Ledger, create_db_engine
from dp_governor.budget.audit.tlog import DEFAULT_ORIGIN, TransparencyLog
from dp_governor.mechanisms.signed_note import Checkpoint, Signer, check_origin
from tests.api.test_tiles_http import _checkpoint_job
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T
from tests.api.test_witness import NOW
from tests.live import ADMIN_TOKEN, serve, server_env

ORIGIN = "dpgov.example.com/tlog"


def test_the_default_is_the_origin_every_log_had() -> None:
    assert Settings.model_fields["tlog_origin"].default == DEFAULT_ORIGIN


@pytest.mark.parametrize(
    "origin",
    ["", "https://dpgov.example.com/tlog", "dpgov example", "a\nb", "a+b", "tab\there", "x\x00y"],
)
def test_an_origin_that_is_no_c2sp_origin_is_refused_naming_the_setting(origin: str) -> None:
    with pytest.raises(ValidationError, match="tlog_origin") as refused:
        Settings(tlog_origin=origin)
    assert "schema-less URL" in str(refused.value)


@given(st.text(max_size=40))
def test_an_accepted_origin_is_a_key_name_and_a_checkpoint_first_line(origin: str) -> None:
    try:
        check_origin(origin)
    except ValueError:
        return
    signer = Signer(origin, bytes(32))  # a signed-note key name: no space, no +
    point = Checkpoint(origin, 1, bytes(32))
    assert Checkpoint.parse(point.text()) == point
    assert signer.verifier.vkey().startswith(origin + "+")


def test_a_server_signs_under_its_origin_and_refuses_another_later(tmp_path: Path) -> None:
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY, tlog_origin=ORIGIN) as s:
        engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        try:
            ledger = Ledger(engine, SECRET.encode(), audit_key=AUDIT_KEY.encode())
            assert ledger.charge("origin-device", "emoji", now=NOW).accepted
            _checkpoint_job(s.base)
            # the vkey a device is configured with, computed offline under the origin
            log = TransparencyLog(engine, AUDIT_KEY.encode(), origin=ORIGIN).verifier
        finally:
            engine.dispose()
        served = httpx.get(f"{s.base}/v1/tlog/checkpoint", timeout=T).json()
        assert served["origin"] == ORIGIN and served["vkey"] == log.vkey()
        tiles_note = httpx.get(f"{s.base}/checkpoint", timeout=T).text
        assert tiles_note.startswith(ORIGIN + "\n")
        point, _ = Checkpoint.open(tiles_note, log)
        assert point.origin == ORIGIN
        default_key = TransparencyLog(engine, AUDIT_KEY.encode()).verifier
        assert default_key.vkey() != log.vkey()  # another origin, another key name and id
    for origin in (None, "elsewhere.example/tlog"):  # the default, or any other one
        env = server_env(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY)
        if origin is not None:
            env["DPGOV_TLOG_ORIGIN"] = origin
        done = subprocess.run(
            [sys.executable, "-m", "dp_governor.api.cli", "jobs", "run", "checkpoint"],
            env=env,
            capture_output=True,
            text=True,
            timeout=T,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "`tlog_origin`" in done.stderr and repr(ORIGIN) in done.stderr
        assert f"DPGOV_TLOG_ORIGIN={ORIGIN}" in done.stderr and "Traceback" not in done.stderr
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        device_key_secret=SecretStr(SECRET),
        audit_key=SecretStr(AUDIT_KEY),
        shuffler_key_file=tmp_path / "shuffler.key",
        admin_token=SecretStr(ADMIN_TOKEN),
        scheduler=False,
    )
    with pytest.raises(KeyRefused, match="`tlog_origin`"), TestClient(create_app(settings)):
        pass  # the server does not start either
    with TestClient(create_app(settings.model_copy(update={"tlog_origin": ORIGIN}))) as client:
        assert client.get("/v1/tlog/checkpoint").json()["origin"] == ORIGIN
