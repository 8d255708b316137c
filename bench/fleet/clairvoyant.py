"""The clairvoyant lower bound: every interval's demand known, moves instant and free, the
cheapest packing per interval.

Per interval (60 s) each pool's demand is its arrivals over the interval divided by its length
(floored to a 0.05 req/s grid; a pool with any arrival keeps a positive demand). The bound is
the minimum $/hour, over how many replicas each pool runs on each GPU type and how many VMs of
each shape are bought, such that

* each pool's replicas serve its demand at the calibrated per-replica rate (``Capacity.qps``);
* per GPU type the replicas' GPUs fit in the GPUs bought of that type (a replica needs a shape
  with at least its own GPU count).

That is a mixed-integer program (HiGHS through ``scipy.optimize.milp``) and a *relaxation* of
the real packing: GPUs are pooled per type instead of per VM. Every fleet that serves the
demand therefore costs at least this much, so it stays a valid lower bound. It is also what
``tests/fleet/milp.py::exact_min_cost`` gives for the same replicas whenever the replicas of a
type pack into its shapes without leftovers (power-of-two sizes into 4- and 8-GPU shapes):
``check_exact`` compares the two on a sample of intervals. Solving ``exact_min_cost`` itself
per interval is too slow (it enumerates one node variable per replica and site) and fixes each
pool's GPU type, which the bound must not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from bench.fleet.fluid import PoolQueue
from bench.fleet.models import Variant
from bench.fleet.profiles import Capacity
from controlplane.fleet.capacity import Offer, PoolNeed

INTERVAL_S = 60.0
GRID_RPS = 0.05


@dataclass
class Bound:
    cost: float = 0.0
    billed_gpu_h: float = 0.0
    allocated_gpu_h: float = 0.0
    intervals: int = 0
    solved: int = 0  # distinct demand vectors solved
    samples: list[tuple[tuple, dict]] = field(default_factory=list)  # (demand key, replicas per (pool, type))
    gpu_h_by_pool_type: dict[str, float] = field(default_factory=dict)  # "<pool>@<GPU type>" -> GPU-hours held
    # (first step, end step, replicas per (pool, GPU type)) per interval: what ``attainment`` replays
    plan: list[tuple[int, int, dict]] = field(default_factory=list)
    interval_cost: list[float] = field(default_factory=list)  # $ of each interval, in plan's order


def _solve(demand: Mapping[str, float], variants: Mapping[str, Variant], caps: Mapping[str, Mapping[str, Capacity]],
           offers: Sequence[Offer]) -> tuple[float, float, float, dict]:
    offers = [o for o in offers if not o.spot and o.zones]
    types = sorted({o.gpu_type for o in offers})
    xs = []  # (pool, type)
    for pool, lam in demand.items():
        if lam <= 0:
            continue
        v = variants[pool]
        for t in caps[pool]:
            if any(o.gpu_type == t and o.gpu_count >= v.gpus and o.gpu_memory_gb >= v.gpu_memory_gb for o in offers):
                xs.append((pool, t))
    if not xs:
        return 0.0, 0.0, 0.0, {}
    nx, ny = len(xs), len(offers)
    cost = np.concatenate([np.zeros(nx), [o.price_per_hour for o in offers]])
    rows, lo, hi = [], [], []
    for pool, lam in demand.items():
        if lam <= 0:
            continue
        row = np.zeros(nx + ny)
        for j, (p, t) in enumerate(xs):
            if p == pool:
                row[j] = caps[p][t].qps
        rows.append(row)
        lo.append(lam)
        hi.append(np.inf)
    for t in types:
        row = np.zeros(nx + ny)
        for j, (p, tt) in enumerate(xs):
            if tt == t:
                row[j] = variants[p].gpus
        for k, o in enumerate(offers):
            if o.gpu_type == t:
                row[nx + k] = -o.gpu_count
        rows.append(row)
        lo.append(-np.inf)
        hi.append(0.0)
    res = milp(cost, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=np.ones(nx + ny),
               bounds=Bounds(np.zeros(nx + ny), np.full(nx + ny, np.inf)))
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"clairvoyant MILP not solved: {res.message}")
    x = np.round(res.x).astype(int)
    billed = sum(x[nx + k] * o.gpu_count for k, o in enumerate(offers))
    allocated = sum(x[j] * variants[p].gpus for j, (p, _) in enumerate(xs))
    replicas = {xs[j]: int(x[j]) for j in range(nx) if x[j]}
    return float(res.fun), float(billed), float(allocated), replicas


def lower_bound(arrivals: Mapping[str, np.ndarray], dt: float, first_step: int, variants: Mapping[str, Variant],
                caps: Mapping[str, Mapping[str, Capacity]], offers: Sequence[Offer],
                demand_factor: float = 1.0) -> Bound:
    """``arrivals[pool][k]`` counts requests of step k (``dt`` long); the day starts at ``first_step``.

    ``demand_factor`` provisions every interval for that multiple of its demand: above 1 the
    bound's price of a higher SLO attainment, below 1 what it saves at a lower one
    (``attainment`` measures what it gets)."""
    per = round(INTERVAL_S / dt)
    pools = sorted(arrivals)
    steps = len(arrivals[pools[0]]) - first_step
    memo: dict[tuple, tuple] = {}
    bound = Bound()
    hours = INTERVAL_S / 3600
    for i in range(math.ceil(steps / per)):
        a, b = first_step + i * per, min(first_step + (i + 1) * per, first_step + steps)
        span = (b - a) * dt
        key = []
        for p in pools:
            lam = demand_factor * float(arrivals[p][a:b].sum()) / span
            floored = math.floor(lam / GRID_RPS) * GRID_RPS
            key.append(max(floored, 1e-6) if lam > 0 else 0.0)
        key_t = tuple(key)
        if key_t not in memo:
            memo[key_t] = _solve(dict(zip(pools, key_t, strict=True)), variants, caps, offers)
            if len(bound.samples) < 400 and len(memo) % 7 == 1:
                bound.samples.append((key_t, memo[key_t][3]))
        c, billed, allocated, replicas = memo[key_t]
        bound.plan.append((a, b, replicas))
        h = hours * span / INTERVAL_S
        bound.interval_cost.append(c * h)
        for (p, t), k in replicas.items():
            key_pt = f"{p}@{t}"
            bound.gpu_h_by_pool_type[key_pt] = bound.gpu_h_by_pool_type.get(key_pt, 0.0) + k * variants[p].gpus * h
        bound.cost += c * h
        bound.billed_gpu_h += billed * h
        bound.allocated_gpu_h += allocated * h
        bound.intervals += 1
    bound.solved = len(memo)
    return bound


def attainment(bound: Bound, arrivals: Mapping[str, np.ndarray], dt: float, start_s: float,
               variants: Mapping[str, Variant], caps: Mapping[str, Mapping[str, Capacity]],
               phases: Mapping[str, Callable[[float], str]] | None = None) -> dict[str, PoolQueue]:
    """The bound's replicas, interval by interval, through the contenders' queueing model
    (``fluid.PoolQueue``, the same arrivals): the SLO attainment the bound's cost buys. At a
    factor of 1 every replica runs at its calibrated rate, where the calibration itself keeps
    only 95-97 % of requests inside the SLO, and a minute's Poisson peak queues: a bound that
    is cheap *and* as good as a contender exists only at a higher ``demand_factor``. ``start_s``
    is the time of step 0 (the contenders' clock, on which the day starts at 0)."""
    queues = {p: PoolQueue(variants[p].slo_s, phase_of=(phases or {}).get(p)) for p in arrivals}
    for a, b, replicas in bound.plan:
        servers: dict[str, list] = {p: [] for p in arrivals}
        for (p, t), k in replicas.items():
            servers[p].append((k, caps[p][t]))
        for step in range(a, b):
            for p, q in queues.items():
                q.step(start_s + step * dt, dt, int(arrivals[p][step]), servers[p])
    for q in queues.values():
        q.close()
    return queues


def check_exact(bound: Bound, variants: Mapping[str, Variant], offers: Sequence[Offer], limit: int = 40,
                time_limit: float = 10.0) -> tuple[int, int, float]:
    """(sampled intervals, those where the relaxation equals exact_min_cost for the same replicas,
    worst relative gap). Imports the exact MILP from tests/fleet/milp.py."""
    from tests.fleet.milp import exact_min_cost

    od = [o for o in offers if not o.spot and o.zones]
    same, worst, n = 0, 0.0, 0
    for _, replicas in bound.samples[:limit]:
        if not replicas:
            continue
        needs = [PoolNeed(pool_id=f"{p}@{t}", gpus_per_replica=variants[p].gpus,
                          gpu_memory_gb=variants[p].gpu_memory_gb, gpu_types=(t,), missing_on_demand=k)
                 for (p, t), k in replicas.items()]
        relaxed = _cost_of(replicas, variants, od)
        exact = exact_min_cost(needs, od, time_limit=time_limit)
        n += 1
        gap = (exact - relaxed) / max(exact, 1e-9)
        worst = max(worst, gap)
        same += gap < 1e-6
    return n, same, worst


def _cost_of(replicas: Mapping[tuple[str, str], int], variants: Mapping[str, Variant], offers: Sequence[Offer]) -> float:
    """The relaxation's cost for fixed replicas: per GPU type, the cheapest GPUs that hold them."""
    total = 0.0
    by_type: dict[str, int] = {}
    for (p, t), k in replicas.items():
        by_type[t] = by_type.get(t, 0) + k * variants[p].gpus
    for t, gpus in by_type.items():
        shapes = [o for o in offers if o.gpu_type == t]
        n = len(shapes)
        cost = np.array([o.price_per_hour for o in shapes])
        row = np.array([[o.gpu_count for o in shapes]], dtype=float)
        res = milp(cost, constraints=LinearConstraint(row, [gpus], [np.inf]), integrality=np.ones(n),
                   bounds=Bounds(np.zeros(n), np.full(n, np.inf)))
        total += float(res.fun)
    return total
