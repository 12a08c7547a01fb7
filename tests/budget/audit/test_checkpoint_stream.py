"""Checkpoints cost the same however many are stored: the kept file's append, verify's memory.

The checkpoint job appends to the kept file reading only its last line (a file whose earlier
part cannot be read still takes the append; a torn last line still refuses it), and ``verify``
reads the database's checkpoints and the kept file a page or a line at a time: a ledger with
thousands of checkpoints verifies in the memory of one with a few (Python's own allocation
count, ``tracemalloc``), with every check as before.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from dp_governor.budget import Ledger
from dp_governor.budget.audit import log as audit_log
from dp_governor.budget.audit import tlog as transparency_log
from dp_governor.budget.audit.checkpoints import CheckpointFile
from dp_governor.budget.audit.log import (
    Checkpoint,
    CheckpointFileError,
    last_kept_seq,
    read_checkpoints,
    write_checkpoints,
)
from tests.conftest import SECRET, make_engine

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)
PAGE = 50  # checkpoints a page during these tests: far fewer than the ledger holds


def _points(n: int, start: int = 1) -> list[Checkpoint]:
    return [
        Checkpoint(s, f"{s:064x}", "2026-11-22T00:00:00+00:00", f"{s:x}")
        for s in range(start, start + n)
    ]


def test_the_append_reads_only_the_last_line(tmp_path: Path) -> None:
    kept = tmp_path / "checkpoints.jsonl"
    assert write_checkpoints(_points(2_000), kept) == 2_000
    # the file's earlier part made unreadable: an append that read it would refuse
    data = kept.read_bytes()
    kept.write_bytes(b"\xff\xfe not a checkpoint\n" + data[data.index(b"\n") + 1 :])
    with pytest.raises(CheckpointFileError):
        read_checkpoints(kept)
    assert last_kept_seq(kept) == 2_000
    assert write_checkpoints(_points(2_003), kept) == 3  # the ones after the last line only
    assert last_kept_seq(kept) == 2_003
    assert kept.read_bytes().count(b"\n") == 2_003


@pytest.mark.parametrize(
    "tail",
    [b'{"seq": 3, "hash"', b'{"seq": \xff\xfe}\n', b'{"seq": "x"}\n', b"[1, 2]\n"],
    ids=["torn", "not-utf8", "bad-seq", "not-an-object"],
)
def test_a_bad_last_line_refuses_the_append_and_changes_nothing(
    tmp_path: Path, tail: bytes
) -> None:
    kept = tmp_path / "checkpoints.jsonl"
    write_checkpoints(_points(2), kept)
    kept.write_bytes(kept.read_bytes() + tail)
    before = kept.read_bytes()
    with pytest.raises(CheckpointFileError, match="last line"):
        write_checkpoints(_points(5), kept)
    assert kept.read_bytes() == before


def test_blank_lines_at_the_end_are_read_past(tmp_path: Path) -> None:
    kept = tmp_path / "checkpoints.jsonl"
    write_checkpoints(_points(3), kept)
    kept.write_bytes(kept.read_bytes() + b"\n" * 5000)  # more than one read from the end
    assert last_kept_seq(kept) == 3
    assert write_checkpoints(_points(4), kept) == 1
    assert [p.seq for p in CheckpointFile(kept)] == [1, 2, 3, 4]


@settings(max_examples=60, deadline=None)
@given(
    cuts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=12),
    longest=st.integers(1, 300),
)
def test_any_sequence_of_overlapping_appends_keeps_each_checkpoint_once_in_order(
    tmp_path_factory: pytest.TempPathFactory, cuts: list[tuple[int, int]], longest: int
) -> None:
    """The job sends whatever the database holds after some seq: overlaps, repeats, gaps of none."""
    kept = tmp_path_factory.mktemp("kept") / "checkpoints.jsonl"
    every = _points(80, start=1)
    sent: set[int] = set()
    for a, b in cuts:
        lo, hi = sorted((a, b))
        chunk = every[lo : hi + 1]
        write_checkpoints(chunk, kept)
        sent.update(p.seq for p in chunk if p.seq > max(sent, default=0))
        expected = sorted(sent)
        if kept.exists():
            assert [p.seq for p in read_checkpoints(kept)] == expected
    lines = kept.read_text(encoding="utf-8").splitlines() if kept.exists() else []
    assert [orjson.loads(x) for x in lines] == [asdict(every[s - 1]) for s in sorted(sent)]
    assert longest >= 1


def _signed_often(ledger: Ledger, entries: int, every: int) -> None:
    """``entries`` entries, both logs signed every ``every`` entries (as the job does)."""
    for i in range(entries):
        ledger.audit.record("system", "test", {"i": i}, now=NOW)
        if (i + 1) % every == 0:
            ledger.tlog.sync()
            ledger.audit.checkpoint(now=NOW)


def _peak(ledger: Ledger, kept: Path, *, full: bool) -> int:
    """The peak of Python's allocations during one verification against the kept file."""
    tracemalloc.start()
    try:
        verdict, _ = ledger.verify(kept=CheckpointFile(kept), full=full)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert verdict.ok, verdict
    return peak


