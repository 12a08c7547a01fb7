"""The privacy mathematics: pure functions of epsilons, deltas and schedules, no I/O.

- :mod:`.accountant`: composition of charges into one ``(epsilon, delta)`` (basic sum, PLD).
- :mod:`.amplification`: the central epsilon of a shuffled batch of local reports.
- :mod:`.sub_batches`: a batch as sub-batches of one report per device, their bounds composed.
- :mod:`.odometer`: privacy filters and the running odometer a device's spend is held to.
- :mod:`.allowance`: what a budget's caps allow one device over a span of days (the worst case).
- :mod:`.display`: figures rounded up for display, so no shown figure understates a loss.
"""
