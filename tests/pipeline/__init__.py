"""Tests of the private pipeline: ingest, seal, flush, fold, purge, export."""
