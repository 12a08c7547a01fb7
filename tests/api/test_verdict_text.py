"""One text for a verdict: the dashboard's line, the command's summary and the JSON agree.

For any verdict (hypothesis), the entries the dashboard names are ``from_seq + 1`` to
``from_seq + entries`` of the JSON the route and the command print, the command's summary line
names the same, and the note shown is the JSON's note.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

from hypothesis import given
from hypothesis import strategies as st

from dp_governor.api._verdict_text import (
    REPLAY_HINT,
    checked_entries,
    entry_span,
    summary,
    with_clause,
)
from dp_governor.api.dashboard import _chain_panel
from dp_governor.api.schemas import AuditVerification
from dp_governor.budget.audit.log import Verification

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
_NOTES = st.one_of(st.none(), st.sampled_from(["a & <b>", "entries before 5 are archived"]))


@st.composite
def verdicts(draw: st.DrawFn) -> Verification:
    """A verdict as a run records it: ``entries`` after ``from_seq``, up to the head read."""
    from_seq = draw(st.integers(0, 10**7))
    entries = draw(st.integers(0, 10**6))
    ok = draw(st.booleans())
    head = from_seq + entries + (0 if ok else draw(st.integers(0, 1)))
    return Verification(
        ok=ok,
        entries=entries,
        head_seq=head,
        head_hash="0" * 64,
        checkpoints=1,
        latest_checkpoint_seq=from_seq or None,
        latest_checkpoint_at=(NOW - timedelta(minutes=1)).isoformat() if from_seq else None,
        first_bad=None if ok else head + 1,
        problem=None if ok else "entry x does not link",
        note=draw(_NOTES),
        from_seq=from_seq,
    )


def _shown(html: str, name: str) -> str | None:
    found = re.search(rf'id="{name}">(.*?)</span>', html)
    return None if found is None else unescape(found[1])


@given(verdicts())
def test_the_dashboard_and_the_summary_name_the_jsons_entries(verdict: Verification) -> None:
    json_view = AuditVerification(**verdict.to_dict()).model_dump()
    html = _chain_panel(verdict, NOW, NOW + timedelta(seconds=5))
    shown = _shown(html, "chain-entries")
    assert shown == checked_entries(verdict)
    numbers = [int(n.replace(",", "")) for n in re.findall(r"[\d,]+\d|\d", str(shown))]
    first, last = json_view["from_seq"] + 1, json_view["from_seq"] + json_view["entries"]
    if json_view["entries"]:
        assert numbers[:2] == [first, last] and entry_span(verdict) == (first, last)
        assert shown is not None and shown.endswith(" checked")
        if verdict.ok:
            assert last == json_view["head_seq"]
    else:
        assert shown is not None and shown.startswith("no ")
        assert numbers == ([json_view["from_seq"]] if json_view["from_seq"] else [])
    nothing_new = verdict.ok and json_view["from_seq"] and not json_view["entries"]
    if nothing_new:  # said as such, not "checked": the earlier run checked up to from_seq
        assert shown == f"no new entries since the last verified checkpoint at entry {first - 1:,d}"
    assert f": {shown}{REPLAY_HINT if nothing_new else ''}" in summary(verdict)
    assert (REPLAY_HINT in summary(verdict)) == bool(nothing_new)
    note = _shown(html, "chain-note")
    assert note == (None if not json_view["note"] else f"note: {json_view['note']}")
    if json_view["note"]:
        assert summary(verdict).endswith(f"; note: {json_view['note']}")


@given(st.one_of(st.none(), st.text(min_size=1, max_size=20)), st.text(min_size=1, max_size=20))
def test_a_clause_is_added_after_the_note(note: str | None, clause: str) -> None:
    made = with_clause(note, clause)
    assert made.endswith(clause) and (note is None or made.startswith(note))
