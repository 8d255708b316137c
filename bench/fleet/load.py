"""Per-pool load for the day: request-rate curves and Poisson arrival counts per time step.

Main pools follow ``bench.autoscale.trace``'s diurnal curve (peak/trough 12 h apart) shifted to
their own peak hour, with its bursts (1.8-3x for 2-15 min, sharp onset). Long-tail pools get a
few *episodes*: minutes of traffic at a fraction of a request per second to a few, separated by
at least an hour of nothing. Everything is seeded per (seed, pool).
"""

from __future__ import annotations

import itertools
import random
import zlib
from dataclasses import dataclass

import numpy as np

from bench.autoscale.trace import Burst, TraceShape, diurnal_rps, make_bursts
from bench.fleet.models import Load, Variant

MIN_GAP_S = 3600.0


@dataclass(frozen=True)
class Episode:
    start: float
    duration: float
    rps: float


@dataclass
class PoolLoad:
    variant: Variant
    bursts: list[Burst]
    episodes: list[Episode]

    def rate(self, t: float) -> float:
        load = self.variant.load
        if load.sparse:
            return sum(e.rps for e in self.episodes if e.start <= t < e.start + e.duration)
        shape = TraceShape(peak_rps=load.peak_rps, trough_rps=load.trough_rps)
        factor = 1.0
        for b in self.bursts:
            if b.start <= t < b.start + b.duration:
                factor = max(factor, b.factor)
        return float(diurnal_rps(shape, t - (load.peak_hour - 16.0) * 3600)) * factor


def _episodes(load: Load, horizon: float, rng: random.Random) -> list[Episode]:
    n = rng.randint(*load.episodes)
    for _ in range(200):
        eps = []
        for _ in range(n):
            duration = rng.uniform(*load.episode_min) * 60
            eps.append(Episode(rng.uniform(0, horizon - duration), duration, rng.uniform(*load.episode_rps)))
        eps.sort(key=lambda e: e.start)
        if all(b.start - (a.start + a.duration) >= MIN_GAP_S for a, b in itertools.pairwise(eps)):
            return eps
    return eps[:1]


def make_load(variant: Variant, seed: int, hours: float) -> PoolLoad:
    rng = random.Random(seed * 1_000_003 + zlib.crc32(variant.pool_id.encode()))
    horizon = hours * 3600
    load = variant.load
    if load.sparse:
        return PoolLoad(variant, [], _episodes(load, horizon, rng))
    shape = TraceShape(hours=hours, first_traffic_s=0.0, launch_ramp_s=0.0, bursts=load.bursts)
    return PoolLoad(variant, make_bursts(shape, np.random.default_rng([seed, zlib.crc32(variant.pool_id.encode())])), [])


AFTER_BURST_S = 600.0


def phase_of(pool: PoolLoad, after_s: float = AFTER_BURST_S):
    """The load's phase at time t, for the SLO split: ``burst`` (inside one), ``after-burst``
    (the ``after_s`` that follow one: a backlog still draining, capacity still arriving),
    ``steady`` (the diurnal curve alone); ``episode`` for a long-tail pool's traffic."""
    if pool.variant.load.sparse:
        return lambda t: "episode"
    spans = sorted((b.start, b.start + b.duration) for b in pool.bursts)

    def phase(t: float) -> str:
        after = False
        for start, end in spans:
            if start <= t < end:
                return "burst"
            after = after or end <= t < end + after_s
        return "after-burst" if after else "steady"
    return phase


def arrival_counts(pool: PoolLoad, seed: int, start: float, end: float, dt: float, scale: float = 1.0) -> np.ndarray:
    """Poisson arrivals per step [start + k dt, start + (k+1) dt), the rate times ``scale``."""
    steps = round((end - start) / dt)
    rates = np.array([scale * pool.rate(start + (k + 0.5) * dt) for k in range(steps)])
    gen = np.random.default_rng([seed, zlib.crc32(pool.variant.pool_id.encode())])
    return gen.poisson(rates * dt)
