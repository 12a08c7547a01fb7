"""The private pipeline: reports charged into the inbox, shuffled into the store, folded, purged.

Its own layer between the ledger (``budget``) and the HTTP service (``api``): it knows no HTTP.
One job per module, in a report's order:

- :mod:`.ingest`: validates a report, charges it through the ledger's gate and writes its sealed
  inbox row in the same transaction (:mod:`.seal`: the inbox sealed to the shuffler key).
- :mod:`.flush`: the inbox shuffled into published batches in the report store.
- :mod:`.fold`: published batch parts added into per-day sketches (each mechanism decodes its
  own reports); :mod:`.codec`: a sketch's stored form, compressed bytes and a digest.
- :mod:`.purge`: retention, past each use case's window.
- :mod:`.parquet` and :mod:`.distributed`: the store exported to Parquet and folded with Dask.
- :mod:`.tables`: the pipeline's tables (their migrations are the ledger's, in
  ``budget/storage/migrations``).

Every job writes in short transactions (at most ``STEP_ROWS`` rows each, and for the fold one
sketch), does its reading, shuffling and sketch arithmetic outside them, and can stop between any
two of them: the next run takes over where it stopped. Each is safe to run concurrently with
itself (two processes, or a scheduled run beside ``dpgov jobs run``).
"""
