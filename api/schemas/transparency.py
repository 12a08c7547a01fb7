"""The wire models of the transparency log's routes: checkpoints, proofs, a device's record."""

from __future__ import annotations

from pydantic import BaseModel
from pydantic import Field as PydField

__all__ = ["ConsistencyProof", "DeviceRecord", "GateTotal", "LeafProof", "TlogCheckpoint"]


class TlogCheckpoint(BaseModel):
    """The newest signed checkpoint (C2SP tlog-checkpoint) and the key that signs it."""

    origin: str = PydField(description="The log's origin line and its key's name.")
    vkey: str = PydField(description="The log's Ed25519 verifier key (C2SP signed-note vkey).")
    size: int = PydField(description="Leaves in the tree (0 before the first checkpoint).")
    note: str | None = PydField(description="The signed checkpoint note; null before the first.")


class LeafProof(BaseModel):
    """One leaf with its inclusion proof (RFC 9162 audit path)."""

    index: int = PydField(description="The leaf's index (its audit entry's number minus one).")
    leaf: str = PydField(description="The leaf: canonical JSON, hashed as its UTF-8 bytes.")
    proof: list[str] = PydField(
        description="The audit path, leaf to root: each hash in standard padded base64."
    )


class GateTotal(BaseModel):
    """What the gate's account row holds for one use case on the day."""

    use_case: str = PydField(description="The use case.")
    reports: int = PydField(description="Reports charged that day.")
    epsilon_micro: int = PydField(description="Their epsilon, in micro-epsilon (exact).")


class DeviceRecord(BaseModel):
    """A device's leaves of one day with proofs, and the gate's totals for that day."""

    day: int = PydField(description="The UTC day number (days since 1970-01-01).")
    label_key: str = PydField(description="The device's label key, hex: keep it secret.")
    label: str = PydField(
        description="The day's label, HMAC-SHA256(label key, 'day:<day>')[:16]: the label of"
        " the device's charges recorded before per-charge labels (version 1 leaves)."
    )
    checkpoint: str | None = PydField(description="The signed checkpoint every proof is against.")
    size: int = PydField(description="The checkpoint's tree size.")
    covered: bool = PydField(
        description="Whether the checkpoint covered every charge when the totals were read."
    )
    leaves: list[LeafProof] = PydField(
        description="The device's leaves of the day, in log order, with proofs."
    )
    gate: list[GateTotal] = PydField(description="The gate's totals that day, per use case.")


class ConsistencyProof(BaseModel):
    """A consistency proof between two tree sizes (RFC 9162 section 2.1.4)."""

    old: int = PydField(description="The smaller tree size.")
    new: int = PydField(description="The larger tree size.")
    proof: list[str] = PydField(description="The proof's hashes, standard padded base64.")
