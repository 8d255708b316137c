"""One simulated day of a multi-model GPU fleet, four contenders side by side.

    .venv/bin/python -m bench.fleet --catalog sample --seed 1      # about 3 minutes on 2 cores
    .venv/bin/python -m bench.fleet --catalog fine --seed 1
    .venv/bin/python -m bench.fleet.tick                            # one tick on 10k nodes / 50k replicas

Contenders, on the same arrivals (seeded per pool), the same replica capacities (calibrated
from the ``dataplane.sim.timing`` profiles) and the same queueing model:

1. ``nimbus``: ``controlplane.autoscaler.policy.decide`` per pool, then the fleet tick of
   ``controlplane.fleet.reconcile`` (placement, surplus choice, empty-node TTL, consolidation);
2. ``nimbus-no-consol``: the same without ``plan_consolidation``;
3. ``skyserve``: one service per model, a VM of the cheapest fitting shape per replica (filled
   with data-parallel copies), SkyServe's request-rate rule;
4. ``clairvoyant``: a lower bound (``clairvoyant.py``).

Writes ``bench/fleet/results-<catalog>.json`` (``-seed<N>`` added for seeds other than 1).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.fleet import clairvoyant, sim
from bench.fleet.catalog import offers_for
from bench.fleet.fluid import PoolQueue
from bench.fleet.load import arrival_counts, make_load, phase_of
from bench.fleet.models import FLEETS, fleet_variants
from bench.fleet.profiles import capacities
from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.fleet.capacity import ConsolidationBudget

HERE = Path(__file__).resolve().parent
CONTENDERS = ("nimbus", "nimbus-no-consol", "skyserve")
# nimbus-no-spares: Nimbus without spare replicas on the fleet's free GPU slots, and so with the
# autoscaler's own hysteresis (``controlplane.fleet.spares``, ``AutoscalerConfig.for_warm_surplus``)
DIAGNOSTICS = ("nimbus-oracle", "nimbus-no-spares")
# The bound provisioned for these multiples of each interval's demand as well: its cost at a
# contender's SLO attainment is interpolated on them (``equal_slo_bound``). Below 1 it is
# provisioned short of each minute's demand: served deadline-first (``fluid``), its attainment
# falls steeply but not to nothing, so a contender below f = 1's attainment is still compared
# with what the bound pays for that attainment, not with f = 1's cost.
BOUND_FACTORS = (0.95, 0.98, 0.99, 1.0, 1.02, 1.05, 1.1)
PHASES = ("steady", "burst", "after-burst", "episode")


def _setup(catalog: str, seed: int, hours: float, load_scale: float = 1.0, fleet: str = "default"):
    offers = offers_for(catalog)
    variants = fleet_variants(fleet)
    caps = capacities(variants, {o.gpu_type for o in offers})
    end = hours * 3600
    loads = {v.pool_id: make_load(v, seed, hours) for v in variants}
    arrivals = {v.pool_id: arrival_counts(loads[v.pool_id], seed, -sim.WARMUP_S, end, sim.DT,
                                          scale=1.0 if v.tail else load_scale)
                for v in variants}
    phases = {p: phase_of(load) for p, load in loads.items()}
    return offers, variants, caps, arrivals, end, phases


def row_factor(kind: str) -> float:
    """The factor a row's name carries ("skyserve-x1.5", "clairvoyant-x1.05"); 1 without one."""
    return float(kind.split("-x")[1]) if "-x" in kind else 1.0


def bound_row(demand_factor: float) -> str:
    """The bound's row at ``demand_factor``: "clairvoyant" at 1, "clairvoyant-x1.05" (or -x0.98) elsewhere."""
    return "clairvoyant" if demand_factor == 1.0 else f"clairvoyant-x{demand_factor:g}"


def run_row(kind: str, catalog: str, seed: int, hours: float, load_scale: float = 1.0, budget: dict | None = None,
            fleet: str = "default", autoscaler: dict | None = None,
            empty_node_ttl_s: float = sim.EMPTY_NODE_TTL_S) -> dict:
    """One row of a day, by its name: the bound (at the factor the name carries) or a contender."""
    if kind.startswith("clairvoyant"):
        return run_bound(catalog, seed, hours, load_scale, fleet, row_factor(kind))
    return run_contender(kind, catalog, seed, hours, load_scale, budget, fleet, autoscaler, empty_node_ttl_s)


