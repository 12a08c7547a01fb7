"""Tests of budget/storage."""
