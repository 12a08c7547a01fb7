"""Whether a device-key secret may be adopted by a ledger that records no fingerprint of its own.

A device is stored only as ``HMAC-SHA256(secret, device id)``
(:func:`dp_governor.budget.gate.prepared.device_key`), so under another installation's secret every
device looks new and every budget starts again. A ledger made before fingerprints cannot tell the
secret from its data alone; the operator names devices that have reported (their pseudonyms under
the right secret are in ``accounts``), or says explicitly that the secret is trusted unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, inspect, text

from dp_governor.budget.gate.prepared import device_key

__all__ = ["DeviceAdoption", "holds_devices"]

SETTINGS = "DPGOV_DEVICE_KEY_SECRET or DPGOV_SECRET_FILE"


def holds_devices(engine: Engine) -> bool:
    """Whether any device was ever charged here (a secret then decides whose budget is whose)."""
    if not inspect(engine).has_table("accounts"):
        return False
    with engine.connect() as conn:
        return conn.execute(text("SELECT 1 FROM accounts LIMIT 1")).first() is not None


@dataclass(frozen=True, slots=True)
class DeviceAdoption:
    """What an operator gave to adopt a device-key secret: devices known to have reported, or trust.

    ``known_devices`` are device ids (as devices send them in ``X-Device-Id``); each must have a
    pseudonym in ``accounts`` under the secret. ``trusted`` adopts it unchecked.
    """

    known_devices: tuple[str, ...] = ()
    trusted: bool = False

    def problem(self, engine: Engine, secret: bytes, source: str) -> str | None:
        """Why ``secret`` (from ``source``) may not be adopted by this ledger; ``None``: it may."""
        if self.trusted:
            return None
        if not self.known_devices:
            return (
                f"this database holds device budgets but records no fingerprint of its"
                f" device-key secret, and nothing in it can tell whether the one from {source}"
                f" is the secret its devices were charged under (another installation's would"
                f" make every device new and reset every budget): set {SETTINGS} to the"
                f" server's and run `dpgov db upgrade --known-device ID` once with the id of a"
                f" device that has reported, which checks the secret and records its fingerprint"
            )
        with engine.connect() as conn:
            for device_id in self.known_devices:
                found = conn.execute(
                    text("SELECT 1 FROM accounts WHERE device_key = :k"),
                    {"k": device_key(secret, device_id)},
                ).first()
                if found is None:
                    return (
                        f"the device-key secret from {source} is not the one this database's"
                        f" devices were charged under: device {device_id!r} has no budget under"
                        f" it (or never reported): set {SETTINGS} to the server's"
                    )
        return None
