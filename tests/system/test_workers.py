"""PostgreSQL with ``dpgov serve --workers 4``: caps hold across workers, jobs run once.

Skipped without ``DPGOV_TEST_DATABASE_URL``. Four worker processes share one schema; clients
hammer few devices from many threads; the scheduler runs in every worker with short intervals.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from dp_governor.api.server import free_port
from dp_governor.budget import create_db_engine
from dp_governor.budget.storage.db import scratch_schema
from tests.system.test_crash import _workload

PG_URL = os.environ.get("DPGOV_TEST_DATABASE_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")


def test_four_workers_hold_the_caps_and_run_each_job_once(tmp_path: Path) -> None:
    assert PG_URL is not None
    with scratch_schema(PG_URL, "workers") as url:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "DPGOV_DATABASE_URL": url,
            "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
            "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
            "DPGOV_ADMIN_TOKEN": "workers-admin-token-workers-admin",
            "DPGOV_DEVICE_RATE_PER_MINUTE": "100000",
            "DPGOV_SCHEDULER": "true",
            "DPGOV_FLUSH_SECONDS": "1",
            "DPGOV_AGGREGATE_SECONDS": "2",
            "DPGOV_CHECKPOINT_SECONDS": "2",
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dp_governor.api.cli",
                "serve",
                "--port",
                str(port),
                "--workers",
                "4",
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 300  # generous: a busy machine starts slowly
            while time.monotonic() < deadline:
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            else:
                raise AssertionError("the server did not start")
            time.sleep(2)  # let every worker come up
            work = _workload()
            answers: list[tuple[int, dict[str, object]]] = []
            lock = threading.Lock()
            items = iter(work)
            started = time.monotonic()

            def client() -> None:
                with httpx.Client(timeout=30) as c:
                    while True:
                        with lock:
                            item = next(items, None)
                        if item is None:
                            return
                        device, name, body, key = item
                        r = c.post(
                            f"{base}/v1/use-cases/{name}/reports",
                            json=body,
                            headers={"X-Device-Id": device, "Idempotency-Key": key},
                        )
                        with lock:
                            answers.append((r.status_code, r.json()))

            threads = [threading.Thread(target=client) for _ in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            time.sleep(max(0.0, 8 - (time.monotonic() - started)))  # at least 8 s of jobs
            elapsed = time.monotonic() - started
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        statuses = Counter(status for status, _ in answers)
        assert len(answers) == len(work) and set(statuses) <= {202, 429}, statuses
        engine = create_db_engine(url)
        try:
            with engine.connect() as conn:
                charges = conn.execute(text("SELECT COUNT(*) FROM charges")).scalar_one()
                over = conn.execute(
                    text(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM charges GROUP BY device_key, budget,"
                        " day HAVING COUNT(*) > 2) AS over_cap"
                    )
                ).scalar_one()
                checkpoints = conn.execute(
                    text("SELECT COUNT(*) FROM audit_checkpoints")
                ).scalar_one()
        finally:
            engine.dispose()
        assert charges == statuses[202] == 100 * 2 + 100 * 2  # Safari's and Lookup's 2/day
        assert over == 0
        # one checkpoint per 2 s interval at most (four workers would make four times as many)
        assert 1 <= checkpoints <= elapsed / 2 + 2, (checkpoints, elapsed)


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                found.append(int(entry.name))
    return found


def test_two_workers_start_and_serve_under_load(tmp_path: Path) -> None:
    assert PG_URL is not None
    with scratch_schema(PG_URL, "workers2") as url:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DPGOV_")},
            "DPGOV_DATABASE_URL": url,
            "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
            "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
            "DPGOV_ADMIN_TOKEN": "workers-admin-token-workers-admin",
            "DPGOV_DEVICE_RATE_PER_MINUTE": "100000",
            "DPGOV_REQUIRE_REPORT_FAMILY": "false",  # its bodies carry no `family`
        }
        log = tmp_path / "serve.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dp_governor.api.cli",
                    "serve",
                    "--port",
                    str(port),
                    "--workers",
                    "2",
                ],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if httpx.get(base + "/healthz", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            else:
                raise AssertionError(log.read_text(errors="replace"))
            answers: Counter[int] = Counter()
            lock = threading.Lock()
            work = iter(_workload()[:200])

            def client() -> None:
                with httpx.Client(timeout=60) as c:
                    while (item := next(work, None)) is not None:
                        device, name, body, key = item
                        r = c.post(
                            f"{base}/v1/use-cases/{name}/reports",
                            json=body,
                            headers={"X-Device-Id": device, "Idempotency-Key": key},
                        )
                        with lock:
                            answers[r.status_code] += 1

            threads = [threading.Thread(target=client) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            workers = _children(proc.pid)
            assert proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        text_log = log.read_text(errors="replace")
        assert sum(answers.values()) == 200 and set(answers) <= {202, 429}, answers
        assert "died" not in text_log, text_log  # no worker was restarted
        assert text_log.count("Application startup complete") == 2, text_log
        # uvicorn's supervisor spawns the two workers (and a resource tracker may run beside)
        assert len(workers) >= 2, workers
