"""The tamper-evident audit log on SQLite and PostgreSQL: contents, append-only, tamper matrix."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from dp_governor.budget import Ledger
from dp_governor.budget.audit.log import AuditLog, Entry, canonical_body, chain_hash
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.budget.storage.tables import GENESIS
from dp_governor.policies import PolicyUpdate

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def entries(ledger: Ledger) -> list[dict[str, object]]:
    return [
        {**orjson.loads(row[4]), "hash": row[6], "prev_hash": row[5]} for row in ledger.audit.rows()
    ]


@contextmanager
def attacker(ledger: Ledger) -> Iterator[Connection]:
    """A connection that writes the log behind the service's back (triggers disabled)."""
    postgres = ledger.engine.dialect.name == "postgresql"
    with ledger.engine.begin() as conn:
        if postgres:
            conn.execute(text("ALTER TABLE audit_log DISABLE TRIGGER USER"))
            conn.execute(text("ALTER TABLE audit_head DISABLE TRIGGER USER"))
        else:
            for op in ("update", "delete"):
                conn.execute(text(f"DROP TRIGGER audit_log_no_{op}"))
        yield conn
        if postgres:
            conn.execute(text("ALTER TABLE audit_log ENABLE TRIGGER USER"))


def seeded(ledger: Ledger) -> None:
    """Accepted and refused charges, a policy change, a batch, a purge: about 40 entries."""
    for i in range(10):
        ledger.charge(f"d{i}", "emoji", now=NOW)
    ledger.charge("d0", "emoji", now=NOW)  # daily cap: refused
    ledger.policies.update(
        "emoji", PolicyUpdate(max_reports_per_day=2), actor="admin", allow_loosen=True
    )
    items = [BatchItem(f"b{i % 5}", "lookup-hints") for i in range(15)]
    charge_batch(ledger.gate, items, now=NOW)
    ledger.purge(now=NOW + timedelta(days=100))


def test_every_decision_policy_change_and_purge_is_an_entry(ledger: Ledger) -> None:
    seeded(ledger)
    log = entries(ledger)
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    actions = [e["action"] for e in log]
    assert actions.count("policy.create") == 7  # the defaults
    assert actions.count("policy.update") == 1
    assert actions.count("charge") == 11 + 15
    assert actions[-1] == "purge.ledger"
    charges = [e for e in log if e["action"] == "charge"]
    refused = [e for e in charges if not e["data"]["accepted"]]  # type: ignore[index]
    assert len(refused) == 1 + 5  # one emoji, five batch items over 2/day
    assert {e["data"]["reason"] for e in refused} == {"daily_cap"}  # type: ignore[index]
    keys = {f"device:{ledger.device_key(f'd{i}')}" for i in range(10)}
    keys |= {f"device:{ledger.device_key(f'b{i}')}" for i in range(5)}
    assert {str(e["actor"]) for e in charges} == keys  # pseudonyms only
    update = next(e for e in log if e["action"] == "policy.update")
    assert update["actor"] == "admin"
    assert update["data"]["old"]["max_reports_per_day"] == 1  # type: ignore[index]
    assert update["data"]["new"]["max_reports_per_day"] == 2  # type: ignore[index]
    result = ledger.audit.verify()
    assert result.ok and result.entries == len(log), result


def test_an_entry_is_written_only_with_what_it_records(ledger: Ledger) -> None:
    before = ledger.audit.head()

    def fail(_conn: Connection, _accepted: object) -> None:
        raise RuntimeError("the report insert failed")

    with pytest.raises(RuntimeError):
        charge_batch(ledger.gate, [BatchItem("x", "emoji")], now=NOW, on_accept=fail)
    with pytest.raises(RuntimeError):
        ledger.charge("y", "emoji", now=NOW, on_accept=fail)
    assert ledger.audit.head() == before
    assert ledger.audit.verify().ok


def test_the_database_refuses_update_and_delete(ledger: Ledger) -> None:
    ledger.charge("d", "emoji", now=NOW)
    assert ledger.audit.checkpoint(now=NOW) is not None
    statements = [
        "UPDATE audit_log SET actor = 'admin' WHERE seq = 1",
        "DELETE FROM audit_log WHERE seq = 1",
        "UPDATE audit_checkpoints SET seq = 1",
        "DELETE FROM audit_checkpoints",
    ]
    if ledger.engine.dialect.name == "postgresql":
        statements += ["TRUNCATE audit_log", "TRUNCATE audit_checkpoints"]
    for statement in statements:
        with pytest.raises(DBAPIError, match="append-only"), ledger.engine.begin() as conn:
            conn.execute(text(statement))
    assert ledger.audit.verify().ok


