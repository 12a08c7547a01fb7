"""Use-case policies: mechanism and parameters, epsilon per report, caps, retention, thresholds."""

from dp_governor.policies.defaults import DEFAULT_POLICIES, default_policies
from dp_governor.policies.files import (
    PolicyFileError,
    dump_policies,
    load_device_budget,
    load_policies,
)
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
