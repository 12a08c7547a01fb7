"""The PostgreSQL upgrade procedure of docs/operations.md, run as written on a real database.

A ledger is made by release 0.1 (commit ``ed8e891``, from this repository's history) with its own
``dpgov db init`` and charges, in a PostgreSQL database of its own; the procedure's commands are
then read from the documentation and run in ``bash`` with the server's settings. A device-key
secret from another installation is refused, naming the setting, whatever the database records.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import make_url, text

from dp_governor.budget import create_db_engine
from dp_governor.budget.storage.db import stored_fingerprints
from tests.conftest import PG_URL
from tests.live import serve

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "ed8e891"  # release 0.1 (tests/budget/test_schema_migrations.py)
PACKAGES = ("api", "budget", "mechanisms", "policies")
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")

# Run by release 0.1's code: its database, its keys' fingerprints, spend by two devices.
CHARGE = """
from datetime import UTC, datetime
from api.ingest import Ingestor, SubmitRequest
from api.settings import Settings, service_keys
from budget import Ledger, create_db_engine
settings = Settings()
engine = create_db_engine(settings.database_url)
keys = service_keys(settings, engine)
ledger = Ledger(engine, keys.device_key_secret, audit_key=keys.audit_key)
now = datetime.now(UTC)
body = {"j": 17, "l": 1023, "bit": -1}
requests = [
    SubmitRequest("safari-energy-domains", device, body, f"key-{i}")
    for i, device in enumerate(("device-1", "device-1", "device-2"))
]
answers = Ingestor(ledger, keys.device_key_secret).submit_group(requests, now=now)
assert all(not isinstance(a, Exception) and a.accepted for a in answers), answers
ledger.audit.checkpoint(now=now)
engine.dispose()
"""


@dataclass(frozen=True)
class Installation:
    """A database made by release 0.1 and the environment its server ran with."""

    url: str
    folder: Path
    env: dict[str, str]

    def run(self, command: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """``command`` in bash, in the installation's folder, with its settings (and ``extra``)."""
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.folder,
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )


def _release_code(tmp_path: Path) -> Path:
    """Release 0.1's packages, from this repository's history."""
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{RELEASE}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        pytest.skip(f"this clone's history does not hold {RELEASE} (a shallow clone)")
    source = tmp_path / "release-0.1"
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", RELEASE, *PACKAGES],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    return source


@pytest.fixture
def installation(tmp_path: Path) -> Iterator[Installation]:
    """A PostgreSQL database of its own, initialised and charged by release 0.1."""
    assert PG_URL is not None
    name = f"dpgov_upgrade_{uuid.uuid4().hex[:10]}"
    admin = create_db_engine(PG_URL, pool_size=1)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    try:
        folder = tmp_path / "server"
        folder.mkdir()
        base = {k: v for k, v in os.environ.items() if not k.upper().startswith("DPGOV_")}
        env = {
            **base,
            "PATH": f"{VENV_BIN}:{base.get('PATH', '/usr/bin:/bin')}",
            "DPGOV_DATABASE_URL": url,
            "DPGOV_SECRETS_DIR": str(tmp_path / "keys"),
        }
        old = {**env, "PYTHONPATH": str(_release_code(tmp_path))}
        for args in (["-m", "api.cli", "db", "init"], ["-c", CHARGE]):  # release 0.1: top level
            made = subprocess.run(
                [sys.executable, *args], cwd=folder, env=old, capture_output=True, text=True
            )
            assert made.returncode == 0, made.stderr
        yield Installation(url, folder, env)
    finally:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def documented_procedure() -> list[str]:
    """The commands of docs/operations.md's PostgreSQL upgrade procedure, in order."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    block = doc.split("The upgrade procedure on PostgreSQL:", 1)[1].split("```bash", 1)[1]
    lines = block.split("```", 1)[0].strip().splitlines()
    return [re.sub(r"\s+# .*$", "", line) for line in lines if not line.startswith("#")]


def follow(installation: Installation, **extra: str) -> list[subprocess.CompletedProcess[str]]:
    """Run the procedure's steps 2 to 5 as written (3 installs this release: it is installed)."""
    steps = documented_procedure()
    assert [s.split()[0] for s in steps] == ["pg_dump", "pip", "dpgov", "dpgov", "dpgov"]
    assert steps[2:5] == [
        "dpgov db upgrade",
        "dpgov audit verify --full",
        "dpgov serve --workers 4",
    ]
    done = []
    for step in (steps[0], steps[2], steps[3]):
        done.append(installation.run(step, **extra))
        if done[-1].returncode != 0:
            break
    return done


