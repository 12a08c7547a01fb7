"""The per-device privacy ledger, the atomic check-and-charge gate, and the accountant."""

from budget.accountant import Accountant, PrivacyLoss
from budget.clock import Clock, FixedClock, SystemClock, utc_day
from budget.errors import IdempotencyConflict, InvalidRequest, PolicyConflict, UnknownUseCase
from budget.gate import Gate
from budget.ledger import BudgetStatus, Ledger, PurgeResult
from budget.reporting.loss import DeviceLoss
from budget.rule import Decision
from budget.storage.db import create_db_engine
from budget.storage.schema import init_db

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
