"""Tests of budget/reporting."""
