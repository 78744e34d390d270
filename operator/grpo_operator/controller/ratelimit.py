"""A per-key rate limiter: the same action (a delete, a patch, an Event) at most once per window per key.

The controller sends a delete and then sees the pod go only when the watch says so; decide() asks for the same
delete on every pass until then. Resending within the window would only load the API server (its watch event is
on the way); the same holds for Kueue's end-of-group patch and for Events that repeat a condition.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Optional

PRUNE_ABOVE = 10000  # keys held before the ones whose window passed are dropped (they would allow anyway)


class RateLimiter:
    def __init__(self, window: float):
        self.window = window  # seconds between two allowed actions of one key
        self._last: dict[Hashable, float] = {}

    def allow(self, key: Hashable, now: Optional[float] = None) -> bool:
        """True (and recorded as done now) unless the same key was allowed less than `window` seconds ago."""
        now = time.monotonic() if now is None else now
        if now - self._last.get(key, -1e9) < self.window:
            return False
        self._last[key] = now
        if len(self._last) > PRUNE_ABOVE:
            cutoff = now - self.window
            self._last = {k: t for k, t in self._last.items() if t > cutoff}
        return True

    def __len__(self) -> int:
        return len(self._last)
