"""Old audit entries moved out of the database into files, beside their signed checkpoints.

An archive holds the entries ``[first, boundary)``: ``boundary`` is the signed checkpoint an
accepted verification reached (:mod:`dp_governor.budget.audit.verdicts`), its entry stays in
the log, and the replay state there is recorded with the archive, so an incremental
verification resumes from it unchanged and a full one without the files starts there. The file
is gzip-compressed JSON lines: a header (format, the range, the chain heads before and at its
end, the boundary entry's head, the signed checkpoints covering it), then one entry a line as
the log stores it, ``[seq, at, actor, action, body, prev_hash, hash, tag]``. It is written to a
temporary name, fsynced and renamed, read back and checked (chain, tags, checkpoints, and
continuity into the boundary entry), and only then are the entries deleted, in the transaction
that records the archive in ``audit_archives`` (its SHA-256, the heads, the state; tagged with a
key derived from the audit key). The database lets DELETE remove only rows below the newest
archive's boundary (revision 0016's triggers).
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from dp_governor.budget.audit.log import (
    AuditLog,
    Checkpoint,
    _columns_match,
    chain_hash,
    timestamp,
)
from dp_governor.budget.audit.verdicts import Resume, VerdictForged, Verdicts
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.tables import AuditArchive

__all__ = [
    "FORMAT",
    "ArchiveError",
    "ArchiveRecord",
    "ArchiveRefused",
    "Archives",
    "NotTheArchives",
    "read_archive",
]

FORMAT = "dp-governor/audit-archive/v1"
_TABLE = AuditArchive.__table__  # type: ignore[attr-defined]
_LABEL = b"dp-governor/audit-archive/v1"
_PAGE = 10_000
Row = tuple[int, str, str, str, str, str, str, str]


class ArchiveRefused(ValueError):
    """An archive cannot be written now; the message says why and what to run (one line)."""


class ArchiveError(ValueError):
    """An archive file or record is not what the database recorded (names which and why)."""


class NotTheArchives(ValueError):
    """The files given to replay are not this log's archives: a wrong argument, no verdict.

    A file whose SHA-256 no ``audit_archives`` row records (another file, a corrupt or edited
    copy) or an archive left without its file: what was given is wrong, not the log, so the
    verification does not run. Only a file that is a recorded archive (its SHA-256 matches) and
    disagrees with the log fails a verification (:class:`ArchiveError`).
    """


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """One row of ``audit_archives`` (:class:`~dp_governor.budget.storage.tables.AuditArchive`)."""

    boundary: int
    hash: str
    first_seq: int
    prev_hash: str
    last_hash: str
    file: str
    sha256: str
    signed_at: str
    signature: str
    claimed_through: int | None
    state: str
    at: str
    tag: str

    @property
    def checkpoint(self) -> Checkpoint:
        """The signed checkpoint at the boundary."""
        return Checkpoint(self.boundary, self.hash, self.signed_at, self.signature)

    def resume(self) -> Resume:
        """The verified replay at the boundary, where a verification without the files starts."""
        data = json.loads(self.state)
        leaves, edge, nodes = data["tlog"]
        return Resume(self.checkpoint, str(data["replay"]), (int(leaves), tuple(edge), int(nodes)))


def _header_of(handle: Any, path: Path) -> dict[str, Any]:
    """The first line of an archive, checked to be one."""
    try:
        header = orjson.loads(handle.readline())
    except orjson.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ArchiveError(f"{path} is not an audit archive ({FORMAT})")
    return header


def read_archive(path: Path) -> tuple[dict[str, Any], Iterator[list[Row]]]:
    """An archive's header and its entries, a page at a time (gzip and JSON errors raised).

    Raises :class:`ArchiveError` for a file that cannot be read or is no archive.
    """
    try:
        handle = gzip.open(path, "rt", encoding="utf-8")
        header = _header_of(handle, path)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"cannot read the archive {path}: {exc}") from None

    def pages() -> Iterator[list[Row]]:
        page: list[Row] = []
        try:
            with handle:
                for n, line in enumerate(handle, start=2):
                    try:
                        seq, at, actor, action, body, prev, new, tag = orjson.loads(line)
                        page.append((int(seq), at, actor, action, body, prev, new, tag))
                    except (orjson.JSONDecodeError, ValueError, TypeError):
                        raise ArchiveError(f"{path}: line {n} is not an audit entry") from None
                    if len(page) >= _PAGE:
                        yield page
                        page = []
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise ArchiveError(f"cannot read the archive {path}: {exc}") from None
        if page:
            yield page

    return header, pages()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, hex (:class:`ArchiveError` if it cannot be read)."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ArchiveError(f"cannot read the archive {path}: {exc.strerror or exc}") from None
    return digest.hexdigest()


class Archives:
    """Writes archives of the oldest entries and reads them back (``audit_archives``)."""

    def __init__(self, audit: AuditLog, audit_key: bytes) -> None:
        self.audit = audit
        self.engine = audit.engine
        self._mac = hmac.new(hmac.digest(audit_key, _LABEL, "sha256"), digestmod="sha256")

    def _tag(self, row: dict[str, Any]) -> str:
        mac = self._mac.copy()
        fields = {k: row[k] for k in sorted(row) if k not in ("tag", "state")}
        fields["state_sha256"] = hashlib.sha256(str(row["state"]).encode()).hexdigest()
        mac.update(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
        return mac.hexdigest()

    def records(self) -> list[ArchiveRecord]:
        """Every archive, oldest first; :class:`ArchiveError` names one the key did not tag."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(_TABLE).order_by(_TABLE.c.boundary)).all()
        found = []
        for r in rows:
            row = r._asdict()
            if not hmac.compare_digest(self._tag(row), str(row["tag"])):
                raise ArchiveError(
                    f"audit_archives: the archive at entry {row['boundary']} is not the audit"
                    " key's (written or edited outside the service)"
                )
            found.append(ArchiveRecord(**row))
        return found

    def claimed_through(self) -> int | None:
        """The newest day a claim in the archived entries covered (``None``: none archived)."""
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT max(claimed_through) FROM audit_archives")).scalar()

    def archive(
        self, verdicts: Verdicts, *, through: int | None, out: Path, now: datetime
    ) -> ArchiveRecord:
        """Archive every entry before ``through`` (``None``: the last verified checkpoint).

        ``through`` must be the signed checkpoint of the last accepted verification (which
        holds the replay there); raises :class:`ArchiveRefused` otherwise, before writing.
        """
        try:
            found = verdicts.last()
        except VerdictForged as exc:
            raise ArchiveRefused(str(exc)) from None
        if found is None:
            if self.audit.latest_checkpoint() is None:
                raise ArchiveRefused(
                    "the audit log has no signed checkpoint yet: run `dpgov jobs run checkpoint`"
                    " (the service's `checkpoint` job signs one every DPGOV_CHECKPOINT_SECONDS),"
                    " then `dpgov audit verify`"
                )
            raise ArchiveRefused(
                "no accepted verification has reached a signed checkpoint: run"
                " `dpgov audit verify` first"
            )
        resume = found[0]
        point = resume.checkpoint
        if through is not None and through != point.seq:
            signed = next(self.audit.iter_checkpoints(after=through - 1, through=through), None)
            what = "no signed checkpoint" if signed is None else "a signed checkpoint"
            raise ArchiveRefused(
                f"entry {through} is {what} an accepted verification holds the state at (the"
                f" last reached entry {point.seq}): run `dpgov audit verify` first, or give"
                " --through verified"
            )
        previous = self.records()
        first = previous[-1].boundary if previous else 1
        if point.seq <= first:
            raise ArchiveRefused(f"the entries before {point.seq} are archived already")
        if resume.tlog[0] < point.seq - 1:
            raise ArchiveRefused(
                f"the transparency log's last verified size ({resume.tlog[0]}) does not cover"
                f" entry {point.seq - 1}: run `dpgov jobs run checkpoint`, then"
                " `dpgov audit verify`"
            )
        boundary = self._boundary_row(point)
        if out.exists() or out.is_symlink():
            raise ArchiveRefused(f"{out} exists (an archive is never overwritten)")
        [start] = list(self.audit.rows(after=first - 1, limit=1))  # read whole: closed
        state = json.dumps(
            {
                "replay": resume.state,
                "tlog": [resume.tlog[0], list(resume.tlog[1]), resume.tlog[2]],
            },
            separators=(",", ":"),
        )
        checkpoints = list(self.audit.iter_checkpoints(after=first - 1, through=point.seq))
        header = {
            "format": FORMAT,
            "first_seq": first,
            "last_seq": point.seq - 1,
            "prev_hash": str(start[5]),
            "last_hash": str(boundary[5]),
            "boundary": {"seq": point.seq, "hash": point.hash},
            "checkpoints": [asdict(p) for p in checkpoints],
        }
        claimed = self._write(out, header, first, point.seq)
        if claimed is None and previous:
            claimed = previous[-1].claimed_through
        try:
            self.check_file(out, header, checkpoints)
        except ArchiveError:
            out.unlink()  # not recorded, nothing deleted: a file no archive names is no use
            raise
        row: dict[str, Any] = {
            "boundary": point.seq,
            "hash": point.hash,
            "first_seq": first,
            "prev_hash": header["prev_hash"],
            "last_hash": header["last_hash"],
            "file": out.name,
            "sha256": file_sha256(out),
            "signed_at": point.at,
            "signature": point.signature,
            "claimed_through": claimed,
            "state": state,
            "at": timestamp(now),
        }
        row["tag"] = self._tag(row)
        try:
            self._record(row, first, point.seq)
        except IntegrityError:
            out.unlink()
            raise ArchiveRefused(
                f"another archive recorded the boundary {point.seq} meanwhile: nothing was deleted"
            ) from None
        return ArchiveRecord(**row)

    def _record(self, row: dict[str, Any], first: int, boundary: int) -> None:
        """Record the archive and delete its entries, in one transaction.

        Rolled back (raising :class:`ArchiveRefused`) unless exactly ``[first, boundary)`` went.
        """
        with writer(self.engine).begin() as conn:
            conn.execute(_TABLE.insert().values(**row))
            deleted = conn.execute(
                text("DELETE FROM audit_log WHERE seq >= :a AND seq < :b"),
                {"a": first, "b": boundary},
            ).rowcount
            if deleted != boundary - first:
                raise ArchiveRefused(  # rolled back: the log changed under the archive
                    f"the log held {deleted} entries in [{first}, {boundary}), not"
                    f" {boundary - first}: nothing was deleted"
                )

    def _boundary_row(self, point: Checkpoint) -> Row:
        """The boundary entry, checked to be the one the checkpoint signs."""
        signed = list(self.audit.iter_checkpoints(after=point.seq - 1, through=point.seq))
        row = next(iter(list(self.audit.rows(after=point.seq - 1, limit=1))), None)
        if (
            signed != [point]
            or row is None
            or int(row[0]) != point.seq
            or row[6] != point.hash
            or chain_hash(row[5], row[4]) != row[6]
            or not hmac.compare_digest(self.audit.tag(row[6]), row[7])
        ):
            raise ArchiveRefused(
                f"entry {point.seq} or its checkpoint is not what the last verification"
                " accepted: run `dpgov audit verify`"
            )
        return (int(row[0]), *row[1:])

    def _write(self, out: Path, header: dict[str, Any], first: int, boundary: int) -> int | None:
        """Write the file (temporary name, fsync, rename); the newest day a claim covered."""
        temporary = out.with_name(f".{out.name}.{os.getpid()}.partial")
        claimed: int | None = None
        try:
            # owner-only, like the database: the entries name devices by their pseudonyms
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as raw:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed:
                    packed.write(orjson.dumps(header) + b"\n")
                    for row in self.audit.rows(after=first - 1):
                        if int(row[0]) >= boundary:
                            break
                        if row[3] == "claim.day":
                            day = int(orjson.loads(row[4])["data"]["inputs"]["day"])
                            claimed = day if claimed is None else max(claimed, day)
                        packed.write(orjson.dumps(list(row)) + b"\n")
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(temporary, out)
            directory = os.open(out.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise ArchiveRefused(f"cannot write {out}: {exc.strerror or exc}") from None
        return claimed

    def check_file(
        self, path: Path, expected: dict[str, Any], checkpoints: Sequence[Checkpoint]
    ) -> None:
        """Read an archive back: its header, chain, tags and checkpoints, into the boundary.

        Raises :class:`ArchiveError` naming the first problem.
        """
        header, pages = read_archive(path)
        if header != expected:
            raise ArchiveError(f"{path}: its header is not the archive's")
        signed = {p.seq: p.hash for p in checkpoints}
        seq, running = int(header["first_seq"]) - 1, str(header["prev_hash"])
        for page in pages:
            for row in page:
                problem = self._entry_problem(row, seq + 1, running, signed)
                if problem is not None:
                    raise ArchiveError(f"{path}: {problem}")
                seq, running = row[0], row[6]
        if (seq, running) != (header["last_seq"], header["last_hash"]):
            raise ArchiveError(
                f"{path}: it ends at entry {seq}, not at {header['last_seq']} linking to"
                f" entry {header['boundary']['seq']}"
            )

    def _entry_problem(
        self, row: Row, seq: int, running: str, signed: dict[int, str]
    ) -> str | None:
        """What is wrong with one archived entry (``None``: nothing)."""
        got, at, actor, action, body, prev, new, tag = row
        if got != seq:
            return f"entry {seq} is missing (next is {got})"
        if prev != running or chain_hash(prev, body) != new:
            return f"entry {seq} does not chain to entry {seq - 1}"
        if not hmac.compare_digest(self.audit.tag(new), tag):
            return f"entry {seq}'s tag is not the audit key's"
        if not _columns_match(seq, at, actor, action, body):
            return f"entry {seq}'s columns disagree with its hashed body"
        if signed.get(seq, new) != new:
            return f"entry {seq} differs from the signed checkpoint at {seq}"
        return None

    def replay(
        self, paths: Sequence[Path], records: Sequence[ArchiveRecord]
    ) -> Iterator[list[Row]]:
        """The entries of the files of every archive, oldest first, a page at a time.

        Each file is matched to its archive by SHA-256 before anything is read; every archive
        needs its file. Raises :class:`NotTheArchives` at once naming a file that is none of
        them (or cannot be read) or an archive without its file; the pages raise
        :class:`ArchiveError` for a header that disagrees with its record. The chain itself is
        checked by whoever replays the pages (:meth:`AuditLog.verify`).
        """
        if paths and not records:
            raise NotTheArchives(
                f"{paths[0]}: this log has no archive (`dpgov audit verify --full` replays it"
                " all without files)"
            )
        by_digest = {r.sha256: r for r in records}
        given: dict[int, Path] = {}
        for path in paths:
            try:
                digest = file_sha256(path)
            except ArchiveError as exc:
                raise NotTheArchives(str(exc)) from None
            record = by_digest.get(digest)
            if record is None:
                raise NotTheArchives(
                    f"{path} is none of the recorded archives (its SHA-256 differs: edited,"
                    " truncated or another file)"
                )
            given[record.boundary] = path
        missing = [r for r in records if r.boundary not in given]
        if missing:
            raise NotTheArchives(
                f"no file given for the archive of entries {missing[0].first_seq} to"
                f" {missing[0].boundary - 1} ({missing[0].file}): give every archive's file"
            )
        return self._pages(records, given)

    def _pages(
        self, records: Sequence[ArchiveRecord], given: dict[int, Path]
    ) -> Iterator[list[Row]]:
        """The files' pages in order, each header checked against its record."""
        for record in records:
            path = given[record.boundary]
            header, pages = read_archive(path)
            if (
                header.get("first_seq") != record.first_seq
                or header.get("last_seq") != record.boundary - 1
                or header.get("prev_hash") != record.prev_hash
                or header.get("last_hash") != record.last_hash
                or header.get("boundary") != {"seq": record.boundary, "hash": record.hash}
            ):
                raise ArchiveError(f"{path}: its header disagrees with audit_archives")
            yield from pages
