"""Commands from any folder: right keys answer right, wrong ones are refused, reads create nothing.

Every case runs the ``dpgov`` console script in a real process, in a folder other than the
server's, with ``HOME`` pointed at a scratch folder so the default secrets directory is the
test's own.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from dp_governor.api.database import init_service_db
from dp_governor.budget import Decision, Ledger, create_db_engine
from dp_governor.budget.storage.db import scratch_schema, stored_fingerprints
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import default_policies, dump_policies, mechanism_for
from tests.conftest import BACKENDS, PG_URL

DPGOV = str(Path(sys.executable).with_name("dpgov"))
READS = [
    ["budget", "device-1"],
    ["audit", "verify"],
    ["audit", "report"],
    ["audit", "export", "-o", "ledger.jsonl"],
    ["policies", "list"],
    ["policies", "show", "emoji"],
    ["policies", "export"],
    ["aggregate", "emoji", "--out", "pq"],
    ["selftest", "--samples", "10000"],
]
WRITES = [["jobs", "run", "checkpoint"], ["policies", "apply", "--allow-loosen", "p.yaml"]]


def dpgov(
    args: list[str], *, cwd: Path, home: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``dpgov`` with only the given ``DPGOV_*`` settings, ``HOME`` and folder."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DPGOV_", "XDG_"))}
    if "SAME" in args:  # commands whose --database-url replaces the environment's
        args = [env["DPGOV_DATABASE_URL"] if a == "SAME" else a for a in args]
    return subprocess.run(
        [DPGOV, *args],
        cwd=cwd,
        env={**base, "HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def refused(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """One error line on stderr naming each needle, exit 2, no traceback."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def tree(folder: Path) -> list[str]:
    """Every path under ``folder`` (to show that nothing was created)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@dataclass
class Service:
    """A service database initialised by ``dpgov db init``, and one device that spent 8."""

    backend: str
    url: str
    home: Path  # its user's HOME: the keys are in home/.config/dp-governor
    elsewhere: Path  # another, empty folder to run commands from

    @property
    def keys(self) -> Path:
        """The default secrets directory of the service's user."""
        return self.home / ".config" / "dp-governor"

    def run(
        self, args: list[str], *, home: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``dpgov`` from the other folder, as the service's user, on the service's database."""
        env = {"DPGOV_DATABASE_URL": self.url, **env}
        return dpgov(args, cwd=self.elsewhere, home=home or self.home, **env)


def _spend_8(url: str, keys: Path) -> None:
    """Two accepted Safari reports of epsilon 4 by ``device-1``, yesterday (UTC).

    Submitted as the service does (charge and inbox row together), so the service's verify
    finds every recorded charge's report.
    """
    engine = create_db_engine(url)
    secret = (keys / "dpgov.secret").read_text().strip().encode()
    audit_key = (keys / "dpgov-audit.key").read_text().strip().encode()
    ledger = Ledger(engine, secret, audit_key=audit_key)
    shuffler = keys / "dpgov-shuffler.key"
    if not shuffler.exists():  # a database made before sealing: its first start generates one
        shuffler.write_text(secrets.token_hex(32) + "\n")
    ingestor = Ingestor(ledger, secret, seal=InboxSeal([shuffler.read_text().strip().encode()]))
    body = mechanism_for(ledger.policies.get("safari-energy-domains")).privatize_one("a.example")
    yesterday = datetime.now(UTC) - timedelta(days=1)
    requests = [SubmitRequest("safari-energy-domains", "device-1", body.to_dict())] * 2
    for result in ingestor.submit_group(requests, now=yesterday):
        assert isinstance(result, Decision) and result.accepted
    engine.dispose()


def _database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'server' / 'dpgov.sqlite'}"
        return
    assert PG_URL is not None
    with scratch_schema(PG_URL, "keys") as url:
        yield url


@pytest.fixture(params=BACKENDS)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    for folder in ("server", "home", "elsewhere"):
        (tmp_path / folder).mkdir()
    for url in _database_url(request.param, tmp_path):
        made = dpgov(
            ["db", "init"], cwd=tmp_path / "server", home=tmp_path / "home", DPGOV_DATABASE_URL=url
        )
        assert made.returncode == 0, made.stderr
        service = Service(request.param, url, tmp_path / "home", tmp_path / "elsewhere")
        _spend_8(url, service.keys)
        yield service


def _safari_lifetime(output: str) -> str:
    line = next(x for x in output.splitlines() if x.startswith("safari-energy-domains"))
    return line.split()[-1]


def test_db_init_keeps_the_keys_in_the_secrets_directory(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "run").mkdir()
    url = f"sqlite:///{tmp_path / 'db' / 'ledger.sqlite'}"
    (tmp_path / "db").mkdir()
    made = dpgov(
        ["db", "init"], cwd=tmp_path / "run", home=tmp_path / "home", DPGOV_DATABASE_URL=url
    )
    assert made.returncode == 0, made.stderr
    assert "dpgov.secret (generated)" in made.stdout
    assert tree(tmp_path / "run") == []  # nothing where the command ran
    assert tree(tmp_path / "home") == [
        ".config",
        ".config/dp-governor",
        ".config/dp-governor/dpgov-audit.key",
        ".config/dp-governor/dpgov-shuffler.key",
        ".config/dp-governor/dpgov.secret",
    ]
    again = dpgov(
        ["db", "init"], cwd=tmp_path / "run", home=tmp_path / "home", DPGOV_DATABASE_URL=url
    )
    assert again.returncode == 0 and "(generated)" not in again.stdout  # idempotent


def test_another_folder_with_the_servers_settings_gets_the_right_answers(service: Service) -> None:
    budget = service.run(["budget", "device-1"])
    assert budget.returncode == 0, budget.stderr
    assert _safari_lifetime(budget.stdout) == "8"
    verify = service.run(["audit", "verify"])
    assert verify.returncode == 0, verify.stderr
    assert '"ok": true' in verify.stdout
    assert tree(service.elsewhere) == []


def test_keys_missing_where_the_command_runs_are_refused_and_nothing_is_created(
    service: Service, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger"  # a user (or a HOME) without the service's keys
    stranger.mkdir()
    (service.elsewhere / "p.yaml").write_text("policies: []\n")
    engine = create_db_engine(service.url)
    before = stored_fingerprints(engine)
    engine.dispose()
    # every command on SQLite; a read, the verification and a write on PostgreSQL too
    commands = READS + WRITES if service.backend == "sqlite" else [*READS[:2], WRITES[0]]
    for args in commands:
        proc = service.run(args, home=stranger)
        refused(proc, "DPGOV_DEVICE_KEY_SECRET or DPGOV_SECRET_FILE", "DPGOV_AUDIT_KEY_FILE")
    assert tree(stranger) == []
    assert tree(service.elsewhere) == ["p.yaml"]
    engine = create_db_engine(service.url)
    assert stored_fingerprints(engine) == before
    engine.dispose()
    budget = service.run(["budget", "device-1"])  # the right keys still answer
    assert _safari_lifetime(budget.stdout) == "8"


def test_selftest_audits_the_policies_of_the_database_it_is_pointed_at(service: Service) -> None:
    emoji = next(p for p in default_policies() if p.name == "emoji")
    words = emoji.model_copy(update={"name": "my-words", "k": 64, "m": 256})
    (service.elsewhere / "p.yaml").write_text(dump_policies([words]))
    applied = service.run(["policies", "apply", "p.yaml"])
    assert applied.returncode == 0, applied.stderr
    audited = service.run(["selftest", "--samples", "10000", "--seed", "3"])
    assert audited.returncode == 0, audited.stderr
    rows = [ln.split()[0] for ln in audited.stdout.splitlines() if ln.rstrip().endswith(" ok")]
    assert "my-words" in rows and len(rows) == 8  # the database's policies, not the defaults
    assert "selftest my-words: 20,000 of 20,000 reports (100%)" in audited.stderr
    defaults = service.run(["selftest", "--defaults", "--samples", "10000", "--seed", "3"])
    assert defaults.returncode == 0, defaults.stderr
    assert "my-words" not in defaults.stdout and defaults.stdout.count(" ok\n") == 7


def test_other_keys_are_refused_naming_the_setting(service: Service, tmp_path: Path) -> None:
    other = tmp_path / "other-keys"
    other.mkdir()
    (service.elsewhere / "p.yaml").write_text("policies: []\n")
    for name in ("dpgov.secret", "dpgov-audit.key"):
        (other / name).write_text(secrets.token_hex(32) + "\n")
    refused(
        service.run(["budget", "device-1"], DPGOV_SECRETS_DIR=str(other)),
        "device-key secret from",
        "not the one this database was initialised with",
        "DPGOV_DEVICE_KEY_SECRET or DPGOV_SECRET_FILE",
    )
    only_audit = service.run(
        ["audit", "verify"], DPGOV_AUDIT_KEY_FILE=str(other / "dpgov-audit.key")
    )  # the right device secret, another audit key: refused, not a false tamper alarm
    refused(only_audit, "audit key from", "DPGOV_AUDIT_KEY or DPGOV_AUDIT_KEY_FILE")
    assert "tag" not in only_audit.stderr
    by_value = service.run(["budget", "device-1"], DPGOV_DEVICE_KEY_SECRET="x" * 40)
    refused(by_value, "device-key secret from DPGOV_DEVICE_KEY_SECRET")
    serve = service.run(["serve", "--port", "1"], DPGOV_SECRETS_DIR=str(other))
    refused(serve, "DPGOV_SECRET_FILE", "DPGOV_AUDIT_KEY_FILE")  # before binding anything
    for args in WRITES:
        refused(service.run(args, DPGOV_SECRETS_DIR=str(other)), "DPGOV_SECRET_FILE")
    assert sorted(p.name for p in other.iterdir()) == ["dpgov-audit.key", "dpgov.secret"]


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a[:2]))
def test_reads_in_an_empty_folder_create_no_database(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "home").mkdir()
    url = "sqlite:///dpgov.sqlite"
    proc = dpgov(args, cwd=tmp_path / "empty", home=tmp_path / "home", DPGOV_DATABASE_URL=url)
    refused(proc, f"no database at {tmp_path / 'empty' / 'dpgov.sqlite'}", "DPGOV_DATABASE_URL")
    assert tree(tmp_path) == ["empty", "home"]


def test_an_uninitialised_postgresql_schema_is_refused_and_left_empty(tmp_path: Path) -> None:
    if PG_URL is None:
        pytest.skip("DPGOV_TEST_DATABASE_URL is not set (no PostgreSQL to test on)")
    with scratch_schema(PG_URL, "keys") as url:
        for args in (["budget", "device-1"], ["jobs", "run", "purge"]):
            proc = dpgov(args, cwd=tmp_path, home=tmp_path, DPGOV_DATABASE_URL=url)
            refused(proc, "not initialised by dp-governor", "dpgov db init")
        engine = create_db_engine(url)
        assert inspect(engine).get_table_names() == []
        engine.dispose()


def _legacy_database(tmp_path: Path) -> tuple[str, Path]:
    """A ledger made before fingerprints (through the library): keys in a folder, no record."""
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("dpgov.secret", "dpgov-audit.key"):
        (keys / name).write_text(secrets.token_hex(32) + "\n")
    url = f"sqlite:///{tmp_path / 'legacy.sqlite'}"
    engine = create_db_engine(url)
    init_service_db(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE dpgov_meta"))  # as the release before it,
        conn.execute(text("DROP TABLE alembic_version"))  # which had no migrations either
    secret = (keys / "dpgov.secret").read_text().strip().encode()
    audit_key = (keys / "dpgov-audit.key").read_text().strip().encode()
    Ledger(engine, secret, audit_key=audit_key).policies.ensure_defaults()
    engine.dispose()
    _spend_8(url, keys)
    return url, keys


def test_a_database_without_fingerprints_gets_them_from_db_upgrade_with_its_keys(
    tmp_path: Path,
) -> None:
    url, keys = _legacy_database(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    env = {"DPGOV_DATABASE_URL": url, "DPGOV_SECRETS_DIR": str(keys)}
    refused(dpgov(["budget", "device-1"], cwd=run, home=run, **env), "dpgov db upgrade")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "audit.key").write_text(secrets.token_hex(32))
    bad_audit = dpgov(
        ["db", "init"], cwd=run, home=run, **env, DPGOV_AUDIT_KEY_FILE=str(wrong / "audit.key")
    )
    refused(bad_audit, "did not tag this database's first audit entry", "DPGOV_AUDIT_KEY_FILE")
    no_keys = dpgov(["db", "init"], cwd=run, home=run, DPGOV_DATABASE_URL=url)
    refused(no_keys, "DPGOV_SECRET_FILE", "DPGOV_AUDIT_KEY_FILE")  # history: never generated
    assert tree(run) == []
    engine = create_db_engine(url)
    assert not stored_fingerprints(engine)  # nothing recorded by a refused start
    engine.dispose()
    unchecked = dpgov(["jobs", "run", "checkpoint"], cwd=run, home=run, **env)
    refused(unchecked, "DPGOV_SECRET_FILE", "--known-device")  # never adopted unchecked
    upgrade = dpgov(["db", "upgrade", "--known-device", "device-1"], cwd=run, home=run, **env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert "key fingerprints recorded" in upgrade.stdout
    first_write = dpgov(["jobs", "run", "checkpoint"], cwd=run, home=run, **env)
    assert first_write.returncode == 0, first_write.stderr
    budget = dpgov(["budget", "device-1"], cwd=run, home=run, **env)
    assert budget.returncode == 0, budget.stderr
    assert _safari_lifetime(budget.stdout) == "8"
    verify = dpgov(["audit", "verify"], cwd=run, home=run, **env)
    assert verify.returncode == 0, verify.stderr
