"""Where one Nimbus day's misses and GPU-hours go: the numbers behind the README's diagnoses.

    .venv/bin/python -m bench.fleet.diagnose --catalog sample --seed 1      # about a minute, once calibrated

Runs the ``nimbus`` contender of ``bench.fleet`` (the same setup, arrivals and capacities) with a
trace of every step, then prints four tables:

* **Bursts.** For every burst of a warm pool: its arrival rate, the ready capacity before it and
  at its peak, the highest backlog, how long after its onset the backlog was gone, and the share
  of its requests inside the TTFT SLO (exact: the queue counts each burst apart).
* **GPU-hours by GPU type.** What the nodes of each type bill, split into the GPUs held by regular
  replicas (ready), spares, replicas loading or draining, and idle GPUs; the *rounding floor*
  (per instance type, minute by minute, the GPUs that whole nodes for the regular and loading
  replicas leave over).
* **Regular replicas' GPU-hours by pool and GPU type** next to the clairvoyant bound's
  (``clairvoyant.lower_bound``, f = 1), the long-tail pools summed.
* **$ by the load's phase**, minute by minute against the bound's plan for the same minute: a
  minute is *burst* where any warm pool is inside a burst, else *after-burst* in the 10 minutes
  after one, else *steady* (``cost_by_phase``).
"""

from __future__ import annotations

import argparse
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.fleet import clairvoyant, run, sim
from bench.fleet.fluid import PoolQueue
from bench.fleet.load import PoolLoad, make_load, phase_of
from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.fleet.capacity import ConsolidationBudget

SAMPLE_S = 60.0  # the GPU accounting samples the fleet once a minute


def burst_labels(pool: PoolLoad) -> Callable[[float], str]:
    """``phase_of`` with each burst told apart ("burst 3"), so the queue counts them one by one
    (a request inside two overlapping bursts counts for the earlier one)."""
    phase = phase_of(pool)
    starts = sorted(b.start for b in pool.bursts)
    ends = {b.start: b.start + b.duration for b in pool.bursts}

    def label(t: float) -> str:
        for i, start in enumerate(starts):
            if start <= t < ends[start]:
                return f"burst {i}"
        return phase(t)
    return label


@dataclass
class BurstRow:
    pool_id: str
    start: float
    duration: float
    arrival_rps: float
    capacity_before: float
    capacity_peak: float
    backlog_peak: float
    cleared_after_s: float | None  # from the onset; None: still waiting when the trace ends
    requests: float
    within: float


@dataclass
class GpuHours:
    billed: Counter = field(default_factory=Counter)  # GPU type -> GPU-hours
    held: Counter = field(default_factory=Counter)  # (GPU type, "regular" | "spare" | "loading") -> GPU-hours
    floor: Counter = field(default_factory=Counter)  # GPU type -> GPU-hours whole nodes leave over
    regular_by_pool: Counter = field(default_factory=Counter)  # "pool@type" -> GPU-hours

    def idle(self, gpu_type: str) -> float:
        return self.billed[gpu_type] - sum(v for (t, _), v in self.held.items() if t == gpu_type)


