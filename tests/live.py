"""A real ``dpgov serve`` in a subprocess for end-to-end tests, on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import httpx
from pydantic import SecretStr

from dp_governor.api.server import free_port
from dp_governor.api.settings import Settings

ADMIN_TOKEN = "live-admin-token-live-admin-token-live-admin"
START = 300  # seconds a busy machine may take to start a server: generous, never asserted on


class Served(NamedTuple):
    """A running server: its base URL, process id and log (its standard output and error)."""

    base: str
    pid: int
    log: Path


def server_env(folder: Path, **settings: str | None) -> dict[str, str]:
    """The environment of a server on a SQLite file in ``folder``.

    The caller's ``DPGOV_*`` variables are left out (but ``DPGOV_REQUIRE_REPORT_FAMILY`` and
    ``DPGOV_FIGURES_WAIT_SECONDS``, which the suite sets for its bodies without ``family`` and
    for a busy machine); ``settings`` are ``DPGOV_*`` variables
    (lowercase names without the prefix) on top of the defaults, ``None`` removing one (e.g.
    ``admin_token=None`` for a server without an admin token).
    """
    values: dict[str, str | None] = {
        "database_url": f"sqlite:///{folder / 'ledger.sqlite'}",
        "secret_file": str(folder / "secret"),
        "audit_key_file": str(folder / "audit.key"),
        "shuffler_key_file": str(folder / "shuffler.key"),
        "admin_token": ADMIN_TOKEN,
        "scheduler": "false",
        "require_report_family": os.environ.get("DPGOV_REQUIRE_REPORT_FAMILY"),
        "figures_wait_seconds": os.environ.get("DPGOV_FIGURES_WAIT_SECONDS"),
        **settings,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPGOV_")}
    env.update({f"DPGOV_{k.upper()}": v for k, v in values.items() if v is not None})
    return env


@contextmanager
def serve(folder: Path, *args: str, **settings: str | None) -> Iterator[Served]:
    """Start the service (:func:`server_env`, ``args`` on its command line); yields it running.

    Waits up to :data:`START` seconds for ``/healthz``; the server's own error output is the
    failure message if it never answers. The log holds its standard output and error. It is
    stopped after the block.
    """
    port = free_port()
    log = folder / f"serve-{port}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dp_governor.api.cli", "serve", "--port", str(port), *args],
            env=server_env(folder, **settings),
            cwd=folder,
            stdout=err,
            stderr=err,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(log.read_text(errors="replace") or "no answer")
            time.sleep(0.2)
        yield Served(base, proc.pid, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def lower_batch_minimums(base: str, names: list[str], token: str = ADMIN_TOKEN) -> None:
    """Set ``min_batch_devices`` to 1 for default use cases on a running server (a loosening).

    For tests of the pipeline with a few devices against a server process, which the
    ``small_batches`` fixture does not reach: each named use case gets a new version of its
    default policy with no batch minimum, written with ``allow_loosen``.
    """
    from dp_governor.policies.defaults import DEFAULT_POLICIES

    for policy in DEFAULT_POLICIES:
        if policy["name"] in names:
            response = httpx.put(
                f"{base}/v1/use-cases/{policy['name']}",
                params={"allow_loosen": "true"},
                json={**policy, "min_batch_devices": 1},
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            )
            assert response.status_code == 200, response.text


def app_settings(folder: Path, token: str) -> Settings:
    """An in-process app's settings: SQLite in ``folder``, no scheduler, admin ``token``."""
    return Settings(
        database_url=f"sqlite:///{folder / 'service.sqlite'}",
        secret_file=folder / "secret",
        audit_key_file=folder / "audit.key",
        shuffler_key_file=folder / "shuffler.key",
        admin_token=SecretStr(token),
        scheduler=False,
    )
