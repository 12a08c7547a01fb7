"""``dpgov demo`` end to end on a small fleet (the full one runs 20,000 devices)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from api.cli import app
from api.demo.demo import run_demo


def test_demo_runs_the_whole_loop(tmp_path: Path) -> None:
    seen: list[int] = []
    result = run_demo(3000, 2, seed=11, progress=seen.append, workdir=tmp_path)
    assert result.submitted == sum(seen) == 3000 * 2 * 2
    assert result.accepted == result.submitted  # one emoji and one word per device and day
    assert result.emoji_top[0]["item"] == "😂"  # the most popular emoji comes out first
    top = result.emoji_top[0]
    assert abs(top["count"] - result.emoji_truth["😂"]) < 4 * top["stderr"]
    assert result.words, "SFP discovered nothing"
    best = max(result.word_truth, key=lambda w: result.word_truth[w])
    assert best in {w["word"] for w in result.words}
    assert {s["use_case"]: s["epsilon_lifetime"] for s in result.spend} == {
        "emoji": 8.0,
        "quicktype": 16.0,
    }
    lines = {u["use_case"]: u for u in result.effective_epsilon["use_cases"]}
    assert lines["emoji"]["spent_window"]["max"] == 8.0  # 2 days x 4
    assert lines["emoji"]["spent_window"]["devices"] == 3000
    assert lines["quicktype"]["spent_lifetime"]["median"] == 16.0  # 2 days x one 8-report
    assert result.audit["ok"] and result.audit["latest_checkpoint_seq"] == result.audit["entries"]


def test_demo_cli_validates_its_options() -> None:
    bad = CliRunner().invoke(app, ["demo", "--devices", "5"])
    assert bad.exit_code != 0 and "--devices" in bad.output
