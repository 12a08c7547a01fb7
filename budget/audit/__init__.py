"""The audit log and its replay.

- :mod:`.log`: the hash-chained, keyed log of every charge and policy change, and its checkpoints.
- :mod:`.row_tags`: keyed tags over the rows the log does not chain (inbox rows, stored reports).
- :mod:`.verify`: replays the log against the tables it decides, naming any table that differs.
"""
