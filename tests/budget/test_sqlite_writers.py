"""SQLite's writers: one holder at a time across processes, checkpoints beside them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, text

from budget.db import (
    WalCheckpointer,
    WriterLock,
    create_db_engine,
    start_checkpointer,
    writer,
    writer_lock,
)


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


def _table(engine: Engine) -> None:
    with writer(engine).begin() as conn:
        conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, blob BLOB)"))


def _write(engine: Engine, rows: int = 16, size: int = 4096) -> None:
    with writer_lock(engine), writer(engine).begin() as conn:
        conn.execute(text("INSERT INTO t (blob) VALUES (randomblob(:n))"), [{"n": size}] * rows)


def test_writers_leave_checkpoints_to_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    engine = create_db_engine(f"sqlite:///{path}")
    _table(engine)
    checkpointer = start_checkpointer(engine)
    assert checkpointer is not None
    checkpointer.stop()  # run it by hand below
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        for _ in range(80):  # 5 MiB: past the 1,000 pages a commit would have checkpointed
            _write(engine)
        wal = Path(f"{path}-wal")
        frames, copied = checkpointer.run_once()
        assert frames > 1000 and copied == frames  # nothing was copied at commit
        checkpointer.truncate_bytes = 1
        assert checkpointer.run_once() == (0, 0)
        assert wal.stat().st_size == 0
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 80 * 16
    finally:
        checkpointer.stop()
        engine.dispose()


def test_the_wal_stays_bounded_under_writers_that_never_pause(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    engine = create_db_engine(f"sqlite:///{path}")
    _table(engine)
    lock = writer_lock(engine)
    assert isinstance(lock, WriterLock)
    checkpointer = WalCheckpointer(str(path), lock, interval=0.005, truncate_bytes=2 << 20)
    checkpointer.start()
    largest = 0
    try:
        for _ in range(300):  # 19 MiB written back to back
            _write(engine)
            largest = max(largest, os.path.getsize(f"{path}-wal"))
    finally:
        checkpointer.stop()
    try:
        assert largest < 12 << 20  # truncated along the way, never all of it
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 300 * 16
    finally:
        engine.dispose()


def test_no_checkpointer_for_postgres() -> None:
    engine = create_db_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connects
    try:
        assert start_checkpointer(engine) is None
    finally:
        engine.dispose()
