"""``dpgov audit tiles --out DIR``: the log's tiles as static files, the same bytes as the routes.

A client rebuilds the root, inclusion proofs and a consistency proof from the files alone
(with the client code that reads tiles over HTTP), every file equals what the routes serve,
and a second run writes nothing but what is new: full tiles are never written again. ``vkey``
beside them is the log's verifier key, and docs/transparency.md's example checks a device's
record against the files served by a static host, as written.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from dp_governor.budget import Ledger, create_db_engine
from dp_governor.client import Client, Receipt
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
            assert f"verifier key written to {out / 'vkey'}" in first.stdout, first.stdout
            before = _files(out)
            assert not [name for name in before if "/." in f"/{name}"]  # no temporary file left
            vkey = httpx.get(f"{base}/v1/tlog/checkpoint", timeout=T).json()["vkey"]
            assert (out / "vkey").read_text() == f"{vkey}\n" == f"{log.vkey()}\n"
            for name in set(before) - {"vkey"}:  # the same bytes as the routes serve
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
            assert "verifier key" not in again.stdout  # written once
            assert _files(out) == before  # nothing rewritten

            for n in range(300, 600):
                ledger.charge(f"static-device-{n}", "emoji", now=NOW)
            _checkpoint_job(base)
            grown = _tiles(tmp_path, out)
            assert grown.returncode == 0, grown.stderr
            after = _files(out)
            for name, stat in before.items():  # tiles are immutable: only the checkpoint moves
                assert (after[name] == stat) == (name != "checkpoint"), name
            for name in set(after) - {"vkey"}:
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


@contextmanager
def _static_host(folder: Path) -> Iterator[str]:
    """``folder`` served over HTTP, as a static host serves the tiles; its base URL."""
    handler = functools.partial(_QuietFiles, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=T)


class _QuietFiles(SimpleHTTPRequestHandler):
    """A static file server that keeps its request log to itself."""

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing (the test's output stays the test's)."""


def test_the_transparency_docs_example_checks_a_record_against_the_static_tiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/transparency.md's example, as written: a real server, its tiles on a static host."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "transparency.md").read_text("utf-8")
    section = doc.split("### Checking a device's record against the static tiles", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    out = tmp_path / "site"
    with serve(tmp_path, device_key_secret=SECRET, audit_key=AUDIT_KEY) as served:
        with Client(served.base) as device:
            mech = device.randomizer("emoji")
            for n in range(3):  # others' leaves around the device's
                device.submit("emoji", f"other-{n}", mech.privatize_one("x"))
            receipt = device.submit("emoji", "phone", mech.privatize_one("x"))
            assert isinstance(receipt, Receipt)
        _checkpoint_job(served.base)
        assert _tiles(tmp_path, out).returncode == 0
        (tmp_path / "device.vkey").write_bytes((out / "vkey").read_bytes())  # the operator's copy
        day = datetime.now(UTC).date().isoformat()
        with _static_host(out) as host:
            runnable = (
                code.replace("http://127.0.0.1:8000", served.base)
                .replace("https://tlog.example.com", host)
                .replace('Path("log.vkey")', f"Path({str(tmp_path / 'device.vkey')!r})")
                .replace('"device-9", "2026-11-22"', f'"phone", "{day}"')
            )
            exec(compile(runnable, "docs/transparency.md", "exec"), {})
            printed = capsys.readouterr().out
            assert re.match(r"1 leaves of device-9 in the static log of \d+ leaves", printed)
            # the same check fails on a host whose tiles are not the signed tree's
            (tile,) = [p for p in (out / "tile" / "0").rglob("*") if p.is_file()]
            data = bytearray(tile.read_bytes())
            data[0] ^= 1
            tile.write_bytes(bytes(data))
            with pytest.raises(AssertionError):
                exec(compile(runnable, "docs/transparency.md", "exec"), {})
