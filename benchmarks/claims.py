"""The independent verifier's time for one day of the public log; prints a Markdown table.

Usage: ``python -m benchmarks.claims [--charges 1000000]``.

Builds, in memory, the leaves of one day as the service publishes them: ``charges`` charge
leaves (two reports from each of ``charges / 2`` devices, each leaf with its own label and its
device's running total), the day's
``batch.publish`` leaves (batches of 10,000 devices with two reports each) and the day's claim
(:func:`dp_governor.budget.reporting.claims.build_claim`, its figures computed as the server
computes them), saves them as a log copy under a signed checkpoint, and times
``dpgov audit recompute --log COPY`` in a fresh process (its caches cold): the copy read, the
RFC 9162 root of the leaves checked against the checkpoint, every leaf parsed, the local
distribution recounted from the charge leaves, the claim's figures recomputed and its report
regenerated. No database and no network: fetching the copy depends on the link.
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy.orm import configure_mappers

from dp_governor.api.client.log_copy import LogCopy
from dp_governor.budget.privacy.sub_batches import batch_layers
from dp_governor.budget.reporting.claims import ACTOR, CLAIM_ACTION, build_claim
from dp_governor.budget.storage.tables import ShuffledBatch
from dp_governor.mechanisms.merkle import Frontier, leaf_hash
from dp_governor.mechanisms.signed_note import Checkpoint, Signer, sign_note
from dp_governor.policies.model import Policy

DAY = 20_779
EPSILON_MICRO = 2_000_000
PER_BATCH = 10_000  # devices a batch, two reports each
_SORTED = orjson.OPT_SORT_KEYS
# ``dpgov`` in a child that prints its own peak RSS at exit: its memory's high-water mark
# (``VmHWM``, of the new process image; ``ru_maxrss`` would carry the parent's across exec)
_PEAK = (
    "import atexit, runpy, sys; atexit.register(lambda: print("
    "[x for x in open('/proc/self/status') if x.startswith('VmHWM')][0], file=sys.stderr));"
    " sys.argv = ['dpgov', *sys.argv[1:]]; runpy.run_module('dp_governor.api.cli',"
    " run_name='__main__')"
)


def _leaves(charges: int) -> tuple[list[bytes], int]:
    """A day's charge and batch leaves, and its claim's leaf, in log order; and the batches."""
    devices = charges // 2
    leaves = []
    for i in range(charges):
        n = 1 + i // devices  # the device's first report, then its second
        leaf = {
            "kind": "charge",
            "label": hashlib.sha256(i.to_bytes(8, "big")).hexdigest()[:32],
            "use_case": "emoji",
            "policy_version": 1,
            "epsilon_micro": EPSILON_MICRO,
            "budget": "emoji",
            "spent": n * EPSILON_MICRO,
            "v": 2,
            "day": DAY,
            "seq": i + 1,
        }
        leaves.append(orjson.dumps(leaf, option=_SORTED))
    configure_mappers()  # table models built without a database (see claim_figures)
    policy = Policy.model_construct(
        name="emoji",
        version=1,
        mechanism="hcms",
        epsilon_per_report=EPSILON_MICRO / 1e6,
        max_reports_per_day=2,
        retention_days=30,
        min_batch_devices=1_000,
        delta=1e-9,
    )
    batches = []
    for b in range(max(1, devices // PER_BATCH)):
        layers = batch_layers([2] * PER_BATCH)
        record: dict[str, Any] = {
            "first_day": DAY,
            "last_day": DAY,
            "devices": PER_BATCH,
            "reports": 2 * PER_BATCH,
            "max_per_device": 2,
            "layers": layers,
            "untagged": 0,
            "epsilon_micro": EPSILON_MICRO,
            "min_batch_devices": 1_000,
        }
        data = {"use_case": "emoji", "day": DAY, **record}
        leaf = {"kind": "batch.publish", "actor": "job:flush-inbox", "data": data}
        leaves.append(orjson.dumps({**leaf, "day": DAY, "seq": len(leaves) + 1}, option=_SORTED))
        batches.append(
            ShuffledBatch.model_construct(
                id=b + 1,
                use_case="emoji",
                day=DAY,
                split=False,
                **{**record, "layers": orjson.dumps(layers).decode()},
            )
        )
    claim = build_claim(policy, [], batches, DAY, {2 * EPSILON_MICRO: devices})
    leaf = {"kind": CLAIM_ACTION, "actor": ACTOR, "data": claim}
    leaves.append(orjson.dumps({**leaf, "day": DAY + 1, "seq": len(leaves) + 1}, option=_SORTED))
    return leaves, len(batches)


def main() -> None:
    """Save one day's log as a signed copy, run ``dpgov audit recompute`` on it, print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--charges", type=int, default=1_000_000)
    args = parser.parse_args()
    leaves, batches = _leaves(args.charges)
    frontier = Frontier()
    for leaf in leaves:
        frontier.append(leaf_hash(leaf))
    signer = Signer("bench.invalid/tlog", secrets.token_bytes(32))
    point = Checkpoint(signer.name, len(leaves), frontier.root())
    note = sign_note(point.text(), [signer.sign(point.text())])
    copy = LogCopy(signer.verifier.vkey(), note, len(leaves), leaves)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "log.json"
        path.write_bytes(copy.to_json())
        size = path.stat().st_size
        command = [sys.executable, "-c", _PEAK, "audit", "recompute"]
        command += ["--log", str(path), "--log-key", signer.verifier.vkey()]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
    if done.returncode != 0 or "1 claims, 1 reproduced exactly" not in done.stdout:
        raise SystemExit(done.stdout + done.stderr)
    rss = int(done.stderr.rsplit("VmHWM:", 1)[1].split()[0]) / 1024
    print("| charges | batches | leaves | saved copy | `dpgov audit recompute --log` | peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {args.charges:,} | {batches:,} | {len(leaves):,} | {size / 2**20:,.0f} MiB"
        f" | {seconds:.1f} s | {rss:,.0f} MiB |"
    )


if __name__ == "__main__":
    main()
