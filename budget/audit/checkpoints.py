"""Signed heads of the audit log, and the copy of them kept outside the database.

:class:`Checkpoint` is what :meth:`dp_governor.budget.audit.log.AuditLog.checkpoint` signs.
The checkpoint job appends each to a file kept elsewhere (``checkpoint_file``) reading only
the file's last line, and ``verify`` streams the file a line at a time, so neither costs more
as the file grows (a checkpoint every few seconds writes tens of thousands of lines a day).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from dp_governor.budget.storage.files import open_private

__all__ = [
    "Checkpoint",
    "CheckpointFile",
    "CheckpointFileError",
    "last_kept_seq",
    "read_checkpoints",
    "write_checkpoints",
]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed head."""

    seq: int
    hash: str
    at: str
    signature: str


class CheckpointFileError(ValueError):
    """The checkpoint file kept outside the database cannot be read as checkpoints.

    Torn by a crash mid-append, not UTF-8, a folder, unreadable: ``verify`` fails naming it
    (a copy that cannot be read protects nothing) and the checkpoint job appends nothing to it.
    """

    def __init__(self, path: Path, cause: str) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"checkpoint file unreadable: {path}: {cause}")


def write_checkpoints(points: Iterable[Checkpoint], path: Path) -> int:
    """Append ``points`` after the file's last checkpoint, as JSON lines (a copy kept elsewhere).

    Only the file's last line is read (:func:`last_kept_seq`): points up to its entry are
    skipped, so an append costs the same however long the file is. Returns how many were
    added. The file is created with mode 0600
    (:func:`dp_governor.budget.storage.files.open_private`). Raises
    :class:`CheckpointFileError`, appending nothing, when its last line cannot be read (torn
    by a crash, not UTF-8, not a checkpoint) or the file cannot be opened.
    """
    held = last_kept_seq(path) if path.exists() or path.is_symlink() else 0
    added = 0
    try:
        with open_private(path, "a") as out:
            for p in points:
                if p.seq > held:
                    out.write(orjson.dumps(asdict(p)).decode() + "\n")
                    held, added = p.seq, added + 1
    except OSError as exc:
        raise CheckpointFileError(path, exc.strerror or type(exc).__name__) from None
    return added


_TAIL = 4096  # bytes read at a time from a file's end


def last_kept_seq(path: Path) -> int:
    """The entry of the last checkpoint in ``path`` (0: none), reading only its last lines.

    Raises :class:`CheckpointFileError` for a file whose end is torn (no final newline), whose
    last line is not a checkpoint, or that cannot be read.
    """
    try:
        with path.open("rb") as handle:
            end = handle.seek(0, 2)
            tail = b""
            while end > 0:
                size = min(_TAIL, end)
                end = handle.seek(end - size)
                tail = handle.read(size) + tail
                if tail.strip() and b"\n" in tail.rstrip():
                    break
    except OSError as exc:
        raise CheckpointFileError(path, exc.strerror or type(exc).__name__) from None
    if not tail.strip():
        return 0
    if not tail.endswith(b"\n"):
        raise CheckpointFileError(path, "its last line is cut short (torn by a crash mid-append)")
    line = tail.rstrip().rsplit(b"\n", 1)[-1]
    try:
        return _parse(line.decode("utf-8")).seq
    except UnicodeDecodeError as exc:
        raise CheckpointFileError(path, f"its last line is not UTF-8 text ({exc.reason})") from None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointFileError(path, f"its last line is not a checkpoint ({exc})") from None


def _parse(line: str) -> Checkpoint:
    """One line of a checkpoint file."""
    data = orjson.loads(line)
    return Checkpoint(int(data["seq"]), str(data["hash"]), str(data["at"]), str(data["signature"]))


class CheckpointFile:
    """The checkpoints of a file, streamed line by line each time it is iterated (oldest first).

    What :meth:`AuditLog.verify` takes for the kept copy: memory stays one line however
    long the file. Iterating raises :class:`CheckpointFileError` as :func:`read_checkpoints`.
    ``since``: start at about the last line before that entry's checkpoint, found by a binary
    search on the file's bytes (an incremental verification reads only what follows).
    """

    def __init__(self, path: Path, *, since: int = 0) -> None:
        self.path = path
        self.since = since

    def after(self, seq: int) -> CheckpointFile:
        """This file read from about the line before the checkpoint of entry ``seq``."""
        return CheckpointFile(self.path, since=seq)

    def __iter__(self) -> Iterator[Checkpoint]:
        """Each checkpoint of the file (from ``since``'s line before), parsed as it is read."""
        path = self.path
        try:
            with path.open("rb") as handle:
                offset = _search(handle, self.since) if self.since > 1 else 0
                handle.seek(offset)
                if offset:
                    handle.readline()  # the line the search landed in the middle of
                for n, raw in enumerate(handle, start=1):
                    if not raw.strip():
                        continue
                    where = f"line {n}" if not offset else f"a line after byte {offset}"
                    try:
                        point = _parse(raw.decode("utf-8"))
                    except UnicodeDecodeError as exc:
                        raise CheckpointFileError(path, f"not UTF-8 text ({exc.reason})") from None
                    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                        raise CheckpointFileError(
                            path, f"{where} is not a checkpoint ({exc})"
                        ) from None
                    yield point
        except OSError as exc:
            raise CheckpointFileError(path, exc.strerror or type(exc).__name__) from None


def _search(handle: BinaryIO, seq: int) -> int:
    """A byte offset whose next whole line is a checkpoint before ``seq`` (or 0), by bisection.

    A line that cannot be read where the search looks ends it there: the reading goes on
    from the last offset known good, and meets that line.
    """
    lo, hi = 0, handle.seek(0, 2)
    while hi - lo > _TAIL * 16:
        mid = (lo + hi) // 2
        handle.seek(mid)
        handle.readline()
        line = handle.readline()
        try:
            below = bool(line.strip()) and _parse(line.decode("utf-8")).seq < seq
        except (UnicodeDecodeError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return lo
        lo, hi = (mid, hi) if below else (lo, mid)
    return lo


def read_checkpoints(path: Path) -> list[Checkpoint]:
    """The checkpoints of a file written by :func:`write_checkpoints`, oldest first.

    Raises :class:`CheckpointFileError` for a file that cannot be read (missing included) or
    holds a line that is not a checkpoint (naming the line).
    """
    return sorted(CheckpointFile(path), key=lambda p: p.seq)
