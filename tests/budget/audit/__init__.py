"""Tests of budget/audit."""
