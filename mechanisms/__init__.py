"""Apple's local-DP frequency mechanisms in pure numpy: CMS, HCMS and SFP.

Device side: ``privatize(values, rng=...)`` (batch, simulations) and ``privatize_one(value)`` (one
report, OS randomness). Server side: ``sketch()`` with ``add``, ``merge`` and ``estimate``. No I/O,
no logging, no global state.
"""

from dp_governor.mechanisms.cms import CMS, CmsReport, CmsReports, CmsSketch
from dp_governor.mechanisms.estimate import FrequencyEstimate
from dp_governor.mechanisms.hashing import HashFamily
from dp_governor.mechanisms.hcms import HCMS, HcmsReport, HcmsReports, HcmsSketch
from dp_governor.mechanisms.published import describe, family_id, from_published
from dp_governor.mechanisms.sfp import SFP, DiscoveredWord, SfpReport, SfpReports, SfpSketch
from dp_governor.mechanisms.validation import InvalidReport

__all__ = [
    "CMS",
    "HCMS",
    "SFP",
    "CmsReport",
    "CmsReports",
    "CmsSketch",
    "DiscoveredWord",
    "FrequencyEstimate",
    "HashFamily",
    "HcmsReport",
    "HcmsReports",
    "HcmsSketch",
    "InvalidReport",
    "SfpReport",
    "SfpReports",
    "SfpSketch",
    "describe",
    "family_id",
    "from_published",
]
