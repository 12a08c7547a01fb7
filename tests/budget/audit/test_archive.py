"""Archiving old audit entries beside their signed checkpoints, on SQLite and PostgreSQL.

After an archive the incremental verification is unchanged, the full one starts at the newest
archive's boundary (saying so) or replays the files from the first entry; a tampered file, a
missing one, a boundary without an accepted verdict are refused; the database still refuses
every DELETE of an entry no archive holds, and any change to ``audit_archives``. A random model
interleaves charges, checkpoints, verifications and archives and checks all of it at each step.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from dp_governor.budget import Ledger
from dp_governor.budget.audit.archive import (
    ArchiveError,
    ArchiveRefused,
    NotTheArchives,
    read_archive,
)
from dp_governor.budget.audit.log import Verification
from dp_governor.budget.reporting.activity import daily_activity
from dp_governor.budget.reporting.claims import logged_claim, publish_claims
from dp_governor.mechanisms.merkle import leaf_hash, verify_inclusion
from dp_governor.mechanisms.signed_note import Checkpoint

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _verify(ledger: Ledger, *, full: bool, files: tuple[Path, ...] = ()) -> Verification:
    """The ledger's verification, recorded as the service records it (the pipeline aside)."""
    verdict, state = ledger.verify(full=full, archive_files=files)
    ledger.verdicts.record(
        now=NOW, full=full, from_seq=verdict.from_seq, problem=verdict.problem, resume=state.resume
    )
    return verdict


def _checkpoint(ledger: Ledger, when: datetime) -> None:
    """The checkpoint job's two signatures: the chain's head and the transparency log's."""
    ledger.audit.checkpoint(now=when)
    ledger.tlog.sync()


def _charges(ledger: Ledger, n: int, when: datetime, prefix: str = "d") -> None:
    for i in range(n):
        ledger.charge(f"{prefix}{i}", "emoji", now=when)


def _verified(ledger: Ledger, when: datetime = NOW) -> int:
    """A few charges, a checkpoint and an accepted verification; the checkpoint's entry."""
    _charges(ledger, 4, when, prefix=f"v{when.day}-")
    _checkpoint(ledger, when)
    assert _verify(ledger, full=False).ok
    found = ledger.verdicts.last()
    assert found is not None
    return found[0].checkpoint.seq


def _verdicts(ledger: Ledger) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM audit_verifications")).scalar_one())


@contextmanager
def _no_verdict(ledger: Ledger) -> Iterator[None]:
    """The block records no verdict (a wrong argument is no audit)."""
    before = _verdicts(ledger)
    yield
    assert _verdicts(ledger) == before


def _drop_append_only(ledger: Ledger) -> None:
    """What a writer without the key can do to the database: drop the log's triggers."""
    with ledger.engine.begin() as conn:
        if ledger.engine.dialect.name == "sqlite":
            for op in ("update", "delete"):
                conn.execute(text(f"DROP TRIGGER IF EXISTS audit_log_no_{op}"))
        else:
            conn.execute(text("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log"))


def _delete_fails(ledger: Ledger, statement: str, **params: int) -> None:
    with pytest.raises(DBAPIError, match="append-only"), ledger.engine.begin() as conn:
        conn.execute(text(statement), params)


def _first_seq(ledger: Ledger) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text("SELECT min(seq) FROM audit_log")).scalar_one())


def test_archive_then_verify_incremental_full_and_from_the_files(
    ledger: Ledger, tmp_path: Path
) -> None:
    boundary = _verified(ledger)
    head = ledger.audit.head()
    record = ledger.archive(through=None, out=tmp_path / "a1.jsonl.gz", now=NOW)
    assert (record.first_seq, record.boundary) == (1, boundary)
    assert (tmp_path / "a1.jsonl.gz").stat().st_mode & 0o777 == 0o600  # it names pseudonyms
    assert _first_seq(ledger) == boundary and ledger.audit.head() == head
    header, pages = read_archive(tmp_path / "a1.jsonl.gz")
    assert (header["first_seq"], header["last_seq"]) == (1, boundary - 1)
    assert [row[0] for page in pages for row in page] == list(range(1, boundary))
    _charges(ledger, 3, NOW + timedelta(days=1), prefix="after")
    incremental = _verify(ledger, full=False)
    assert incremental.ok and incremental.from_seq == boundary, incremental
    full = _verify(ledger, full=True)
    assert full.ok and full.from_seq == boundary, full
    assert f"entries before {boundary} are archived and were not replayed" in str(full.note)
    replayed = _verify(ledger, full=True, files=(tmp_path / "a1.jsonl.gz",))
    assert replayed.ok and replayed.from_seq == 0, replayed
    assert replayed.entries == ledger.audit.head()[0] and replayed.note is None


def test_archive_before_any_signed_checkpoint_says_to_sign_one(
    ledger: Ledger, tmp_path: Path
) -> None:
    _charges(ledger, 2, NOW)
    assert _verify(ledger, full=False).ok  # accepted, but no checkpoint to start from
    with pytest.raises(ArchiveRefused, match="no signed checkpoint yet: run `dpgov jobs run"):
        ledger.archive(through=None, out=tmp_path / "a.gz", now=NOW)
    assert not (tmp_path / "a.gz").exists()