@pytest.fixture
def engine_pair(engine: Engine, tmp_path: Path) -> Iterator[tuple[Ledger, Ledger]]:
    """Two ledgers of the same backend: ``engine`` and a second fresh database beside it."""
    backend = "sqlite" if engine.dialect.name == "sqlite" else "postgresql"
    second = tmp_path / "second"
    second.mkdir()
    for other in make_engine(backend, second):
        pair = []
        for e in (engine, other):
            led = Ledger(e, SECRET)
            led.policies.ensure_defaults()
            pair.append(led)
        yield pair[0], pair[1]


def test_verify_memory_does_not_grow_with_the_checkpoints(
    engine_pair: tuple[Ledger, Ledger], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_log, "_CHECKPOINT_PAGE", PAGE)
    monkeypatch.setattr(transparency_log, "_POINTS", PAGE)
    few, many = engine_pair
    entries = 1_200
    _signed_often(few, entries, entries // 4)
    _signed_often(many, entries, 1)
    assert len(few.audit.checkpoints()) == 4 and len(many.audit.checkpoints()) == entries
    peaks = []
    for name, ledger in (("few", few), ("many", many)):
        kept = tmp_path / f"{name}.jsonl"
        write_checkpoints(ledger.audit.iter_checkpoints(), kept)
        _peak(ledger, kept, full=True)  # warm: caches, compiled statements
        peaks.append(_peak(ledger, kept, full=True))
    # 1,200 checkpoints of each log held at once take about 1.5 MiB; a page, about 60 KiB
    assert peaks[1] - peaks[0] < 300 * 1024, peaks


def test_a_checkpoint_that_disagrees_still_fails_past_the_first_page(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed checks still reach every checkpoint: the kept copy's last one edited."""
    monkeypatch.setattr(audit_log, "_CHECKPOINT_PAGE", 7)
    monkeypatch.setattr(transparency_log, "_POINTS", 7)
    _signed_often(ledger, 60, 1)
    kept = tmp_path / "checkpoints.jsonl"
    write_checkpoints(ledger.audit.iter_checkpoints(), kept)
    verdict, _ = ledger.verify(kept=CheckpointFile(kept))
    assert verdict.ok and verdict.checkpoints == 60 and verdict.kept_checkpoints == 60
    lines = kept.read_text(encoding="utf-8").splitlines()
    last = orjson.loads(lines[-1])
    last["hash"] = "0" * 64
    kept.write_text("\n".join([*lines[:-1], orjson.dumps(last).decode()]) + "\n", "utf-8")
    verdict, _ = ledger.verify(kept=CheckpointFile(kept))
    head = ledger.audit.head()[0]
    assert not verdict.ok and verdict.first_bad == head and "signature" in str(verdict.problem)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(0, 3_000),
    since=st.integers(0, 3_100),
    blanks=st.booleans(),
)
def test_the_bisected_reading_starts_just_before_since_and_misses_nothing(
    tmp_path_factory: pytest.TempPathFactory, n: int, since: int, blanks: bool
) -> None:
    kept = tmp_path_factory.mktemp("kept") / "checkpoints.jsonl"
    write_checkpoints(_points(n), kept)
    if blanks and n:
        kept.write_bytes(kept.read_bytes().replace(b"}\n", b"}\n\n", n // 3))
    every = [p.seq for p in CheckpointFile(kept)]
    read = [p.seq for p in CheckpointFile(kept).after(since)]
    assert read == every[len(every) - len(read) :]  # a suffix, in order
    assert all(s in read for s in every if s >= since)  # nothing from since on is skipped
    before = [s for s in every if s < since]
    if before:
        assert read and read[0] < since  # the line before, whose signature the next chains to


def test_an_incremental_run_reads_the_kept_file_from_its_start_only(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The kept copy's early part unreadable: the full run fails, the incremental one does not.

    The incremental run bisects the file to its start; a bad line after the start fails it.
    """
    _signed_often(ledger, 800, 1)
    kept = tmp_path / "checkpoints.jsonl"
    write_checkpoints(ledger.audit.iter_checkpoints(), kept)
    verdict, state = ledger.verify(kept=CheckpointFile(kept), full=True)
    assert verdict.ok and state.resume is not None
    ledger.verdicts.record(now=NOW, full=True, from_seq=0, problem=None, resume=state.resume)
    data = kept.read_bytes()
    kept.write_bytes(b"\xff\xfe\n" + data[data.index(b"\n") + 1 :])
    with pytest.raises(CheckpointFileError):
        ledger.verify(kept=CheckpointFile(kept), full=True)
    incremental, _ = ledger.verify(kept=CheckpointFile(kept), full=False)
    assert incremental.ok and incremental.from_seq == state.resume.checkpoint.seq
    ledger.audit.record("system", "test", {"i": -1}, now=NOW)
    ledger.audit.checkpoint(now=NOW)
    ledger.tlog.sync()
    write_checkpoints(ledger.audit.iter_checkpoints(after=last_kept_seq(kept)), kept)
    lines = kept.read_bytes().splitlines(keepends=True)
    kept.write_bytes(b"".join([*lines[:-1], lines[-1].replace(b'"seq":', b'"seq":9')]))
    failed, _ = ledger.verify(kept=CheckpointFile(kept), full=False)
    assert not failed.ok and "signature" in str(failed.problem)
