"""In-process rate limits: per device on the report path, per client on bad admin tokens.

Each limiter is a generic cell rate algorithm (GCRA): one float per key, the time at which the
key's allowance is next full, in a table of at most ``max_keys`` keys that forgets the least
recently seen key first. Memory is therefore bounded whatever the keys are (about 200 bytes a
key), and a flood of new keys only makes the limiter forget, never grow. Each worker process
limits on its own; a fleet-wide limit belongs in front of the service. Keys are hashed, so raw
device ids are not held here either.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict

__all__ = ["RateLimiter"]


class RateLimiter:
    """Bursts of up to ``per_minute`` events per key, refilled at ``per_minute`` a minute.

    ``hit`` answers 0 (allowed, and counted) or the whole seconds until the key may try again.
    Over any 60 s a key gets at most ``2 * per_minute`` events (a full burst, then the refill);
    over longer spans the rate tends to ``per_minute`` a minute.
    """

    def __init__(self, per_minute: int, *, max_keys: int = 100_000) -> None:
        if per_minute < 1 or max_keys < 1:
            raise ValueError(
                f"`per_minute` and `max_keys` must be >= 1, got {per_minute} and {max_keys}"
            )
        self.per_minute = per_minute
        self.max_keys = max_keys
        self._interval = 60.0 / per_minute
        self._burst = 60.0 - self._interval  # how far ahead of now a key's clock may run
        self._full_at: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Keys currently remembered (at most ``max_keys``)."""
        return len(self._full_at)

    def hit(self, key: str, now: float | None = None) -> int:
        """Record an event for ``key``; 0 if allowed, else whole seconds until it would be."""
        return self._check(key, now, record=True)

    def blocked(self, key: str, now: float | None = None) -> int:
        """As :meth:`hit` would answer for one more event, without recording it."""
        return self._check(key, now, record=False)

    def _check(self, key: str, now: float | None, *, record: bool) -> int:
        t = time.monotonic() if now is None else now
        k = hashlib.blake2b(key.encode(), digest_size=16).digest()
        with self._lock:
            full_at = max(self._full_at.get(k, t), t)
            if full_at - t > self._burst:
                return max(1, math.ceil(full_at - self._burst - t))
            if record:
                self._full_at[k] = full_at + self._interval
                self._full_at.move_to_end(k)
                if len(self._full_at) > self.max_keys:
                    self._full_at.popitem(last=False)
            return 0
