"""Fairness: one tenant floods at ten times the others' rate. The others' TTFT p99 with the flood,
against their solo baseline (same router, no flood): Nimbus edge vs sglang-router, same fleet.

    .venv/bin/python -m bench.edge.fairness [--rate 5] [--slots 16] [--duration 20] [--repeat 3]

Defaults: 2 replicas x 16 running slots, the simulator at half speed (32 output tokens take about
half a second), 4 tenants at 5 req/s and one at 50 req/s. The flood alone asks for more than the
fleet can serve, so something has to wait: sglang-router
(no notion of tenants) lets the flood fill the engines' queues; the edge keeps the excess in its
fair queue and lets the quiet tenants through first.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from bench.edge.common import (
    Client,
    bench_key,
    flush_caches,
    new_session,
    nimbus_edge,
    pct,
    run_async,
    sglang_router,
    table,
)
from bench.edge.workload import open_loop, tenants
from dataplane.sim.process import sim_fleet


async def phase(url: str, tenant_list, args, flood: bool) -> dict[str, float]:
    async with new_session() as session:
        client = Client(url, session)
        # warm-up (connections, first-request costs), not measured
        await asyncio.gather(*(open_loop(client, t, random.Random(i), 4.0, 1.0, args.prompt_words, 4)
                               for i, t in enumerate(tenant_list[1:])))
        client.results.clear()
        jobs = []
        for i, t in enumerate(tenant_list):
            is_flood = i == 0
            if is_flood and not flood:
                continue
            rate = args.rate * (10 if is_flood else 1)
            jobs.append(open_loop(client, t, random.Random(args.seed + i), rate, args.duration, args.prompt_words,
                                  args.max_tokens))
        t0 = time.monotonic()
        await asyncio.gather(*jobs)
        wall = time.monotonic() - t0
    others = [r for r in client.results if r.tenant != tenant_list[0].name]
    ok = [r for r in others if r.ok]
    flood_res = [r for r in client.results if r.tenant == tenant_list[0].name]
    ttft = [r.ttft * 1000 for r in ok]
    return {"others": len(others), "others_err": len(others) - len(ok), "p50": pct(ttft, 50), "p99": pct(ttft, 99),
            "flood": len(flood_res), "flood_ok": sum(r.ok for r in flood_res), "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--others", type=int, default=4, help="well-behaved tenants")
    ap.add_argument("--rate", type=float, default=5.0, help="req/s of each well-behaved tenant (flood: 10x)")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16, help="max running requests per replica")
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--stream-interval", type=int, default=1, help="engine tokens per streamed chunk")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--repeat", type=int, default=3, help="alternating rounds of edge and sglang-router; medians")
    ap.add_argument("--only-edge", action="store_true", help="skip sglang-router (for tuning)")
    ap.add_argument("--edge-set", action="append", default=[], metavar="FIELD=VALUE",
                    help="edge setting override for experiments, e.g. fair_burst_slots=2")
    args = ap.parse_args()
    n = args.others + 1
    keys = [bench_key(f"f{i}") for i in range(n)]
    edge_tenants = [{"name": f"tenant{i:02d}", "keys": [{"dev_key": k}]} for i, k in enumerate(keys)]
    sim_args = ["--time-scale", str(args.time_scale), "--max-running-requests", str(args.slots),
                "--stream-interval", str(args.stream_interval)]
    print(f"{args.others} tenants at {args.rate} req/s each + 1 tenant at {10 * args.rate} req/s; "
          f"{args.replicas} replicas x {args.slots} slots; {args.duration:.0f} s per phase")
    runs: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {"nimbus-edge": [], "sglang-router": []}
    with sim_fleet(args.replicas, served_model_name="demo", extra_args=sim_args, ready_delay=0.0) as fleet:
        urls = [s.url for s in fleet]
        replicas = [{"url": u, "max_running_requests": args.slots} for u in urls]
        edge_settings = {"health_interval_s": 30, "queue_timeout_s": 30, **dict(kv.split("=", 1) for kv in args.edge_set)}
        # Alternating rounds, each on its own arrival sample (seed + 100 x round) that both routers get: the
        # p99 of ~400 requests is their 4th-worst, so one round moves the ratio a lot.
        for rnd in range(args.repeat):
            round_args = argparse.Namespace(**{**vars(args), "seed": args.seed + 100 * rnd})
            with nimbus_edge(replicas, edge_tenants, edge_settings) as edge:
                runs["nimbus-edge"].append(solo_and_flood(edge, tenants(n, args.prompt_words, args.seed, keys),
                                                          round_args, urls))
            if not args.only_edge:
                with sglang_router(urls, "cache_aware") as router:
                    runs["sglang-router"].append(solo_and_flood(
                        router, tenants(n, args.prompt_words, args.seed, [None] * n), round_args, urls))
    rows = [["router", "others solo p99 ms", "others flood p99 ms", "p99 ratio", "ratio per run",
             "others p50 solo/flood ms", "others err", "flood ok/sent"]]
    ratios = {}
    for name, pairs in runs.items():
        if not pairs:
            continue
        per_run = [flood["p99"] / solo["p99"] for solo, flood in pairs]
        ratios[name] = statistics.median(per_run)
        rows.append([name, f"{median_of(pairs, 0, 'p99'):.0f}", f"{median_of(pairs, 1, 'p99'):.0f}",
                     f"{ratios[name]:.2f}x", " ".join(f"{r:.2f}" for r in per_run),
                     f"{median_of(pairs, 0, 'p50'):.0f}/{median_of(pairs, 1, 'p50'):.0f}",
                     str(sum(int(f["others_err"]) for _, f in pairs)),
                     f"{sum(int(f['flood_ok']) for _, f in pairs)}/{sum(int(f['flood']) for _, f in pairs)}"])
    print(table(rows))
    summary = f"\nothers' TTFT p99 under the flood vs solo (median of {args.repeat}): edge {ratios['nimbus-edge']:.2f}x"
    if "sglang-router" in ratios:
        summary += f" (target <= 1.5x), sglang-router {ratios['sglang-router']:.2f}x"
    print(summary)


def median_of(pairs: list[tuple[dict[str, float], dict[str, float]]], phase_index: int, key: str) -> float:
    return statistics.median(p[phase_index][key] for p in pairs)


def solo_and_flood(url: str, tenant_list, args, urls: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """The quiet tenants alone, then with the flood, each from empty caches."""
    flush_caches(urls)
    solo = run_async(phase(url, tenant_list, args, flood=False))
    flush_caches(urls)
    return solo, run_async(phase(url, tenant_list, args, flood=True))

if __name__ == "__main__":
    main()
