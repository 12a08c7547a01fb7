"""The log served as C2SP tlog-tiles by a real server; a client rebuilds proofs from the tiles.

More than 256 leaves, so the tree has level-1 tiles and partial tiles; the client checks the
checkpoint's signature, recomputes its root from tiles, proves leaves from entry bundles into
it, and proves the next checkpoint consistent with it, all from ``/checkpoint`` and ``/tile``.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from dp_governor.budget import Ledger, create_db_engine
from dp_governor.mechanisms.merkle import (
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)
from dp_governor.mechanisms.signed_note import Checkpoint
from dp_governor.mechanisms.tiles import TilePath, bundle_entries, tile_reader, tile_width
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T
from tests.api.test_witness import NOW
from tests.live import ADMIN_TOKEN, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_a_client_proves_leaves_and_consistency_from_tiles_alone(tmp_path: Path) -> None:
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        base = served.base
        assert httpx.get(f"{base}/checkpoint", timeout=T).status_code == 404
        engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        try:
            ledger = Ledger(engine, SECRET.encode(), audit_key=AUDIT_KEY.encode())
            log = ledger.tlog.verifier
            for n in range(300):
                assert ledger.charge(f"tile-device-{n}", "emoji", now=NOW).accepted
            _checkpoint_job(base)
            got = httpx.get(f"{base}/checkpoint", timeout=T)
            assert got.headers["content-type"] == "text/plain; charset=utf-8"
            point, _ = Checkpoint.open(got.text, log)
            size = point.size
            assert size > 256 and size % 256 != 0  # level-1 tiles and partial tiles

            read: list[str] = []

            def fetch(tile: TilePath) -> bytes:
                answer = httpx.get(f"{base}/{tile.path()}", timeout=T)
                assert answer.status_code == 200, (tile.path(), answer.text)
                assert answer.headers["content-type"] == "application/octet-stream"
                assert "immutable" in answer.headers["cache-control"]
                read.append(tile.path())
                return answer.content

            reader = tile_reader(size, fetch)
            assert root_of(size, reader) == point.root
            assert read == ["tile/1/000.p/1", f"tile/0/001.p/{size - 256}"]  # the level-1 hash
            leaves = httpx.get(
                f"{base}/v1/tlog/leaves", params={"start": 0, "end": size}, timeout=T
            ).json()
            for index in (0, 255, 256, size - 1):
                n = index // 256
                bundle = fetch(TilePath(None, n, tile_width(0, n, size)))
                leaf = bundle_entries(bundle)[index % 256]
                assert leaf.decode() == leaves[index]
                proof = inclusion_proof(index, size, reader)
                assert verify_inclusion(leaf_hash(leaf), index, size, proof, point.root)

            for n in range(300, 600):
                ledger.charge(f"tile-device-{n}", "emoji", now=NOW)
            _checkpoint_job(base)
            later, _ = Checkpoint.open(httpx.get(f"{base}/checkpoint", timeout=T).text, log)
            grown = tile_reader(later.size, fetch)
            steps = consistency_proof(size, later.size, grown)
            assert verify_consistency(size, point.root, later.size, later.root, steps)
            # the earlier checkpoint's partial tile is still served, and says the same
            assert fetch(TilePath(0, 1, size - 256)) == fetch(TilePath(0, 1))[: (size - 256) * 32]
        finally:
            engine.dispose()
        bad = httpx.get(f"{base}/tile/0/1", timeout=T)
        assert bad.status_code == 422 and "`path`" in bad.text  # the service's bad-field answer
        beyond = httpx.get(f"{base}/tile/0/x001/000", timeout=T)
        assert beyond.status_code == 404
        wide = httpx.get(f"{base}/tile/1/000.p/255", timeout=T)
        assert wide.status_code == 404 and "tile/1/000.p/255" in wide.text


def _checkpoint_job(base: str) -> None:
    ran = httpx.post(f"{base}/v1/admin/jobs/checkpoint:run", headers=ADMIN, timeout=T)
    assert ran.status_code == 200, ran.text
