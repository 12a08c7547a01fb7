"""Transparency log benchmark: build, prove, verify; prints a Markdown table.

Usage: ``python -m benchmarks.tlog [--entries 1000000]
[--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]``.

Appends ``entries`` realistic charge decisions to the audit log (as ``benchmarks.audit``
does), then times the checkpoint job's ``TransparencyLog.sync`` (leaves and tiles
stored, one checkpoint signed), a receipt read and its verification by a device (the signed
note and the inclusion proof; median of 200), and ``TransparencyLog.verify`` (every leaf
against its entry, every node and checkpoint), and ``dpgov audit tiles``'s writer
(``write_tiles``: every tile and bundle as static files, then again with nothing new, which
keeps every file). A second table gives the receipt's size and
verification time at simulated sizes up to 10^9 leaves: the proof is computed over a
synthetic node function (hashes of the node's position), as long as a real one. A receipt's
size is its JSON as the wire carries it (hashes in base64); a device's time includes decoding.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.audit import CHUNK
from benchmarks.budget import NOW, SECRET, database
from dp_governor.budget.audit.log import AuditLog, Entry, derive_audit_key
from dp_governor.budget.audit.tiles import write_tiles
from dp_governor.budget.audit.tlog import Receipt, TransparencyLog
from dp_governor.budget.storage.db import writer
from dp_governor.mechanisms.merkle import (
    decode_hashes,
    inclusion_proof,
    leaf_hash,
    node_hash,
    verify_inclusion,
)
from dp_governor.mechanisms.signed_note import Checkpoint, Signer, Verifier, sign_note


def _append(log: AuditLog, engine: object, entries: int) -> None:
    for start in range(0, entries, CHUNK):
        batch = [
            Entry(
                f"device:{(i * 2654435761) % (1 << 64):032x}",
                "charge",
                {
                    "use_case": "emoji",
                    "budget": "emoji",
                    "policy_version": 1,
                    "epsilon_micro": 4_000_000,
                    "day": 20_779,
                    "accepted": i % 7 != 0,
                    "reason": "accepted" if i % 7 else "daily_cap",
                    "charge_id": i,
                    "idempotency": None,
                    "n": 1 if i % 7 else None,  # each device's first charge of the day
                    "spent": 4_000_000 if i % 7 else None,
                },
            )
            for i in range(start, min(entries, start + CHUNK))
        ]
        with writer(engine).begin() as conn:  # type: ignore[arg-type]
            log.append(conn, batch, now=NOW)


def _receipt_bytes(receipt: Receipt) -> int:
    """The receipt's size as JSON on the wire: leaf, index, proof in base64, signed checkpoint."""
    return len(orjson.dumps(receipt.to_dict()))


def _device_verifies(wire: dict[str, Any], verifier: Verifier) -> bool:
    """What a device does with a receipt it received: decode, open the note, check the path."""
    got, _ = Checkpoint.open(wire["checkpoint"], verifier)
    leaf = leaf_hash(wire["leaf"].encode())
    return verify_inclusion(leaf, wire["index"], got.size, decode_hashes(wire["proof"]), got.root)


def run(kind: str, pg_url: str | None, entries: int) -> str:
    """Build, prove and verify on one backend; returns a table row."""
    with database(kind, pg_url) as engine:
        key = derive_audit_key(SECRET)
        log = AuditLog(engine, key)
        _append(log, engine, entries)
        tlog = TransparencyLog(engine, key)
        t0 = time.perf_counter()
        point = tlog.sync()
        built = time.perf_counter() - t0
        assert point is not None and point.size == entries
        reads, checks, sizes = [], [], []
        for i in range(200):
            seq = 1 + (i * 7_919_993) % entries
            t1 = time.perf_counter()
            receipt = tlog.receipt(seq)
            assert receipt is not None
            wire = receipt.to_dict()
            t2 = time.perf_counter()
            assert _device_verifies(wire, tlog.verifier)
            t3 = time.perf_counter()
            reads.append(t2 - t1)
            checks.append(t3 - t2)
            sizes.append(_receipt_bytes(receipt))
        t4 = time.perf_counter()
        verdict = tlog.verify()
        verified = time.perf_counter() - t4
        assert verdict.ok, verdict
        with tempfile.TemporaryDirectory() as folder:
            t5 = time.perf_counter()
            first = write_tiles(tlog, Path(folder))
            t6 = time.perf_counter()
            again = write_tiles(tlog, Path(folder))
            t7 = time.perf_counter()
        assert not again.written and again.kept == len(first.written) - 1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (
        f"| {kind} | {entries:,} | {built:.1f} s ({entries / built:,.0f} /s)"
        f" | {statistics.median(reads) * 1e3:.2f} ms | {statistics.median(sizes):,.0f} B"
        f" | {statistics.median(checks) * 1e3:.3f} ms | {verified:.1f} s"
        f" | {t6 - t5:.1f} s ({len(first.written):,} files) | {t7 - t6:.2f} s | {peak:,.0f} MiB |"
    )


def simulated(size: int) -> str:
    """A receipt's size and verification time at ``size`` leaves (synthetic node hashes)."""

    def node(level: int, index: int) -> bytes:
        return hashlib.sha256(f"{level}:{index}".encode()).digest()

    signer = Signer("dp-governor.invalid/tlog", bytes(32))
    index = 0  # the first leaf: the longest path, every sibling a right one
    proof = inclusion_proof(index, size, node)
    root = node(0, index)
    for sibling in proof:
        root = node_hash(root, sibling)
    text = Checkpoint(signer.name, size, root).text()
    note = sign_note(text, [signer.sign(text)])
    leaf = orjson.dumps(
        {"budget": "emoji", "day": 20_779, "epsilon_micro": 4_000_000, "kind": "charge",
         "label": "0" * 32, "policy_version": 1, "seq": size, "spent": 4_000_000,
         "use_case": "emoji", "v": 2}
    )  # fmt: skip
    receipt = Receipt(index, leaf, proof, note)
    wire = receipt.to_dict()
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        got, _ = Checkpoint.open(wire["checkpoint"], signer.verifier)
        path = decode_hashes(wire["proof"])
        assert verify_inclusion(node(0, index), index, got.size, path, got.root)
        times.append(time.perf_counter() - t0)
    return (
        f"| {size:,} | {len(proof)} | {_receipt_bytes(receipt):,} B"
        f" | {statistics.median(times) * 1e3:.3f} ms |"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--postgres", default=os.environ.get("DPGOV_TEST_DATABASE_URL"))
    args = parser.parse_args(argv)
    print("| leaves | proof hashes | receipt | device verifies (signature + proof) |")
    print("|---|---|---|---|")
    for size in (10**6, 10**9):
        print(simulated(size), flush=True)
    print()
    print(
        "| backend | entries | sync (checkpoint job) | receipt read | receipt | device verifies"
        " | verify all | static tiles | tiles again | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(run("sqlite", None, args.entries), flush=True)
    if args.postgres:
        print(run("postgresql", args.postgres, args.entries), flush=True)


if __name__ == "__main__":
    main()
