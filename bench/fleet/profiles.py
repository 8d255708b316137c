"""Replica capacity per (variant, GPU type), calibrated from the simulator's timing profiles.

For each pair, one replica of ``bench.autoscale.engine`` (the ``dataplane.sim.timing`` model:
prefill/decode step times, KV pool, batch limit) is fed stationary Poisson traffic with the
bench's request mix. As in ``bench.autoscale.run.calibrate_qps``:

* ``qps`` is the highest rate at which its p95 TTFT stays within the SLO, on two seeds (bisection);
* at loads u = 0.2 … 1.0 of that rate the run also records the share of requests inside the SLO,
  the p95 TTFT and the mean number of requests in flight (Little's law over the run).

Those are the queueing model's inputs (``fluid.py``): a replica serves up to ``qps``, requests
above it queue. Every GPU type of the catalogs (h100, l40s, a10g, l4) has a timing profile, so
no profile has to be derived. Results are cached under ``bench/fleet/.cache`` (keyed by every
input, the engine's and the timing model's source included; ``--recalibrate`` measures again).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.autoscale.engine import Replica, ReplicaProfile, StepTimes
from bench.autoscale.trace import TraceShape, poisson_trace
from bench.fleet.models import Variant
from dataplane.sim import timing

CACHE = Path(__file__).resolve().parent / ".cache" / "profiles.json"
CALIBRATION_VERSION = 2
LOADS = (0.2, 0.4, 0.6, 0.8, 0.9, 1.0)
SECONDS = 1800.0
MIX = TraceShape()  # the request mix of bench.autoscale (only the length distributions are used)
MIN_KV_TOKENS = 32_768  # a GPU type whose KV pool is smaller than this does not host the variant
MIN_QPS = 0.25  # nor one where a replica cannot keep p95 TTFT inside the SLO at this rate


@dataclass(frozen=True)
class Capacity:
    pool_id: str
    gpu_type: str
    qps: float  # requests/s one replica serves with p95 TTFT <= SLO
    tokens_per_s: float  # prompt + output tokens/s at that rate
    output_tokens_per_s: float
    model_ready_s: float
    kv_capacity_tokens: int
    max_running: int
    loads: tuple[float, ...]
    within: tuple[float, ...]  # share of requests inside the SLO at each load
    p95_ttft: tuple[float, ...]
    p50_ttft: tuple[float, ...]
    in_flight: tuple[float, ...]  # mean running + queued requests at each load

    def at(self, series: tuple[float, ...], u: float, zero: float | None = None) -> float:
        """Piecewise-linear in the load u, clamped to the measured range; below the lowest load
        measured, towards ``zero`` at u = 0 when given."""
        xs = self.loads
        if u <= xs[0]:
            return series[0] if zero is None else zero + (series[0] - zero) * max(0.0, u) / xs[0]
        for k in range(1, len(xs)):
            if u <= xs[k]:
                w = (u - xs[k - 1]) / (xs[k] - xs[k - 1])
                return series[k - 1] + w * (series[k] - series[k - 1])
        return series[-1]


class _Timed(Replica):
    """An engine replica that also remembers when each request finished."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.finished: dict[int, float] = {}

    def _finish_done(self) -> None:
        running = self.running
        while running and running[0][0] <= self.decoded:
            self.finished[running[0][2]] = self.clock
            _, kv, _ = heapq.heappop(running)
            self.kv_used -= kv
            self.context -= kv
            self.completed += 1
        self.context = max(0, self.context) if running else 0


def replica_profile(variant: Variant, gpu: str) -> ReplicaProfile:
    return ReplicaProfile(model=variant.model, gpu=gpu, tp=variant.gpus, quantization=variant.quantization)


def fits(variant: Variant, gpu: str) -> bool:
    return replica_profile(variant, gpu).kv_capacity_tokens >= MIN_KV_TOKENS


