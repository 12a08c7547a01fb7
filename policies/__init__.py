"""Use-case policies: mechanism and parameters, epsilon per report, caps, retention, thresholds.

- :mod:`.model`: a policy version (``PolicyCreate`` to write one, ``Policy`` as stored,
  ``PolicyPublic`` as published) and the budget a use case's caps count against.
- :mod:`.defaults`: Apple's published table as the defaults of a fresh install.
- :mod:`.device`: the device-wide budget and its per-use-case quotas.
- :mod:`._files` (private): policy files (YAML, TOML, JSON) read and written, every field stated.
- :mod:`._randomizer` (private): what a device needs to build the server's randomizer.
- :mod:`.repository`: the store of every version, with the locks its writes take.
- :mod:`.errors`: the errors a policy write raises (a loosening, a conflict, an unknown name).
"""

from dp_governor.policies._files import (
    PolicyFileError,
    dump_policies,
    load_device_budget,
    load_policies,
)
from dp_governor.policies.defaults import DEFAULT_POLICIES, default_policies
from dp_governor.policies.model import (
    Policy,
    PolicyBase,
    PolicyCreate,
    PolicyPublic,
    PolicyTerms,
    PolicyUpdate,
    budget_key,
    mechanism_for,
    publish,
)
from dp_governor.policies.repository import PolicyStore

__all__ = [
    "DEFAULT_POLICIES",
    "Policy",
    "PolicyBase",
    "PolicyCreate",
    "PolicyFileError",
    "PolicyPublic",
    "PolicyStore",
    "PolicyTerms",
    "PolicyUpdate",
    "budget_key",
    "default_policies",
    "dump_policies",
    "load_device_budget",
    "load_policies",
    "mechanism_for",
    "publish",
]