def test_a_second_archive_continues_from_the_first(ledger: Ledger, tmp_path: Path) -> None:
    first = _verified(ledger)
    ledger.archive(through=first, out=tmp_path / "a1.gz", now=NOW)
    second = _verified(ledger, NOW + timedelta(days=1))
    record = ledger.archive(through=None, out=tmp_path / "a2.gz", now=NOW)
    assert (record.first_seq, record.boundary) == (first, second)
    assert record.prev_hash == ledger.archives.records()[0].last_hash
    assert _first_seq(ledger) == second
    files = (tmp_path / "a1.gz", tmp_path / "a2.gz")
    assert _verify(ledger, full=True, files=files).ok
    assert _verify(ledger, full=True, files=files[::-1]).ok  # matched by digest, in any order
    assert _verify(ledger, full=True).from_seq == second
    with (
        _no_verdict(ledger),
        pytest.raises(NotTheArchives, match="no file given for the archive of entries 1 to"),
    ):
        _verify(ledger, full=True, files=files[1:])
    again = _verify(ledger, full=False)
    assert again.ok and again.from_seq == second


def _rewrite(path: Path, edit: int) -> None:
    """The archive re-packed with one entry's body edited (its hash, tag and digest kept)."""
    with gzip.open(path, "rb") as handle:
        lines = handle.read().splitlines()
    row = orjson.loads(lines[edit])
    row[4] = row[4].replace('"emoji"', '"emojj"')
    lines[edit] = orjson.dumps(row)
    with gzip.open(path, "wb") as handle:
        handle.write(b"\n".join(lines) + b"\n")


def test_a_tampered_archive_file_is_refused(ledger: Ledger, tmp_path: Path) -> None:
    _verified(ledger)
    out = tmp_path / "a.gz"
    record = ledger.archive(through=None, out=out, now=NOW)
    _rewrite(out, 2)
    with _no_verdict(ledger), pytest.raises(NotTheArchives, match="none of the recorded archives"):
        _verify(ledger, full=True, files=(out,))
    header, _ = read_archive(out)
    points = [p for p in ledger.audit.checkpoints() if p.seq <= record.boundary]
    with pytest.raises(ArchiveError, match="does not chain to entry"):
        ledger.archives.check_file(out, header, points)
    out.write_bytes(b"not gzip")
    with _no_verdict(ledger), pytest.raises(NotTheArchives, match="none of the recorded"):
        _verify(ledger, full=True, files=(out,))
    with _no_verdict(ledger), pytest.raises(NotTheArchives, match="cannot read the archive"):
        _verify(ledger, full=True, files=(tmp_path / "gone.gz",))


def test_files_given_to_a_log_without_archives_are_refused(ledger: Ledger, tmp_path: Path) -> None:
    _verified(ledger)
    (tmp_path / "x.gz").write_bytes(b"anything")
    with _no_verdict(ledger), pytest.raises(NotTheArchives, match="this log has no archive"):
        _verify(ledger, full=True, files=(tmp_path / "x.gz",))


