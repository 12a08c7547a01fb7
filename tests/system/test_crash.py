"""Crash safety: SIGKILL a real ``dpgov serve`` under load, restart, and audit.

SQLite: 2,000 submissions and five kills; PostgreSQL with two workers: 1,000 and three. The
submissions come from 100 devices, each with an ``Idempotency-Key``; clients retry through the
crashes until they get an answer, as real devices would. Afterwards: every 202 has its charge and,
after the inbox is flushed, its stored report; charges equal reports per (use case, day); no device
is over its daily cap; SQLite's ``integrity_check`` is ok; the audit chain verifies. A restart with
reports in the inbox loses none and aggregates none twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random as stdlib_random  # noqa: TID251 - test scheduling only, never privacy
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from dp_governor.api.server import free_port
from dp_governor.budget import create_db_engine
from dp_governor.budget.audit.tlog import DEFAULT_ORIGIN
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.policies import default_policies, mechanism_for
from tests.live import lower_batch_minimums

TOKEN = "crash-admin-token-crash-admin-token"
PG_URL = os.environ.get("DPGOV_TEST_DATABASE_URL")


class Server:
    """``dpgov serve`` in a subprocess that can be killed and restarted on the same port."""

    def __init__(self, tmp: Path, url: str | None = None, workers: int = 1) -> None:
        self.tmp = tmp
        self.workers = workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DPGOV_DATABASE_URL": url or f"sqlite:///{tmp / 'crash.sqlite'}",
            "DPGOV_SECRET_FILE": str(tmp / "secret"),
            "DPGOV_AUDIT_KEY_FILE": str(tmp / "audit.key"),
            "DPGOV_ADMIN_TOKEN": TOKEN,
            "DPGOV_SCHEDULER": "false",
            "DPGOV_DEVICE_RATE_PER_MINUTE": "100000",
            "DPGOV_FLUSH_MIN_BATCH": "1",  # the checks below expect an empty inbox after a flush
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dp_governor.api.cli",
                "serve",
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
            ],
            env=self.env,
            cwd=self.tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its workers too: the kill takes the whole group
        )
        deadline = time.monotonic() + 300  # generous: a busy machine starts slowly
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError("the server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        time.sleep(0.2)  # orphaned workers, if any, die with the group

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dp_governor.api.cli", *args],
            env=self.env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def _workload(submissions: int = 2000) -> list[tuple[str, str, dict[str, object], str]]:
    """(device, use case, body, idempotency key) x ``submissions`` over 100 devices."""
    rng = np.random.default_rng(7)
    policies = {p.name: p for p in default_policies()}
    cases = ["safari-energy-domains", "safari-crash-domains", "lookup-hints"]
    bodies: dict[str, list[Any]] = {
        name: mechanism_for(policies[name])
        .privatize([f"v{i}" for i in range(50)], rng=rng)
        .to_dicts()
        for name in cases
    }
    out: list[tuple[str, str, dict[str, object], str]] = []
    for i in range(submissions):
        name = cases[i % 3]
        out.append((f"device-{i % 100}", name, bodies[name][i % 50], f"key-{i}"))
    return out


def test_sigkill_under_load_loses_nothing_and_overspends_nothing(tmp_path: Path) -> None:
    server = Server(tmp_path)
    accepted = _chaos(server)
    db = sqlite3.connect(tmp_path / "crash.sqlite")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        _check(server, accepted, lambda sql: db.execute(sql).fetchall())
    finally:
        db.close()


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
def test_sigkill_with_two_workers_on_postgresql(tmp_path: Path) -> None:
    assert PG_URL is not None
    with scratch_schema(PG_URL, "crash") as url:
        server = Server(tmp_path, url, workers=2)
        accepted = _chaos(server, kills=3, submissions=1000)
        engine = create_db_engine(url)
        try:
            with engine.connect() as conn:
                _check(server, accepted, lambda sql: [tuple(r) for r in conn.execute(text(sql))])
        finally:
            engine.dispose()


def _chaos(server: Server, kills: int = 5, submissions: int = 2000) -> list[dict[str, object]]:
    """Load, ``kills`` SIGKILLs and restarts, a restart with a full inbox, flush and fold.

    Returns the bodies of the 202 answers.
    """
    server.start()
    cases = ["safari-energy-domains", "safari-crash-domains", "lookup-hints"]
    lower_batch_minimums(server.base, cases, TOKEN)  # a few devices publish
    work = _workload(submissions)
    answers: dict[str, tuple[int, dict[str, object]]] = {}
    lock = threading.Lock()
    next_item = iter(range(len(work)))
    done = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=10) as c:
            while True:
                with lock:
                    i = next(next_item, None)
                if i is None:
                    return
                device, name, body, key = work[i]
                while True:  # a device retries with the same key until it hears back
                    try:
                        r = c.post(
                            f"{server.base}/v1/use-cases/{name}/reports",
                            json=body,
                            headers={"X-Device-Id": device, "Idempotency-Key": key},
                        )
                    except httpx.TransportError:
                        time.sleep(0.05)
                        continue
                    if r.status_code >= 500:
                        time.sleep(0.05)
                        continue
                    answers[key] = (r.status_code, r.json())
                    break

    def killer() -> None:
        chooser = stdlib_random.Random(11)
        for _ in range(kills):
            time.sleep(chooser.uniform(0.2, 1.2))
            if done.is_set():
                break
            server.kill()
            server.start()

    clients = [threading.Thread(target=client) for _ in range(8)]
    chaos = threading.Thread(target=killer)
    for t in [*clients, chaos]:
        t.start()
    for t in clients:
        t.join(timeout=600)
    done.set()
    chaos.join(timeout=120)

    assert len(answers) == len(work)
    statuses = Counter(status for status, _ in answers.values())
    assert set(statuses) <= {202, 429}, statuses

    accepted = [body for status, body in answers.values() if status == 202]
    # Restart once more with reports still in the inbox, then flush and fold.
    server.kill()
    server.start()
    server.kill()
    for job in ("flush-inbox", "aggregate"):
        ran = server.cli("jobs", "run", job)
        assert ran.returncode == 0, ran.stderr
    return accepted


def _check(
    server: Server,
    accepted: list[dict[str, object]],
    query: Callable[[str], list[tuple[Any, ...]]],
) -> None:
    """Every 202 charged and stored once; nothing over a cap; the chain verifies."""
    charges = query("SELECT use_case, day, id FROM charges")
    # every 202 has its charge: the receipt is an HMAC of the log's origin and the charge id
    secret = (server.tmp / "secret").read_text().strip().encode()
    label = f"\0dp-governor/receipt/v2\0{DEFAULT_ORIGIN}\0"
    receipts = {
        hmac.new(secret, f"{label}{uc}\0{cid}".encode(), hashlib.sha256).hexdigest()[:32]
        for uc, _, cid in charges
    }
    assert {b["receipt"] for b in accepted} <= receipts
    assert len(charges) == len({b["receipt"] for b in accepted})  # and nothing else
    per_case_day = Counter((uc, day) for uc, day, _ in charges)
    stored = Counter(
        (uc, day)
        for uc, day in query(
            "SELECT use_case, day FROM reports UNION ALL SELECT use_case, day FROM inbox"
        )
    )
    assert stored == per_case_day
    assert query("SELECT COUNT(*) FROM inbox") == [(0,)]
    folded = query("SELECT COALESCE(SUM(n), 0) FROM sketches")[0][0]
    assert folded == len(charges)  # nothing aggregated twice
    # every budget here allows 2 a day
    assert query(
        "SELECT COUNT(*) FROM (SELECT 1 FROM charges GROUP BY device_key, budget, day"
        " HAVING COUNT(*) > 2) AS over_cap"
    ) == [(0,)]
    verified = server.cli("audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["ok"]
