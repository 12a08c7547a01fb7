"""The gate: the one transaction that checks and charges reports, atomically.

- :mod:`.charge`: the transaction itself (:func:`~.charge.charge_batch`; one report is a batch
  of one): idempotency claims, device rows locked and read, the rule's decisions, the writes.
- :mod:`.prepared`: what the transaction reads through, prepared once per ledger
  (:class:`~.prepared.Gate`): device pseudonyms, keyed idempotency data, the cached policy book,
  the hot path's statements and the write lock.
"""
