"""A synthetic, seeded day of traffic for one pool.

Shape (all times in seconds from midnight):

* a new model's first traffic: nothing before ``first_traffic_s``; then the diurnal level is
  reached over a 20-minute launch ramp with a launch surge that decays over an hour;
* a diurnal cycle: trough at 04:00, peak at 16:00, ``peak_rps / trough_rps`` apart;
* bursts: ``bursts`` episodes at random times, each multiplying the rate by 1.8–3× for
  2–15 minutes with a sharp onset (a batch job or a viral client);
* requests: Poisson arrivals; prompt and output lengths lognormal (chat-like, long tail).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceShape:
    hours: float = 24.0
    peak_rps: float = 12.0
    trough_rps: float = 2.0
    first_traffic_s: float = 2 * 3600.0
    launch_ramp_s: float = 1200.0
    launch_surge: float = 0.6  # extra share of the level right after launch, decaying
    bursts: int = 8
    prompt_median: float = 1200.0
    prompt_sigma: float = 0.9
    output_median: float = 220.0
    output_sigma: float = 0.7


@dataclass(frozen=True)
class Burst:
    start: float
    duration: float
    factor: float


@dataclass
class Trace:
    shape: TraceShape
    bursts: list[Burst]
    arrivals: list[float]
    prompts: list[int]
    outputs: list[int]

    def __len__(self) -> int:
        return len(self.arrivals)

    def mean_tokens(self) -> float:
        return (sum(self.prompts) + sum(self.outputs)) / max(1, len(self))


def diurnal_rps(shape: TraceShape, t: float) -> float:
    mid = (shape.peak_rps + shape.trough_rps) / 2
    amp = (shape.peak_rps - shape.trough_rps) / 2
    return mid - amp * math.cos(2 * math.pi * (t - 4 * 3600) / 86400)


def launch_factor(shape: TraceShape, t: float) -> float:
    if t < shape.first_traffic_s:
        return 0.0
    since = t - shape.first_traffic_s
    ramp = min(1.0, since / shape.launch_ramp_s)
    return ramp * (1 + shape.launch_surge * math.exp(-since / 3600))


def make_bursts(shape: TraceShape, rng: random.Random) -> list[Burst]:
    horizon = shape.hours * 3600
    bursts = []
    for _ in range(shape.bursts):
        start = rng.uniform(shape.first_traffic_s + shape.launch_ramp_s, horizon - 900)
        bursts.append(Burst(start, rng.uniform(120, 900), rng.uniform(1.8, 3.0)))
    return sorted(bursts, key=lambda b: b.start)


def rate(shape: TraceShape, bursts: list[Burst], t: float) -> float:
    factor = 1.0
    for b in bursts:
        if b.start <= t < b.start + b.duration:
            factor = max(factor, b.factor)
    return diurnal_rps(shape, t) * launch_factor(shape, t) * factor


def _lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, rng.lognormvariate(math.log(median), sigma))))


def sample_lengths(shape: TraceShape, rng: random.Random) -> tuple[int, int]:
    return (_lognormal_int(rng, shape.prompt_median, shape.prompt_sigma, 16, 16000),
            _lognormal_int(rng, shape.output_median, shape.output_sigma, 4, 2048))


def make_trace(shape: TraceShape, seed: int) -> Trace:
    """Non-homogeneous Poisson arrivals by thinning against the highest possible rate."""
    rng = random.Random(seed)
    bursts = make_bursts(shape, rng)
    ceiling = shape.peak_rps * (1 + shape.launch_surge) * max([b.factor for b in bursts] + [1.0])
    horizon = shape.hours * 3600
    arrivals, prompts, outputs = [], [], []
    t = shape.first_traffic_s
    while True:
        t += rng.expovariate(ceiling)
        if t >= horizon:
            break
        if rng.random() * ceiling <= rate(shape, bursts, t):
            arrivals.append(t)
            prompt, output = sample_lengths(shape, rng)
            prompts.append(prompt)
            outputs.append(output)
    return Trace(shape, bursts, arrivals, prompts, outputs)


def poisson_trace(shape: TraceShape, rps: float, seconds: float, seed: int) -> Trace:
    """Stationary arrivals with the same request mix, for calibrating a single replica."""
    rng = random.Random(seed)
    arrivals, prompts, outputs = [], [], []
    t = 0.0
    while True:
        t += rng.expovariate(rps)
        if t >= seconds:
            break
        arrivals.append(t)
        prompt, output = sample_lengths(shape, rng)
        prompts.append(prompt)
        outputs.append(output)
    return Trace(shape, [], arrivals, prompts, outputs)
