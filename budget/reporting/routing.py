"""The routing rule of a ledger sharded by device key, and the check that a shard keeps to it.

A sharded ledger (docs/scaling.md) puts each device in the shard ``int(device_key[:8], 16) %
shards``. The report and the what-if over shards add per-device figures, so a device held by
two shards, or by the wrong one, would count twice or under another shard's batches. A shard
given twice under two URLs, shards given in another order, or a shard holding another's
devices all show as devices that route elsewhere: :class:`RouteCheck` counts them as the
shard's accounts are read (one comparison a device), and :class:`ShardMisrouted` refuses the
result. Device keys are 128-bit HMAC pseudonyms in hex
(:func:`dp_governor.budget.gate.prepared.device_key`): a key that is not hex (no release writes
one) routes nowhere and is counted apart, and no message names a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import Engine, func, select

from dp_governor.budget.storage.tables import Account

__all__ = ["ROUTING", "RouteCheck", "ShardMisrouted", "key_ends", "shard_of"]

ROUTING: Final = "int(device_key[:8], 16) % shards"


def shard_of(device_key: str, shards: int) -> int:
    """The shard a device key is routed to (docs/scaling.md).

    >>> shard_of("0000000a" + "0" * 24, 4)
    2
    """
    return int(device_key[:8], 16) % shards


def key_ends(engine: Engine) -> list[str]:
    """The smallest and largest device key the database holds (none if it holds no account).

    What a shard's check reads besides the devices that changed, when a stored summary is
    brought forward. One aggregate a statement: SQLite reads a lone ``min`` or ``max`` from the
    key's index.
    """
    c = Account.__table__.c  # type: ignore[attr-defined]
    with engine.connect() as conn:
        ends = [conn.execute(select(f(c.device_key))).scalar() for f in (func.min, func.max)]
    return sorted({str(key) for key in ends if key is not None})


@dataclass(slots=True)
class RouteCheck:
    """What a read of shard ``position`` of ``shards`` found routed elsewhere, counted.

    ``misrouted`` devices route to another shard (``example``: the first one's shard);
    ``unroutable`` keys are not hex, so the rule routes them nowhere. Keys are never kept.
    ``partial``: only some of the shard's devices were read (those a stored summary brought
    forward, and the key ends), so the counts are lower bounds.
    """

    position: int
    shards: int
    misrouted: int = 0
    example: int | None = None
    unroutable: int = 0
    partial: bool = False

    def see(self, device_key: str) -> None:
        """Count ``device_key`` if it does not route to this shard.

        >>> check = RouteCheck(1, 2)
        >>> for key in ("00000001", "00000002", "00000004", "device-7"):
        ...     check.see(key)
        >>> (check.misrouted, check.example, check.unroutable)
        (2, 0, 1)
        """
        try:
            shard = shard_of(device_key, self.shards)
        except ValueError:
            self.unroutable += 1
            return
        if shard != self.position:
            if self.example is None:
                self.example = shard
            self.misrouted += 1

    def merge(self, other: RouteCheck) -> None:
        """Add ``other``'s counts, a read of another key range of the same shard."""
        if (other.position, other.shards) != (self.position, self.shards):
            raise ValueError("route checks of different shards do not merge")
        self.misrouted += other.misrouted
        self.unroutable += other.unroutable
        self.partial = self.partial or other.partial
        if self.example is None:
            self.example = other.example

    def refuse(self) -> None:
        """Raise :class:`ShardMisrouted` if any device read does not route to this shard."""
        if self.misrouted or self.unroutable:
            raise ShardMisrouted(self)


class ShardMisrouted(ValueError):
    """Shard ``check.position`` holds devices routed elsewhere: no figure would count them once."""

    def __init__(self, check: RouteCheck) -> None:
        self.check = check
        super().__init__(f"shard {check.position} {self.problem()}")

    @property
    def shard(self) -> int:
        """The position of the shard that holds them."""
        return self.check.position

    def problem(self, shard_name: str = "shard") -> str:
        """What the shard holds that it should not, naming another shard as ``shard_name N``.

        >>> print(ShardMisrouted(RouteCheck(0, 2, misrouted=3, example=1)).problem("--shard"))
        holds 3 device(s) that int(device_key[:8], 16) % 2 routes to other shards (one to --shard 1)
        >>> print(ShardMisrouted(RouteCheck(0, 1, unroutable=2, partial=True)).problem())
        holds at least 2 device key(s) that are not hex (routed nowhere)
        """
        c = self.check
        least = "at least " if c.partial else ""
        said = []
        if c.misrouted:
            said.append(
                f"holds {least}{c.misrouted} device(s) that int(device_key[:8], 16) % {c.shards}"
                f" routes to other shards (one to {shard_name} {c.example}"
                + ("; --full counts every device)" if c.partial else ")")
            )
        if c.unroutable:
            said.append(
                f"holds {least}{c.unroutable} device key(s) that are not hex (routed nowhere)"
            )
        return " and ".join(said)
