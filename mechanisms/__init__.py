"""Apple's local-DP frequency mechanisms in pure numpy: CMS, HCMS and SFP.

Each implements :class:`Mechanism` (``interface.py``). Device side: ``privatize(values, rng=...)``
(batch, simulations) and ``privatize_one(value)`` (one report, OS randomness). Codec:
``parse_report`` (a wire body, errors naming the field), ``decode`` (stored payloads) and
``from_columns``; ``fingerprint`` and ``describe``. Server side: ``sketch()`` with ``add``,
``merge``, ``estimate`` and ``to_arrays``. No I/O, no logging, no global state.
"""

from dp_governor.mechanisms._validation import InvalidReport
from dp_governor.mechanisms.cms import CMS, CmsReport, CmsReports, CmsSketch
from dp_governor.mechanisms.estimate import FrequencyEstimate
from dp_governor.mechanisms.hashing import HashFamily
from dp_governor.mechanisms.hcms import HCMS, HcmsReport, HcmsReports, HcmsSketch
from dp_governor.mechanisms.interface import (
    Arrays,
    Discovering,
    Fingerprint,
    Mechanism,
    Report,
    Reports,
    Sketch,
)
from dp_governor.mechanisms.published import describe, family_id, from_published
from dp_governor.mechanisms.sfp import SFP, DiscoveredWord, SfpReport, SfpReports, SfpSketch

__all__ = [
    "CMS",
    "HCMS",
    "SFP",
    "Arrays",
    "CmsReport",
    "CmsReports",
    "CmsSketch",
    "DiscoveredWord",
    "Discovering",
    "Fingerprint",
    "FrequencyEstimate",
    "HashFamily",
    "HcmsReport",
    "HcmsReports",
    "HcmsSketch",
    "InvalidReport",
    "Mechanism",
    "Report",
    "Reports",
    "SfpReport",
    "SfpReports",
    "SfpSketch",
    "Sketch",
    "describe",
    "family_id",
    "from_published",
]
