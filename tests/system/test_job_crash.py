"""A job's process SIGKILLed mid-run: its lease dies with it, and the pipeline resumes.

A real ``dpgov jobs run aggregate`` subprocess is caught holding the inbox lease with work left
(the test blocks the database's writes for a moment, so the child can neither finish nor
release), then killed with SIGKILL. With the lease's TTL configured short, a restarted run
takes over once it expires; with a long one, ``--force`` takes over at once. Either way every
charge ends up stored and folded exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Connection, Engine, text

from dp_governor.api._keys import service_keys
from dp_governor.api.database import init_service_db
from dp_governor.api.jobs import lease_of
from dp_governor.api.settings import Settings
from dp_governor.budget import Decision, Ledger, create_db_engine
from dp_governor.budget.storage.db import writer
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, mechanism_for

TOKEN = "job-crash-admin-token-job-crash-admin-token"
NOW = datetime.now(UTC)  # the CLI's jobs run on the system clock
POLICY = PolicyCreate.model_validate(
    {
        "name": "tiny",
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 1.0,
        "max_reports_per_day": 1000,
    }
)
LEASE = lease_of("aggregate")


class Pipeline:
    """The service's database with reports waiting, and the ``dpgov`` CLI pointed at it."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.env = {
            **os.environ,
            "DPGOV_DATABASE_URL": url,
            "DPGOV_SECRET_FILE": str(tmp / "secret"),
            "DPGOV_AUDIT_KEY_FILE": str(tmp / "audit.key"),
            "DPGOV_SHUFFLER_KEY_FILE": str(tmp / "shuffler.key"),
            "DPGOV_ADMIN_TOKEN": TOKEN,
            "DPGOV_FLUSH_MIN_BATCH": "1",
            "DPGOV_SHUFFLE_BATCH": "50",  # many short transactions: a long job to catch
        }
        self.tmp = tmp
        settings = Settings(
            database_url=url,
            secret_file=tmp / "secret",
            audit_key_file=tmp / "audit.key",
            shuffler_key_file=tmp / "shuffler.key",
        )
        self.engine: Engine = create_db_engine(url, pool_size=2)
        init_service_db(self.engine)
        keys = service_keys(settings, self.engine, generate=True, record=True)
        secret = keys.device_key_secret
        self.ledger = Ledger(self.engine, secret, audit_key=keys.audit_key)
        self.ledger.policies.create(POLICY)
        self.ingestor = Ingestor(self.ledger, secret, seal=InboxSeal(keys.shuffler_keys))
        self.submitted = 0

    def submit(self, n: int) -> None:
        """``n`` more accepted reports from new devices, waiting in the inbox."""
        rng = np.random.default_rng(self.submitted)
        bodies = mechanism_for(POLICY).privatize(["a"] * n, rng=rng).to_dicts()
        requests = [
            SubmitRequest("tiny", f"dev-{self.submitted + i}", b) for i, b in enumerate(bodies)
        ]
        results = self.ingestor.submit_group(requests, now=NOW)
        assert all(isinstance(r, Decision) and r.accepted for r in results)
        self.submitted += n

    def start(self, lease_seconds: float, *args: str) -> subprocess.Popen[bytes]:
        env = {**self.env, "DPGOV_JOB_LEASE_SECONDS": str(lease_seconds)}
        return subprocess.Popen(
            [sys.executable, "-m", "dp_governor.api.cli", "jobs", "run", "aggregate", *args],
            env=env,
            cwd=self.tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def run(self, *args: str, lease_seconds: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "DPGOV_JOB_LEASE_SECONDS": str(lease_seconds)}
        return subprocess.run(
            [sys.executable, "-m", "dp_governor.api.cli", "jobs", *args],
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    @contextmanager
    def writes_blocked(self) -> Iterator[Connection]:
        """A transaction that holds off every other writer (reads go on) until it ends."""
        if self.engine.dialect.name == "sqlite":
            with writer(self.engine).begin() as conn:  # BEGIN IMMEDIATE: the write lock
                yield conn
            return
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "LOCK TABLE job_leases, inbox, inbox_moves, reports, batch_parts, sketches"
                    " IN EXCLUSIVE MODE"
                )
            )
            yield conn

    def count(self, sql: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text(sql)).scalar_one())

    def kill_mid_job(self, lease_seconds: float) -> None:
        """Start ``jobs run aggregate`` and SIGKILL it while it holds the lease with work left.

        The check and the kill happen while the test blocks writes, so the child can neither
        finish nor release its lease in between. A child that finished before it could be
        caught is simply tried again with more reports (no outcome depends on speed).
        """
        for _ in range(10):
            self.submit(3000)
            child = self.start(lease_seconds)
            holder = f":{child.pid}:"
            deadline = time.monotonic() + 300
            while child.poll() is None and time.monotonic() < deadline:
                with self.engine.connect() as conn:
                    row = conn.execute(
                        text("SELECT holder, until FROM job_leases WHERE job = :j"), {"j": LEASE}
                    ).first()
                if row is not None and holder in row[0] and row[1] > 0:
                    break
                time.sleep(0.01)
            with self.writes_blocked() as conn:
                row = conn.execute(
                    text("SELECT holder, until FROM job_leases WHERE job = :j"), {"j": LEASE}
                ).first()
                left = conn.execute(
                    text(
                        "SELECT (SELECT COUNT(*) FROM inbox)"
                        " + (SELECT COALESCE(SUM(reports), 0) FROM batch_parts WHERE NOT folded)"
                    )
                ).scalar_one()
                caught = row is not None and holder in row[0] and row[1] > 0 and left > 0
                if caught:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait(timeout=60)
            if caught:
                return
            child.wait(timeout=300)  # it finished first: try again with more work
        raise AssertionError("the job never ran long enough to be caught mid-run")

    def check_every_charge_stored_and_folded_once(self) -> None:
        charges = self.count("SELECT COUNT(*) FROM charges")
        assert charges == self.submitted
        assert self.count("SELECT COUNT(*) FROM inbox") == 0
        assert self.count("SELECT COUNT(*) FROM reports") == charges
        assert self.count("SELECT COUNT(*) FROM inbox_moves WHERE batch IS NOT NULL") == 0
        assert self.count("SELECT SUM(reports) FROM batch_parts WHERE folded") == charges
        assert self.count("SELECT COUNT(*) FROM batch_parts WHERE NOT folded") == 0
        assert self.count("SELECT COALESCE(SUM(n), 0) FROM sketches") == charges


