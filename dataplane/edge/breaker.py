"""Circuit breaker per replica, and a retry budget so an outage cannot turn into a retry storm.

Pure state machines; callers pass the clock in."""

from __future__ import annotations

from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(slots=True)
class CircuitBreaker:
    failures_to_open: int = 5
    cooldown_s: float = 10.0
    state: str = CLOSED
    consecutive_failures: int = 0
    opened_at: float = 0.0
    probe_in_flight: bool = False

    def allows(self, now: float) -> bool:
        """May a request go to this replica now? In half-open, exactly one probe goes through."""
        if self.state == CLOSED:
            return True
        if self.state == OPEN and now - self.opened_at >= self.cooldown_s:
            self.state = HALF_OPEN
            self.probe_in_flight = False
        if self.state == HALF_OPEN and not self.probe_in_flight:
            return True
        return False

    def on_dispatch(self) -> None:
        if self.state == HALF_OPEN:
            self.probe_in_flight = True

    def on_success(self) -> None:
        self.state = CLOSED
        self.consecutive_failures = 0
        self.probe_in_flight = False

    def on_failure(self, now: float) -> None:
        self.consecutive_failures += 1
        self.probe_in_flight = False
        if self.state == HALF_OPEN or self.consecutive_failures >= self.failures_to_open:
            self.state = OPEN
            self.opened_at = now


class RetryBudget:
    """Token bucket: each request earns ``ratio`` of a retry, plus a floor per second; a retry
    spends one. In an outage the retry rate is capped at ratio × request rate + floor."""

    def __init__(self, ratio: float = 0.1, min_per_s: float = 5.0, burst: float = 20.0) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.burst = burst
        self.tokens = burst
        self.updated: float | None = None

    def _refill(self, now: float) -> None:
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.min_per_s)
        self.updated = now

    def on_request(self, now: float) -> None:
        self._refill(now)
        self.tokens = min(self.burst, self.tokens + self.ratio)

    def try_spend(self, now: float) -> bool:
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
