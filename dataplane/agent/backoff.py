"""Capped exponential backoff with "equal jitter", for every call the agent makes to the control plane.

After the n-th failure in a row the wait is ``min(cap, base * 2**(n-1))`` times a random factor in
``[1 - jitter, 1]``. With the default ``jitter`` of 0.5 each wait is at least as long as the one
before until the cap (so an outage costs the control plane less and less), and a fleet of agents
that lost the control plane together comes back spread over half the cap instead of all at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    def __init__(self, base_s: float = 1.0, cap_s: float = 30.0, jitter: float = 0.5,
                 rand: Callable[[], float] = random.random) -> None:
        self.base_s = max(0.0, base_s)
        self.cap_s = max(self.base_s, cap_s)
        self.jitter = min(1.0, max(0.0, jitter))
        self.rand = rand
        self.failures = 0

    def ceiling(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row, before jitter."""
        if failures <= 0:
            return 0.0
        return min(self.cap_s, self.base_s * 2.0 ** min(failures - 1, 60))

    def next_delay(self) -> float:
        """Count one more failure; the wait before the next attempt."""
        self.failures += 1
        return self.ceiling(self.failures) * (1.0 - self.jitter * self.rand())

    def reset(self) -> None:
        self.failures = 0
