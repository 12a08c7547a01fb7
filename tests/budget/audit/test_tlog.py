"""The transparency log over a real ledger: projection, receipts, consistency, tamper evidence.

Run on SQLite and PostgreSQL: charges and policy edits are projected into the tree by ``sync``,
each receipt verifies against the signed checkpoint with nothing but the log's public key, and
an edit of a leaf, a node or a checkpoint fails ``Ledger.verify``.
"""

from __future__ import annotations

import hmac
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from dp_governor.budget import Ledger
from dp_governor.budget.audit import tlog
from dp_governor.budget.audit.leaves import (
    LabelKeys,
    charge_label,
    day_label,
    device_label_key,
    hmac_sha256,
    leaf_of,
)
from dp_governor.budget.audit.log import Entry, canonical_body
from dp_governor.budget.storage.db import writer
from dp_governor.mechanisms.merkle import leaf_hash, verify_consistency, verify_inclusion
from dp_governor.mechanisms.signed_note import COSIGNATURE, Checkpoint, Signer
from dp_governor.policies import PolicyUpdate

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)
DAY = int(NOW.timestamp() // 86_400)


def _history(ledger: Ledger) -> None:
    ledger.policies.update("emoji", PolicyUpdate(group_size=2))
    for back in (2, 1, 0):
        for device in ("a", "b", "c"):
            ledger.charge(device, "emoji", now=NOW - timedelta(days=back))


def test_every_audit_entry_is_a_leaf_under_a_signed_checkpoint(ledger: Ledger) -> None:
    _history(ledger)
    head, _ = ledger.audit.head()
    point = ledger.tlog.sync()
    assert point is not None and point.size == head
    assert ledger.tlog.sync() is None  # nothing new
    got, _ = Checkpoint.open(point.note, ledger.tlog.verifier)
    assert (got.size, got.root) == (point.size, point.root)
    for seq in range(1, head + 1):
        receipt = ledger.tlog.receipt(seq)
        assert receipt is not None
        assert verify_inclusion(
            leaf_hash(receipt.leaf), receipt.index, got.size, receipt.proof, got.root
        )
    verdict, _ = ledger.verify()
    assert verdict.ok, verdict


def test_a_backlog_is_signed_step_by_step(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step stores and signs what it computed: a backlog yields a checkpoint per step."""
    monkeypatch.setattr(tlog, "STEP_SECONDS", 0.0)  # one chunk of 1,000 entries a step
    monkeypatch.setattr(tlog, "_STEP_ENTRIES", 5_000)  # the time bound, not the size, ends it
    entries = [Entry("admin", "note", {"i": i}) for i in range(2_500)]
    with writer(ledger.engine).begin() as conn:
        ledger.audit.append(conn, entries, now=NOW)
    head, _ = ledger.audit.head()
    point = ledger.tlog.sync()
    assert point is not None and point.size == head
    with ledger.engine.connect() as conn:
        sizes = [int(r[0]) for r in conn.execute(text("SELECT size FROM tlog_checkpoints"))]
    assert sorted(sizes) == [1_000, 2_000, head], sizes
    verdict, _ = ledger.verify()
    assert verdict.ok, verdict


def test_a_step_stores_at_most_its_entries_in_one_write(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog is stored in steps of :data:`tlog._STEP_ENTRIES`: each write stays short.

    Within a second a run stores its checkpoint once, at the end; each write's leaves are
    counted from the sizes the steps stored.
    """
    stored: list[int] = []
    store = tlog.TransparencyLog._store

    def counted(self: tlog.TransparencyLog, conn: Any, step: Any, *, signed: bool = True) -> None:
        stored.append(len(step.leaves))
        store(self, conn, step, signed=signed)

    monkeypatch.setattr(tlog.TransparencyLog, "_store", counted)
    monkeypatch.setattr(tlog, "STEP_SECONDS", 3_600.0)  # no checkpoint for the time passed
    entries = [Entry("admin", "note", {"i": i}) for i in range(2 * tlog._STEP_ENTRIES + 7)]
    with writer(ledger.engine).begin() as conn:
        ledger.audit.append(conn, entries, now=NOW)
    head, _ = ledger.audit.head()
    before = ledger.tlog.latest()
    point = ledger.tlog.sync()
    assert point is not None and point.size == head
    assert max(stored) == tlog._STEP_ENTRIES and sum(stored) == head - (
        before.size if before else 0
    )
    with ledger.engine.connect() as conn:
        sizes = sorted(int(r[0]) for r in conn.execute(text("SELECT size FROM tlog_checkpoints")))
    new = [n for n in sizes if before is None or n > before.size]
    assert new == [head], sizes  # one checkpoint for the run, not one a step
    verdict, _ = ledger.verify()
    assert verdict.ok, verdict


def test_a_run_ending_on_a_full_step_stores_its_checkpoint(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose last step was full (``limit``) stores that step's checkpoint after it."""
    monkeypatch.setattr(tlog, "STEP_SECONDS", 3_600.0)
    entries = [Entry("admin", "note", {"i": i}) for i in range(3 * tlog._STEP_ENTRIES)]
    with writer(ledger.engine).begin() as conn:
        ledger.audit.append(conn, entries, now=NOW)
    start = ledger.tlog.latest()
    done = 2 * tlog._STEP_ENTRIES
    point = ledger.tlog.sync(limit=done)
    assert point is not None and point.size == (start.size if start else 0) + done
    latest = ledger.tlog.latest()
    assert latest is not None and latest.size == point.size
    assert ledger.tlog.sync() is not None
    verdict, _ = ledger.verify()
    assert verdict.ok, verdict


def test_a_leaf_shows_a_label_of_its_own_and_no_device(ledger: Ledger) -> None:
    _history(ledger)
    ledger.charge("a", "quicktype", now=NOW)
    ledger.charge("a", "quicktype", now=NOW)
    ledger.tlog.sync()
    dk = ledger.device_key("a")
    key = ledger.tlog.label_key(dk)
    first, second = (ledger.tlog.leaves(charge_label(key, DAY, "quicktype", n)) for n in (1, 2))
    assert len(first) == len(second) == 1
    leaf = orjson.loads(second[0][1])
    assert leaf["kind"] == "charge" and leaf["day"] == DAY and leaf["use_case"] == "quicktype"
    assert leaf["spent"] == 2 * leaf["epsilon_micro"] and leaf["v"] == 2
    assert set(leaf) == {
        "kind", "label", "use_case", "policy_version", "epsilon_micro", "budget", "spent", "day",
        "seq", "v",
    }  # fmt: skip
    everything = b"".join(ledger.tlog.entries(0, 10_000))
    assert dk.encode() not in everything and b"device:" not in everything
    assert b"T15:30" not in everything  # no time finer than the day
    assert ledger.tlog.leaves(day_label(key, DAY)) == []  # no label shared by a day's charges
    labels = {charge_label(key, DAY - back, "emoji", 1) for back in (0, 1, 2)}
    labels |= {charge_label(key, DAY, "quicktype", n) for n in (1, 2)}
    assert len(labels) == 5  # one device's charges are unlinkable without its key


def test_consistency_proofs_join_every_pair_of_checkpoints(ledger: Ledger) -> None:
    ledger.policies.update("emoji", PolicyUpdate(group_size=2))
    first = ledger.tlog.sync()
    _history(ledger)
    second = ledger.tlog.sync()
    assert first is not None and second is not None
    proof = ledger.tlog.consistency(first.size, second.size)
    assert verify_consistency(first.size, first.root, second.size, second.root, proof)
    assert ledger.tlog.checkpoint_at(first.size) == first
    with pytest.raises(ValueError, match="sizes must satisfy"):
        ledger.tlog.consistency(second.size, second.size + 5)


def test_sync_in_short_transactions_builds_the_same_tree(ledger: Ledger) -> None:
    _history(ledger)
    head, _ = ledger.audit.head()
    while ledger.tlog.sync(limit=3) is not None:
        pass
    latest = ledger.tlog.latest()
    assert latest is not None and latest.size == head
    assert ledger.verify()[0].ok


def _drop_append_only(ledger: Ledger, table: str) -> None:
    with ledger.engine.begin() as conn:
        if ledger.engine.dialect.name == "sqlite":
            for op in ("update", "delete"):
                conn.execute(text(f"DROP TRIGGER {table}_no_{op}"))
        else:
            conn.execute(text(f"DROP TRIGGER {table}_append_only ON {table}"))


TAMPERS = {
    "a leaf edited": (
        "tlog_leaves",
        "UPDATE tlog_leaves SET data = replace(data, 'epsilon_micro', 'epsilon_micrO')"
        " WHERE idx = (SELECT max(idx) FROM tlog_leaves)",
        "differs from the projection",
    ),
    "a leaf deleted": (
        "tlog_leaves",
        "DELETE FROM tlog_leaves WHERE idx = (SELECT max(idx) FROM tlog_leaves)",
        "is missing",
    ),
    "a tile edited": (
        "tlog_tiles",
        "UPDATE tlog_tiles SET hashes = :zero WHERE level = 0 AND idx = 0",
        "subtree (0, 0)",
    ),
    "a checkpoint's root edited": (
        "tlog_checkpoints",
        "UPDATE tlog_checkpoints SET root = '" + "0" * 64 + "'",
        "signs another root",
    ),
    "a checkpoint's note swapped": (
        "tlog_checkpoints",
        "UPDATE tlog_checkpoints SET note = replace(note, '\u2014', '-')",
        "checkpoint at size",
    ),
}


@pytest.mark.parametrize("edit", sorted(TAMPERS))
def test_every_edit_of_the_public_log_is_caught(ledger: Ledger, edit: str) -> None:
    _history(ledger)
    ledger.tlog.sync()
    table, statement, problem = TAMPERS[edit]
    _drop_append_only(ledger, table)
    with ledger.engine.begin() as conn:
        conn.execute(text(statement), {"zero": bytes(32)} if ":zero" in statement else {})
    verdict, _ = ledger.verify()
    assert not verdict.ok and problem in (verdict.problem or ""), verdict.problem


def test_the_log_tables_are_append_only(ledger: Ledger) -> None:
    _history(ledger)
    ledger.tlog.sync()
    for table in ("tlog_leaves", "tlog_tiles", "tlog_checkpoints"):
        with pytest.raises(Exception, match="append-only"), ledger.engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {table}"))


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ("grown by a hash", True),
        ("a hash changed", False),
        ("cut short", False),
        ("moved", False),
        ("a full tile grown", False),
    ],
)
def test_a_tile_may_only_grow_while_partial(ledger: Ledger, change: str, allowed: bool) -> None:
    """The tiles are append-only but for a partial tile's growth, its hashes kept."""
    with writer(ledger.engine).begin() as conn:
        conn.execute(
            text("INSERT INTO tlog_tiles (level, idx, hashes) VALUES (0, 0, :a), (1, 0, :b)"),
            {"a": bytes(range(32)) * 2, "b": bytes(32 * 256)},
        )
    grown = "SET hashes = :h WHERE level = 0 AND idx = 0"
    statements = {
        "grown by a hash": (grown, bytes(range(32)) * 3),
        "a hash changed": (grown, bytes(range(32)) + bytes(64)),
        "cut short": (grown, bytes(range(32))),
        "moved": ("SET idx = 5, hashes = :h WHERE level = 0", bytes(range(32)) * 3),
        "a full tile grown": ("SET hashes = :h WHERE level = 1", bytes(32 * 257)),
    }
    where, hashes = statements[change]
    statement = text(f"UPDATE tlog_tiles {where}")
    if allowed:
        with writer(ledger.engine).begin() as conn:
            conn.execute(statement, {"h": hashes})
        with ledger.engine.connect() as conn:
            assert ledger.tlog.tile(conn, 0, 0) == hashes
        return
    with pytest.raises(Exception, match="a partial tile may only grow"):
        with writer(ledger.engine).begin() as conn:
            conn.execute(statement, {"h": hashes})


def test_witness_cosignatures_are_kept_once_and_served_with_their_checkpoint(
    ledger: Ledger,
) -> None:
    _history(ledger)
    point = ledger.tlog.sync()
    assert point is not None
    witness = Signer("witness.example/w1", bytes([7] * 32), kind=COSIGNATURE)
    text_ = Checkpoint(ledger.tlog.origin, point.size, point.root).text()
    line = witness.cosign(text_, 1_700_000_000).line().rstrip("\n")
    assert ledger.tlog.cosigned_size(witness.name) == 0
    ledger.tlog.add_cosignature(point.size, witness.name, line)
    ledger.tlog.add_cosignature(point.size, witness.name, line)  # kept once
    assert ledger.tlog.cosigned_size(witness.name) == point.size
    for served in (ledger.tlog.latest(), ledger.tlog.checkpoint_at(point.size)):
        assert served is not None and served.note == point.note + line + "\n"
        got, cosigned = Checkpoint.open(
            served.note, ledger.tlog.verifier, witnesses=[witness.verifier], quorum=1
        )
        assert got.size == point.size and list(cosigned) == [witness.name]
    assert ledger.verify()[0].ok
    with pytest.raises(Exception, match="append-only"), ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM tlog_cosignatures"))


@given(
    secret=st.binary(min_size=1, max_size=80),  # past SHA-256's 64-byte block: a hashed key
    pseudonyms=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=30),
    cached=st.integers(min_value=1, max_value=5),
)
def test_label_keys_from_the_pre_keyed_hmac_are_the_device_label_keys(
    secret: bytes, pseudonyms: list[str], cached: int
) -> None:
    """The sync's pre-keyed, cached label keys equal the defined ones, however the cache fills."""
    keys = LabelKeys(secret, cached=cached)
    for dk in pseudonyms + pseudonyms[::-1]:
        assert keys.of(f"device:{dk}") == device_label_key(secret, dk)