def test_a_genuine_archive_the_log_no_longer_continues_is_a_failed_verification(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The file is the recorded archive (its SHA-256 matches): a mismatch is the log's."""
    boundary = _verified(ledger)
    out = tmp_path / "a.gz"
    ledger.archive(through=None, out=out, now=NOW)
    _drop_append_only(ledger)
    with ledger.engine.begin() as conn:  # the boundary entry re-linked by a writer without the key
        conn.execute(
            text("UPDATE audit_log SET prev_hash = :h WHERE seq = :s"),
            {"h": "0" * 64, "s": boundary},
        )
    before = _verdicts(ledger)
    verdict = _verify(ledger, full=True, files=(out,))
    assert not verdict.ok and verdict.first_bad == boundary, verdict
    assert f"entry {boundary} does not link to entry {boundary - 1}" in str(verdict.problem)
    assert _verdicts(ledger) == before + 1  # recorded: a failed audit


def test_archive_refuses_a_boundary_without_an_accepted_verdict(
    ledger: Ledger, tmp_path: Path
) -> None:
    _charges(ledger, 3, NOW)
    _checkpoint(ledger, NOW)
    with pytest.raises(ArchiveRefused, match="run `dpgov audit verify` first"):
        ledger.archive(through=None, out=tmp_path / "a.gz", now=NOW)
    boundary = _verified(ledger)
    _charges(ledger, 2, NOW, prefix="later")
    _checkpoint(ledger, NOW)
    newer = ledger.audit.checkpoints()[-1].seq
    with pytest.raises(ArchiveRefused, match=f"entry {newer} is a signed checkpoint"):
        ledger.archive(through=newer, out=tmp_path / "a.gz", now=NOW)
    with pytest.raises(ArchiveRefused, match="entry 2 is no signed checkpoint"):
        ledger.archive(through=2, out=tmp_path / "a.gz", now=NOW)
    failed = ledger.verdicts  # a failed verdict after the accepted one changes nothing
    failed.record(now=NOW, full=False, from_seq=0, problem="x", resume=None)
    ledger.archive(through=boundary, out=tmp_path / "a.gz", now=NOW)
    with pytest.raises(ArchiveRefused, match="archived already"):
        ledger.archive(through=None, out=tmp_path / "b.gz", now=NOW)
    assert not (tmp_path / "b.gz").exists()


def test_deleting_entries_no_archive_holds_still_fails(ledger: Ledger, tmp_path: Path) -> None:
    _charges(ledger, 3, NOW)
    _delete_fails(ledger, "DELETE FROM audit_log WHERE seq = 1")
    boundary = _verified(ledger)
    ledger.archive(through=None, out=tmp_path / "a.gz", now=NOW)
    _delete_fails(ledger, "DELETE FROM audit_log WHERE seq = :s", s=boundary)
    _delete_fails(ledger, "DELETE FROM audit_log")
    _delete_fails(ledger, "UPDATE audit_log SET body = body WHERE seq = :s", s=boundary)
    _delete_fails(ledger, "DELETE FROM audit_archives")
    _delete_fails(ledger, "UPDATE audit_archives SET file = 'x'")
    if ledger.engine.dialect.name == "postgresql":
        _delete_fails(ledger, "TRUNCATE audit_log")
        _delete_fails(ledger, "TRUNCATE audit_archives")
    assert _verify(ledger, full=False).ok


def test_a_forged_archive_record_fails_verification(ledger: Ledger, tmp_path: Path) -> None:
    boundary = _verified(ledger)
    with ledger.engine.begin() as conn:  # a writer without the key adds a record
        conn.execute(
            text(
                "INSERT INTO audit_archives (boundary, hash, first_seq, prev_hash, last_hash,"
                " file, sha256, signed_at, signature, state, at, tag) VALUES (:b, 'h', 1, 'p',"
                " 'l', 'f', 's', 'a', 'g', '{}', 'now', 't')"
            ),
            {"b": boundary},
        )
    verdict = _verify(ledger, full=True)
    assert not verdict.ok and str(verdict.problem).startswith("audit_archives:")


def test_claims_activity_and_receipts_read_on_after_an_archive(
    ledger: Ledger, tmp_path: Path
) -> None:
    from dp_governor.budget import utc_day

    _charges(ledger, 3, NOW)
    today = utc_day(NOW) + 1
    claimed = publish_claims(ledger, today=today, now=NOW + timedelta(days=1))
    assert claimed > 0
    before = logged_claim(ledger, "emoji", today - 1)
    assert before is not None
    _verified(ledger, NOW + timedelta(days=1))
    ledger.archive(through=None, out=tmp_path / "a.gz", now=NOW)
    with ledger.engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM audit_log WHERE action = 'claim.day'")
        ).scalar_one()
    assert left == 0  # every claim was archived: the day is still known as claimed
    assert publish_claims(ledger, today=today, now=NOW + timedelta(days=1)) == 0
    assert logged_claim(ledger, "emoji", today - 1) == before  # read from its public leaf
    assert logged_claim(ledger, "emoji", today) is None
    activity = daily_activity(ledger.engine, now=NOW + timedelta(days=1))
    assert sum(activity.accepted["emoji"]) >= 3
    receipt = ledger.tlog.receipt(1)  # an archived entry's leaf stays, and still proves
    point = ledger.tlog.latest()
    assert receipt is not None and point is not None
    opened, _ = Checkpoint.open(point.note, ledger.tlog.verifier)
    assert verify_inclusion(
        leaf_hash(receipt.leaf), receipt.index, opened.size, receipt.proof, opened.root
    )


@pytest.mark.parametrize("seed", range(4))
def test_random_histories_with_archives_verify_and_refuse_other_deletes(
    ledger: Ledger, tmp_path: Path, seed: int
) -> None:
    """Charges, checkpoints, verifications and archives in random order; checked at each step."""
    rng = np.random.default_rng(seed)
    when = NOW
    files: list[Path] = []
    for step in range(30):
        choice = rng.random()
        if choice < 0.5:
            when += timedelta(days=int(rng.choice((0, 0, 1))))
            ledger.charge(f"device-{int(rng.integers(5))}", "emoji", now=when)
        elif choice < 0.7:
            _checkpoint(ledger, when)
        elif choice < 0.85:
            assert _verify(ledger, full=False).ok
        else:
            out = tmp_path / f"archive-{step}.gz"
            try:
                ledger.archive(through=None, out=out, now=when)
            except ArchiveRefused:
                assert not out.exists()
                continue
            files.append(out)
            first, head = _first_seq(ledger), ledger.audit.head()[0]
            seq = int(rng.integers(first, head + 1))
            _delete_fails(ledger, "DELETE FROM audit_log WHERE seq = :s", s=seq)
    assert _verify(ledger, full=False).ok
    full = _verify(ledger, full=True)
    assert full.ok and full.from_seq == (_first_seq(ledger) if files else 0)
    replayed = _verify(
        ledger, full=True, files=tuple(rng.permutation(np.array(files, dtype=object)))
    )
    assert replayed.ok and replayed.from_seq == 0
    assert replayed.entries == ledger.audit.head()[0]
