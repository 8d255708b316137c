"""Day-long autoscaling benchmark: our policy vs SkyServe's request-rate rule vs static peak.

    .venv/bin/python -m bench.autoscale.run --hours 24 --seed 1

Steps, all seeded:

1. Calibrate one replica (``dataplane.sim.timing`` profile): the highest Poisson QPS at which
   its p95 TTFT stays within the SLO, found by bisection on the trace's request mix. That is
   SkyServe's ``target_qps_per_replica`` and, times the mix's tokens per request, our
   profiled ``replica_tokens_per_s``; static provisioning gets ceil(peak rate / that QPS).
2. Generate the day (diurnal cycle, bursts, a new model's first traffic).
3. Run the three policies on the same trace and the same cold-start draws; print GPU-hours,
   SLO attainment, scale events (decisions that launched or drained replicas), replicas
   launched and requests that waited on a cold start, with ratios against SkyServe.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from functools import partial

from bench.autoscale.engine import ReplicaProfile
from bench.autoscale.simulate import PolicyRunner, PoolSimulation, Result, single_replica_p95
from bench.autoscale.trace import TraceShape, make_trace, poisson_trace, rate
from controlplane.autoscaler.baselines import (
    SkyServeConfig,
    SkyServeState,
    StaticConfig,
    skyserve_decide,
    static_decide,
)
from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.autoscaler.policy import decide
from controlplane.autoscaler.signals import AutoscalerState, PoolSpec


def calibrate_qps(shape: TraceShape, profile: ReplicaProfile, slo_s: float, seed: int,
                  seconds: float = 1800.0) -> float:
    """Highest QPS one replica serves with p95 TTFT <= SLO (two seeds must agree)."""
    lo, hi = 0.05, 64.0
    for _ in range(14):
        mid = (lo + hi) / 2
        ok = all(single_replica_p95(poisson_trace(shape, mid, seconds, seed + k), profile)[0] <= slo_s
                 for k in range(2))
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def peak_rate(shape: TraceShape, trace_bursts, step_s: float = 10.0) -> float:
    steps = int(shape.hours * 3600 / step_s)
    return max(rate(shape, trace_bursts, k * step_s) for k in range(steps))


def clairvoyant_gpu_hours(shape: TraceShape, trace_bursts, qps: float, gpus: int, step_s: float = 10.0) -> float:
    """GPU-hours of a sizer that knows the trace's rate curve and has no cold start:
    ceil(rate / qps) replicas at every instant. A reference for what any policy can save."""
    steps = int(shape.hours * 3600 / step_s)
    replica_seconds = sum(math.ceil(rate(shape, trace_bursts, k * step_s) / qps - 1e-9) * step_s
                          for k in range(steps))
    return replica_seconds * gpus / 3600


def run_policy(kind: str, args: argparse.Namespace, qps: float, static_replicas: int) -> Result:
    shape = TraceShape(hours=args.hours, peak_rps=args.peak_rps, trough_rps=args.trough_rps, bursts=args.bursts)
    trace = make_trace(shape, args.seed)
    profile = ReplicaProfile(model=args.model, gpu=args.gpu, tp=args.tp, quantization=args.quantization)
    spec = PoolSpec(
        pool_id="bench", kind=args.kind, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        ttft_slo_s=args.slo, idle_timeout_s=args.idle_timeout, gpus_per_replica=args.tp,
        replica_tokens_per_s=qps * trace.mean_tokens(),
    )
    if kind == "ours":
        runner = PolicyRunner("ours", partial(decide, config=AutoscalerConfig()), AutoscalerState(),
                              AutoscalerConfig().decision_interval_s)
    elif kind == "skyserve":
        config = SkyServeConfig(target_qps_per_replica=qps)
        # SkyServe's min_replicas for a scale-to-zero service is 0; it scales up from 0 at once.
        if args.kind == "scale_to_zero":
            spec = replace(spec, min_replicas=0)
        runner = PolicyRunner("skyserve", partial(skyserve_decide, config=config), SkyServeState(),
                              config.decision_interval_s)
    else:
        runner = PolicyRunner("static-peak", partial(static_decide, config=StaticConfig(static_replicas)), None,
                              60.0)
    return PoolSimulation(trace, profile, spec, seed=args.seed).run(runner)


def render(results: dict[str, Result], slo_s: float, bounds: dict[str, float]) -> str:
    base = results["skyserve"]
    header = (f"{'policy':<12} {'GPU-h':>8} {'xSky':>6} {'SLO%':>7} {'events':>7} {'xSky':>6} "
              f"{'launched':>8} {'cold-wait':>9} {'p50 TTFT':>9} {'p95 TTFT':>9} {'peak':>5}")
    lines = [header, "-" * len(header)]
    for r in results.values():
        lines.append(
            f"{r.name:<12} {r.gpu_hours:8.1f} {r.gpu_hours / base.gpu_hours:6.2f} {100 * r.slo_attainment:7.2f} "
            f"{r.scale_events:7d} {r.scale_events / max(1, base.scale_events):6.2f} {r.replicas_launched:8d} "
            f"{r.cold_start_waits:9d} {r.ttft_p50_s:8.2f}s {r.ttft_p95_s:8.2f}s {r.peak_replicas:5d}"
        )
    for label, gpu_hours in bounds.items():
        lines.append(f"{label:<12} {gpu_hours:8.1f} {gpu_hours / base.gpu_hours:6.2f}   (no lag, no cold start, "
                     f"knows the rate curve)")
    ours = results["ours"]
    checks = {
        f"SLO attainment >= SkyServe ({100 * ours.slo_attainment:.2f}% vs {100 * base.slo_attainment:.2f}%)":
            ours.slo_attainment >= base.slo_attainment,
        f"GPU-hours <= 0.75x SkyServe ({ours.gpu_hours / base.gpu_hours:.2f}x)":
            ours.gpu_hours <= 0.75 * base.gpu_hours,
        f"scale events <= 1/3 SkyServe ({ours.scale_events} vs {base.scale_events})":
            3 * ours.scale_events <= base.scale_events,
    }
    lines.append("")
    lines += [f"[{'PASS' if ok else 'FAIL'}] {name}" for name, ok in checks.items()]
    lines.append(f"(TTFT SLO {slo_s:.1f}s; scale event = one decision that launched or drained replicas)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--peak-rps", type=float, default=30.0)
    p.add_argument("--trough-rps", type=float, default=5.0)
    p.add_argument("--bursts", type=int, default=8)
    p.add_argument("--slo", type=float, default=2.0, help="TTFT SLO in seconds")
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--quantization", default="fp8")
    p.add_argument("--kind", default="scale_to_zero", choices=["warm", "scale_to_zero"])
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=64)
    p.add_argument("--idle-timeout", type=float, default=900.0)
    p.add_argument("--only", choices=["ours", "skyserve", "static"], action="append")
    p.add_argument("--json", help="also write the results (without timelines) to this file")
    p.add_argument("--jobs", type=int, default=2)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    shape = TraceShape(hours=args.hours, peak_rps=args.peak_rps, trough_rps=args.trough_rps, bursts=args.bursts)
    profile = ReplicaProfile(model=args.model, gpu=args.gpu, tp=args.tp, quantization=args.quantization)
    qps = calibrate_qps(shape, profile, args.slo, args.seed)
    trace = make_trace(shape, args.seed)
    static_replicas = math.ceil(peak_rate(shape, trace.bursts) / qps)
    print(f"replica: {args.model} {args.quantization} on {args.tp}x{args.gpu}, model-ready "
          f"{profile.model_ready_seconds:.0f}s; sustainable {qps:.2f} req/s at p95 TTFT <= {args.slo:.1f}s")
    print(f"trace: {len(trace)} requests over {args.hours:.0f}h, {len(trace.bursts)} bursts, "
          f"first traffic at {shape.first_traffic_s / 3600:.1f}h; static peak pool {static_replicas} replicas")
    kinds = args.only or ["ours", "skyserve", "static"]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {k: pool.submit(run_policy, k, args, qps, static_replicas) for k in kinds}
        results = {k: f.result() for k, f in futures.items()}
    if "skyserve" in results and "ours" in results:
        bounds = {
            "clairvoyant": clairvoyant_gpu_hours(shape, trace.bursts, qps, args.tp),
            "clairv.x1.1": clairvoyant_gpu_hours(shape, trace.bursts, 1.1 * qps, args.tp),
        }
        print(render(results, args.slo, bounds))
    else:
        for r in results.values():
            print(r.name, f"{r.gpu_hours:.1f} GPU-h", f"{100 * r.slo_attainment:.2f}% SLO",
                  r.scale_events, "events", r.cold_start_waits, "cold waits")
    print(f"({time.time() - started:.0f}s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({k: {key: v for key, v in asdict(r).items() if key not in ("timeline", "decisions")}
                       for k, r in results.items()}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
