"""The SQLite writers' queue: one holder at a time across threads and processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from budget.db import WriterLock, create_db_engine, writer_lock


def test_one_lock_per_file_and_process(tmp_path: Path) -> None:
    a = create_db_engine(f"sqlite:///{tmp_path / 'x.sqlite'}")
    b = create_db_engine(f"sqlite:///{tmp_path / 'x.sqlite'}")
    other = create_db_engine(f"sqlite:///{tmp_path / 'y.sqlite'}")
    try:
        assert writer_lock(a) is writer_lock(b)
        assert writer_lock(a) is not writer_lock(other)
    finally:
        for engine in (a, b, other):
            engine.dispose()


def test_separate_opens_exclude_each_other(tmp_path: Path) -> None:
    """Two locks on one file stand for two processes: ``flock`` makes the second wait."""
    path = str(tmp_path / "db.sqlite")
    first, second = WriterLock(path), WriterLock(path)
    order: list[str] = []
    with first:
        waiter = threading.Thread(target=lambda: (second.__enter__(), order.append("second")))
        waiter.start()
        time.sleep(0.2)
        assert order == []  # still waiting on the file lock
        order.append("first released")
    waiter.join(timeout=5)
    second.__exit__(None, None, None)
    assert order == ["first released", "second"]


def test_released_when_the_body_raises(tmp_path: Path) -> None:
    lock = WriterLock(str(tmp_path / "db.sqlite"))
    try:
        with lock:
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    acquired = threading.Event()
    threading.Thread(target=lambda: (lock.__enter__(), acquired.set())).start()
    assert acquired.wait(timeout=5)
