"""Routing quality on a multi-tenant shared-prefix workload: the Nimbus edge (predicted TTFT) vs
sglang-router cache_aware vs round robin, on the same simulator fleet (caches flushed between runs).

    .venv/bin/python -m bench.edge.routing [--tenants 32] [--users 4] [--turns 5] [--prefix-words 3000]

Dozens of tenants, each with a long system prompt; several users per tenant (Zipf-distributed
tenant sizes, as on a real platform) in multi-turn chats.
Four replicas whose KV cache cannot hold every tenant's prefix at once, but could if the prefixes
were partitioned across them. Reports TTFT p50/p90/p99, output tokens/s and the prompt cache hit
rate (cached / prompt tokens, as the engines report them).
"""

from __future__ import annotations

import argparse
import asyncio
import random
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
from bench.edge.workload import conversation, tenants
from dataplane.sim.process import sim_fleet


def users_per_tenant(args) -> list[int]:
    """Tenant sizes follow a Zipf law (a few big tenants, a long tail), as real platforms see;
    ``--zipf 0`` gives every tenant ``--users`` users."""
    total = args.users * args.tenants
    weights = [1.0 / (i + 1) ** args.zipf for i in range(args.tenants)]
    return [max(1, round(total * w / sum(weights))) for w in weights]


async def run_workload(url: str, tenant_list, args) -> dict[str, float]:
    rng = random.Random(args.seed)
    async with new_session() as session:
        client = Client(url, session)
        t0 = time.monotonic()
        jobs = []
        for t, users in zip(tenant_list, users_per_tenant(args), strict=True):
            for _ in range(users):
                jobs.append(conversation(client, t, random.Random(rng.random()), args.turns, args.think,
                                         args.user_words, args.max_tokens, rng.uniform(0, args.ramp)))
        await asyncio.gather(*jobs)
        wall = time.monotonic() - t0
    res = client.results
    ok = [r for r in res if r.ok]
    ttfts = [r.ttft * 1000 for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return {
        "requests": len(res), "errors": len(res) - len(ok),
        "p50": pct(ttfts, 50), "p90": pct(ttfts, 90), "p99": pct(ttfts, 99),
        "tok_s": sum(r.completion_tokens for r in ok) / wall,
        "hit": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenants", type=int, default=32)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--zipf", type=float, default=1.0, help="skew of users across tenants (0 = even)")
    ap.add_argument("--prefix-words", type=int, default=3000)
    ap.add_argument("--user-words", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--think", type=float, default=0.5, help="mean think time between turns, s")
    ap.add_argument("--ramp", type=float, default=3.0, help="users start uniformly over this many s")
    ap.add_argument("--kv-tokens", type=int, default=32000, help="KV capacity per replica (tokens)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only-edge", action="store_true", help="skip the sglang-router runs (for tuning)")
    ap.add_argument("--edge-set", action="append", default=[], metavar="FIELD=VALUE",
                    help="edge setting override for experiments, e.g. balance_abs=16")
    args = ap.parse_args()

    keys = [bench_key(f"r{i}") for i in range(args.tenants)]
    edge_tenants = [{"name": f"tenant{i:02d}", "keys": [{"dev_key": k}]} for i, k in enumerate(keys)]
    sim_args = ["--time-scale", str(args.time_scale), "--max-total-tokens", str(args.kv_tokens),
                "--max-running-requests", "32", "--schedule-policy", "lpm"]
    sizes = users_per_tenant(args)
    print(f"{args.tenants} tenants, {sum(sizes)} users (largest tenant {sizes[0]}, zipf {args.zipf}) x {args.turns} "
          f"turns, ~{args.prefix_words}-token system "
          f"prompts; {args.replicas} replicas x {args.kv_tokens} KV tokens "
          f"(all prefixes: ~{args.tenants * args.prefix_words} tokens)")
    results = {}
    with sim_fleet(args.replicas, served_model_name="demo", extra_args=sim_args, ready_delay=0.0) as fleet:
        urls = [s.url for s in fleet]
        # Warm every replica up first, so whichever router runs first does not pay for fresh processes.
        warm = argparse.Namespace(**{**vars(args), "tenants": 4, "users": 2, "turns": 2, "zipf": 0.0, "ramp": 0.5})
        for url in urls:
            run_async(run_workload(url, tenants(4, args.prefix_words, args.seed + 1, [None] * 4), warm))
        replicas = [{"url": u, "max_running_requests": 32, "max_total_tokens": args.kv_tokens} for u in urls]
        edge_settings = {"health_interval_s": 30, **dict(kv.split("=", 1) for kv in args.edge_set)}
        with nimbus_edge(replicas, edge_tenants, edge_settings) as edge:
            flush_caches(urls)
            results["nimbus-edge (predicted_ttft)"] = run_async(
                run_workload(edge, tenants(args.tenants, args.prefix_words, args.seed, keys), args))
        if args.only_edge:
            print(results)
            return
        with sglang_router(urls, "cache_aware") as router:
            flush_caches(urls)
            results["sglang-router cache_aware"] = run_async(
                run_workload(router, tenants(args.tenants, args.prefix_words, args.seed, [None] * args.tenants),
                             args))
        with sglang_router(urls, "round_robin") as router:
            flush_caches(urls)
            results["round_robin (sglang-router)"] = run_async(
                run_workload(router, tenants(args.tenants, args.prefix_words, args.seed, [None] * args.tenants),
                             args))
    rows = [["router", "reqs", "err", "TTFT p50 ms", "p90 ms", "p99 ms", "out tok/s", "cache hit"]]
    for name, r in results.items():
        rows.append([name, str(r["requests"]), str(r["errors"]), f"{r['p50']:.1f}", f"{r['p90']:.1f}",
                     f"{r['p99']:.1f}", f"{r['tok_s']:.0f}", f"{r['hit']:.1%}"])
    print(table(rows))
    e, s = results["nimbus-edge (predicted_ttft)"], results["sglang-router cache_aware"]
    print(f"\nedge vs sglang-router cache_aware: TTFT p90 {e['p90'] / s['p90']:.2f}x (target <= 0.5x), "
          f"p50 {e['p50'] / s['p50']:.2f}x, p99 {e['p99'] / s['p99']:.2f}x, hit rate {e['hit'] / s['hit']:.2f}x "
          f"(target >= 1x), output tok/s {e['tok_s'] / s['tok_s']:.2f}x")


if __name__ == "__main__":
    main()
