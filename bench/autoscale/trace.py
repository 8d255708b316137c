"""Synthetic, seeded traffic for one pool: the diurnal day and the request-mix day.

Shape (all times in seconds from midnight of the first day; a trace may span several days):

* a new model's first traffic: nothing before ``first_traffic_s``; then the level is reached
  over a ``launch_ramp_s`` ramp with a launch surge that decays over an hour (first day only);
* a diurnal cycle: trough at 04:00, peak at 16:00, ``peak_rps / trough_rps`` apart (equal:
  a flat request rate);
* bursts: ``bursts`` episodes at random times, each multiplying the rate by 1.8–3× for
  2–15 minutes with a sharp onset (a batch job or a viral client);
* the request mix by time of day: prompt and output lengths are lognormal (chat-like, long
  tail) around medians that ``prompt_factor`` scales during business hours (document traffic)
  and ``output_factor`` scales at night (batch-like generation), each window entered and left
  over ``mix_ramp_s``;
* requests: Poisson arrivals (thinning against the highest rate).

``day_shape`` is the single-pool day (diurnal, bursts, fixed mix); ``mix_shape`` holds the
request rate flat while the mix moves: the trace on which request rate misleads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

DAY_S = 86400.0


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
    prompt_max: int = 16000
    output_max: int = 4096
    # The mix by time of day (hours, local; a window may run past midnight). Factor 1: fixed mix.
    prompt_factor: float = 1.0
    prompt_window_h: tuple[float, float] = (9.0, 18.0)
    output_factor: float = 1.0
    output_window_h: tuple[float, float] = (22.0, 6.0)
    mix_ramp_s: float = 1800.0

    @property
    def horizon_s(self) -> float:
        return self.hours * 3600.0

    @property
    def mixed(self) -> bool:
        return self.prompt_factor != 1.0 or self.output_factor != 1.0


def day_shape(hours: float = 24.0, peak_rps: float = 30.0, trough_rps: float = 5.0, bursts: int = 8,
              load: float = 1.0) -> TraceShape:
    """The single-pool day: diurnal 5 → 30 req/s, 8 bursts, a new model's first traffic at 02:00."""
    return TraceShape(hours=hours, peak_rps=peak_rps * load, trough_rps=trough_rps * load, bursts=bursts)


def mix_shape(hours: float = 24.0, rps: float = 15.0, load: float = 1.0) -> TraceShape:
    """Flat request rate all day; prompts 3× during business hours, outputs 4× at night."""
    return TraceShape(hours=hours, peak_rps=rps * load, trough_rps=rps * load, first_traffic_s=0.0,
                      launch_surge=0.0, bursts=0, prompt_factor=3.0, output_factor=4.0)


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


# ---------------------------------------------------------------------------------------------
# Rate and mix (vectorised: ``t`` may be a float or a numpy array)


def diurnal_rps(shape: TraceShape, t):
    mid = (shape.peak_rps + shape.trough_rps) / 2
    amp = (shape.peak_rps - shape.trough_rps) / 2
    return mid - amp * np.cos(2 * np.pi * (np.asarray(t, dtype=float) - 4 * 3600) / DAY_S)


def launch_factor(shape: TraceShape, t):
    t = np.asarray(t, dtype=float)
    since = t - shape.first_traffic_s
    ramp = np.clip(since / shape.launch_ramp_s, 0.0, 1.0) if shape.launch_ramp_s > 0 else (since >= 0) * 1.0
    return np.where(since < 0, 0.0, ramp * (1 + shape.launch_surge * np.exp(-np.maximum(since, 0) / 3600)))


def burst_factor(bursts: list[Burst], t):
    t = np.asarray(t, dtype=float)
    factor = np.ones_like(t)
    for b in bursts:
        factor = np.where((t >= b.start) & (t < b.start + b.duration), np.maximum(factor, b.factor), factor)
    return factor


def rate(shape: TraceShape, bursts: list[Burst], t):
    """Arrival rate (req/s) at ``t``."""
    value = diurnal_rps(shape, t) * launch_factor(shape, t) * burst_factor(bursts, t)
    return float(value) if np.ndim(value) == 0 else value


def window_weight(window_h: tuple[float, float], ramp_s: float, t):
    """0 outside the daily window, 1 inside, linear over ``ramp_s`` centred on each edge."""
    t = np.asarray(t, dtype=float) % DAY_S
    start, end = window_h[0] * 3600, window_h[1] * 3600
    length = (end - start) % DAY_S
    since = (t - start) % DAY_S  # seconds since the window opened (today or yesterday)
    half = ramp_s / 2
    up = np.clip((since + half) / ramp_s, 0, 1) if ramp_s > 0 else (since < length) * 1.0
    until_end = length - since
    down = np.clip((until_end + half) / ramp_s, 0, 1) if ramp_s > 0 else 1.0
    # ``since`` near DAY_S means just before the window opens: the ramp starts half a ramp early.
    early = np.clip((since - DAY_S + half) / ramp_s, 0, 1) if ramp_s > 0 else 0.0
    inside = since < length + half
    return np.where(inside, np.minimum(up, down), early)


