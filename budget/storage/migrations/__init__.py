"""The schema's Alembic migrations (``env.py``, ``versions/``), run by budget.storage.schema."""
