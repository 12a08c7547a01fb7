"""The rule: whether one more report fits a device's state, decided in memory with no I/O.

Read in this order: :mod:`.state` (a device's counters), :mod:`.book` (the policy versions and
the terms a report is charged on), :mod:`.refusal` (why and until when), :mod:`.filter` (the
``(epsilon, delta)`` filters), :mod:`.device` (the device-wide budget), then :mod:`.decide` (the
rule itself: :func:`~.decide.decide_on`). Beside it: :mod:`.standing` (a device's standing
against the device-wide budget) and :mod:`.loosening` (which policy edits loosen a cap).
"""
