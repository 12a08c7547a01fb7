"""Tests of budget/privacy."""
