"""What the bench measures against: calibrated capacity, the clairvoyant need, ramps, the
operator's schedule, and SkyServe's frontier.

* ``calibrate_qps``: the highest Poisson QPS at which one always-ready replica (behind the
  edge's cap) keeps p95 TTFT within the SLO on a request mix. That is SkyServe's
  ``target_qps_per_replica`` (on the whole day's mix) and, times the mix's tokens per request,
  our profiled ``replica_tokens_per_s``.
* ``capacity_curve``: that QPS at every time of day, for a trace whose mix moves (calibrated on
  a grid of the mix factors and interpolated in seconds per request).
* ``need_series``: the clairvoyant need per second: ceil(rate / (QPS at that time × pooling)).
  Its integral is the clairvoyant GPU-hours (no lag, no cold start, knows the future); with
  pooling 1.1 it is what a pool behind the edge's balancer needs (``AutoscalerConfig``'s
  ``capacity_scale_max``, measured in the README).
* ``ramp_windows``: the predictable rises of that need (diurnal or mix, no bursts, not the new
  model's launch) that ``simulate.score_ramps`` scores.
* ``operator_schedule``: the scheduled minimum an operator would set from yesterday's curve.
* ``frontier`` / ``interpolate``: SkyServe's GPU-hours vs SLO-attainment curve and its
  GPU-hours at a given attainment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np

from bench.autoscale.engine import ReplicaProfile
from bench.autoscale.simulate import RampWindow, single_replica_p95
from bench.autoscale.trace import (
    DAY_S,
    Burst,
    TraceShape,
    burst_factor,
    diurnal_rps,
    launch_factor,
    mix_factors,
    poisson_trace,
    steady_mix_shape,
)

POOLING = 1.1
QpsCurve = Callable[[np.ndarray], np.ndarray]


def calibrate_qps(shape: TraceShape, profile: ReplicaProfile, slo_s: float, seed: int,
                  seconds: float = 1800.0) -> float:
    """Highest QPS one replica serves with p95 TTFT <= SLO on ``shape``'s whole-day mix
    (two seeds must agree)."""
    lo, hi = 0.05, 64.0
    for _ in range(14):
        mid = (lo + hi) / 2
        ok = all(single_replica_p95(poisson_trace(shape, mid, seconds, seed + k), profile)[0] <= slo_s
                 for k in range(2))
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def mix_grid(shape: TraceShape, points: int = 5) -> list[tuple[float, float]]:
    """The (prompt factor, output factor) pairs to calibrate: the mix windows do not overlap,
    so one factor moves at a time."""
    grid = {(1.0, 1.0)}
    for k in range(1, points):
        grid.add((1 + (shape.prompt_factor - 1) * k / (points - 1), 1.0))
        grid.add((1.0, 1 + (shape.output_factor - 1) * k / (points - 1)))
    return sorted(grid)


def grid_shapes(shape: TraceShape) -> list[tuple[tuple[float, float], TraceShape]]:
    return [(factors, steady_mix_shape(shape, *factors)) for factors in mix_grid(shape)]


def capacity_curve(shape: TraceShape, calibrated: dict[tuple[float, float], float]) -> QpsCurve:
    """QPS one replica sustains at time ``t`` (numpy array), from the grid ``calibrated``
    ({(prompt factor, output factor): QPS}), linear in seconds per request between grid points."""
    base = calibrated[(1.0, 1.0)]
    if not shape.mixed:
        return lambda t: np.full(np.shape(t), base, dtype=float)
    prompt_pts = sorted((pf, 1 / q) for (pf, of), q in calibrated.items() if of == 1.0)
    output_pts = sorted((of, 1 / q) for (pf, of), q in calibrated.items() if pf == 1.0)

    def qps(t: np.ndarray) -> np.ndarray:
        pf, of = mix_factors(shape, t)
        cost_p = np.interp(pf, [p for p, _ in prompt_pts], [c for _, c in prompt_pts])
        cost_o = np.interp(of, [o for o, _ in output_pts], [c for _, c in output_pts])
        return 1 / np.maximum(cost_p, cost_o)  # the windows do not overlap: the costlier one applies

    return qps


def need_series(shape: TraceShape, bursts: Sequence[Burst], qps: QpsCurve, pooling: float = 1.0,
                predictable: bool = False) -> np.ndarray:
    """Replicas the load needs at every second: ceil(rate / (QPS × pooling)). ``predictable``:
    the diurnal and mix part only, without bursts."""
    t = np.arange(int(shape.horizon_s), dtype=float) + 0.5
    rate = diurnal_rps(shape, t) * launch_factor(shape, t)
    if not predictable:
        rate = rate * burst_factor(list(bursts), t)
    return np.ceil(rate / (qps(t) * pooling) - 1e-9).astype(np.int64)


def clairvoyant_gpu_hours(series: np.ndarray, gpus: int) -> float:
    return float(series.sum()) * gpus / 3600


def ramp_windows(shape: TraceShape, bursts: Sequence[Burst], predictable: np.ndarray,
                 before_s: float = 300.0, after_s: float = 600.0, settle_s: float = 3600.0) -> list[RampWindow]:
    """Every second at which the predictable need rises, after the launch has settled and away
    from bursts, with the window a request in it is scored over."""
    start = shape.first_traffic_s + shape.launch_ramp_s + settle_s
    rises = np.nonzero(predictable[1:] > predictable[:-1])[0] + 1
    out = []
    for second in rises:
        at = float(second)
        if at < start or at + after_s > shape.horizon_s:
            continue
        if any(b.start - after_s < at < b.start + b.duration + before_s for b in bursts):
            continue
        out.append(RampWindow(at=at, need=int(predictable[second]), start=at - before_s, end=at + after_s))
    return out


def operator_schedule(predictable: np.ndarray, max_replicas: int) -> list[dict]:
    """The scheduled minimum an operator sets from yesterday's curve: for every hour of the
    day, the most replicas that hour needed (predictable part, pooled capacity). It never asks
    for more than the need did at some point of the hour; bursts stay the autoscaler's job."""
    per_day = int(DAY_S)
    day = predictable[-per_day:] if len(predictable) >= per_day else predictable
    windows = []
    for hour in range(24):
        chunk = day[hour * 3600:(hour + 1) * 3600]
        if not len(chunk):
            break
        floor = int(min(max_replicas, chunk.max()))
        if floor > 0:
            windows.append({"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                            "start": f"{hour:02d}:00", "end": f"{hour + 1:02d}:00" if hour < 23 else "24:00",
                            "min_replicas": floor})
    return windows


