"""Files the service writes outside its database, readable by their owner only.

The checkpoint file and ``dpgov audit export``'s output carry the ledger's history (device
pseudonyms, spend, the signed heads of the audit log): like the keys and the SQLite file
beside them they are created with mode 0600 (missing folders 0700), whatever the process's
umask.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, TextIO

__all__ = ["open_private"]

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def open_private(path: Path, mode: Literal["a", "w"]) -> TextIO:
    """Open ``path`` as UTF-8 text to append (``"a"``) or replace (``"w"``), mode 0600.

    A file this call creates is made 0600 by ``fchmod`` (a umask can only take permissions
    away, and one that took the owner's away would leave it unreadable); a file it replaces
    (``"w"``) is made 0600 too, since what it held is gone. A file it appends to keeps its
    mode: an operator may have widened it on purpose (a reader's group). Missing folders are
    created 0700.
    """
    path.parent.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    try:
        fd = os.open(path, flags | os.O_EXCL, PRIVATE_FILE)
        created = True
    except FileExistsError:
        fd = os.open(path, flags, PRIVATE_FILE)
        created = False
    try:
        if created or mode == "w":
            os.fchmod(fd, PRIVATE_FILE)
        return os.fdopen(fd, mode, encoding="utf-8", newline="")
    except BaseException:
        os.close(fd)
        raise