def slo_by_phase(queues) -> dict[str, dict[str, float]]:
    """Requests and the share inside the SLO by the load's phase at arrival, over all pools."""
    out: dict[str, dict[str, float]] = {}
    for q in queues:
        for phase, n in q.requests_by_phase.items():
            d = out.setdefault(phase, {"requests": 0.0, "within": 0.0})
            d["requests"] += n
            d["within"] += q.within_by_phase.get(phase, 0.0)
    for d in out.values():
        d["attainment"] = d["within"] / d["requests"] if d["requests"] else 1.0
    return out


def run_contender(kind: str, catalog: str, seed: int, hours: float, load_scale: float = 1.0,
                  budget: dict | None = None, fleet: str = "default", autoscaler: dict | None = None,
                  empty_node_ttl_s: float = sim.EMPTY_NODE_TTL_S) -> dict:
    started = time.process_time()
    offers, variants, caps, arrivals, end, phases = _setup(catalog, seed, hours, load_scale, fleet)
    pools = [sim.PoolRun(v, caps[v.pool_id], arrivals[v.pool_id], PoolQueue(v.slo_s, phase_of=phases[v.pool_id]))
             for v in variants]
    if kind.startswith("skyserve"):
        contender = sim.SkyServe(pools, offers, -sim.WARMUP_S, end, qps_factor=row_factor(kind))
    elif kind == "nimbus-oracle":
        contender = sim.OracleNimbus(pools, offers, -sim.WARMUP_S, end, budget=ConsolidationBudget(**(budget or {})),
                                     empty_node_ttl_s=empty_node_ttl_s)
    else:
        contender = sim.Nimbus(pools, offers, -sim.WARMUP_S, end, consolidation=kind != "nimbus-no-consol",
                               budget=ConsolidationBudget(**(budget or {})),
                               config=AutoscalerConfig(**(autoscaler or {})), empty_node_ttl_s=empty_node_ttl_s,
                               spares=kind != "nimbus-no-spares")
    o = contender.run()
    t = o.totals
    billed = t.billed_gpu_s / 3600
    allocated = t.allocated_gpu_s / 3600
    out = {
        "name": o.name, "cost": t.cost, "billed_gpu_h": billed, "allocated_gpu_h": allocated,
        "fragmentation": 1 - allocated / billed if billed else 0.0,
        "fragmentation_cost": max(0.0, t.cost - sum(t.held_cost.values())),
        "requests": o.requests, "slo_attainment": o.within / o.requests if o.requests else 1.0,
        "slo_by_phase": slo_by_phase(p.queue for p in pools),
        "cold_start_waits": o.cold_waits, "dropped": o.dropped, "migrations": t.migrations,
        "consolidation_actions": dict(t.consolidation_actions), "nodes_launched": t.nodes_launched,
        "spares": {"placed": t.spares_placed, "promoted": t.spares_promoted, "demoted": t.spares_demoted,
                   "swapped": t.spares_swapped,
                   "evicted": t.spares_evicted},
        "replicas_placed": t.replicas_placed, "peak_nodes": t.peak_nodes, "peak_gpus": t.peak_gpus,
        "unplaced": t.unplaced, "held_cost": dict(t.held_cost), "cost_by_shape": dict(t.cost_by_shape),
        "gpu_h_by_pool_type": {k: v / 3600 for k, v in t.gpu_s_by_pool_type.items()},
        "pools": {p: dict(d, cost=t.pool_cost.get(p, 0.0),
                          slo_attainment=d["within"] / d["requests"] if d["requests"] else 1.0,
                          cold_starts=len(contender.fleet.cold_starts[p]),
                          cold_start_mean_s=(sum(contender.fleet.cold_starts[p]) / len(contender.fleet.cold_starts[p])
                                             if contender.fleet.cold_starts[p] else None))
                  for p, d in o.per_pool.items()},
        "idle_gpu_h_by_fill": {k: v / 3600 for k, v in sorted(t.idle_gpu_s.items(), key=lambda kv: -kv[1])},
        "idle_cost": dict(t.idle_cost), "type_premium": dict(t.type_premium),
        "idle_gpu_h_by_cause": {k: v / 3600 for k, v in t.idle_gpu_s_by_cause.items()},
        "ready_over_demand": {p.pool_id: (t.ready_qps_s[p.pool_id] / p.queue.requests if p.queue.requests else None)
                              for p in pools},
        "cpu_s": time.process_time() - started,
    }
    if kind.startswith("skyserve"):
        out["shapes"] = {p: f"{s.cloud}/{s.region}/{s.instance_type} x{contender.copies[p]} copies"
                         for p, s in contender.shape.items()}
        out["target_qps_per_replica"] = {p: c.target_qps_per_replica for p, c in contender.configs.items()}
    return out


