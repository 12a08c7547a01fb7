"""Where the ledger lives: engines, tables, day partitions, the schema and its upgrades.

- :mod:`.db`: ``create_db_engine`` for the embedded SQLite default and for PostgreSQL.
- :mod:`.tables`: the ledger's tables (devices appear only as a keyed HMAC, ``device_key``).
- :mod:`.schema`: every table the service keeps, created or upgraded by the Alembic migrations in
  ``migrations/`` (the pipeline's tables included; ``dpgov db upgrade`` runs them).
- :mod:`.partitions`: PostgreSQL's charges partitioned by UTC day, so retention drops days.
- :mod:`.migrate`: ledgers of older layouts folded into one account row per device.
- :mod:`.files`: key and checkpoint files beside the database, readable by their owner only.
"""
