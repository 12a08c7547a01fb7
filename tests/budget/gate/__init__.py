"""Tests of budget/gate."""
