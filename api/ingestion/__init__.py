"""The private ingestion pipeline: charge and enqueue, flush and shuffle, store, aggregate.

``ingest`` charges reports and writes them to the inbox; ``committer`` groups concurrent
single reports into one transaction; ``pipeline`` flushes the inbox, stores and aggregates
sketches and purges; ``parquet`` and ``distributed`` export stored reports and aggregate them
with Dask; ``tables`` holds the pipeline's tables.
"""