def test_concurrent_appends_make_one_chain_without_gaps(ledger: Ledger) -> None:
    start = ledger.audit.head()[0]

    def append(i: int) -> int:
        return ledger.audit.record("job:test", "test", {"i": i}, now=NOW)

    with ThreadPoolExecutor(max_workers=16) as pool:
        seqs = list(pool.map(append, range(1000)))
    assert sorted(seqs) == list(range(start + 1, start + 1001))
    result = ledger.audit.verify()
    assert result.ok and result.head_seq == start + 1000, result


def test_concurrent_charges_make_one_chain(ledger: Ledger) -> None:
    def charge(i: int) -> bool:
        return ledger.charge(f"c{i % 50}", "lookup-hints", now=NOW).accepted

    with ThreadPoolExecutor(max_workers=16) as pool:
        accepted = sum(pool.map(charge, range(300)))
    assert accepted == 100
    log = entries(ledger)
    assert sum(1 for e in log if e["action"] == "charge") == 300
    assert ledger.audit.verify().ok


# -- the tamper matrix -----------------------------------------------------------------------------


def _rehash_from(conn: Connection, ledger: Ledger, seq: int, *, retag: AuditLog | None) -> None:
    """Recompute hashes (and tags, with ``retag``'s key) from ``seq`` on, and the head."""
    rows = conn.execute(
        text("SELECT seq, body FROM audit_log WHERE seq >= :s ORDER BY seq"), {"s": seq}
    ).all()
    prev = conn.execute(
        text("SELECT hash FROM audit_log WHERE seq = :s"), {"s": seq - 1}
    ).scalar_one_or_none()
    prev = prev or GENESIS
    for s, body in rows:
        new = chain_hash(prev, body)
        tag = retag.tag(new) if retag else hashlib.sha256(new.encode()).hexdigest()
        conn.execute(
            text("UPDATE audit_log SET prev_hash = :p, hash = :h, tag = :t WHERE seq = :s"),
            {"p": prev, "h": new, "t": tag, "s": s},
        )
        prev = new
    conn.execute(text("UPDATE audit_head SET hash = :h WHERE id = 1"), {"h": prev})


def flip_a_byte(conn: Connection, ledger: Ledger) -> int:
    body = conn.execute(text("SELECT body FROM audit_log WHERE seq = 20")).scalar_one()
    forged = body.replace('"accepted":true', '"accepted":false', 1)
    if forged == body:
        forged = body[:-2] + chr(ord(body[-2]) ^ 1) + body[-1]
    conn.execute(text("UPDATE audit_log SET body = :b WHERE seq = 20"), {"b": forged})
    return 20


def delete_one(conn: Connection, ledger: Ledger) -> int:
    conn.execute(text("DELETE FROM audit_log WHERE seq = 12"))
    return 12


def swap_two(conn: Connection, ledger: Ledger) -> int:
    a, b = (
        conn.execute(
            text(
                "SELECT at, actor, action, body, prev_hash, hash, tag FROM audit_log WHERE seq = :s"
            ),
            {"s": s},
        ).one()
        for s in (14, 15)
    )
    for seq, row in ((14, b), (15, a)):
        conn.execute(
            text(
                "UPDATE audit_log SET at = :at, actor = :ac, action = :an, body = :b,"
                " prev_hash = :p, hash = :h, tag = :t WHERE seq = :s"
            ),
            {"at": row[0], "ac": row[1], "an": row[2], "b": row[3], "p": row[4], "h": row[5]}
            | {"t": row[6], "s": seq},
        )
    return 14


def insert_forged(conn: Connection, ledger: Ledger) -> int:
    """A forged entry appended by someone without the audit key, chained correctly."""
    seq, head = conn.execute(text("SELECT seq, hash FROM audit_head")).one()
    at = "2026-11-22T15:30:00.000000+00:00"
    body = canonical_body(seq + 1, at, "admin", "policy.delete", {"name": "emoji"})
    new = chain_hash(head, body)
    conn.execute(
        text(
            "INSERT INTO audit_log (seq, at, actor, action, body, prev_hash, hash, tag)"
            " VALUES (:s, :at, 'admin', 'policy.delete', :b, :p, :h, :t)"
        ),
        {"s": seq + 1, "at": at, "b": body, "p": head, "h": new, "t": "0" * 64},
    )
    conn.execute(
        text("UPDATE audit_head SET seq = :s, hash = :h WHERE id = 1"), {"s": seq + 1, "h": new}
    )
    return int(seq) + 1


