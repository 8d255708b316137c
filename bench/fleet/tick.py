"""Time one fleet tick's pure planning on a big fleet: 10k nodes, 50k replicas.

    .venv/bin/python -m bench.fleet.tick [--nodes 10000] [--replicas 50000] [--pools 2000] [--seed 1]

A seeded synthetic fleet on the fine catalog's shapes (8-GPU H100, 4-GPU L40S, 1/2-GPU L4 and
A10G nodes in all regions), pools of 1-, 2- and 4-GPU replicas spread over it, a tenth of the
nodes underused long enough to be consolidation candidates. One tick = what
``controlplane.fleet.reconcile.fleet_tick`` runs: ``choose_surplus`` for the pools that shrink,
``plan_placement`` for the pools that grow (missing replicas summing to ``--missing``), then
``plan_consolidation``, then ``plan_spares`` for the free slots and ``plan_swaps`` over them, with
the default budget (1 node in flight) and with a wide one. Then the
worst cases: more missing than the free GPUs (new nodes), a mass launch (every pool misses 10
more replicas: thousands of pools need new nodes at once) and a cold start (an empty fleet, all
of its replicas missing). Target: <= 2 s for the whole tick, each of them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter, defaultdict

from bench.fleet.catalog import fine_offers
from controlplane.fleet.capacity import ConsolidationBudget, HostedReplica, NodeSlots, PoolNeed
from controlplane.fleet.consolidation import plan_consolidation
from controlplane.fleet.placement import choose_surplus, pick_gpus, plan_placement, tokens_per_s
from controlplane.fleet.spares import plan_spares, plan_swaps

NOW = 1_000_000.0


def build(n_nodes: int, n_replicas: int, n_pools: int, seed: int):
    rng = random.Random(seed)
    offers = [o for o in fine_offers() if not o.spot]
    groups = ([o for o in offers if o.gpu_type == "h100" and o.gpu_count == 8],
              [o for o in offers if o.gpu_type == "l40s" and o.gpu_count == 4],
              [o for o in offers if o.gpu_type in ("l4", "a10g") and o.gpu_count in (1, 2)])
    pools = {}
    for k in range(n_pools):
        gpus = rng.choices((1, 2, 4), (0.8, 0.14, 0.06))[0]
        types = ("h100",) if gpus > 1 else rng.choice((("h100", "l40s"), ("l4", "a10g", "l40s"), ("h100",)))
        memory = 80.0 if types == ("h100",) else (24.0 if "l4" in types else 40.0)
        pools[f"pool-{k:05d}"] = PoolNeed(f"pool-{k:05d}", gpus, memory, gpu_types=types,
                                          tokens_per_s={t: rng.uniform(500, 5000) for t in types},
                                          model_path=f"org/model-{k:05d}")
    by_fit: dict[tuple[str, int], list[str]] = defaultdict(list)
    for pid, need in pools.items():
        for t in need.gpu_types:
            by_fit[(t, need.gpus_per_replica)].append(pid)
    hosted_before = {t: sorted(by_fit[(t, 1)]) or sorted(pools) for t in ("h100", "l40s", "l4", "a10g")}
    nodes, placed = [], 0
    for i in range(n_nodes):
        o = rng.choice(rng.choices(groups, (0.75, 0.18, 0.07))[0])
        zone = rng.choice(o.zones)
        free = (1 << o.gpu_count) - 1
        reps = []
        underused = rng.random() < 0.1
        # nodes mostly full, so the fleet holds about n_replicas; a tenth hold a single replica
        want = 1 if underused else o.gpu_count
        for _ in range(want):
            sizes = [g for g in (1, 2, 4) if g <= o.gpu_count and by_fit.get((o.gpu_type, g))]
            if not sizes or placed >= n_replicas:
                break
            g = rng.choices(sizes, (0.85, 0.1, 0.05)[: len(sizes)])[0]
            ids = pick_gpus(free, o.gpu_count, g)
            if ids is None:
                ids = pick_gpus(free, o.gpu_count, 1) if by_fit.get((o.gpu_type, 1)) else None
                if ids is None:
                    break
                g = 1
            free &= ~sum(1 << x for x in ids)
            pid = rng.choice(by_fit[(o.gpu_type, g)])
            reps.append(HostedReplica(f"r{placed:06d}", pid, ids, ready=True, model_ready_s=rng.uniform(30, 180)))
            placed += 1
        nodes.append(NodeSlots(
            node_id=f"n{i:05d}", cloud=o.cloud, region=o.region, zone=zone, instance_type=o.instance_type,
            gpu_type=o.gpu_type, gpus_total=o.gpu_count, spot=False, dedicated_tenant_id=None,
            price_per_hour=o.price_per_hour, replicas=tuple(reps), launched=True, ready=True,
            underused_since=NOW - 900 if underused else None, gpu_memory_gb=o.gpu_memory_gb,
            # the checkpoints of what it hosts and of a few pools it hosted before
            cached_models=frozenset([pools[r.pool_id].model_path for r in reps]
                                    + [pools[p].model_path for p in rng.sample(hosted_before[o.gpu_type], k=3)])))
    return offers, pools, nodes, placed


def tick(offers, pools, nodes, rng: random.Random, missing: int, budget: ConsolidationBudget,
         per_pool: dict[str, int] | None = None) -> dict[str, float]:
    """One tick; the growing pools miss ``missing`` replicas in all (1-5 each, the last one the
    rest) or, with ``per_pool``, exactly that many each (the shrinking pools aside)."""
    timings = {}
    by_pool: dict[str, list[NodeSlots]] = defaultdict(list)
    for n in nodes:
        for pid in {r.pool_id for r in n.replicas}:
            by_pool[pid].append(n)
    shrinking = rng.sample(sorted(by_pool), k=min(len(by_pool), len(pools) // 10))
    t0 = time.perf_counter()
    stopped = 0
    for pid in shrinking:
        stopped += len(choose_surplus(pid, 0, 2, by_pool[pid]))
    timings["choose_surplus"] = time.perf_counter() - t0
    if per_pool is None:
        growing = [p for p in rng.sample(sorted(pools), k=min(len(pools), max(1, missing // 3)))
                   if p not in shrinking]
        counts, left = {}, missing
        for k, pid in enumerate(growing):
            count = left if k == len(growing) - 1 else min(left, rng.randint(1, 5))
            if count <= 0:
                break
            left -= count
            counts[pid] = count
    else:
        counts = {pid: n for pid, n in sorted(per_pool.items()) if n > 0 and pid not in shrinking}
    needs = []
    for pid, count in counts.items():
        p = pools[pid]
        needs.append(PoolNeed(p.pool_id, p.gpus_per_replica, p.gpu_memory_gb, gpu_types=p.gpu_types,
                              missing_on_demand=count, tokens_per_s=p.tokens_per_s, model_path=p.model_path))
    t0 = time.perf_counter()
    plan = plan_placement(needs, nodes, offers)
    timings["plan_placement"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    actions = plan_consolidation(nodes, pools, offers, NOW, budget, scaling_up=frozenset(n.pool_id for n in needs))
    timings["plan_consolidation"] = time.perf_counter() - t0
    # reconcile.fill_spares: the free slots of the fleet's nodes (as placement left them) take spares
    t0 = time.perf_counter()
    serving: dict[str, float] = defaultdict(float)
    for n in nodes:
        for r in n.replicas:
            serving[r.pool_id] += tokens_per_s(pools[r.pool_id], n.gpu_type)
    spares = plan_spares([n for n in nodes if n.free_gpus], pools, serving, {}, max_ratio=2.0)
    timings["plan_spares"] = time.perf_counter() - t0
    # reconcile.swap_spares: those spares, ready, stand in for the replicas of nodes they can empty
    spares_on: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for k, sp in enumerate(spares):
        spares_on[sp.node_id].append((f"spare-{k}", sp.pool_id, True))
    t0 = time.perf_counter()
    swaps = plan_swaps(nodes, spares_on, pools)
    timings["plan_swaps"] = time.perf_counter() - t0
    timings["tick"] = sum(timings.values())
    timings.update(stopped=stopped, placed=len(plan.placed), launches=len(plan.launches),
                   launch_cost=sum(n.offer.price_per_hour for n in plan.launches),
                   unplaced=sum(n for _, n, _ in plan.unplaced), actions=len(actions),
                   moves=sum(len(a.moves) for a in actions), spares=len(spares), swaps=len(swaps))
    return timings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--replicas", type=int, default=50_000)
    p.add_argument("--pools", type=int, default=2_000)
    p.add_argument("--missing", type=int, default=1_000, help="replicas the growing pools miss in total")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    offers, pools, nodes, placed = build(args.nodes, args.replicas, args.pools, args.seed)
    gpus = sum(n.gpus_total for n in nodes)
    used = sum(len(n.used) for n in nodes)
    print(f"fleet: {len(nodes)} nodes, {gpus} GPUs ({used} held), {placed} replicas of {len(pools)} pools, "
          f"{sum(1 for n in nodes if n.underused_since is not None)} underused; built in {time.perf_counter() - t0:.1f} s")
    checks = []
    free = gpus - used
    scenarios = (
        (f"{args.missing} missing, default budget (1 node in flight)", args.missing, ConsolidationBudget()),
        (f"{args.missing} missing, wide budget (100 nodes in flight)", args.missing,
         ConsolidationBudget(max_nodes_in_flight=100)),
        (f"{free + 5000} missing (more than the {free} free GPUs: new nodes), default budget", free + 5000,
         ConsolidationBudget()),
    )
    # the worst ticks: thousands of pools on new nodes at once, and a fleet built from nothing
    held = Counter(r.pool_id for n in nodes for r in n.replicas)
    worst_cases = (
        (f"mass launch: every pool misses 10 more ({10 * len(pools)} missing, more than the {free} free GPUs), "
         "default budget",
         nodes, {pid: 10 for pid in pools}),
        (f"cold start: empty fleet, its {placed} replicas missing, default budget", [], dict(held)),
    )
    runs_of = [(label, nodes, missing, budget, None) for label, missing, budget in scenarios]
    runs_of += [(label, fleet, sum(per_pool.values()), ConsolidationBudget(), per_pool)
                for label, fleet, per_pool in worst_cases]
    for label, fleet, missing, budget, per_pool in runs_of:
        runs = [tick(offers, pools, fleet, random.Random(args.seed + k), missing, budget, per_pool)
                for k in range(args.repeat)]
        worst = max(runs, key=lambda r: r["tick"])
        print(f"{label}: worst of {args.repeat} ticks {worst['tick']:.2f} s (choose_surplus "
              f"{worst['choose_surplus']:.2f} s, plan_placement {worst['plan_placement']:.2f} s, plan_consolidation "
              f"{worst['plan_consolidation']:.2f} s, plan_spares {worst['plan_spares']:.2f} s, plan_swaps "
              f"{worst['plan_swaps']:.2f} s); {worst['placed']} placed, "
              f"{worst['spares']} spares, {worst['swaps']} swaps, {worst['launches']} new nodes "
              f"(${worst['launch_cost']:,.2f}/h), "
              f"{worst['unplaced']} unplaced, {worst['stopped']} stopped, {worst['actions']} consolidation actions "
              f"({worst['moves']} moves)")
        checks.append((f"tick <= 2 s on {len(fleet)} nodes / {placed} replicas, {label} "
                       f"({worst['tick']:.2f} s)", worst["tick"] <= 2.0))
    for text, ok in checks:
        print(f"[{'PASS' if ok else 'FAIL'}] {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
