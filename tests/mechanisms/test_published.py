"""Published randomizers: the JSON a device reads rebuilds the server's mechanism exactly."""

from __future__ import annotations

import json

import pytest

from mechanisms import CMS, HCMS, HashFamily, describe, family_id, from_published
from policies import Policy, PolicyCreate, default_policies, mechanism_for, publish


@pytest.mark.parametrize("policy", default_policies(), ids=lambda p: p.name)
def test_every_default_policy_publishes_its_own_randomizer(policy: PolicyCreate) -> None:
    row = Policy.model_validate({**policy.model_dump(), "version": 1})
    wire = json.loads(publish(row).model_dump_json())
    assert wire["randomizer"]["hash_family"]["seed"] != "0"
    assert from_published(wire) == mechanism_for(row)
    assert wire["randomizer"]["family_id"] == family_id(mechanism_for(row))
    assert wire["randomizer"]["report_schema"]["properties"]["family"]["const"].startswith("f1-")


def test_family_ids_differ_with_any_parameter_or_seed() -> None:
    base = HCMS(4.0, 1024, 32768, HashFamily(1))
    others: list[CMS | HCMS] = [
        HCMS(4.0, 1024, 32768, HashFamily(2)),
        HCMS(4.0, 512, 32768, HashFamily(1)),
        HCMS(2.0, 1024, 32768, HashFamily(1)),
        CMS(4.0, 1024, 1024, HashFamily(1)),
    ]
    assert len({family_id(m) for m in [base, *others]}) == 5
    assert family_id(base) == family_id(HCMS(4.0, 1024, 32768, HashFamily(1)))


def test_an_altered_description_is_refused() -> None:
    wire = json.loads(json.dumps(describe(HCMS(4.0, 1024, 32768, HashFamily(7)))))
    wire["k"] = 512
    with pytest.raises(ValueError, match="family_id"):
        from_published(wire)
    del wire["hash_family"]
    with pytest.raises(ValueError, match="hash_family"):
        from_published(wire)
