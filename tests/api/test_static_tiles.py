"""``dpgov audit tiles --out DIR``: the log's tiles as static files, the same bytes as the routes.

A client rebuilds the root, inclusion proofs and a consistency proof from the files alone
(with the client code that reads tiles over HTTP), every file equals what the routes serve,
and a second run writes nothing but what is new: full tiles are never written again.
"""

from __future__ import annotations

import subprocess
import sys
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
from tests.api.test_tiles_http import _checkpoint_job
from tests.api.test_truth_http import AUDIT_KEY, SECRET, T
from tests.api.test_witness import NOW
from tests.live import serve, server_env


def _tiles(folder: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = server_env(folder, device_key_secret=SECRET, audit_key=AUDIT_KEY)
    return subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", "audit", "tiles", "--out", str(out)],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=T,
        check=False,
    )


def _files(out: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``out`` with its inode and modification time."""
    return {
        p.relative_to(out).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in out.rglob("*")
        if p.is_file()
    }


def test_static_tiles_are_the_routes_bytes_and_prove_from_files_alone(tmp_path: Path) -> None:
    out = tmp_path / "site"
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        base = served.base
        empty = _tiles(tmp_path, out)
        assert empty.returncode == 1 and "no checkpoint yet" in empty.stderr, empty.stderr
        engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        try:
            ledger = Ledger(engine, SECRET.encode(), audit_key=AUDIT_KEY.encode())
            log = ledger.tlog.verifier
            for n in range(300):
                assert ledger.charge(f"static-device-{n}", "emoji", now=NOW).accepted
            _checkpoint_job(base)
            first = _tiles(tmp_path, out)
            assert first.returncode == 0, first.stderr
            before = _files(out)
            assert not [name for name in before if "/." in f"/{name}"]  # no temporary file left
            for name in before:  # the same bytes as the routes serve
                served_bytes = httpx.get(f"{base}/{name}", timeout=T)
                assert served_bytes.status_code == 200, name
                assert (out / name).read_bytes() == served_bytes.content, name

            point, _ = Checkpoint.open((out / "checkpoint").read_text(), log)
            size = point.size
            assert size > 256 and size % 256 != 0  # level-1 tiles and partial tiles

            def fetch(tile: TilePath) -> bytes:
                return (out / tile.path()).read_bytes()

            reader = tile_reader(size, fetch)
            assert root_of(size, reader) == point.root
            for index in (0, 255, 256, size - 1):
                n = index // 256
                leaf = bundle_entries(fetch(TilePath(None, n, tile_width(0, n, size))))[index % 256]
                proof = inclusion_proof(index, size, reader)
                assert verify_inclusion(leaf_hash(leaf), index, size, proof, point.root)

            again = _tiles(tmp_path, out)
            assert again.returncode == 0 and "unchanged; 0 tile(s) written" in again.stdout
            assert _files(out) == before  # nothing rewritten

            for n in range(300, 600):
                ledger.charge(f"static-device-{n}", "emoji", now=NOW)
            _checkpoint_job(base)
            grown = _tiles(tmp_path, out)
            assert grown.returncode == 0, grown.stderr
            after = _files(out)
            for name, stat in before.items():  # tiles are immutable: only the checkpoint moves
                assert (after[name] == stat) == (name != "checkpoint"), name
            for name in after:
                answer = httpx.get(f"{base}/{name}", timeout=T)
                assert (out / name).read_bytes() == answer.content, name
            later, _ = Checkpoint.open((out / "checkpoint").read_text(), log)
            assert later.size > size
            steps = consistency_proof(size, later.size, tile_reader(later.size, fetch))
            assert verify_consistency(size, point.root, later.size, later.root, steps)
            assert "tile/0/000" in after and f"tile/0/001.p/{size - 256}" in after
        finally:
            engine.dispose()
    (tmp_path / "a-file").write_text("")
    refused = _tiles(tmp_path, tmp_path / "a-file")
    assert refused.returncode == 2 and "`--out` must be a folder" in refused.stderr
    assert "Traceback" not in refused.stderr
