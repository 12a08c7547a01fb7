"""The purge's paging (``delete_pages``) deletes exactly its range, on SQLite and PostgreSQL.

A random model test: random rows, a random range and page size; what is left must be exactly
the rows outside the range, whatever the pages' boundaries.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Engine, Index, Integer, MetaData, String, Table, and_, select

from dp_governor.budget.storage.db import delete_pages, writer

_META = MetaData()
# one key column (the purge's charges, reports, inbox) and two (its idempotency records)
ONE = Table(
    "pages_one",
    _META,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("grp", Integer, nullable=False),
    Column("day", Integer, nullable=False),
    Index("ix_pages_one", "grp", "day", "id"),
)
TWO = Table(
    "pages_two",
    _META,
    Column("a", String(8), primary_key=True),
    Column("b", String(8), primary_key=True),
    Column("day", Integer, nullable=False),
    Index("ix_pages_two", "day", "a", "b"),
    sqlite_with_rowid=False,
)

rows_st = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 5)), min_size=0, max_size=60
)  # (group, day) of each row


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=rows_st, grp=st.integers(0, 2), cutoff=st.integers(-1, 5), page=st.integers(1, 9))
def test_pages_delete_exactly_the_range(
    engine: Engine, rows: list[tuple[int, int]], grp: int, cutoff: int, page: int
) -> None:
    """Every row of the group on or before the cutoff goes, every other row stays.

    The last page's callback runs once, whatever the page size.
    """
    _META.create_all(engine)
    with writer(engine).begin() as conn:
        conn.execute(ONE.delete())
        conn.execute(TWO.delete())
        if rows:
            conn.execute(
                ONE.insert(), [{"id": i, "grp": g, "day": d} for i, (g, d) in enumerate(rows)]
            )
            conn.execute(
                TWO.insert(),
                [{"a": f"a{g}", "b": f"b{i}", "day": d} for i, (g, d) in enumerate(rows)],
            )
    lasts: list[int] = []
    where = and_(ONE.c.grp == grp, ONE.c.day <= cutoff)
    order = (ONE.c.grp, ONE.c.day, ONE.c.id)
    gone = delete_pages(engine, ONE, order, where, page, last=lambda conn: lasts.append(1))
    expected = {i for i, (g, d) in enumerate(rows) if not (g == grp and d <= cutoff)}
    assert gone == len(rows) - len(expected)
    assert lasts == [1]
    with engine.connect() as conn:
        assert {int(r) for r in conn.execute(select(ONE.c.id)).scalars()} == expected
    order2 = (TWO.c.day, TWO.c.a, TWO.c.b)
    gone2 = delete_pages(engine, TWO, order2, TWO.c.day <= cutoff, page, key=2)
    left = {f"b{i}" for i, (_, d) in enumerate(rows) if d > cutoff}
    assert gone2 == len(rows) - len(left)
    with engine.connect() as conn:
        assert set(conn.execute(select(TWO.c.b)).scalars()) == left


def test_a_page_refused_by_before_stops_the_paging(engine: Engine) -> None:
    """``before`` returning ``False`` ends the run with what earlier pages deleted."""
    _META.create_all(engine)
    with writer(engine).begin() as conn:
        conn.execute(ONE.insert(), [{"id": i, "grp": 0, "day": 0} for i in range(10)])
    calls: list[int] = []

    def before(_conn: object) -> bool:
        calls.append(1)
        return len(calls) < 3  # the third page is refused

    order = (ONE.c.grp, ONE.c.day, ONE.c.id)
    assert delete_pages(engine, ONE, order, ONE.c.grp == 0, 3, before=before) == 6
    with engine.connect() as conn:
        assert len(conn.execute(select(ONE.c.id)).all()) == 4
