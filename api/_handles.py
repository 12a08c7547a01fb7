"""The two parts of the ledger that the service layer may hold: its engine and its policy store.

The ledger facade (:class:`dp_governor.budget.Ledger`) answers every question about devices and
budgets itself. Two of its parts are the service's own business: the database engine (for the
jobs' leases, the pipeline's steps and the operations queries) and the policy store (the one way
policies are read and written). Routes, commands and jobs reach them through these two functions
(routes through the ``EngineDep`` and ``PolicyStoreDep`` dependencies built on them), never by
reaching into the ledger, so ``tests/test_layers.py`` can hold that no other module of ``api``
does.
"""

from __future__ import annotations

from sqlalchemy import Engine

from dp_governor.budget import Ledger
from dp_governor.policies.repository import PolicyStore

__all__ = ["ledger_engine", "policy_store"]


def ledger_engine(ledger: Ledger) -> Engine:
    """The engine of the ledger's database, for the jobs, the pipeline and operations queries."""
    return ledger.engine


def policy_store(ledger: Ledger) -> PolicyStore:
    """The store of every policy version: the one way the service reads and writes policies."""
    return ledger.policies