@pytest.fixture
def pipeline(empty_url: str, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(empty_url, tmp_path)
    yield p
    p.engine.dispose()


def test_the_lease_of_a_killed_job_expires_and_the_pipeline_resumes(pipeline: Pipeline) -> None:
    """A short TTL (2 s) configured for the test stands for the default minute."""
    pipeline.kill_mid_job(lease_seconds=2)
    deadline = time.monotonic() + 600
    while True:  # a restarted process runs the job once the dead holder's lease has expired
        ran = pipeline.run("run", "aggregate", lease_seconds=2)
        if ran.returncode == 0:
            break
        assert ran.returncode == 1 and "running in another process" in ran.stderr, ran.stderr
        assert time.monotonic() < deadline, "the pipeline never resumed"
    pipeline.check_every_charge_stored_and_folded_once()


def test_the_operator_overrides_a_killed_jobs_lease(pipeline: Pipeline) -> None:
    """With an hour's TTL the dead holder blocks runs; ``--force`` and ``release`` do not wait."""
    pipeline.kill_mid_job(lease_seconds=3600)
    refused = pipeline.run("run", "aggregate")
    assert refused.returncode == 1
    assert "--force" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    forced = pipeline.run("run", "aggregate", "--force")
    assert forced.returncode == 0, forced.stderr
    pipeline.check_every_charge_stored_and_folded_once()

    pipeline.kill_mid_job(lease_seconds=3600)
    released = pipeline.run("release", "flush-inbox")
    assert released.returncode == 0 and '"released": true' in released.stdout
    resumed = pipeline.run("run", "flush-inbox")
    assert resumed.returncode == 0, resumed.stderr
    assert pipeline.run("run", "aggregate").returncode == 0
    pipeline.check_every_charge_stored_and_folded_once()