def run_bound(catalog: str, seed: int, hours: float, load_scale: float = 1.0, fleet: str = "default",
              demand_factor: float = 1.0) -> dict:
    """The clairvoyant bound (provisioned for ``demand_factor`` x each interval's demand) and the
    SLO attainment its replicas get through the contenders' queueing model."""
    started = time.process_time()
    offers, variant_list, caps, arrivals, _, phases = _setup(catalog, seed, hours, load_scale, fleet)
    variants = {v.pool_id: v for v in variant_list}
    b = clairvoyant.lower_bound(arrivals, sim.DT, round(sim.WARMUP_S / sim.DT), variants, caps, offers,
                                demand_factor=demand_factor)
    queues = clairvoyant.attainment(b, arrivals, sim.DT, -sim.WARMUP_S, variants, caps, phases).values()
    requests, within = sum(q.requests for q in queues), sum(q.within for q in queues)
    out = {
        "name": bound_row(demand_factor),
        "demand_factor": demand_factor, "cost": b.cost, "billed_gpu_h": b.billed_gpu_h,
        "allocated_gpu_h": b.allocated_gpu_h,
        "fragmentation": 1 - b.allocated_gpu_h / b.billed_gpu_h if b.billed_gpu_h else 0.0,
        "intervals": b.intervals, "distinct_demands": b.solved, "gpu_h_by_pool_type": b.gpu_h_by_pool_type,
        "slo_attainment": within / requests if requests else 1.0, "slo_by_phase": slo_by_phase(queues),
    }
    if demand_factor == 1.0:
        sampled, equal, worst = clairvoyant.check_exact(b, variants, offers)
        out["exact_check"] = {"sampled": sampled, "equal_to_exact_min_cost": equal, "worst_gap": worst}
    out["cpu_s"] = time.process_time() - started
    return out


def equal_slo_bound(bounds: list[dict], attainment: float) -> dict | None:
    """The bound's cost at ``attainment``: linear between the two demand factors whose
    attainments bracket it; None where it lies outside them (no extrapolation)."""
    points = sorted((b["slo_attainment"], b["cost"], b["demand_factor"]) for b in bounds)
    for (a0, c0, f0), (a1, c1, f1) in itertools.pairwise(points):
        if a0 <= attainment <= a1 and a1 > a0:
            w = (attainment - a0) / (a1 - a0)
            return {"cost": c0 + w * (c1 - c0), "demand_factor": f0 + w * (f1 - f0)}
    return None


def _fmt_row(r: dict, sky: dict, bound: dict | None) -> str:
    slo = f"{100 * r['slo_attainment']:7.2f}" if "slo_attainment" in r else f"{'—':>7}"
    cold = f"{r['cold_start_waits']:9d}" if "cold_start_waits" in r else f"{'—':>9}"
    mig = f"{r['migrations']:6d}" if "migrations" in r else f"{'—':>6}"
    vs_cv = f"{r['cost'] / bound['cost']:6.2f}" if bound else f"{'—':>6}"
    return (f"{r['name']:<17} {r['cost']:9,.0f} {r['billed_gpu_h']:8.1f} {r['allocated_gpu_h']:8.1f} "
            f"{100 * r['fragmentation']:6.1f} {slo} {cold} {mig} {r['cost'] / sky['cost']:6.2f} {vs_cv}")


