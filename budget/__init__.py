"""The per-device privacy ledger, the atomic check-and-charge gate, and the accountant.

Start at :class:`Ledger` (``ledger.py``, the facade: charge, standing, policy writes, purge,
verify). Below it, in the order to read them: ``privacy/`` (the mathematics), ``rule/`` (the
decision, no I/O), ``storage/`` (tables and migrations), ``audit/`` (the log and its replay) and
``gate/`` (the one charge transaction); above it, ``reporting/`` (the read side: effective
epsilon, central figures, what-if, export). docs/architecture.md draws the layers.
"""

from dp_governor.budget.clock import Clock, FixedClock, SystemClock, utc_day
from dp_governor.budget.errors import (
    IdempotencyConflict,
    InvalidRequest,
    PolicyConflict,
    UnknownUseCase,
)
from dp_governor.budget.gate.prepared import Gate
from dp_governor.budget.ledger import BudgetStatus, Ledger, PurgeResult
from dp_governor.budget.privacy.accountant import Accountant, PrivacyLoss
from dp_governor.budget.reporting.loss import DeviceLoss
from dp_governor.budget.rule.decide import Decision
from dp_governor.budget.storage.db import create_db_engine
from dp_governor.budget.storage.schema import init_db

__all__ = [
    "Accountant",
    "BudgetStatus",
    "Clock",
    "Decision",
    "DeviceLoss",
    "FixedClock",
    "Gate",
    "IdempotencyConflict",
    "InvalidRequest",
    "Ledger",
    "PolicyConflict",
    "PrivacyLoss",
    "PurgeResult",
    "SystemClock",
    "UnknownUseCase",
    "create_db_engine",
    "init_db",
    "utc_day",
]
