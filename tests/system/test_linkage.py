"""A reader of the database alone (no key) cannot join a report to its device.

The attacks: hash each stored report as the service hashes a request, look the hash up in the
idempotency records, and follow the device pseudonym to its charges and audit entries; look the
client's idempotency keys up where they are stored; pair the inbox with the charges in the
order a backup holds them (a plain ``pg_dump``, a copy of SQLite's file and ``-wal`` taken while
the service runs); cut the charges at the published batch sizes to single out a stored report.
Every join is tried on the real file or dump.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import make_url

from dp_governor.api.app import create_app
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.conftest import BACKENDS, PG_URL

# a few devices publish: the pipeline here, not the defaults' batch minimums
pytestmark = pytest.mark.usefixtures("small_batches")

ADMIN = {"Authorization": "Bearer linkage-admin-token-linkage-admin-token"}
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
DEVICES = 60


@pytest.fixture
def database(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.sqlite'}",
        secret_file=tmp_path / "secret",
        audit_key_file=tmp_path / "audit.key",
        admin_token=SecretStr("linkage-admin-token-linkage-admin-token"),
        scheduler=False,
        flush_min_batch=DEVICES,  # the flush stores them all: the hashes are tried on the store
    )
    keys = [f"retry-key-{i}" for i in range(DEVICES)]
    with TestClient(create_app(settings, clock=FixedClock(NOW))) as client:
        body = client.get("/v1/use-cases/safari-energy-domains").json()
        fields = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
        mech = mechanism_for(PolicyCreate.model_validate(fields))
        for i, key in enumerate(keys):
            report = mech.privatize_one(f"site{i % 7}.example").to_dict()
            headers = {"X-Device-Id": f"device-{i}", "Idempotency-Key": key}
            url = "/v1/use-cases/safari-energy-domains/reports"
            assert client.post(url, json=report, headers=headers).status_code == 202
            assert client.post(url, json=report, headers=headers).status_code == 202  # a retry
        half = client.post("/v1/admin/jobs/flush-inbox:run", headers=ADMIN)
        assert half.status_code == 200, half.text
    yield tmp_path / "service.sqlite", keys


def test_no_stored_report_hashes_to_an_idempotency_record(
    database: tuple[Path, list[str]],
) -> None:
    path, _ = database
    with sqlite3.connect(path) as db:
        payloads = list(db.execute("SELECT use_case, payload FROM reports"))
        assert len(payloads) == DEVICES
        assert db.execute("SELECT COUNT(*) FROM inbox").fetchone() == (0,)
        hashes = {str(h) for (h,) in db.execute("SELECT request_hash FROM idempotency")}
        assert len(hashes) == DEVICES
        for use_case, payload in payloads:
            canonical = orjson.dumps(orjson.loads(payload), option=orjson.OPT_SORT_KEYS).decode()
            for text in (f"{use_case}\n{canonical}", f"{use_case}\n{payload}", payload):
                digest = hashlib.sha256(text.encode()).hexdigest()
                assert digest not in hashes
                assert not any(digest in h or h in digest for h in hashes)


def test_idempotency_keys_are_not_stored_in_clear(database: tuple[Path, list[str]]) -> None:
    path, keys = database
    with sqlite3.connect(path) as db:
        stored = {str(k) for (k,) in db.execute("SELECT key FROM idempotency")}
        stored |= {
            str(k) for (k,) in db.execute("SELECT idempotency_key FROM charges") if k is not None
        }
        for key in keys:
            assert key not in stored
            assert hashlib.sha256(key.encode()).hexdigest()[:32] not in stored
        dump = "\n".join(db.iterdump())
    assert not any(key in dump for key in keys)


# -- What a backup alone links: a plain pg_dump, or a copy of the SQLite file and its -wal -----

Tables = dict[str, list[dict[str, str | None]]]
CMS_POLICY: dict[str, Any] = {
    "mechanism": "cms",
    "k": 16,
    "m": 256,  # 44 base64 characters of bits: a report's text is its own fingerprint
    "epsilon_per_report": 2.0,
    "max_reports_per_day": 5,
    "retention_days": 30,
    "min_batch_devices": 5,
}


@dataclass
class Served:
    """The service on a SQLite file or a PostgreSQL schema, and what a backup of it holds."""

    client: TestClient
    clock: FixedClock
    backend: str
    url: str
    folder: Path

    def put(self, name: str, **changes: Any) -> dict[str, Any]:
        r = self.client.put(f"/v1/use-cases/{name}", json={**CMS_POLICY, **changes}, headers=ADMIN)
        assert r.status_code in (200, 201), r.text
        body: dict[str, Any] = r.json()
        return body

    def submit(self, name: str, devices: range) -> dict[str, str]:
        """One report from each device, one request (and one transaction) each: bits by device."""
        body = self.client.get(f"/v1/use-cases/{name}").json()
        fields = {k: v for k, v in body.items() if k in PolicyCreate.model_fields}
        mech = mechanism_for(PolicyCreate.model_validate(fields))
        sent = {}
        for d in devices:
            report = mech.privatize_one(f"site{d % 7}.example").to_dict()
            headers = {"X-Device-Id": f"device-{d}"}
            url = f"/v1/use-cases/{name}/reports"
            assert self.client.post(url, json=report, headers=headers).status_code == 202
            sent[f"device-{d}"] = str(report["bits"])
        return sent

    def flush(self) -> int:
        r = self.client.post("/v1/admin/jobs/flush-inbox:run", headers=ADMIN)
        assert r.status_code == 200, r.text
        return int(r.json()["result"]["moved"])

    def device_key(self, device: str) -> str:
        """The harness's ground truth (it holds the secret; the attacks below never do)."""
        key: str = self.client.app.state.ledger.device_key(device)  # type: ignore[attr-defined]
        return key

    def backup(self) -> tuple[Tables, list[bytes]]:
        """What a backup taken now holds: its tables in physical order, and its raw bytes.

        SQLite: the database file and its ``-wal`` copied while the service runs (no -shm), then
        opened as a restore would. PostgreSQL: a plain ``pg_dump`` of the service's schema.
        """
        if self.backend == "sqlite":
            return _sqlite_copy(self.folder / "service.sqlite", self.folder / "copy")
        return _pg_dump(self.url)


