"""What the service's own database recorded of audit verifications (shared by the CLI tests)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text


def recorded_verdicts(path: Path) -> int:
    """The verdicts recorded in ``audit_verifications`` of ``path``'s ``service.sqlite``."""
    engine = create_engine(f"sqlite:///{path / 'service.sqlite'}")
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM audit_verifications")).scalar_one())
    finally:
        engine.dispose()
