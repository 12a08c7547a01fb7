"""End to end over real HTTP: ``dpgov serve`` in a subprocess and a fleet of devices.

The caps, the jobs, the estimates, and the unlinkability of the report store.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy import stats

from dp_governor.api.client import Client, Refusal
from dp_governor.api.demo.simulation import zipf_indices
from dp_governor.api.server import free_port
from tests.live import lower_batch_minimums

TOKEN = "e2e-admin-token-e2e-admin-token-e2e"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("e2e")
    port = free_port()
    env = {
        **os.environ,
        "DPGOV_DATABASE_URL": f"sqlite:///{tmp / 'e2e.sqlite'}",
        "DPGOV_SECRET_FILE": str(tmp / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp / "audit.key"),
        "DPGOV_ADMIN_TOKEN": TOKEN,
        "DPGOV_SCHEDULER": "false",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dp_governor.api.cli", "serve", "--port", str(port)],
        env=env,
        cwd=tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # generous: a busy machine starts slowly
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    else:
        proc.kill()
        message = proc.stderr.read().decode() if proc.stderr else "server did not start"
        if proc.stderr is not None:
            proc.stderr.close()
        raise AssertionError(message)
    yield base, tmp / "e2e.sqlite"
    proc.terminate()
    proc.wait(timeout=30)
    if proc.stderr is not None:
        proc.stderr.close()


def test_fleet_caps_estimates_and_unlinkability(server: tuple[str, Path]) -> None:
    base, db = server
    rng = np.random.default_rng(2026)
    domains = [f"site{i}.example" for i in range(50)]
    devices = 1000
    lower_batch_minimums(base, ["safari-energy-domains", "safari-crash-domains"], TOKEN)
    with Client(base, admin_token=TOKEN) as admin:
        mech = admin.randomizer("safari-energy-domains")
        index = zipf_indices(len(domains), devices, 1.1, rng=rng)
        reports = mech.privatize([domains[i] for i in index], rng=rng).to_dicts()
        submitted: list[dict[str, int]] = []

        local = threading.local()  # a client per thread: devices differ by id, not connection
        clients: list[Client] = []

        def device(i: int) -> list[int]:
            c = getattr(local, "client", None)
            if c is None:
                c = local.client = Client(base)
                clients.append(c)
            a = c.submit("safari-energy-domains", f"dev-{i}", reports[i])
            b = c.submit("safari-crash-domains", f"dev-{i}", reports[i])
            refused = c.submit("safari-energy-domains", f"dev-{i}", reports[i])
            assert isinstance(refused, Refusal) and refused.retry_at is not None
            return [int(a.accepted), int(b.accepted)]

        try:
            with ThreadPoolExecutor(8) as pool:
                statuses = [s for pair in pool.map(device, range(devices)) for s in pair]
        finally:
            for c in clients:
                c.close()
        assert sum(statuses) == 2 * devices
        submitted = reports
        budget = admin.budget("dev-7", as_device=False)
        safari = [u for u in budget.use_cases if u.budget == "safari-domains"]
        assert all(u.reports_left_today == 0 and u.epsilon_today == 8.0 for u in safari)

        result = admin.run_job("aggregate").result
        assert result["moved"] == 2 * devices and result["folded"] == 2 * devices
        est = admin.estimates("safari-energy-domains", domains)
        truth = np.bincount(index, minlength=len(domains))
        by_item = {e.item: e for e in est.estimates}
        stderr = max(e.stderr for e in est.estimates)
        for i in np.argsort(-truth)[:10]:
            if truth[i] < 4 * stderr:
                continue  # may rightly fall below the publication threshold
            e = by_item[domains[i]]
            assert abs(e.count - truth[i]) < 4 * e.stderr, (domains[i], e, truth[i])

    # The store's order and ids are unlinked from submission order.
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT rowid, id, payload FROM reports WHERE use_case = 'safari-energy-domains'"
        " ORDER BY rowid"
    ).fetchall()
    con.close()
    position: dict[str, int] = {}
    for i, body in enumerate(submitted):
        key = f'{{"bit":{body["bit"]},"j":{body["j"]},"l":{body["l"]}}}'
        position.setdefault(key, i)
    order = [position[payload] for _, _, payload in rows if payload in position]
    assert len(order) >= 990
    rho = stats.spearmanr(np.arange(len(order)), order).statistic
    assert abs(rho) < 0.15, rho
    # ids follow the store's order (a random prefix per step, then the place in it), which is
    # unlinked: read in id order, the reports are in no submission order either
    by_id = sorted(rows, key=lambda r: r[1])
    id_order = [position[payload] for _, _, payload in by_id if payload in position]
    id_rank = stats.spearmanr(np.arange(len(id_order)), id_order).statistic
    assert len(id_order) == len(order) and abs(id_rank) < 0.15, id_rank
