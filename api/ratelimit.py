"""In-process rate limits: per device on the report path, per client on bad admin tokens.

A sliding one-minute window per key, kept in memory (each worker process limits on its own; a
fleet-wide limit belongs in front of the service). Keys are hashed, so raw device ids are not
held here either.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import deque

__all__ = ["RateLimiter"]


class RateLimiter:
    """At most ``per_minute`` events per key in any 60 s; answers the seconds to wait."""

    def __init__(self, per_minute: int, *, max_keys: int = 1_000_000) -> None:
        self.per_minute = per_minute
        self.max_keys = max_keys
        self._events: dict[bytes, deque[float]] = {}
        self._lock = threading.Lock()

    def hit(self, key: str, now: float | None = None) -> int:
        """Record an event for ``key``; 0 if allowed, else whole seconds until it would be."""
        t = time.monotonic() if now is None else now
        k = hashlib.blake2b(key.encode(), digest_size=16).digest()
        with self._lock:
            window = self._events.get(k)
            if window is None:
                if len(self._events) >= self.max_keys:
                    self._evict(t)
                window = self._events.setdefault(k, deque())
            while window and window[0] <= t - 60.0:
                window.popleft()
            if len(window) >= self.per_minute:
                return max(1, math.ceil(window[0] + 60.0 - t))
            window.append(t)
            return 0

    def _evict(self, t: float) -> None:
        stale = [k for k, w in self._events.items() if not w or w[-1] <= t - 60.0]
        for k in stale:
            del self._events[k]
        if len(self._events) >= self.max_keys:  # still full: forget the oldest half
            for k in list(self._events)[: self.max_keys // 2]:
                del self._events[k]
