"""Report health: a fleet built with another epsilon shows on the dashboard and in metrics.

The misbuilt device here copies the published ``family`` (so it is not refused) but draws its
coins with epsilon 1 instead of 4: every report is valid, and folded it would bias every
estimate while looking normal.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from dp_governor.mechanisms import CMS, HCMS, SFP, from_published
from dp_governor.pipeline.health import ReportHealth, Z
from tests.live import serve

N = 2000  # reports per fleet in the band checks; a correct one falls outside about 2e-9 a report


def _count(health: ReportHealth, mech: CMS | HCMS | SFP, device: CMS | HCMS | SFP) -> float:
    """The share of ``N`` reports from ``device`` implausible under ``mech``."""
    values = [f"item-{i % 50}" for i in range(N)]
    for report in device.privatize(values, rng=np.random.default_rng(5)):
        health.observe("uc", mech, report)
    (line,) = health.lines()
    assert line.checked == N
    return line.share


@pytest.mark.parametrize("m", [32, 1024, 4096])
def test_correct_cms_reports_fall_in_the_band_and_another_epsilon_out_of_it(m: int) -> None:
    policy = CMS(4.0, 64, m)
    assert _count(ReportHealth(), policy, policy) == 0.0
    if m >= 1024:  # enough coordinates to tell epsilon 1 from 4 in one report
        assert _count(ReportHealth(), policy, dataclasses.replace(policy, epsilon=1.0)) == 1.0
        assert _count(ReportHealth(), policy, dataclasses.replace(policy, epsilon=8.0)) == 1.0
    low, high = policy.plausible_ones(Z)
    assert 0 <= low < high <= m


def test_sfp_checks_both_parts_and_hcms_is_not_checked() -> None:
    policy = SFP(2.0, 6.0)
    assert _count(ReportHealth(), policy, policy) == 0.0
    assert _count(ReportHealth(), policy, dataclasses.replace(policy, epsilon_word=0.5)) == 1.0
    health = ReportHealth()
    hcms = HCMS(4.0, 64, 1024)
    for report in hcms.privatize(["a"] * 10, rng=np.random.default_rng(1)):
        health.observe("uc", hcms, report)
    assert health.lines() == []


TIMEOUT = 300  # the first page imports the accounting and computes every figure: seconds on a busy
# machine, never a measure here


def test_a_misbuilt_fleet_shows_on_the_dashboard_and_in_metrics(tmp_path: Path) -> None:
    with (
        serve(tmp_path, require_report_family=None) as served,
        httpx.Client(timeout=TIMEOUT) as http,
    ):
        published = http.get(f"{served.base}/v1/use-cases/emoji").json()
        right = from_published(published)
        assert isinstance(right, CMS)
        family = published["randomizer"]["family_id"]
        wrong = dataclasses.replace(right, epsilon=1.0)  # the family copied, not computed
        for i, mech in enumerate([right] * 20 + [wrong] * 20):
            body = mech.privatize_one("😂").to_dict() | {"family": family}
            sent = http.post(
                f"{served.base}/v1/use-cases/emoji/reports",
                json=body,
                headers={"X-Device-Id": f"device-{i}"},
            )
            assert sent.status_code == 202, sent.text
        metrics = http.get(f"{served.base}/metrics").text
        assert 'dpgov_reports_checked_total{use_case="emoji"} 40.0' in metrics
        assert 'dpgov_reports_implausible_total{use_case="emoji"} 20.0' in metrics
        assert 'dpgov_reports_implausible_share{use_case="emoji"} 0.5' in metrics
        page = http.get(f"{served.base}/").text
        row = re.search(r'<table id="health">.*?</table>', page, re.S)
        assert row is not None, page
        assert re.search(r"<td>emoji</td><td>40</td><td>20</td><td class=\"bad\">50.00%", row[0])