def _sqlite_copy(path: Path, into: Path) -> tuple[Tables, list[bytes]]:
    into.mkdir(exist_ok=True)
    copied = []
    for suffix in ("", "-wal"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            target = into / f"backup.sqlite{suffix}"
            shutil.copyfile(source, target)
            copied.append(target.read_bytes())
    tables: Tables = {}
    with sqlite3.connect(into / "backup.sqlite") as db:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for name in names:
            try:
                cursor = db.execute(f"SELECT * FROM {name} ORDER BY rowid")
            except sqlite3.OperationalError:  # WITHOUT ROWID: no physical order to show
                cursor = db.execute(f"SELECT * FROM {name}")
            columns = [c[0] for c in cursor.description]
            tables[name] = [
                {
                    c: None if v is None else v.hex() if isinstance(v, bytes) else str(v)
                    for c, v in zip(columns, row, strict=True)
                }
                for row in cursor
            ]
    return tables, copied


def _pg_dump(url: str) -> tuple[Tables, list[bytes]]:
    parsed = make_url(url)
    schema = parsed.query["options"].split("search_path=")[1]  # type: ignore[union-attr]
    plain = parsed.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    dump = subprocess.run(
        ["pg_dump", "--data-only", f"--schema={schema}", plain],
        capture_output=True,
        check=True,
    ).stdout
    tables: Tables = {}
    lines = iter(dump.decode().splitlines())
    for line in lines:
        found = re.match(r"COPY \S+?\.(\w+) \((.*)\) FROM stdin;", line)
        if not found:
            continue
        columns = [c.strip().strip('"') for c in found.group(2).split(",")]
        name = "charges" if found.group(1).startswith("charges_d") else found.group(1)
        rows = tables.setdefault(name, [])  # the day partitions of charges, in day order
        for row in lines:
            if row == "\\.":
                break
            values = row.split("\t")
            rows.append(
                {c: None if v == "\\N" else v for c, v in zip(columns, values, strict=True)}
            )
    return tables, [dump]


@pytest.fixture(params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    with ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'service.sqlite'}"
        else:
            assert PG_URL is not None
            url = stack.enter_context(scratch_schema(PG_URL, "linkage"))
        settings = Settings(
            database_url=url,
            secret_file=tmp_path / "secret",
            audit_key_file=tmp_path / "audit.key",
            admin_token=SecretStr("linkage-admin-token-linkage-admin-token"),
            scheduler=False,
            flush_min_batch=20,
        )
        clock = FixedClock(NOW)
        with TestClient(create_app(settings, clock=clock)) as client:
            yield Served(client, clock, request.param, url, tmp_path)


def _pair_dump_order(tables: Tables, use_case: str) -> dict[str, str]:
    """A plain dump writes heap (commit) order: the i-th inbox row is the i-th charge's report.

    Returns the device pseudonym each readable inbox payload is thereby linked to.
    """
    charges = [c for c in tables["charges"] if c["use_case"] == use_case]
    inbox = [r for r in tables["inbox"] if r["use_case"] == use_case]
    return {
        str(charge["device_key"]): str(orjson.loads(str(row["payload"]))["bits"])
        for charge, row in zip(charges, inbox, strict=False)
        if row.get("payload") is not None
    }


def _pair_wal_commits(wal: bytes, device_keys: set[str]) -> tuple[dict[str, str], int]:
    """Each commit in SQLite's WAL holds its pages: a report and a device key new in one commit.

    Frames of one transaction end with a commit frame (nonzero "database size"); a device key
    or report text seen for the first time in a transaction's pages was written by it. After a
    checkpoint the file is rewritten from its start, and the frames past the new ones still
    hold older commits. Returns the links, and how many commits wrote one new device key (the
    charges the attack could pair with a report).
    """
    page = int.from_bytes(wal[8:12], "big")
    salts = wal[16:24]
    seen_keys: set[str] = set()
    seen_reports: set[str] = set()
    pending = b""
    linked = {}
    charges = 0
    offset = 32
    while offset + 24 + page <= len(wal):
        header, data = wal[offset : offset + 24], wal[offset + 24 : offset + 24 + page]
        offset += 24 + page
        if header[8:16] != salts:  # the rest of the file's previous generation: older commits
            salts, pending = header[8:16], b""
        pending += data
        if int.from_bytes(header[4:8], "big") == 0:
            continue
        keys = {k for k in device_keys if k.encode() in pending} - seen_keys
        text = pending.decode("latin-1")
        reports = set(re.findall(r'"bits":"([A-Za-z0-9+/=]{44})"', text)) - seen_reports
        charges += len(keys) == 1
        if len(keys) == 1 and len(reports) == 1:
            linked[next(iter(keys))] = next(iter(reports))
        seen_keys |= keys
        seen_reports |= reports
        pending = b""
    return linked, charges


def test_a_backup_links_no_waiting_report_to_its_device(served: Served) -> None:
    """Reports of a quiet use case wait (40 devices of the 100 it needs); a backup is taken.

    The attacks read the backup only: a plain pg_dump's inbox and charges paired in dump
    order, and the commits of a copy of SQLite's -wal. Neither finds a waiting report: the
    inbox holds them sealed, the same length each, and no report's text is anywhere in the
    backup's bytes.
    """
    served.put("quiet", min_batch_devices=100)
    sent = served.submit("quiet", range(40))
    assert served.flush() == 0  # they wait: the service runs a flush that finds too few
    tables, raw = served.backup()
    truth = {served.device_key(d): bits for d, bits in sent.items()}
    assert len(tables["inbox"]) == 40 and len(tables["charges"]) == 40
    linked = _pair_dump_order(tables, "quiet")
    if served.backend == "sqlite":
        from_wal, charges = _pair_wal_commits(raw[1], set(truth))
        assert charges == 40  # every charge's commit is in the copy of the -wal
        linked |= from_wal
    right = sum(truth.get(key) == bits for key, bits in linked.items())
    assert right == 0, f"{right} of {len(sent)} waiting reports linked to their devices"
    for blob in raw:
        assert not any(bits.encode() in blob for bits in sent.values())
    sizes = {len(str(row["sealed"])) for row in tables["inbox"]}
    assert len(sizes) == 1  # the same length whatever the report says


def _versions_of(
    runs: list[tuple[list[dict[str, str | None]], list[dict[str, str | None]]]],
) -> dict[str, str]:
    """Which policy version each stored parameter hash belongs to, read off the batches.

    A batch whose charges are of one version and whose reports of one parameter hash pairs
    the two; the others follow by elimination.
    """
    out: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for run, stored in runs:
            versions = {str(c["policy_version"]) for c in run} - set(out.values())
            hashes = {str(r["params"]) for r in stored} - set(out)
            if len(versions) == 1 and len(hashes) == 1:
                out[hashes.pop()] = versions.pop()
                changed = True
    return out


def _single_out(tables: Tables, use_case: str) -> tuple[list[tuple[str, str]], int]:
    """Cut the charges (in id order) at the published batch sizes; find reports alone in a part.

    A stored report is singled out when no other report of its batch shares its parameter hash
    and day, and one charge of the batch's run of charges has that version and day: that
    charge's device pseudonym and time are the report's. Returns those links and the smallest
    group of stored reports that look alike (batch, parameters, day).
    """
    charges = sorted(
        (c for c in tables["charges"] if c["use_case"] == use_case), key=lambda c: int(str(c["id"]))
    )
    batches = sorted(
        (b for b in tables["shuffled_batches"] if b["use_case"] == use_case),
        key=lambda b: int(str(b["id"])),
    )
    stored = [r for r in tables["reports"] if r["use_case"] == use_case]
    order = list(dict.fromkeys(str(r["batch"]) for r in stored))  # stored in publication order
    assert len(order) == len(batches)
    runs = []
    start = 0
    for number, record in zip(order, batches, strict=True):
        run = charges[start : start + int(str(record["reports"]))]
        start += len(run)
        runs.append((run, [r for r in stored if r["batch"] == number]))
    version = _versions_of(runs)
    links = []
    smallest = len(stored)
    for run, reports in runs:
        cells = Counter((str(r["params"]), str(r["day"])) for r in reports)
        smallest = min([smallest, *cells.values()])
        for (p, day), n in cells.items():
            matching = [c for c in run if c["policy_version"] == version.get(p) and c["day"] == day]
            if n == 1 and len(matching) == 1:
                links.append((str(matching[0]["device_key"]), str(matching[0]["policy_version"])))
    return links, smallest


@pytest.mark.parametrize("boundary", ["day", "parameters"])
def test_no_part_of_a_published_batch_is_smaller_than_the_batch(
    served: Served, boundary: str
) -> None:
    """A day's tail, or the reports queued before the parameters changed, join no short part.

    20 reports publish a first batch; one more waits; then the day turns (or the policy's
    parameters change) and 20 more arrive. The backup's charges, cut at the published batch
    sizes, single out no stored report, and every group of look-alike stored reports holds at
    least the batch minimum.
    """
    served.put("edge")
    served.submit("edge", range(20))
    assert served.flush() == 20
    served.submit("edge", range(20, 21))  # the tail
    assert served.flush() == 0
    if boundary == "day":
        served.clock.advance(days=1)
    else:
        served.put("edge", epsilon_per_report=1.5)  # new parameters
    served.submit("edge", range(21, 41))
    served.flush()
    tables, _ = served.backup()
    links, smallest = _single_out(tables, "edge")
    assert links == [], f"{len(links)} stored report(s) linked to device and version: {links}"
    assert smallest >= 20
    report = served.client.get("/v1/audit/effective-epsilon").json()
    (line,) = [x for x in report["central"] if x["use_case"] == "edge"]
    for day in line["days"]:
        for batch in day["batches"]:
            assert batch["devices"] >= 5 and batch["reports"] >= 20