class Tracer:
    """Reads the fleet after every step (``Contender.run(on_step=...)``)."""

    def __init__(self, contender: sim.Contender, pools: dict[str, sim.PoolRun]):
        self.c = contender
        self.pools = pools
        self.steps: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)  # t, rps, cap, backlog
        self.gpu = GpuHours()
        self.minute_cost: dict[int, float] = {}  # minute of the day -> $ the fleet's nodes billed in it

    def __call__(self, t: float, k: int) -> None:
        for pid, pool in self.pools.items():
            if pool.variant.tail:
                continue
            ready = [r for r in self.c.fleet.by_pool[pid].values() if r.state == "ready" and r.replaces is None]
            self.steps[pid].append((t, pool.arrivals[k] / sim.DT, sum(r.copies * r.cap.qps for r in ready),
                                    pool.queue.backlog))
        if t >= 0 and t % SAMPLE_S < sim.DT:
            self._sample(t)

    def _sample(self, t: float) -> None:
        h = SAMPLE_S / 3600
        self.minute_cost[int(t // SAMPLE_S)] = sum(n.offer.price_per_hour for n in self.c.fleet.nodes.values()) * h
        running: Counter = Counter()  # (instance type, GPU type, GPUs per node) -> GPUs of regular and loading replicas
        for node in self.c.fleet.nodes.values():
            o = node.offer
            self.gpu.billed[o.gpu_type] += o.gpu_count * h
            for r in node.replicas.values():
                if r.state == "ended":
                    continue
                kind = "spare" if r.spare else "regular" if r.state == "ready" else "loading"
                self.gpu.held[(o.gpu_type, kind)] += len(r.gpu_ids) * h
                if kind == "regular":
                    self.gpu.regular_by_pool[f"{r.pool_id}@{o.gpu_type}"] += len(r.gpu_ids) * h
                if kind != "spare":
                    running[(o.instance_type, o.gpu_type, o.gpu_count)] += len(r.gpu_ids)
        for (_, gpu_type, per_node), used in running.items():
            self.gpu.floor[gpu_type] += (math.ceil(used / per_node) * per_node - used) * h

    def bursts(self, loads: dict[str, PoolLoad], after_s: float = 600.0) -> list[BurstRow]:
        """One row per burst; its backlog is followed for ``after_s`` past its end."""
        rows = []
        for pid, steps in self.steps.items():
            queue = self.pools[pid].queue
            for i, b in enumerate(sorted(loads[pid].bursts, key=lambda b: b.start)):
                ks = [k for k, s in enumerate(steps) if b.start <= s[0] < b.start + b.duration + after_s]
                inside = [steps[k] for k in ks if steps[k][0] < b.start + b.duration]
                if not inside:
                    continue
                first = ks[0]
                peak = max(ks, key=lambda k: steps[k][3])
                cleared = next((steps[k][0] + sim.DT - b.start for k in range(peak, len(steps)) if steps[k][3] == 0),
                               None)
                rows.append(BurstRow(
                    pool_id=pid, start=b.start, duration=b.duration,
                    arrival_rps=sum(s[1] for s in inside) / len(inside),
                    capacity_before=steps[first - 1][2] if first else 0.0,
                    capacity_peak=max(steps[k][2] for k in ks), backlog_peak=steps[peak][3], cleared_after_s=cleared,
                    requests=queue.requests_by_phase.get(f"burst {i}", 0.0),
                    within=queue.within_by_phase.get(f"burst {i}", 0.0)))
        return sorted(rows, key=lambda r: (r.pool_id, r.start))


def cost_by_phase(minute_cost: Mapping[int, float], bound_cost: Sequence[float],
                  phases: Sequence[Callable[[float], str]]) -> dict[str, tuple[int, float, float]]:
    """phase -> (minutes, Nimbus's $, the bound's $) over the minutes both priced. A minute's phase
    is the most disruptive of the warm pools' at its middle: burst, then after-burst, then steady."""
    out: dict[str, tuple[int, float, float]] = {}
    for minute, ours in sorted(minute_cost.items()):
        if minute >= len(bound_cost):
            continue
        seen = {phase((minute + 0.5) * SAMPLE_S) for phase in phases}
        kind = next((k for k in ("burst", "after-burst") if k in seen), "steady")
        n, a, b = out.get(kind, (0, 0.0, 0.0))
        out[kind] = (n + 1, a + ours, b + bound_cost[minute])
    return out


def render(bursts: list[BurstRow], gpu: GpuHours, bound_by_pool_type: dict[str, float], tail_pools: set[str],
           by_phase: dict[str, tuple[int, float, float]]) -> str:
    lines = ["Bursts of the warm pools (capacity in req/s at the SLO, as the queueing model serves it):", "",
             "| pool | onset | length s | arrivals req/s | capacity before | peak capacity | peak backlog "
             "| backlog gone after s | requests | inside the SLO |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for b in bursts:
        cleared = "—" if b.cleared_after_s is None else f"{b.cleared_after_s:.0f}"
        share = f"{100 * b.within / b.requests:.1f} %" if b.requests else "— (inside an earlier burst)"
        lines.append(f"| {b.pool_id} | {b.start / 3600:05.2f} h | {b.duration:.0f} | {b.arrival_rps:.1f} "
                     f"| {b.capacity_before:.1f} | {b.capacity_peak:.1f} | {b.backlog_peak:.0f} | {cleared} "
                     f"| {b.requests:.0f} | {share} |")
    total = sum(b.requests for b in bursts)
    within = sum(b.within for b in bursts)
    lines.append(f"\nAll bursts: {total:.0f} requests, {100 * within / total if total else 100:.1f} % inside the SLO.")
    lines += ["", "GPU-hours by GPU type (sampled once a minute):", "",
              "| GPU type | billed | regular | spares | loading or draining | idle | rounding floor |",
              "|---|---|---|---|---|---|---|"]
    for t in sorted(gpu.billed):
        lines.append(f"| {t} | {gpu.billed[t]:.0f} | {gpu.held[(t, 'regular')]:.0f} | {gpu.held[(t, 'spare')]:.0f} "
                     f"| {gpu.held[(t, 'loading')]:.0f} | {gpu.idle(t):.0f} | {gpu.floor[t]:.0f} |")
    lines += ["", "Regular replicas' GPU-hours by pool and GPU type, against the clairvoyant bound's (f = 1):", "",
              "| pool@type | nimbus | bound |", "|---|---|---|"]
    def tail(key: str) -> bool:
        return key.split("@")[0] in tail_pools

    for key in sorted(set(gpu.regular_by_pool) | set(bound_by_pool_type)):
        if not tail(key):
            lines.append(f"| {key} | {gpu.regular_by_pool.get(key, 0.0):.0f} | {bound_by_pool_type.get(key, 0.0):.0f} |")
    tails = (sum(v for k, v in gpu.regular_by_pool.items() if tail(k)),
             sum(v for k, v in bound_by_pool_type.items() if tail(k)))
    lines.append(f"| the {len(tail_pools)} long-tail pools | {tails[0]:.0f} | {tails[1]:.0f} |")
    lines += ["", "$ by the load's phase, minute by minute, against the bound's plan for the same minutes (f = 1):",
              "", "| phase | minutes | nimbus $ | bound $ | × bound |", "|---|---|---|---|---|"]
    for kind in ("steady", "burst", "after-burst"):
        if kind in by_phase:
            n, ours, bound = by_phase[kind]
            lines.append(f"| {kind} | {n} | {ours:,.0f} | {bound:,.0f} | {ours / bound:.3f} |" if bound else
                         f"| {kind} | {n} | {ours:,.0f} | 0 | — |")
    return "\n".join(lines)


def diagnose(catalog: str, seed: int, hours: float, load_scale: float = 1.0
             ) -> tuple[list[BurstRow], GpuHours, dict[str, float], set[str], dict[str, tuple[int, float, float]]]:
    offers, variants, caps, arrivals, end, _ = run._setup(catalog, seed, hours, load_scale)
    loads = {v.pool_id: make_load(v, seed, hours) for v in variants}
    pools = {v.pool_id: sim.PoolRun(v, caps[v.pool_id], arrivals[v.pool_id],
                                    PoolQueue(v.slo_s, phase_of=burst_labels(loads[v.pool_id])))
             for v in variants}
    contender = sim.Nimbus(list(pools.values()), offers, -sim.WARMUP_S, end, budget=ConsolidationBudget(),
                           config=AutoscalerConfig())
    tracer = Tracer(contender, pools)
    contender.run(on_step=tracer)
    bound = clairvoyant.lower_bound(arrivals, sim.DT, round(sim.WARMUP_S / sim.DT), {v.pool_id: v for v in variants},
                                    caps, offers)
    warm = [phase_of(loads[v.pool_id]) for v in variants if not v.tail]
    return (tracer.bursts(loads), tracer.gpu, dict(bound.gpu_h_by_pool_type), {v.pool_id for v in variants if v.tail},
            cost_by_phase(tracer.minute_cost, bound.interval_cost, warm))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--catalog", choices=("sample", "fine"), default="sample")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--load-scale", type=float, default=1.0)
    args = p.parse_args(argv)
    print(render(*diagnose(args.catalog, args.seed, args.hours, args.load_scale)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