def truncate_tail(conn: Connection, ledger: Ledger) -> int:
    """Delete the tail after the last checkpoint, and move the head back to match."""
    last = int(conn.execute(text("SELECT max(seq) FROM audit_checkpoints")).scalar_one())
    conn.execute(text("DELETE FROM audit_log WHERE seq > :s"), {"s": last - 5})
    h = conn.execute(text("SELECT hash FROM audit_log WHERE seq = :s"), {"s": last - 5}).scalar()
    conn.execute(
        text("UPDATE audit_head SET seq = :s, hash = :h WHERE id = 1"), {"s": last - 5, "h": h}
    )
    return last - 4


def recompute_chain(conn: Connection, ledger: Ledger) -> int:
    """Change an entry and recompute every later hash (without the key: the tags fail)."""
    flip_a_byte(conn, ledger)
    _rehash_from(conn, ledger, 20, retag=None)
    return 20


def recompute_chain_with_the_key(conn: Connection, ledger: Ledger) -> int:
    """Even with the audit key stolen, the signed checkpoints catch a rewritten past."""
    flip_a_byte(conn, ledger)
    _rehash_from(conn, ledger, 20, retag=ledger.audit)
    return 35  # the first checkpoint after the change


TAMPERS: list[Callable[[Connection, Ledger], int]] = [
    flip_a_byte,
    delete_one,
    swap_two,
    insert_forged,
    truncate_tail,
    recompute_chain,
    recompute_chain_with_the_key,
]


@pytest.mark.parametrize("tamper", TAMPERS, ids=lambda f: f.__name__)
def test_tampering_is_caught_and_the_first_bad_entry_named(
    ledger: Ledger, tamper: Callable[[Connection, Ledger], int]
) -> None:
    seeded(ledger)
    assert ledger.audit.head()[0] == 35
    assert ledger.audit.checkpoint(now=NOW) is not None  # signs entry 35
    for _ in range(10):
        ledger.audit.record("job:test", "filler", {}, now=NOW)
    assert ledger.audit.checkpoint(now=NOW) is not None  # signs entry 45
    assert ledger.audit.checkpoint(now=NOW) is None  # nothing new to sign
    assert ledger.audit.verify().ok
    with attacker(ledger) as conn:
        expected = tamper(conn, ledger)
    result = ledger.audit.verify()
    assert not result.ok
    assert result.first_bad == expected, result
    assert result.problem


def test_a_forged_checkpoint_is_caught(ledger: Ledger) -> None:
    ledger.charge("d", "emoji", now=NOW)
    ledger.audit.checkpoint(now=NOW)
    ledger.audit.record("job:test", "filler", {}, now=NOW)
    other = AuditLog(ledger.engine, b"another-key-another-key-another-key!")
    other.checkpoint(now=NOW)  # signed with a key that is not the service's
    result = ledger.audit.verify()
    assert not result.ok and "signature" in str(result.problem)


def test_tags_are_hmac_sha256(ledger: Ledger) -> None:
    for key in (b"k" * 32, b"long" * 40):
        log = AuditLog(ledger.engine, key)
        expected = hmac.new(key, b"ab" * 32, hashlib.sha256).hexdigest()
        assert log.tag("ab" * 32) == expected


def test_record_outside_a_transaction_and_entries_are_canonical(ledger: Ledger) -> None:
    seq = ledger.audit.record("job:test", "test", {"b": 1, "a": [1, 2]}, now=NOW)
    row = next(iter(ledger.audit.rows(after=seq - 1)))
    assert row[4] == (
        '{"action":"test","actor":"job:test","at":"2026-11-22T15:30:00.000000+00:00",'
        f'"data":{{"a":[1,2],"b":1}},"seq":{seq}}}'
    )
    assert row[6] == hashlib.sha256(bytes.fromhex(row[5]) + row[4].encode()).hexdigest()
    with ledger.engine.begin() as conn:
        assert ledger.audit.append(conn, [], now=NOW) == -1
        ledger.audit.append(conn, [Entry("admin", "x", {})], now=NOW)
    assert ledger.audit.verify().ok