def mix_factors(shape: TraceShape, t):
    """(prompt median factor, output median factor) at ``t``."""
    pf = 1 + (shape.prompt_factor - 1) * window_weight(shape.prompt_window_h, shape.mix_ramp_s, t)
    of = 1 + (shape.output_factor - 1) * window_weight(shape.output_window_h, shape.mix_ramp_s, t)
    return pf, of


# ---------------------------------------------------------------------------------------------
# Generation


def make_bursts(shape: TraceShape, rng: np.random.Generator) -> list[Burst]:
    horizon = shape.horizon_s
    bursts = []
    for _ in range(shape.bursts):
        start = float(rng.uniform(shape.first_traffic_s + shape.launch_ramp_s, horizon - 900))
        bursts.append(Burst(start, float(rng.uniform(120, 900)), float(rng.uniform(1.8, 3.0))))
    return sorted(bursts, key=lambda b: b.start)


def sample_lengths(shape: TraceShape, rng: np.random.Generator, t) -> tuple[np.ndarray, np.ndarray]:
    pf, of = mix_factors(shape, t)
    n = np.size(t)
    prompts = shape.prompt_median * pf * np.exp(shape.prompt_sigma * rng.standard_normal(n))
    outputs = shape.output_median * of * np.exp(shape.output_sigma * rng.standard_normal(n))
    return (np.clip(prompts, 16, shape.prompt_max).astype(np.int64),
            np.clip(outputs, 4, shape.output_max).astype(np.int64))


def make_trace(shape: TraceShape, seed: int) -> Trace:
    """Non-homogeneous Poisson arrivals by thinning against the highest possible rate."""
    rng = np.random.default_rng(seed)
    bursts = make_bursts(shape, rng)
    ceiling = shape.peak_rps * (1 + shape.launch_surge) * max([b.factor for b in bursts] + [1.0])
    start, horizon = shape.first_traffic_s, shape.horizon_s
    count = rng.poisson(ceiling * (horizon - start))
    candidates = np.sort(rng.uniform(start, horizon, count))
    keep = rng.uniform(0, ceiling, count) <= rate(shape, bursts, candidates)
    arrivals = candidates[keep]
    prompts, outputs = sample_lengths(shape, rng, arrivals)
    return Trace(shape, bursts, arrivals.tolist(), prompts.tolist(), outputs.tolist())


def poisson_trace(shape: TraceShape, rps: float, seconds: float, seed: int, at: float | None = None) -> Trace:
    """Stationary arrivals for calibrating a single replica: the mix at time of day ``at``, or
    (None) the whole day's mix, lengths drawn at uniformly random times of day."""
    rng = np.random.default_rng(seed)
    count = rng.poisson(rps * seconds)
    arrivals = np.sort(rng.uniform(0, seconds, count))
    when = np.full(count, at) if at is not None else rng.uniform(0, DAY_S, count)
    if not shape.mixed:
        when = np.zeros(count)
    prompts, outputs = sample_lengths(shape, rng, when)
    return Trace(replace(shape, bursts=0), [], arrivals.tolist(), prompts.tolist(), outputs.tolist())


def steady_mix_shape(shape: TraceShape, prompt_factor: float, output_factor: float) -> TraceShape:
    """A fixed mix at the given factors (for calibrating the capacity at one point of the day)."""
    return replace(shape, prompt_median=shape.prompt_median * prompt_factor,
                   output_median=shape.output_median * output_factor, prompt_factor=1.0, output_factor=1.0)


def describe(shape: TraceShape) -> str:
    if shape.peak_rps == shape.trough_rps:
        level = f"flat {shape.peak_rps:.1f} req/s"
    else:
        level = f"diurnal {shape.trough_rps:.1f}→{shape.peak_rps:.1f} req/s"
    mix = ""
    if shape.mixed:
        mix = (f", prompts ×{shape.prompt_factor:g} {shape.prompt_window_h[0]:02.0f}–{shape.prompt_window_h[1]:02.0f}h"
               f", outputs ×{shape.output_factor:g} {shape.output_window_h[0]:02.0f}–{shape.output_window_h[1]:02.0f}h")
    return f"{level}, {shape.bursts} bursts{mix}, {shape.hours:.0f}h"

