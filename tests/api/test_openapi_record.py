"""The examples recorder still runs against the service as it is (it rots silently otherwise)."""

from __future__ import annotations

import json

from dp_governor.api.openapi_record import EXAMPLES, record


def test_the_recorder_answers_every_example_the_file_holds() -> None:
    """Seeding and every recorded read succeed; the file holds exactly what it records."""
    recorded = record()
    stored = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    assert set(recorded["responses"]) == set(stored["responses"])
    assert recorded["errors"].keys() == stored["errors"].keys()
