"""The audit log and its replay.

- :mod:`.log`: the hash-chained, keyed log of every charge and policy change, and its checkpoints.
- :mod:`.checkpoints`: a signed head, and the copy of them kept in a file outside the database.
- :mod:`.row_tags`: keyed tags over the rows the log does not chain (inbox rows, stored reports).
- :mod:`.verify`: replays the log against the tables it decides, naming any table that differs.
- :mod:`.tlog`: the public transparency log, the audit log as a signed RFC 9162 Merkle tree.
- :mod:`.leaves`: what a leaf of it shows of each entry, and the labels that hide the device.
- :mod:`.tiles`: the tree served as C2SP ``tlog-tiles``.
"""
