"""Tests of the pure rule: decisions from terms and state, no database."""
