"""Routing quality on a multi-tenant shared-prefix workload: the Nimbus edge (predicted TTFT) vs
sglang-router cache_aware vs round robin, on the same simulator fleet (caches flushed between runs).

    .venv/bin/python -m bench.edge.routing [--session-rate 12] [--repeat 3] [--tenants 32] [--turns 5]
    .venv/bin/python -m bench.edge.routing --session-rate 0 --think 0.5   # the cold burst

Dozens of tenants, each with a long system prompt; user sessions (tenants Zipf-weighted, as on a
real platform) of multi-turn chats. By default sessions arrive as a Poisson stream (steady state);
``--session-rate 0`` starts every user within a few seconds instead (a cold burst whose tail is
the unavoidable first prefill of every tenant's prompt, whatever the router does).
Four replicas whose KV cache cannot hold every tenant's prefix at once, but could if the prefixes
were partitioned across them. Reports TTFT p50/p90/p99, output tokens/s and the prompt cache hit
rate (cached / prompt tokens, as the engines report them).
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
from bench.edge.workload import conversation, tenants
from dataplane.sim.process import sim_fleet


def users_per_tenant(args) -> list[int]:
    """Tenant sizes follow a Zipf law (a few big tenants, a long tail), as real platforms see;
    ``--zipf 0`` gives every tenant ``--users`` users."""
    total = args.users * args.tenants
    weights = [1.0 / (i + 1) ** args.zipf for i in range(args.tenants)]
    return [max(1, round(total * w / sum(weights))) for w in weights]


def sessions(args, tenant_list, rng: random.Random) -> list[tuple[object, float]]:
    """(tenant, start time) of every user session. Default (``--session-rate 0``): every tenant's
    users (Zipf sizes) start uniformly within ``--ramp`` s, a burst dominated by the cold first
    prefill of every tenant's prefix. ``--session-rate R``: sessions arrive as a Poisson stream
    of R/s for ``--duration`` s, tenants drawn by the same Zipf weights, as a platform in steady
    state sees them; the few unavoidable cold prefills are then a small share of the requests
    and the tail shows routing: hits kept, KV not thrashed, no replica overloaded."""
    if args.session_rate <= 0:
        return [(t, rng.uniform(0, args.ramp))
                for t, users in zip(tenant_list, users_per_tenant(args), strict=True) for _ in range(users)]
    weights = [1.0 / (i + 1) ** args.zipf for i in range(len(tenant_list))]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(args.session_rate)
        if t >= args.duration:
            return out
        out.append((rng.choices(tenant_list, weights)[0], t))


async def run_workload(url: str, tenant_list, args) -> dict[str, float]:
    rng = random.Random(args.seed)
    async with new_session() as session:
        client = Client(url, session)
        t0 = time.monotonic()
        jobs = [conversation(client, t, random.Random(rng.random()), args.turns, args.think, args.user_words,
                             args.max_tokens, start)
                for t, start in sessions(args, tenant_list, rng)]
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
    ap.add_argument("--think", type=float, default=1.0, help="mean think time between turns, s")
    ap.add_argument("--ramp", type=float, default=3.0, help="users start uniformly over this many s")
    ap.add_argument("--session-rate", type=float, default=12.0,
                    help="steady state: new user sessions per s (Poisson); 0 = the burst mode (--ramp)")
    ap.add_argument("--duration", type=float, default=30.0, help="with --session-rate: arrivals for this many s")
    ap.add_argument("--kv-tokens", type=int, default=32000, help="KV capacity per replica (tokens)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3, help="alternating rounds of edge and cache_aware; medians")
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
    mode = (f"steady state: {args.session_rate:g} new sessions/s for {args.duration:g}s, think {args.think:g}s"
            if args.session_rate > 0 else f"burst: every user starts within {args.ramp:g}s, think {args.think:g}s")
    print(f"{mode}; {args.repeat} round(s), contenders alternating, medians reported")
    EDGE, CACHE_AWARE, RR = "nimbus-edge (predicted_ttft)", "sglang-router cache_aware", "round_robin (sglang-router)"
    runs: dict[str, list[dict[str, float]]] = {EDGE: [], CACHE_AWARE: []}
    with sim_fleet(args.replicas, served_model_name="demo", extra_args=sim_args, ready_delay=0.0) as fleet:
        urls = [s.url for s in fleet]
        # Warm every replica up first, so whichever router runs first does not pay for fresh processes.
        warm = argparse.Namespace(**{**vars(args), "tenants": 4, "users": 2, "turns": 2, "zipf": 0.0, "ramp": 0.5,
                                      "session_rate": 0.0})
        for url in urls:
            run_async(run_workload(url, tenants(4, args.prefix_words, args.seed + 1, [None] * 4), warm))
        replicas = [{"url": u, "max_running_requests": 32, "max_total_tokens": args.kv_tokens} for u in urls]
        edge_settings = {"health_interval_s": 30, **dict(kv.split("=", 1) for kv in args.edge_set)}
        anonymous = tenants(args.tenants, args.prefix_words, args.seed, [None] * args.tenants)
        # Alternating rounds: drift on a shared machine hits every contender alike. Each run starts
        # from empty caches and a fresh router process.
        for _ in range(args.repeat):
            with nimbus_edge(replicas, edge_tenants, edge_settings) as edge:
                flush_caches(urls)
                runs[EDGE].append(run_async(
                    run_workload(edge, tenants(args.tenants, args.prefix_words, args.seed, keys), args)))
            if args.only_edge:
                continue
            with sglang_router(urls, "cache_aware") as router:
                flush_caches(urls)
                runs[CACHE_AWARE].append(run_async(run_workload(router, anonymous, args)))
        if args.only_edge:
            print(runs[EDGE])
            return
        with sglang_router(urls, "round_robin") as router:  # the reference floor, once
            flush_caches(urls)
            runs[RR] = [run_async(run_workload(router, anonymous, args))]
    results = {name: median_result(rs) for name, rs in runs.items()}
    rows = [["router", "reqs", "err", "TTFT p50 ms", "p90 ms", "p99 ms", "out tok/s", "cache hit", "p90 per run"]]
    for name, r in results.items():
        rows.append([name, str(r["requests"]), str(r["errors"]), f"{r['p50']:.1f}", f"{r['p90']:.1f}",
                     f"{r['p99']:.1f}", f"{r['tok_s']:.0f}", f"{r['hit']:.1%}",
                     " ".join(f"{x['p90']:.0f}" for x in runs[name])])
    print(table(rows))
    e, s = results[EDGE], results[CACHE_AWARE]
    print(f"\nedge vs sglang-router cache_aware (medians): TTFT p90 {e['p90'] / s['p90']:.2f}x (target <= 0.5x), "
          f"p50 {e['p50'] / s['p50']:.2f}x, p99 {e['p99'] / s['p99']:.2f}x, hit rate {e['hit'] / s['hit']:.2f}x "
          f"(target >= 1x), output tok/s {e['tok_s'] / s['tok_s']:.2f}x")


def median_result(results: list[dict[str, float]]) -> dict[str, float]:
    """Per metric, the median over the runs (request and error counts summed)."""
    out = {k: statistics.median(r[k] for r in results) for k in results[0]}
    out["requests"] = sum(r["requests"] for r in results)
    out["errors"] = sum(r["errors"] for r in results)
    return out

if __name__ == "__main__":
    main()
