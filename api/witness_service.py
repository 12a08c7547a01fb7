"""A witness as an HTTP service: C2SP ``tlog-witness`` ``POST /add-checkpoint``.

A log submits ``old <size>``, the consistency proof lines, a blank line and its signed
checkpoint; the witness answers with its cosignature line (200), the size it holds (409, when
``old`` is not that size or the same size has another root), 404 for a log it does not follow,
403 when no signature of that log verifies, 422 for a proof that does not verify, 400 for a
malformed body. The check is :func:`~dp_governor.api.client.witness.check_extension`, the one
``dpgov witness run`` makes; the state is a SQLite file whose check-and-advance runs in one
``BEGIN IMMEDIATE`` transaction, so two concurrent requests cannot both advance it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dp_governor.api.client.witness import (
    BadProof,
    Fork,
    WitnessState,
    check_extension,
    cosign_note,
)
from dp_governor.mechanisms.signed_note import Checkpoint, NoteError, Signer, Verifier, open_note

__all__ = ["Answer", "Malformed", "Witness", "WitnessStore", "make_server", "parse_submission"]

log = logging.getLogger("dpgov.witness")
SIZE_TYPE = "text/x.tlog.size"
_MAX_BODY = 64 * 1024
_MAX_PROOF = 63


class Malformed(ValueError):
    """A request body that is not an ``add-checkpoint`` submission."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, content type and body."""

    status: int
    content_type: str
    body: bytes


class WitnessStore:
    """The largest checkpoint cosigned per log, in a SQLite file (created if missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS witness_state"
                " (origin TEXT PRIMARY KEY, size INTEGER NOT NULL, root BLOB NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def get(self, origin: str) -> WitnessState:
        """The kept state of log ``origin`` (size 0 if never cosigned)."""
        conn = self._connect()
        try:
            row = conn.execute(
                "SELECT size, root FROM witness_state WHERE origin = ?", (origin,)
            ).fetchone()
        finally:
            conn.close()
        return WitnessState(origin) if row is None else WitnessState(origin, row[0], row[1])

    def advance(
        self, origin: str, step: Callable[[WitnessState], WitnessState]
    ) -> tuple[WitnessState, WitnessState]:
        """Apply ``step`` to the kept state and store its result, atomically.

        ``step`` runs inside a write transaction (``BEGIN IMMEDIATE``): no other request reads
        the state between its check and the write. Returns the old and new states; whatever
        ``step`` raises rolls back and propagates.
        """
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT size, root FROM witness_state WHERE origin = ?", (origin,)
                ).fetchone()
                old = WitnessState(origin) if row is None else WitnessState(origin, *row)
                new = step(old)
                conn.execute(
                    "INSERT INTO witness_state (origin, size, root) VALUES (?, ?, ?)"
                    " ON CONFLICT (origin)"
                    " DO UPDATE SET size = excluded.size, root = excluded.root",
                    (origin, new.size, new.root),
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()
        return old, new


def parse_submission(body: bytes) -> tuple[int, list[bytes], str]:
    """The old size, the proof hashes and the checkpoint note of an ``add-checkpoint`` body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("the body is not UTF-8") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise Malformed("the body needs an old size line, proof lines, a blank line, a checkpoint")
    lines = head.split("\n")
    first = lines[0]
    digits = first.removeprefix("old ")
    if digits == first or not digits.isdigit() or (digits != "0" and digits.startswith("0")):
        raise Malformed(f"the first line must be 'old <size>', got {first[:40]!r}")
    if len(lines) - 1 > _MAX_PROOF:
        raise Malformed(f"at most {_MAX_PROOF} consistency proof lines, got {len(lines) - 1}")
    proof = []
    for line in lines[1:]:
        try:
            digest = base64.b64decode(line, validate=True)
        except binascii.Error:
            digest = b""
        if len(digest) != 32:
            raise Malformed(f"a proof line must be a base64 SHA-256 hash, got {line[:60]!r}")
        proof.append(digest)
    return int(digits), proof, note


class Witness:
    """Checks submitted checkpoints of the logs it follows and cosigns the consistent ones."""

    def __init__(self, signer: Signer, logs: Sequence[Verifier], store: WitnessStore) -> None:
        self.signer = signer
        self.logs: Mapping[str, Verifier] = {key.name: key for key in logs}
        self.store = store

    def add_checkpoint(self, body: bytes, *, now: int) -> Answer:
        """Answer one ``add-checkpoint`` submission (the status codes of the module's doc)."""
        try:
            old, proof, note = parse_submission(body)
            point = Checkpoint.parse(open_note(note)[0])
        except (Malformed, NoteError) as exc:
            return _text(400, str(exc))
        key = self.logs.get(point.origin)
        if key is None:
            return _text(404, f"this witness does not follow log {point.origin!r}")
        try:
            Checkpoint.open(note, key)
        except NoteError as exc:
            return _text(403, str(exc))
        if old > point.size:
            return _text(400, f"old size {old} is larger than the checkpoint's {point.size}")

        def step(state: WitnessState) -> WitnessState:
            if old != state.size:
                raise _Conflict(state.size)
            return check_extension(state, point, proof)

        try:
            self.store.advance(point.origin, step)
        except _Conflict as exc:
            return Answer(409, SIZE_TYPE, f"{exc.size}\n".encode())
        except BadProof as exc:
            log.warning("witness: %s refused: %s", point.origin, exc)
            return _text(422, str(exc))
        except Fork as exc:  # the same size with another root: a split view
            log.warning("witness: %s refused: %s", point.origin, exc)
            return Answer(409, SIZE_TYPE, f"{old}\n".encode())
        cosigned = cosign_note(note, self.signer, now=now)
        line = open_note(cosigned)[1][-1].line()
        log.info("witness: cosigned %s at size %d", point.origin, point.size)
        return Answer(200, "text/plain; charset=utf-8", line.encode())


class _Conflict(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _text(status: int, message: str) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", (message + "\n").encode())


def make_server(witness: Witness, host: str, port: int) -> ThreadingHTTPServer:
    """A threaded HTTP server answering ``POST /add-checkpoint`` (``port`` 0: a free one)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the protocol recommends

        def do_POST(self) -> None:
            """``add-checkpoint``; any other path is 404, an oversized body 400."""
            length = self.headers.get("Content-Length", "")
            if self.path != "/add-checkpoint":
                self._send(_text(404, f"no route {self.path}"))
            elif not length.isdigit() or int(length) > _MAX_BODY:
                self._send(_text(400, f"Content-Length must be at most {_MAX_BODY}"))
                self.close_connection = True
            else:
                body = self.rfile.read(int(length))
                self._send(witness.add_checkpoint(body, now=int(time.time())))

        def do_GET(self) -> None:
            self._send(_text(404 if self.path != "/add-checkpoint" else 405, "POST only"))

        def _send(self, answer: Answer) -> None:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: object) -> None:
            log.info("witness: %s %s", self.address_string(), format % args)

    return ThreadingHTTPServer((host, port), Handler)