def _run(profile: ReplicaProfile, rps: float, seed: int, slo_s: float) -> tuple[float, float, float, float]:
    """(p95 TTFT, share within SLO, mean in flight, p50 TTFT) of one always-ready replica."""
    trace = poisson_trace(MIX, rps, SECONDS, seed)
    replica = _Timed("calib", profile, StepTimes(profile), 0.0, 0.0, profile.tp)
    replica.state = "ready"
    for k, a in enumerate(trace.arrivals):
        replica.submit(a, trace.prompts[k], trace.outputs[k], k)
    out: list = []
    replica.advance(SECONDS + 120.0, out)
    values = sorted(v for _, v, _ in out)
    n = len(trace)
    values += [math.inf] * (n - len(values))
    p95 = values[min(n - 1, int(0.95 * n))] if n else 0.0
    within = sum(1 for v in values if v <= slo_s) / max(1, n)
    busy = sum(replica.finished.get(k, SECONDS + 120.0) - a for k, a in enumerate(trace.arrivals))
    return p95, within, busy / SECONDS, values[n // 2] if n else 0.0


def _ok(profile: ReplicaProfile, rps: float, slo_s: float) -> bool:
    return all(_run(profile, rps, seed, slo_s)[0] <= slo_s for seed in (1, 2))


def calibrate(variant: Variant, gpu: str) -> Capacity:
    profile = replica_profile(variant, gpu)
    slo = variant.slo_s
    hi = 0.5
    while _ok(profile, hi, slo) and hi < 1024:
        hi *= 2
    lo = hi / 2 if hi > 0.5 else 0.01
    for _ in range(11):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _ok(profile, mid, slo) else (lo, mid)
    qps = lo
    within, p95s, in_flight, p50s = [], [], [], []
    for u in LOADS:
        runs = [_run(profile, u * qps, seed, slo) for seed in (1, 2)]
        p95s.append(sum(r[0] for r in runs) / 2)
        p50s.append(sum(r[3] for r in runs) / 2)
        within.append(sum(r[1] for r in runs) / 2)
        in_flight.append(sum(r[2] for r in runs) / 2)
    sample = poisson_trace(MIX, 50.0, 2000.0, 99)
    mean_tokens = sample.mean_tokens()
    mean_output = sum(sample.outputs) / len(sample)
    return Capacity(
        pool_id=variant.pool_id, gpu_type=gpu, qps=qps, tokens_per_s=qps * mean_tokens,
        output_tokens_per_s=qps * mean_output, model_ready_s=profile.model_ready_seconds,
        kv_capacity_tokens=profile.kv_capacity_tokens, max_running=profile.max_running_requests,
        loads=LOADS, within=tuple(within), p95_ttft=tuple(p95s), p50_ttft=tuple(p50s), in_flight=tuple(in_flight),
    )


def _sources() -> str:
    """The code the calibration runs: a change to the engine or the timing model measures again."""
    import bench.autoscale.engine as engine

    digest = hashlib.sha256()
    for module in (engine, timing):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def _key(variant: Variant, gpu: str) -> str:
    raw = json.dumps([CALIBRATION_VERSION, variant.model, variant.quantization, variant.gpus, gpu, variant.slo_s,
                      asdict(MIX), LOADS, SECONDS, MIN_KV_TOKENS, asdict(timing.get_gpu(gpu)),
                      asdict(timing.get_model(variant.model)), _sources()], sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _calibrate_job(args: tuple[Variant, str]) -> Capacity:
    return calibrate(*args)


def capacities(variants: tuple[Variant, ...], gpu_types: set[str], *, jobs: int = 2,
               recalibrate: bool = False) -> dict[str, dict[str, Capacity]]:
    """{pool_id: {gpu type: Capacity}} for every allowed GPU type the catalog offers and the
    variant fits on."""
    cache: dict[str, dict] = {}
    if CACHE.exists() and not recalibrate:
        cache = json.loads(CACHE.read_text())
    todo, out = [], {v.pool_id: {} for v in variants}
    for v in variants:
        for gpu in v.gpu_types:
            if gpu not in gpu_types or not fits(v, gpu):
                continue
            key = _key(v, gpu)
            if key in cache:
                raw = dict(cache[key], pool_id=v.pool_id)
                out[v.pool_id][gpu] = Capacity(**{k: tuple(x) if isinstance(x, list) else x for k, x in raw.items()})
            else:
                todo.append((v, gpu))
    if todo:
        with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
            for (v, gpu), cap in zip(todo, pool.map(_calibrate_job, todo), strict=True):
                out[v.pool_id][gpu] = cap
                cache[_key(v, gpu)] = asdict(cap)
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True))
    return {pool: {gpu: cap for gpu, cap in caps.items() if cap.qps >= MIN_QPS} for pool, caps in out.items()}