def render(results: dict, catalog: str, seed: int) -> tuple[str, dict[str, bool]]:
    sky, bound, ours = results["skyserve"], results.get("clairvoyant"), results["nimbus"]
    header = (f"{'contender':<17} {'$ / day':>9} {'billed':>8} {'alloc.':>8} {'frag%':>6} {'SLO%':>7} "
              f"{'coldwait':>9} {'moves':>6} {'xSky':>6} {'xClair':>6}")
    lines = [f"catalog {catalog}, seed {seed}: GPU-hours billed / allocated (held by a replica), fragmentation = "
             "billed GPU-hours no replica holds", header, "-" * len(header)]
    order = [*CONTENDERS, *sorted(k for k in results if k.startswith("skyserve-x")), *DIAGNOSTICS, "clairvoyant"]
    for name in order:
        if name in results:
            lines.append(_fmt_row(results[name], sky, bound))
    checks: dict[str, bool] = {}
    if catalog == "sample":
        checks[f"sample: nimbus cost <= 0.6x skyserve ({ours['cost'] / sky['cost']:.2f}x)"] = (
            ours["cost"] <= 0.6 * sky["cost"])
        checks[f"sample: nimbus SLO attainment >= skyserve ({100 * ours['slo_attainment']:.2f}% vs "
               f"{100 * sky['slo_attainment']:.2f}%)"] = ours["slo_attainment"] >= sky["slo_attainment"]
    checks[f"{catalog}: nimbus fragmentation <= 10% of billed GPU-hours ({100 * ours['fragmentation']:.1f}%)"] = (
        ours["fragmentation"] <= 0.10)
    if bound:
        checks[f"{catalog}: nimbus cost <= 1.2x clairvoyant ({ours['cost'] / bound['cost']:.2f}x)"] = (
            ours["cost"] <= 1.2 * bound["cost"])
    lines.append("")
    lines += [f"[{'PASS' if ok else 'FAIL'}] {text}" for text, ok in checks.items()]
    # per pool
    lines.append("")
    names = [n for n in CONTENDERS if n in results]
    head = f"{'pool':<18} {'requests':>9} " + " ".join(f"{n[:16]:>16} {'$':>7}" for n in names)
    lines += ["per pool: SLO % and $ of the GPUs its replicas held (fragmentation not attributed)", head,
              "-" * len(head)]
    for pool in results[names[0]]["pools"]:
        row = f"{pool:<18} {results[names[0]]['pools'][pool]['requests']:9d} "
        row += " ".join(f"{100 * results[n]['pools'][pool]['slo_attainment']:16.2f} "
                        f"{results[n]['pools'][pool]['cost']:7.0f}" for n in names)
        lines.append(row)
    lines.append("")
    lines.append("where the money went ($): " + "; ".join(
        f"{n}: loading {results[n]['held_cost'].get('loading', 0):,.0f}, serving "
        f"{results[n]['held_cost'].get('serving', 0):,.0f}, draining {results[n]['held_cost'].get('draining', 0):,.0f}"
        f", unallocated {results[n]['fragmentation_cost']:,.0f}" for n in names))
    for n in [*names, *(d for d in DIAGNOSTICS if d in results)]:
        r = results[n]
        if r.get("idle_cost") is None or n == "skyserve":
            continue
        held = r["held_cost"]
        main = [p for p in r["pools"] if not p.startswith("tail-")]
        lines.append(
            f"{n}: decomposition ($): unallocated " + ", ".join(
                f"{k} {v:,.0f}" for k, v in sorted(r["idle_cost"].items(), key=lambda kv: -kv[1]) if k != "floor")
            + f" (the shapes' packing floor: {r['idle_cost'].get('floor', 0):,.0f}; in GPU-h: " + ", ".join(
                f"{k} {v:.1f}" for k, v in sorted(r["idle_gpu_h_by_cause"].items(), key=lambda kv: -kv[1])) + ")"
            + f"; loading {held.get('loading', 0):,.0f} (moves' copies {held.get('loading-move', 0):,.0f})"
            + f", draining {held.get('draining', 0):,.0f} (moves' originals {held.get('draining-move', 0):,.0f})"
            + f"; GPU-type premium over each pool's cheapest $/req/s {sum(r['type_premium'].values()):,.0f}"
            + "; ready capacity / demand " + ", ".join(
                f"{p} {r['ready_over_demand'][p]:.2f}" for p in main if r["ready_over_demand"].get(p)))
    for n in [*names, *(d for d in DIAGNOSTICS if d in results)]:
        sp = results[n].get("spares")
        if sp and any(sp.values()):
            lines.append(f"{n}: spare replicas (controlplane.fleet.spares): {sp['placed']} started on free slots, "
                         f"{sp['promoted']} promoted by a scale-up, {sp['demoted']} kept from a scale-down, "
                         f"{sp['evicted']} stopped for a replica placed on their GPUs")
    for n in names:
        idle = results[n].get("idle_gpu_h_by_fill", {})
        if idle:
            lines.append(f"{n}: unallocated GPU-hours by node fill (held/GPUs): " + ", ".join(
                f"{k} {v:.1f}" for k, v in list(idle.items())[:6]))
    for n in names:
        tails = [d for p, d in results[n]["pools"].items() if p.startswith("tail-") and d.get("cold_starts")]
        starts = sum(d["cold_starts"] for d in tails)
        if starts:
            mean = sum(d["cold_start_mean_s"] * d["cold_starts"] for d in tails) / starts
            lines.append(f"{n}: tail pools: {starts} cold starts, mean {mean:.0f} s from placement to ready")
    lines += phase_lines(results)
    if bound:
        ex = bound["exact_check"]
        lines.append(f"clairvoyant: {bound['intervals']} intervals of {clairvoyant.INTERVAL_S:.0f} s, GPU-pooled "
                     f"relaxation (a valid lower bound); equal to tests/fleet/milp.py exact_min_cost on "
                     f"{ex['equal_to_exact_min_cost']}/{ex['sampled']} sampled intervals (worst gap "
                     f"{100 * ex['worst_gap']:.2f}%)")
    if "skyserve" in results:
        lines.append("skyserve shapes: " + "; ".join(f"{p}: {s}" for p, s in results["skyserve"]["shapes"].items()
                                                     if not p.startswith("tail-")) + "; tail pools likewise")
    return "\n".join(lines), checks