def test_the_documented_upgrade_works_as_written(installation: Installation) -> None:
    backup, upgrade, verify = follow(installation)
    assert backup.returncode == 0, backup.stderr
    assert (installation.folder / "dpgov-before-upgrade.dump").stat().st_size > 0
    assert upgrade.returncode == 0, upgrade.stderr
    assert "upgraded from the layout of a release before migrations to revision" in upgrade.stdout
    assert verify.returncode == 0, verify.stderr
    assert '"ok": true' in verify.stdout
    budget = installation.run("dpgov budget device-1")
    assert budget.returncode == 0, budget.stderr
    line = next(x for x in budget.stdout.splitlines() if x.startswith("safari-energy-domains"))
    assert line.split()[-1] == "8"  # two reports of epsilon 4, spent under release 0.1
    current = installation.run("dpgov db current")
    assert current.returncode == 0 and "this release's" in current.stdout, current.stdout
    # step 6, on one worker and a free port: the upgraded database serves
    with serve(
        installation.folder,
        database_url=installation.url,
        secret_file=None,
        audit_key_file=None,
        shuffler_key_file=None,
        secrets_dir=installation.env["DPGOV_SECRETS_DIR"],
    ) as served:
        assert httpx.get(served.base + "/healthz").status_code == 200


def test_a_ledger_made_before_fingerprints_is_upgraded_with_a_known_device(
    installation: Installation,
) -> None:
    engine = create_db_engine(installation.url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM dpgov_meta"))  # as a ledger made before fingerprints
    _, upgrade = follow(installation)
    assert upgrade.returncode == 2
    assert "DPGOV_DEVICE_KEY_SECRET or DPGOV_SECRET_FILE" in upgrade.stderr
    assert "--known-device" in upgrade.stderr and "Traceback" not in upgrade.stderr
    assert not stored_fingerprints(engine)
    # the documented form for such a ledger
    again = installation.run("dpgov db upgrade --known-device device-1")
    assert again.returncode == 0, again.stderr
    assert "key fingerprints recorded" in again.stdout
    assert set(stored_fingerprints(engine) or {}) >= {
        "fingerprint.device_key_secret",
        "fingerprint.audit_key",
    }
    verify = installation.run("dpgov audit verify")
    assert verify.returncode == 0, verify.stderr
    engine.dispose()


def _another_installations_secret(installation: Installation) -> dict[str, str]:
    """The settings with a device-key secret of another installation, the audit key right."""
    other = installation.folder / "other.secret"
    other.write_text(secrets.token_hex(32) + "\n")
    return {"DPGOV_SECRET_FILE": str(other)}


def test_another_installations_device_secret_is_refused_naming_the_setting(
    installation: Installation,
) -> None:
    wrong = _another_installations_secret(installation)
    _, upgrade, verify = follow(installation, **wrong)
    assert upgrade.returncode == 0, upgrade.stderr  # migrations need no key
    assert verify.returncode == 2
    assert "device-key secret" in verify.stderr and "DPGOV_SECRET_FILE" in verify.stderr
    for command in ("dpgov budget device-1", "dpgov db init", "dpgov jobs run checkpoint"):
        refused = installation.run(command, **wrong)
        assert refused.returncode == 2, (command, refused.stderr)
        assert "DPGOV_SECRET_FILE" in refused.stderr and "Traceback" not in refused.stderr


def test_another_installations_secret_is_refused_by_a_ledger_made_before_fingerprints(
    installation: Installation,
) -> None:
    engine = create_db_engine(installation.url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM dpgov_meta"))
    wrong = _another_installations_secret(installation)
    for command in (
        "dpgov db upgrade --known-device device-1",
        "dpgov db upgrade --known-device device-2",
        "dpgov db upgrade",
        "dpgov db init",
        "dpgov jobs run checkpoint",
    ):
        refused = installation.run(command, **wrong)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert "DPGOV_SECRET_FILE" in refused.stderr, (command, refused.stderr)
    assert (
        "device 'device-1' has no budget under it"
        in installation.run("dpgov db upgrade --known-device device-1", **wrong).stderr
    )
    assert not stored_fingerprints(engine)  # nothing recorded by a refusal
    start = installation.run("timeout 60 dpgov serve --port 1", **wrong)
    assert start.returncode == 2 and "DPGOV_SECRET_FILE" in start.stderr, start.stderr
    engine.dispose()
