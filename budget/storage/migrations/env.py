"""Alembic's environment: migrations run on the connection :mod:`budget.storage.schema` passes.

No ``alembic.ini`` and no URL: the caller opens the connection (with its lock and transaction)
and puts it in ``config.attributes["connection"]``; ``target_metadata`` is there only when the
models are compared with the migrated schema (``tests/budget/storage/test_schema_migrations.py``).
"""

from __future__ import annotations

from alembic import context

config = context.config
context.configure(
    connection=config.attributes["connection"],
    target_metadata=config.attributes.get("target_metadata"),
    transactional_ddl=True,  # SQLite and PostgreSQL both roll DDL back with the transaction
)
with context.begin_transaction():
    context.run_migrations()