def phase_lines(results: dict) -> list[str]:
    """Where each row's SLO misses are, and the bound's cost at each contender's attainment."""
    lines = ["", "SLO attainment by the load's phase at arrival (burst: inside a main pool's 1.8-3x burst; "
             "after-burst: the 10 minutes after one; steady: the rest of the main pools' day; episode: "
             "long-tail traffic), % (share of requests):"]
    names = [n for n in [*CONTENDERS, *DIAGNOSTICS, "clairvoyant", *sorted(k for k in results
                                                                         if k.startswith("clairvoyant-x"))]
             if n in results and "slo_by_phase" in results[n]]
    for n in names:
        phases = results[n]["slo_by_phase"]
        total = sum(d["requests"] for d in phases.values()) or 1.0
        lines.append(f"  {n:<18} " + ", ".join(
            f"{ph} {100 * phases[ph]['attainment']:.2f} ({100 * phases[ph]['requests'] / total:.1f}%)"
            for ph in PHASES if ph in phases))
    bounds = [results[k] for k in results if k.startswith("clairvoyant") and "slo_attainment" in results[k]]
    if len(bounds) > 1:
        lines.append("clairvoyant provisioned for f x each interval's demand, its replicas through the same queue: "
                     + "; ".join(f"f {b['demand_factor']:g}: ${b['cost']:,.0f} at {100 * b['slo_attainment']:.2f}%"
                                 for b in sorted(bounds, key=lambda b: b["demand_factor"])))
        for n in [*CONTENDERS, *DIAGNOSTICS]:
            if n not in results or "slo_attainment" not in results[n]:
                continue
            r = results[n]
            eq = equal_slo_bound(bounds, r["slo_attainment"])
            r["equal_slo_bound"] = eq
            lines.append(f"  {n}: at its {100 * r['slo_attainment']:.2f}% the bound costs "
                         + (f"${eq['cost']:,.0f} (f {eq['demand_factor']:.3f}): {n} is {r['cost'] / eq['cost']:.2f}x"
                            if eq else "— (outside the factors' attainments)"))
    return lines