def fit_token_profile(shapes: Sequence[tuple[tuple[float, float], TraceShape]], calibrated: dict,
                      seed: int = 7) -> tuple[float, float] | None:
    """A variant's profile in the control plane's terms, from the calibrations over the mix grid:
    (weighted tokens/s one replica serves inside the SLO, ``output_token_weight``).

    A replica's seconds per request are fitted (non-negative least squares, no intercept: the
    profile has no per-request term) as b × prompt + c × output tokens; then one prompt token
    is 1/b of a replica-second's work and a generated token weighs c/b of them. None for a
    fixed mix, where the weight cannot be told from the capacity.

    Then the fit is scaled down until it promises no grid point more than its calibration: the
    profile is what the policy sizes the pool by, and capacity inside the SLO is not linear in
    tokens (prefill's share of TTFT grows with the prompt), so the least-squares line overstated
    a replica by 12 % at 3× the prompts, business hours' mix, and sized the morning ramps short,
    where the SLO feedback can only correct it after a breach. Where the line understates instead,
    the capacity scale grows it back, up to ``AutoscalerConfig.capacity_scale_max``."""
    if len(shapes) < 3:
        return None
    from scipy.optimize import nnls

    rows = grid_tokens(shapes, seed)
    costs = [1 / calibrated[factors] for factors, _ in shapes]
    (b, c), _ = nnls(np.array(rows), np.array(costs))
    under = max(cost / (b * prompt + c * output) for (prompt, output), cost in zip(rows, costs, strict=True))
    return 1 / (b * under), c / b


def grid_tokens(shapes: Sequence[tuple[tuple[float, float], TraceShape]], seed: int = 7) -> list[tuple[float, float]]:
    """Mean (prompt, output) tokens per request of each mix grid point's requests."""
    out = []
    for _, shape in shapes:
        sample = poisson_trace(shape, 10.0, 5000.0, seed)
        out.append((float(np.mean(sample.prompts)), float(np.mean(sample.outputs))))
    return out


def frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(SLO attainment, GPU-hours) points that no other point beats on both, by attainment."""
    best: list[tuple[float, float]] = []
    for slo, gpu_hours in sorted(points, key=lambda p: (p[1], -p[0])):
        if not best or slo > best[-1][0]:
            best.append((slo, gpu_hours))
    return best


def interpolate(points: Sequence[tuple[float, float]], slo: float) -> float | None:
    """GPU-hours on the frontier at attainment ``slo`` (linear between its points); None when
    ``slo`` lies outside the frontier's range (no extrapolation)."""
    curve = frontier(points)
    for (s0, g0), (s1, g1) in pairwise(curve):
        if s0 <= slo <= s1:
            return g0 if s1 == s0 else g0 + (g1 - g0) * (slo - s0) / (s1 - s0)
    if curve and math.isclose(curve[-1][0], slo):
        return curve[-1][1]
    return None


def interpolate_value(points: Sequence[tuple[float, float]], slo: float) -> float | None:
    """Any other quantity (flaps, events) of the sweep at attainment ``slo``, linear between the
    two sweep points whose attainments bracket it."""
    ordered = sorted(points)
    for (s0, v0), (s1, v1) in pairwise(ordered):
        if s0 <= slo <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (slo - s0) / (s1 - s0)
    return None
