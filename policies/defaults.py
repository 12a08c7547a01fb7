"""Apple's published use cases as default policies.

Epsilons and daily caps from Apple's Differential Privacy Technical Overview, mechanism
parameters from *Learning with Privacy at Scale*, section 6.

Lookup Hints' mechanism is not published: CMS with Emoji's sketch size (k=65536, m=1024) is our
choice. Safari's energy-draining and crashing domains share ONE budget ("a single privacy
budget with epsilon of 4", 2 donations per day), modelled as budget group ``safari-domains``.
Apple publishes no publication threshold; ``publish_threshold`` is 0 here, so publication is
governed by the estimates' own significance until a team sets one.

``min_batch_devices`` (Apple publishes none) is the smallest of 1,000, 2,000, 5,000, 10,000,
20,000, 50,000, 100,000, 200,000, ... at which one shuffled batch's central epsilon at the
policy's delta (1e-9) is at most half its local epsilon per report (FMT21 Theorem 3.2,
:func:`dp_governor.budget.privacy.amplification.shuffle_epsilon`): 1,000 at epsilon 2 (0.75), 5,000
at 4 (1.29), 200,000 at 8 (1.75; 100,000 gives 7.98). See docs/amplification.md.
"""

from __future__ import annotations

from dp_governor.policies.model import PolicyCreate

__all__ = ["DEFAULT_POLICIES", "default_policies"]

_CMS_BIG = {"mechanism": "cms", "k": 65536, "m": 1024}
_SAFARI_HCMS = {
    "mechanism": "hcms",
    "k": 1024,
    "m": 32768,
    "epsilon_per_report": 4.0,
    "max_reports_per_day": 2,
    "budget_group": "safari-domains",
    "min_batch_devices": 5_000,
}

DEFAULT_POLICIES: tuple[dict[str, object], ...] = (
    {
        "name": "quicktype",
        "description": "QuickType new words (SFP): discovery of words missing from the lexicon.",
        "mechanism": "sfp",
        "k": 2048,
        "m": 1024,
        "k_fragment": 2048,
        "m_fragment": 1024,
        "epsilon_per_report": 8.0,
        "epsilon_word": 2.0,
        "epsilon_fragment": 6.0,
        "max_reports_per_day": 2,
        "min_batch_devices": 200_000,
    },
    {
        "name": "emoji",
        "description": "Emoji usage by keyboard locale (CMS).",
        **_CMS_BIG,
        "epsilon_per_report": 4.0,
        "max_reports_per_day": 1,
        "min_batch_devices": 5_000,
    },
    {
        "name": "lookup-hints",
        "description": "Lookup Hints (mechanism unpublished; CMS chosen here).",
        **_CMS_BIG,
        "epsilon_per_report": 4.0,
        "max_reports_per_day": 2,
        "min_batch_devices": 5_000,
    },
    {
        "name": "safari-energy-domains",
        "description": "Safari domains causing high energy use (HCMS; shares safari-domains).",
        **_SAFARI_HCMS,
    },
    {
        "name": "safari-crash-domains",
        "description": "Safari domains causing crashes (HCMS; shares safari-domains).",
        **_SAFARI_HCMS,
    },
    {
        "name": "safari-autoplay",
        "description": "Safari auto-play intent per domain (CMS).",
        **_CMS_BIG,
        "epsilon_per_report": 8.0,
        "max_reports_per_day": 2,
        "min_batch_devices": 200_000,
    },
    {
        "name": "health-types",
        "description": "HealthKit type usage (CMS, m=256).",
        "mechanism": "cms",
        "k": 65536,
        "m": 256,
        "epsilon_per_report": 2.0,
        "max_reports_per_day": 1,
        "min_batch_devices": 1_000,
    },
)


def default_policies() -> list[PolicyCreate]:
    """The defaults, validated (90-day retention, group size 1, delta 1e-9)."""
    return [PolicyCreate.model_validate(p) for p in DEFAULT_POLICIES]
