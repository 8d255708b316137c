"""Fair admission queue: Virtual Token Counter (VTC, Sheng et al., OSDI '24) with weights and two
priority classes. Pure data structure; ``admission.py`` wraps it with futures and timeouts.

* Every tenant has a counter of service received, in weighted tokens: prompt tokens × w_p when a
  request is admitted, generated tokens × w_q when it finishes, both divided by the tenant's weight.
* When a tenant's queue turns non-empty, its counter is lifted to the smallest counter among
  backlogged tenants, so idling does not bank credit to flood with later.
* Interactive requests are always served before batch ones; within a class the backlogged tenant
  with the smallest counter goes next.
* Within a tenant, the oldest request that can still meet its TTFT SLO goes first, and those
  already past that point after them, oldest first (``Waiter.deadline``). In arrival order, a
  backlog makes every request behind it miss: each waits as long as the one before it did. Served
  deadline-first, the same replicas serve the same number of requests, and those that can still
  make it do; a burst past capacity then keeps about capacity / demand of its requests inside the
  SLO instead of almost none (bench/fleet/README.md). The late ones are not dropped: they go as
  soon as nobody who can still make it waits, or time out as they would have in arrival order.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dataplane.edge.catalog import BATCH, INTERACTIVE

PRIORITY_RANK = {INTERACTIVE: 0, BATCH: 1}
_seq = itertools.count()


@dataclass(eq=False, slots=True)
class Waiter:
    tenant_id: str
    weight: float
    priority: str
    prompt_tokens: int
    enqueued_at: float
    # Returns something truthy when the request could be dispatched (and dispatches it).
    try_dispatch: Callable[[float], Any] | None = None
    payload: Any = None
    seq: int = field(default_factory=lambda: next(_seq))
    # The last moment a dispatch can still meet the request's TTFT SLO (inf: it has none).
    deadline: float = math.inf


class _Lane:
    """One (class, tenant) queue: requests that can still meet their deadline, in arrival order,
    and those past it, in arrival order. A waiter moves from the first to the second once (when
    ``head`` finds it late), so keeping the order costs O(1) per request."""

    __slots__ = ("fresh", "late")

    def __init__(self) -> None:
        self.fresh: deque[Waiter] = deque()
        self.late: deque[Waiter] = deque()

    def __len__(self) -> int:
        return len(self.fresh) + len(self.late)

    def head(self, now: float) -> Waiter:
        fresh = self.fresh
        while fresh and fresh[0].deadline < now:
            # Deadlines need not follow arrival order (an SLO or a prompt length can differ), so
            # the late deque is kept in arrival order by insertion, not by appending.
            late = fresh.popleft()
            if self.late and self.late[-1].seq > late.seq:
                i = next(i for i, w in enumerate(self.late) if w.seq > late.seq)
                self.late.insert(i, late)
            else:
                self.late.append(late)
        return fresh[0] if fresh else self.late[0]

    def remove(self, waiter: Waiter) -> bool:
        for q in (self.fresh, self.late):
            try:
                q.remove(waiter)
                return True
            except ValueError:
                pass
        return False


class FairQueue:
    def __init__(self, max_size: int = 2048, w_prompt: float = 1.0, w_output: float = 2.0) -> None:
        self.max_size = max_size
        self.w_prompt = w_prompt
        self.w_output = w_output
        self.counters: dict[str, float] = {}
        self._queues: dict[tuple[int, str], _Lane] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def backlogged(self) -> set[str]:
        return {tenant for (_, tenant), q in self._queues.items() if q}

    def push(self, waiter: Waiter) -> bool:
        if self._size >= self.max_size:
            return False
        tenant = waiter.tenant_id
        backlogged = self.backlogged()
        if tenant not in backlogged and backlogged:
            floor = min(self.counters.get(t, 0.0) for t in backlogged)
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)
        self.counters.setdefault(tenant, 0.0)
        key = (PRIORITY_RANK.get(waiter.priority, 0), tenant)
        self._queues.setdefault(key, _Lane()).fresh.append(waiter)
        self._size += 1
        return True

    def remove(self, waiter: Waiter) -> bool:
        key = (PRIORITY_RANK.get(waiter.priority, 0), waiter.tenant_id)
        q = self._queues.get(key)
        if not q or not q.remove(waiter):
            return False
        self._size -= 1
        if not q:
            del self._queues[key]
        return True

    def heads(self, now: float = -math.inf) -> Iterator[Waiter]:
        """Head waiter of each (class, tenant) queue as of ``now``, in serving order."""
        heads = {key: q.head(now) for key, q in self._queues.items()}
        for key in sorted(heads, key=lambda k: (k[0], self.counters.get(k[1], 0.0), heads[k].seq)):
            if key in self._queues:  # a consumer may have emptied it meanwhile
                yield heads[key]

    def pop_next(self, now: float = -math.inf) -> Waiter | None:
        for head in self.heads(now):
            self.remove(head)
            return head
        return None

    def charge_admit(self, tenant_id: str, weight: float, prompt_tokens: int) -> None:
        self.counters[tenant_id] = self.counters.get(tenant_id, 0.0) + self.w_prompt * prompt_tokens / weight

    def charge_output(self, tenant_id: str, weight: float, output_tokens: int) -> None:
        self.counters[tenant_id] = self.counters.get(tenant_id, 0.0) + self.w_output * output_tokens / weight


@dataclass(slots=True)
class RollingPeak:
    """The largest value observed over the last one to two windows (the window in progress and the
    one before it), so a window boundary never forgets a peak that happened just before it."""

    window_s: float
    started: float
    current: float = 0.0
    previous: float | None = None  # None until one whole window has been observed

    def observe(self, value: float, now: float) -> None:
        if now - self.started >= self.window_s:
            # The window in progress becomes the previous one, unless it ended more than a window
            # ago (no events since): then everything it saw is older than two windows.
            self.previous = self.current if now - self.started < 2 * self.window_s else value
            self.current, self.started = value, now
        else:
            self.current = max(self.current, value)

    def peak(self) -> float:
        return self.current if self.previous is None else max(self.current, self.previous)

    def recent(self, now: float) -> float:
        """The peak of what was observed within the last one to two windows, as of ``now``: a peak
        with no observation since fades instead of standing forever."""
        age = now - self.started
        if age >= 2 * self.window_s:
            return 0.0
        return self.current if age >= self.window_s else self.peak()

    def observed_for(self, now: float) -> float:
        return float("inf") if self.previous is not None else now - self.started


class ShareGuard:
    """Keeps free slots for tenants under their fair share, so a flood cannot fill every slot.

    VTC decides who goes next from the queue, but it cannot preempt: once a flooding tenant holds
    every slot, a quiet tenant still waits for one to free up. So a *heavy* tenant at or above its
    fair share of a variant's slots (capacity / tenants active in the last ``active_window_s``) may
    only take a slot while enough stay free for the others' likely demand. Tenants under their fair
    share are never held back, and a lone tenant may use the whole fleet. Heavy means arriving faster
    than ``heavy_factor`` times the mean of the other active tenants, or holding that many fair
    shares, so evenly loaded tenants never throttle each other.

    The others' likely demand is the smaller of two estimates, less what they already hold:
    * each other tenant's recent peak concurrency plus ``burst_slots``, capped at the fair share;
    * the recent peak of the others' *combined* concurrency plus ``burst_slots`` times its square
      root (until the heavy tenant has been watched for ``rate_window_s``, the recent peak of
      everyone's combined concurrency stands in for it: it bounds it from above).
    Many light tenants do not peak together: with dozens of them the sum of their individual peaks
    reserves several times what they ever use at once, and the heavy tenant (say the head of a Zipf
    mix, a quarter of the traffic) queues at the edge for slots that then stand idle.

    Both estimates size the reserve by what the others *hold*; what the reserve is for is only the
    others' *arrivals* between two slot releases, since a quiet request that finds no free slot
    takes the next one that frees (VTC puts it ahead of the heavy tenant). So the reserve is also
    capped by ``queueing_reserve``: the fewest slots such that at most ``wait_share`` of the others'
    arrivals find none free, from the others' arrival rate against the rate slots free up. On a
    big or busy fleet slots free up many times between two quiet arrivals and a few reserved
    slots do what dozens did (bench/edge/README.md, 2026-12-06 third session); on a small fleet
    of long requests the cap is loose and the estimates above decide.
    """

    def __init__(self, burst_slots: float = 2.0, active_window_s: float = 10.0, heavy_factor: float = 2.0,
                 rate_window_s: float = 2.0, wait_share: float = 0.001) -> None:
        self.burst_slots = burst_slots
        self.wait_share = wait_share
        self.active_window_s = active_window_s
        self.heavy_factor = heavy_factor
        self.rate_window_s = rate_window_s  # short, so a flood is recognised within a fraction of a second
        self.inflight: dict[str, int] = {}
        self.total_inflight = 0
        self._total_peak = RollingPeak(active_window_s, 0.0)  # everyone's combined concurrency
        self.last_seen: dict[str, float] = {}
        self._peak: dict[str, RollingPeak] = {}  # tenant -> its own concurrency
        self._others_peak: dict[str, RollingPeak] = {}  # heavy tenant -> everyone else's combined concurrency
        self._rate: dict[str, tuple[float, float]] = {}  # tenant -> (EWMA arrivals/s, as of)
        self._release_rate: tuple[float, float] = (0.0, 0.0)  # (EWMA slot releases/s, as of)

    def _decayed(self, value: float, at: float, now: float) -> float:
        return value * math.exp(-(now - at) / self.rate_window_s)

    def rate(self, tenant_id: str, now: float) -> float:
        value, at = self._rate.get(tenant_id, (0.0, now))
        return self._decayed(value, at, now)

    def release_rate(self, now: float) -> float:
        return self._decayed(*self._release_rate, now)

    def queueing_reserve(self, others_rate: float, now: float) -> float:
        """The fewest free slots that leave at most ``wait_share`` of the others' arrivals finding
        none. While the heavy tenant takes every slot above the reserve, the free slots go down by
        one at each arrival of the others (rate lambda) and up by one at each release (rate mu), up
        to the reserve r: a birth-death chain in which an arrival finds none free with probability
        (rho - 1) / (rho^(r+1) - 1), rho = mu / lambda. Infinite (no cap) until releases are seen
        to outpace the others' arrivals, and with ``wait_share`` 0 (no arrival may wait)."""
        if self.wait_share <= 0.0:
            return math.inf
        if others_rate <= 0.0:
            return 0.0
        rho = self.release_rate(now) / others_rate
        if rho <= 1.0 + 1e-9:
            return math.inf
        return max(0.0, math.ceil(math.log1p((rho - 1.0) / self.wait_share) / math.log(rho) - 1e-9) - 1.0)

    def heavy(self, tenant_id: str, others: list[str], others_rate: float, fair: float, now: float) -> bool:
        """Arriving much faster than the others (who arrive at ``others_rate`` together), or holding
        far more than a fair share of slots."""
        if not others:
            return False
        if self.inflight.get(tenant_id, 0) >= self.heavy_factor * fair:
            return True
        return self.rate(tenant_id, now) > self.heavy_factor * others_rate / len(others)

    def seen(self, tenant_id: str, now: float) -> None:
        """A request of this tenant arrived (its demand, whether or not it gets a slot)."""
        self.last_seen[tenant_id] = now
        self._rate[tenant_id] = (self.rate(tenant_id, now) + 1.0 / self.rate_window_s, now)

    def active(self, now: float) -> list[str]:
        horizon = now - self.active_window_s
        for t in [t for t, at in self.last_seen.items() if at < horizon and not self.inflight.get(t)]:
            del self.last_seen[t]
            self._peak.pop(t, None)
            self._others_peak.pop(t, None)
            self._rate.pop(t, None)
        return list(self.last_seen)

    def demand(self, tenant_id: str, now: float) -> float:
        peak = self._peak.get(tenant_id)
        if peak is None:
            return self.burst_slots
        peak.observe(self.inflight.get(tenant_id, 0), now)
        return peak.peak() + self.burst_slots

    def others_demand(self, tenant_id: str, others_now: int, now: float) -> float:
        """Combined recent peak of everyone but this (heavy) tenant, who hold ``others_now`` slots
        now, plus the burst allowance."""
        watch = self._others_peak.get(tenant_id)
        if watch is None:
            watch = self._others_peak[tenant_id] = RollingPeak(self.active_window_s, now)
        watch.observe(others_now, now)
        if watch.observed_for(now) >= self.rate_window_s:
            peak = watch.peak()
        else:
            peak = max(self._total_peak.peak(), others_now)
        # Many independent light tenants' combined concurrency swings around its mean by about the
        # square root of it (Poisson), so the margin over the recent peak grows like that too.
        return peak + self.burst_slots * math.sqrt(max(1.0, peak))

    def allows(self, tenant_id: str, free_slots: int, total_slots: int, now: float) -> bool:
        if self.burst_slots < 0 or total_slots <= 0:
            return True  # guard disabled
        active = self.active(now)
        fair = total_slots / max(1, len(active))
        if self.inflight.get(tenant_id, 0) < fair:
            return True
        others = [u for u in active if u != tenant_id]
        others_rate = sum(self.rate(u, now) for u in others)  # once: both the test and the cap read it
        if not self.heavy(tenant_id, others, others_rate, fair, now):
            return True
        reserve = sum(max(0.0, min(fair, self.demand(u, now)) - self.inflight.get(u, 0)) for u in others)
        others_now = self.total_inflight - self.inflight.get(tenant_id, 0)
        reserve = min(reserve, max(0.0, self.others_demand(tenant_id, others_now, now) - others_now),
                      self.queueing_reserve(others_rate, now))
        return free_slots > reserve

    def acquired(self, tenant_id: str, now: float) -> None:
        n = self.inflight[tenant_id] = self.inflight.get(tenant_id, 0) + 1
        self.total_inflight += 1
        self._total_peak.observe(self.total_inflight, now)
        peak = self._peak.get(tenant_id)
        if peak is None:
            peak = self._peak[tenant_id] = RollingPeak(self.active_window_s, now)
        peak.observe(n, now)
        for heavy, watch in self._others_peak.items():
            if heavy != tenant_id:
                watch.observe(self.total_inflight - self.inflight.get(heavy, 0), now)

    def released(self, tenant_id: str, now: float) -> None:
        left = self.inflight.get(tenant_id, 0) - 1
        if left >= 0:
            self.total_inflight -= 1
            self._release_rate = (self.release_rate(now) + 1.0 / self.rate_window_s, now)
        if left > 0:
            self.inflight[tenant_id] = left
        else:
            self.inflight.pop(tenant_id, None)


class ShareGuards:
    """One ``ShareGuard`` per model variant, made on first use."""

    def __init__(self, burst_slots: float, active_window_s: float, wait_share: float) -> None:
        self.burst_slots, self.active_window_s, self.wait_share = burst_slots, active_window_s, wait_share
        self._guards: dict[str, ShareGuard] = {}

    def of(self, variant_id: str) -> ShareGuard:
        guard = self._guards.get(variant_id)
        if guard is None:
            guard = self._guards[variant_id] = ShareGuard(self.burst_slots, self.active_window_s,
                                                          wait_share=self.wait_share)
        return guard
