"""Published randomizers: the JSON a device reads rebuilds the server's mechanism exactly."""

from __future__ import annotations

import json

import pytest

from dp_governor.mechanisms import CMS, HCMS, HashFamily, describe, family_id, from_published
from dp_governor.policies import Policy, PolicyCreate, default_policies, mechanism_for, publish
from dp_governor.policies._randomizer import Randomizer


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


@pytest.mark.parametrize(
    ("fields", "seed", "family"),
    [
        # the seed derived from "uc-3" starts with two zero digits; the family ids were pinned
        # before seeds were published fixed-width, and must never change
        (
            {"name": "uc-3", "mechanism": "cms", "k": 64, "m": 32, "epsilon_per_report": 4.0},
            "00a82b5096afdb0d09414a1f1e87c1cc70e11cfd57bfda94a60eecf872b98795",
            "f1-8f3fe0966999eeed",
        ),
        (
            {"name": "x", "mechanism": "hcms", "k": 16, "m": 64, "epsilon_per_report": 2.0}
            | {"hash_seed": "0000ab"},
            "0" * 62 + "ab",
            "f1-dbe13cf02a007e7a",
        ),
    ],
)
def test_seeds_are_published_fixed_width_and_keep_their_key_and_family(
    fields: dict[str, object], seed: str, family: str
) -> None:
    policy = PolicyCreate.model_validate({**fields, "max_reports_per_day": 1})
    row = Policy.model_validate({**policy.model_dump(), "version": 1})
    wire = json.loads(publish(row).model_dump_json())["randomizer"]
    assert wire["hash_family"]["seed"] == seed and len(seed) == 64
    assert wire["family_id"] == family == family_id(mechanism_for(row))
    # a device decodes the 64 digits as the 32-byte key: the server's key
    assert bytes.fromhex(wire["hash_family"]["seed"]) == mechanism_for(row).hash_family.key
    assert from_published(wire) == mechanism_for(row)


def test_a_shorter_seed_from_an_older_server_still_reads_as_its_key() -> None:
    family = HashFamily(0xAB)
    assert HashFamily.from_dict({"algorithm": family.algorithm, "seed": "ab"}) == family
    assert HashFamily.from_dict(family.to_published()) == family
    # the Python client parses an older server's description and builds the same mechanism
    mech = HCMS(4.0, 16, 64, family)
    old = describe(mech) | {"hash_family": family.to_dict()}
    assert from_published(Randomizer.model_validate(old).model_dump()) == mech
    schema = Randomizer.model_json_schema()["$defs"]["PublishedHashFamily"]
    assert schema["properties"]["seed"]["pattern"] == "^[0-9a-f]{64}$"  # what is published