@given(key=st.binary(max_size=150), message=st.binary(max_size=300))
def test_the_two_hash_hmac_is_hmac_sha256(key: bytes, message: bytes) -> None:
    """The labels' HMAC equals the standard library's for any key (past the block: hashed)."""
    assert hmac_sha256(key, message) == hmac.digest(key, message, "sha256")


_NAMES = st.text(min_size=1, max_size=12)  # any text, escapes and non-ASCII included


@given(
    use_case=_NAMES,
    budget=st.none() | _NAMES,
    numbers=st.tuples(*[st.integers(min_value=0, max_value=2**53)] * 3),
    n=st.none() | st.integers(min_value=1, max_value=10**6),
    day=st.integers(min_value=0, max_value=10**6),
)
def test_a_charge_leaf_is_the_canonical_json_of_what_it_shows(
    use_case: str, budget: str | None, numbers: tuple[int, int, int], n: int | None, day: int
) -> None:
    """The projection of a charge is the sorted-keys JSON of the leaf's fields (docs table)."""
    version, epsilon, spent = numbers
    data = {"accepted": True, "budget": budget, "day": day, "epsilon_micro": epsilon}
    data |= {"n": n, "policy_version": version, "spent": spent, "use_case": use_case}
    body = canonical_body(7, "2026-11-22T15:30:00+00:00", "device:d", "charge", data)
    key = device_label_key(b"s" * 32, "d")
    shown: dict[str, Any] = {"budget": budget, "day": day, "epsilon_micro": epsilon}
    shown |= {"kind": "charge", "policy_version": version, "seq": 7, "use_case": use_case}
    if n is None:
        shown["label"] = day_label(key, day)
    else:
        shown |= {"label": charge_label(key, day, use_case, n), "spent": spent, "v": 2}
    assert leaf_of(b"s" * 32, 7, body) == orjson.dumps(shown, option=orjson.OPT_SORT_KEYS)
