"""Reports from misbuilt devices are refused over real HTTP: ``family`` is required by default.

A device with another epsilon, hash seed or sketch size builds reports that are otherwise valid;
folded, they bias every estimate while looking normal. Each such report is refused with 422
naming ``family`` and, where the service published that family, what differs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest

from dp_governor.api.settings import Settings
from dp_governor.mechanisms import CMS, HCMS, SFP, HashFamily, family_id, from_published
from tests.live import ADMIN_TOKEN, serve

EMOJI = "emoji"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _post(base: str, device: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/use-cases/{EMOJI}/reports", json=body, headers={"X-Device-Id": device}
    )


def _published(base: str) -> dict[str, Any]:
    policy: dict[str, Any] = httpx.get(f"{base}/v1/use-cases/{EMOJI}").json()
    return policy


def _body(mech: CMS | HCMS | SFP, value: str = "😂") -> dict[str, Any]:
    """A report as a device built with ``mech`` sends it: its own family identifier."""
    return mech.privatize_one(value).to_dict() | {"family": family_id(mech)}


def _schema(published: dict[str, Any]) -> jsonschema_rs.Validator:
    """The validator of the report schema a policy publishes (a device's only source)."""
    return jsonschema_rs.validator_for(published["randomizer"]["report_schema"])


def _detail(response: httpx.Response) -> str:
    assert response.status_code == 422, response.text
    (item,) = response.json()["detail"]
    assert item["field"] == "family", item
    return str(item["msg"])


def test_the_setting_requires_the_family_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DPGOV_REQUIRE_REPORT_FAMILY")
    assert Settings().require_report_family is True
    monkeypatch.setenv("DPGOV_REQUIRE_REPORT_FAMILY", "false")  # fleets built before the field
    assert Settings().require_report_family is False


def test_a_misbuilt_device_is_refused_naming_what_differs(tmp_path: Path) -> None:
    with serve(tmp_path, require_report_family=None) as served:
        published = _published(served.base)
        right = from_published(published)
        assert isinstance(right, CMS)
        no_family = right.privatize_one("😂").to_dict()
        assert "is required" in _detail(_post(served.base, "d-0", no_family))
        accepted = _post(served.base, "d-1", _body(right))
        assert accepted.status_code == 202, accepted.text
        # the published schema says so: a device built from it alone sends what is accepted
        schema = _schema(published)
        assert "family" in published["randomizer"]["report_schema"]["required"]
        assert schema.is_valid(_body(right)) and not schema.is_valid(no_family)
        # epsilon 1 instead of 4, another seed, another sketch size: never published
        for i, wrong in enumerate(
            [
                dataclasses.replace(right, epsilon=1.0),
                dataclasses.replace(right, hash_family=HashFamily(12345)),
                dataclasses.replace(right, m=2048),
            ]
        ):
            detail = _detail(_post(served.base, f"d-wrong-{i}", _body(wrong)))
            assert "no randomizer this service published has that family" in detail
            assert "epsilon, k, m, hash family algorithm and seed" in detail
        # a device built from an earlier version: the refusal names each difference
        changed = httpx.put(
            f"{served.base}/v1/use-cases/{EMOJI}",
            params={"allow_loosen": "true"},
            headers=ADMIN,
            json={
                "mechanism": "cms",
                "k": right.k,
                "m": right.m,
                "epsilon_per_report": 2.0,
                "max_reports_per_day": 1,
                "window_epsilon_cap": 120.0,
                "description": "Emoji usage (CMS), a smaller epsilon.",
            },
        )
        assert changed.status_code == 200, changed.text
        detail = _detail(_post(served.base, "d-old", _body(right)))
        assert f"an earlier version (version 1 of {EMOJI!r})" in detail
        assert "epsilon 2.0 (the report: 4.0)" in detail
        # nothing was charged for any refusal: d-old still has its one emoji report to spend
        current = from_published(_published(served.base))
        assert _post(served.base, "d-old", _body(current)).status_code == 202


def test_a_relay_batch_names_the_item(tmp_path: Path) -> None:
    with serve(tmp_path, require_report_family=None) as served:
        right = from_published(_published(served.base))
        assert isinstance(right, CMS)
        items = [
            {"device_id": "r-1", "report": _body(right)},
            {"device_id": "r-2", "report": right.privatize_one("😂").to_dict()},
            {"device_id": "r-3", "report": _body(dataclasses.replace(right, epsilon=1.0))},
        ]
        answer = httpx.post(
            f"{served.base}/v1/use-cases/{EMOJI}/reports:batch",
            json={"items": items},
            headers=ADMIN,
        ).json()
        results = answer["results"]
        assert results[0]["status"] == 202
        assert [r.get("field") for r in results[1:]] == ["items[1].report.family"] * 1 + [
            "items[2].report.family"
        ]


def test_fleets_built_before_the_field_keep_reporting_when_allowed(tmp_path: Path) -> None:
    with serve(tmp_path, require_report_family="false") as served:
        right = from_published(_published(served.base))
        assert isinstance(right, CMS)
        without = _post(served.base, "old-1", right.privatize_one("😂").to_dict())
        assert without.status_code == 202, without.text
        # the published schema accepts what this server accepts: the family optional
        schema = _schema(_published(served.base))
        assert schema.is_valid(right.privatize_one("😂").to_dict())
        assert schema.is_valid(_body(right))
        wrong = _body(dataclasses.replace(right, epsilon=1.0))
        assert "no randomizer" in _detail(_post(served.base, "old-2", wrong))


@pytest.mark.parametrize(
    "mech",
    [CMS(4.0, 16, 32, HashFamily(3)), HCMS(4.0, 16, 32, HashFamily(3)), SFP(2.0, 6.0, 16, 32)],
    ids=lambda m: m.name,
)
def test_the_family_covers_every_parameter_of_the_mechanism(mech: CMS | HCMS | SFP) -> None:
    """Every field that builds a mechanism (what decodes a report, and its epsilon) moves it."""
    changed: dict[str, Any] = {
        "epsilon": 1.0,
        "epsilon_word": 1.0,
        "epsilon_fragment": 1.0,
        "k": 8,
        "m": 64,
        "k_fragment": 8,
        "m_fragment": 64,
        "hash_family": HashFamily(4),
        "alphabet": " abc",
    }
    fields = [f.name for f in dataclasses.fields(mech)]
    assert set(fields) <= changed.keys(), "a new parameter: add it to the family and here"
    for name in fields:
        other = dataclasses.replace(mech, **{name: changed[name]})
        assert family_id(other) != family_id(mech), name
