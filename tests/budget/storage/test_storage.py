"""Storage: SQLite jobs pause as their engine says; driver cursors close with their checkout.

A job's pause after each SQLite write transaction is the engine's setting, and every driver
cursor is closed as its connection returns to the pool.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text

import dp_governor.budget.storage.db as db
from dp_governor.budget import create_db_engine


class _Clock:
    """``time.monotonic`` and ``time.sleep`` of the storage module, without waiting."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        self.now += 0.25  # every reading a quarter second later: a 0.25 s transaction
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.mark.parametrize(("pause", "slept"), [(None, [0.5]), (0.0, []), (1.0, [0.25])])
def test_a_job_pauses_as_its_engine_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pause: float | None, slept: list[float]
) -> None:
    url = f"sqlite:///{tmp_path / 'pause.sqlite'}"
    engine = create_db_engine(url) if pause is None else create_db_engine(url, job_pause=pause)
    clock = _Clock()
    monkeypatch.setattr("dp_governor.budget.storage.db.time.monotonic", clock.monotonic)
    monkeypatch.setattr("dp_governor.budget.storage.db.time.sleep", clock.sleep)
    with db.write_step(engine) as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    assert clock.slept == pytest.approx(slept)  # the default: twice the transaction's time
    engine.dispose()


@pytest.mark.parametrize("pause", [-1.0, float("nan")])
def test_a_negative_pause_is_refused_naming_it(tmp_path: Path, pause: float) -> None:
    with pytest.raises(ValueError, match="`job_pause` must be a number >= 0"):
        create_db_engine(f"sqlite:///{tmp_path / 'x.sqlite'}", job_pause=pause)


def test_driver_cursors_are_closed_as_their_connection_returns_to_the_pool(engine: Engine) -> None:
    """Closed by the thread that held the connection, before the pool hands it to another.

    Freed later (by the frame or traceback that held it), a cursor would reset its prepared
    statement while another thread runs that same cached statement on the connection.
    """
    with engine.connect() as conn:
        read = db.raw_cursor(conn)
        read.execute("SELECT 1")
        read.fetchall()
        pending = db.raw_cursor(conn)
        pending.execute("SELECT 2")  # its row never fetched: the statement still running
    for cursor in (read, pending):
        with pytest.raises((sqlite3.ProgrammingError, psycopg.InterfaceError), match="closed"):
            cursor.execute("SELECT 3")
    with engine.connect() as conn:  # the next checkout holds none of them
        assert "dpgov_cursors" not in conn.connection.info
