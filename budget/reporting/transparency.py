"""A device's own record in the transparency log, beside the totals the gate decided on.

:func:`device_record` gives a device what it needs to check the server's record of its spend
on one day with nothing but the log's public key (``dp_governor.api.client.verify_record``):
its label key, its leaves of that day with an inclusion proof against one signed checkpoint,
and what the gate's account row holds for the day (reports and micro-epsilon per use case).
The leaves are found by their labels: the device's charge ``n`` of a use case carries
:func:`~dp_governor.budget.audit.leaves.charge_label` of ``n``, for ``n`` up to the gate's count
of the use case that day, and charges recorded before per-charge labels carry the day's
:func:`~dp_governor.budget.audit.leaves.day_label`. A device that kept its own count of what it
sent compares the three: a charge it did not make, one dropped, or totals the gate used that
differ from the leaves are all visible.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from dp_governor.budget.audit.leaves import charge_label, day_label
from dp_governor.budget.audit.tlog import Receipt
from dp_governor.budget.ledger import Ledger

__all__ = ["DeviceRecord", "device_record"]


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """A device's leaves of one day, their proofs, and the gate's totals for that day.

    ``covered`` says whether the checkpoint covered every audit entry when the gate's totals
    were read: when it did not, charges made since are in the totals but not yet in the leaves.
    ``gate`` maps each use case to ``(reports, micro-epsilon)`` as the account row holds them
    (the figures every later decision of the gate starts from); ``checkpoint`` is ``None``
    before the log's first checkpoint (then ``leaves`` is empty too).
    """

    day: int
    label_key: bytes
    label: str
    checkpoint: str | None
    size: int
    leaves: list[Receipt]
    gate: dict[str, tuple[int, int]]
    covered: bool


def device_record(ledger: Ledger, device_id: str, day: int) -> DeviceRecord:
    """The record of ``device_id`` on UTC day ``day`` (see the module's docstring)."""
    dk = ledger.device_key(device_id)
    key = ledger.tlog.label_key(dk)
    label = day_label(key, day)
    with ledger.connect() as conn:
        state = ledger.state_of(conn, dk)
    head, _ = ledger.audit.head()  # read after the state: every charge it holds is <= head
    gate: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    if state is not None:
        for entry in state.days:
            if entry[0] != day:
                continue
            for i, n in enumerate(entry[1:]):
                if n:
                    use_case, eps = str(state.slots[i][0]), int(state.slots[i][1])
                    gate[use_case][0] += int(n)
                    gate[use_case][1] += int(n) * eps
    labels = [label]
    labels += [
        charge_label(key, day, uc, n) for uc, (r, _) in gate.items() for n in range(1, r + 1)
    ]
    point, leaves = ledger.tlog.receipts(labels)
    return DeviceRecord(
        day=day,
        label_key=key,
        label=label,
        checkpoint=None if point is None else point.note,
        size=0 if point is None else point.size,
        leaves=leaves,
        gate={uc: (r, e) for uc, (r, e) in sorted(gate.items())},
        covered=point is not None and head <= point.size,
    )
