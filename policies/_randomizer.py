"""The randomizer a policy prescribes, as the API publishes it (see :mod:`mechanisms.published`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from dp_governor.mechanisms import CMS, HCMS, SFP, describe

__all__ = ["PublishedHashFamily", "Randomizer"]


class PublishedHashFamily(BaseModel):
    """The hash family devices must hash with: algorithm and key."""

    algorithm: str = Field(description="Always `blake2b-poly31-v1` (docs/mechanisms.md).")
    seed: str = Field(
        # What the server publishes; parsing stays lenient, so a client still reads an older
        # server's seed that lost its leading zeros (the same key, read as a number).
        json_schema_extra={"pattern": "^[0-9a-f]{64}$"},
        description="The family's 256-bit key in force: exactly 64 lowercase hex digits (the"
        " key's 32 bytes, leading zeros kept; docs/device.md).",
    )


class Randomizer(BaseModel):
    """Everything a device needs to build the server's randomizer (`from_published`)."""

    mechanism: Literal["cms", "hcms", "sfp"] = Field(description="Which randomizer to build.")
    epsilon: float | None = Field(default=None, description="CMS and HCMS: epsilon per report.")
    k: int = Field(description="Hash functions (sketch rows); SFP: of the word sketch.")
    m: int = Field(description="Sketch width (buckets per row); SFP: of the word sketch.")
    k_fragment: int | None = Field(default=None, description="SFP only.")
    m_fragment: int | None = Field(default=None, description="SFP only.")
    epsilon_word: float | None = Field(default=None, description="SFP only.")
    epsilon_fragment: float | None = Field(default=None, description="SFP only.")
    alphabet: str | None = Field(default=None, description="SFP only: the fragments' alphabet.")
    hash_family: PublishedHashFamily = Field(
        description="The hash family the server decodes with: algorithm and seed."
    )
    family_id: str = Field(
        description="Identifies mechanism, parameters and hash family; send it as the report"
        " body's `family` field."
    )
    report_schema: dict[str, Any] = Field(description="JSON schema of one report body.")

    @classmethod
    def of(cls, mech: CMS | HCMS | SFP) -> Randomizer:
        """The published description of ``mech``."""
        return cls.model_validate(describe(mech))