def code_version() -> dict:
    """The commit the run measured, and whether the code under test had local changes."""
    def git(*args: str) -> str:
        try:
            # not stripped: a status line starts with its two status columns, a space among them
            return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    paths = ["controlplane/autoscaler", "controlplane/fleet", "bench/fleet", "bench/autoscale", "dataplane/sim"]
    return {"commit": git("rev-parse", "HEAD").strip(),
            "dirty": [line[3:] for line in git("status", "--porcelain", "--", *[f":/{p}" for p in paths]).splitlines()
                      if not line[3:].startswith("bench/fleet/results")]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--catalog", choices=["sample", "fine"], default="sample")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", action="append", metavar="NAME",
                   help=f"run only these ({', '.join([*CONTENDERS, *DIAGNOSTICS, 'clairvoyant'])}, skyserve-xF)")
    p.add_argument("--skyserve-headroom", type=float, action="append", default=[], metavar="F",
                   help="also run SkyServe planning each VM for F x its calibrated QPS (a row skyserve-xF)")
    p.add_argument("--no-oracle", action="store_true", help="skip the diagnostic rows (nimbus-oracle, nimbus-no-spares)")
    p.add_argument("--load-scale", type=float, default=1.0, help="multiply the main pools' request rates")
    p.add_argument("--fleet", choices=FLEETS, default="default",
                   help="h100: pools that accept an H100 accept only H100s (see models.fleet_variants)")
    p.add_argument("--underused-fraction", type=float, help="consolidation budget override (default 1.0)")
    p.add_argument("--nodes-in-flight", type=int, help="consolidation budget override (default 1)")
    p.add_argument("--settle", type=float, help="consolidation budget override: settle_s (default 300)")
    p.add_argument("--moves-per-pool", type=int, help="consolidation budget override (default 1)")
    p.add_argument("--autoscaler", action="append", default=[], metavar="FIELD=VALUE",
                   help="bench-only AutoscalerConfig override for nimbus rows (the headroom's sensitivity)")
    p.add_argument("--empty-node-ttl", type=float, help=f"empty-node TTL, s (default {sim.EMPTY_NODE_TTL_S:g})")
    p.add_argument("--json", help="where to write the results (default bench/fleet/results-<catalog>.json)")
    p.add_argument("--recalibrate", action="store_true", help="measure the replica capacities again")
    p.add_argument("--scale", action="store_true", help="time one fleet tick on 10k nodes / 50k replicas instead")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scale:
        from bench.fleet import tick

        return tick.main([])
    started = time.time()
    offers = offers_for(args.catalog)
    variants = fleet_variants(args.fleet)
    caps = capacities(variants, {o.gpu_type for o in offers}, jobs=args.jobs, recalibrate=args.recalibrate)
    print(f"{len(variants)} pools, {len(offers)} offers ({args.catalog} catalog); replica capacity at the "
          "TTFT SLO (req/s):")
    for v in variants:
        print(f"  {v.pool_id:<18} {v.model} {v.quantization or 'bf16'} x{v.gpus} {v.kind:<13} " + ", ".join(
            f"{g} {c.qps:.2f}" for g, c in caps[v.pool_id].items()))
    budget = {k: v for k, v in (("underused_fraction", args.underused_fraction),
                                ("max_nodes_in_flight", args.nodes_in_flight), ("settle_s", args.settle),
                                ("max_moves_per_pool", args.moves_per_pool)) if v is not None}
    autoscaler = {}
    for item in args.autoscaler:
        key, _, value = item.partition("=")
        autoscaler[key] = float(value)
    ttl = sim.EMPTY_NODE_TTL_S if args.empty_node_ttl is None else args.empty_node_ttl
    kinds = args.only or [*CONTENDERS, *([] if args.no_oracle else DIAGNOSTICS), "clairvoyant"]
    kinds += [f"skyserve-x{f:g}" for f in args.skyserve_headroom]
    if "clairvoyant" in kinds:
        kinds += [bound_row(f) for f in BOUND_FACTORS if f != 1.0]
    results: dict[str, dict] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {k: pool.submit(run_row, k, args.catalog, args.seed, args.hours, args.load_scale, budget,
                                  args.fleet, autoscaler, ttl)
                   for k in kinds}
        for k, f in futures.items():
            results[k] = f.result()
    if "skyserve" in results and "nimbus" in results:
        text, checks = render(results, args.catalog, args.seed)
        print(text)
    else:
        checks = {}
        for r in results.values():
            print(r["name"], f"${r['cost']:,.0f}", f"{r['billed_gpu_h']:.1f} GPU-h billed")
    print(f"({time.time() - started:.0f} s)")
    suffix = "" if args.seed == 1 else f"-seed{args.seed}"
    if (args.load_scale != 1.0 or budget or args.hours != 24.0 or args.fleet != "default" or autoscaler
            or args.empty_node_ttl is not None):
        suffix += "-variant"
    path = Path(args.json) if args.json else HERE / f"results-{args.catalog}{suffix}.json"
    path.write_text(json.dumps({"catalog": args.catalog, "seed": args.seed, "hours": args.hours,
                                "load_scale": args.load_scale, "fleet": args.fleet, "budget": budget,
                                "autoscaler": autoscaler, "empty_node_ttl_s": ttl,
                                "code": code_version(),
                                "checks": checks, "results": results}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
