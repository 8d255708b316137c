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

Closer to production traffic (``--production``, or each part alone): replicas of mixed GPU
profiles (``--gpus h100,l40s``: the routers must tell a slow replica from a busy one),
one-shot requests about documents of their own beside the chats (``--oneshot-share``: prompts
no cache holds), the streamed answers themselves carried in the history (``--real-answers``)
and log-normal output lengths (``--long-tail``). ``--levels 4,8,12,16,20,0`` runs the
comparison at each session rate (0: the cold burst) and prints one row per level:

    .venv/bin/python -m bench.edge.routing --production --levels 4,8,12,16,20,0
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
from bench.edge.workload import Tenant, conversation, tenants, text
from dataplane.sim.process import sim_fleet


def users_per_tenant(args) -> list[int]:
    """Tenant sizes follow a Zipf law (a few big tenants, a long tail), as real platforms see;
    ``--zipf 0`` gives every tenant ``--users`` users."""
    total = args.users * args.tenants
    weights = [1.0 / (i + 1) ** args.zipf for i in range(args.tenants)]
    return [max(1, round(total * w / sum(weights))) for w in weights]


def sessions(args, tenant_list, rng: random.Random) -> list[tuple[Tenant, float]]:
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


def one_shot(tenant: Tenant, rng: random.Random, words: int) -> Tenant:
    """A single request of ``tenant`` about a document of its own: a prompt no cache holds and none
    will reuse (``--oneshot-share``), beside the chats whose prefixes routing should keep warm."""
    return Tenant(tenant.name, tenant.key, "Summarize this document. " + text(rng, words))


async def run_workload(url: str, tenant_list, args) -> dict[str, float]:
    rng = random.Random(args.seed)
    async with new_session() as session:
        client = Client(url, session)
        t0 = time.monotonic()
        jobs = []
        for t, start in sessions(args, tenant_list, rng):
            own = random.Random(rng.random())
            single = args.oneshot_share > 0 and own.random() < args.oneshot_share
            jobs.append(conversation(client, one_shot(t, own, args.prefix_words // 2) if single else t, own,
                                     1 if single else args.turns, args.think, args.user_words, args.max_tokens,
                                     start, real_answers=args.real_answers, long_tail=args.long_tail))
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
    ap.add_argument("--gpus", default="", help="GPU profile of each replica, cycled (e.g. h100,l40s): a mixed fleet")
    ap.add_argument("--oneshot-share", type=float, default=0.0,
                    help="share of sessions that are one request about a document of their own (no reuse)")
    ap.add_argument("--real-answers", action="store_true", help="the history carries the streamed answers themselves")
    ap.add_argument("--long-tail", action="store_true", help="log-normal output lengths around --max-tokens")
    ap.add_argument("--production", action="store_true",
                    help="all of the above: --gpus h100,l40s --oneshot-share 0.3 --real-answers --long-tail")
    ap.add_argument("--levels", default="",
                    help="session rates to run one after another (e.g. 4,8,12,16,20), a summary row each")
    args = ap.parse_args()
    if args.production:
        args.gpus = args.gpus or "h100,l40s"
        args.oneshot_share = args.oneshot_share or 0.3
        args.real_answers = args.long_tail = True

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
    gpus = [g for g in args.gpus.split(",") if g]
    if gpus or args.oneshot_share or args.real_answers or args.long_tail:
        print(f"replica GPUs {','.join(gpus) or 'default'} (cycled); one-shot share {args.oneshot_share:g}; "
              f"real answers in the history: {args.real_answers}; long-tailed outputs: {args.long_tail}")
    each = [["--gpu", g] for g in gpus]
    with sim_fleet(args.replicas, served_model_name="demo", extra_args=sim_args, each=each, ready_delay=0.0) as fleet:
        if args.levels:
            levels(args, fleet, keys, edge_tenants)
            return
        compare(args, fleet, keys, edge_tenants)


EDGE, CACHE_AWARE, RR = "nimbus-edge (predicted_ttft)", "sglang-router cache_aware", "round_robin (sglang-router)"


def alternate(args, fleet, keys, edge_tenants) -> dict[str, list[dict[str, float]]]:
    """``args.repeat`` rounds of the edge and sglang-router's cache_aware, alternating (drift on a
    shared machine hits both alike); each run from empty caches and a fresh router process."""
    urls = [s.url for s in fleet]
    replicas = [{"url": u, "max_running_requests": 32, "max_total_tokens": args.kv_tokens} for u in urls]
    edge_settings = {"health_interval_s": 30, **dict(kv.split("=", 1) for kv in args.edge_set)}
    anonymous = tenants(args.tenants, args.prefix_words, args.seed, [None] * args.tenants)
    runs: dict[str, list[dict[str, float]]] = {EDGE: [], CACHE_AWARE: []}
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
    return runs


def warm_up(args, fleet) -> None:
    """Every replica serves a little first, so whichever router runs first does not pay for fresh processes."""
    warm = argparse.Namespace(**{**vars(args), "tenants": 4, "users": 2, "turns": 2, "zipf": 0.0, "ramp": 0.5,
                                  "session_rate": 0.0, "oneshot_share": 0.0})
    for sim in fleet:
        run_async(run_workload(sim.url, tenants(4, args.prefix_words, args.seed + 1, [None] * 4), warm))


def levels(args, fleet, keys, edge_tenants) -> None:
    """The same comparison at each session rate of ``--levels``, one summary row per level."""
    warm_up(args, fleet)
    rows = [["sessions/s", "reqs", "edge p50/p90/p99 ms", "cache_aware p50/p90/p99 ms", "p90 ratio", "p99 ratio",
             "hit ratio", "tok/s ratio", "errors edge/router", "edge p90 per run", "router p90 per run"]]
    for rate in [float(x) for x in args.levels.split(",")]:
        runs = alternate(argparse.Namespace(**{**vars(args), "session_rate": rate}), fleet, keys, edge_tenants)
        e = median_result(runs[EDGE])
        if args.only_edge:  # no router runs to compare with: the edge's own row
            print(f"{rate:g} sessions/s: edge p50/p90/p99 {e['p50']:.0f} / {e['p90']:.0f} / {e['p99']:.0f} ms, "
                  f"hit {e['hit']:.1%}, errors {e['errors']}, p90 per run "
                  + " ".join(f"{x['p90']:.0f}" for x in runs[EDGE]), flush=True)
            continue
        s = median_result(runs[CACHE_AWARE])
        rows.append([f"{rate:g}" if rate > 0 else "burst", str(e["requests"]),
                     f"{e['p50']:.0f} / {e['p90']:.0f} / {e['p99']:.0f}",
                     f"{s['p50']:.0f} / {s['p90']:.0f} / {s['p99']:.0f}", f"{e['p90'] / s['p90']:.2f}x",
                     f"{e['p99'] / s['p99']:.2f}x", f"{e['hit'] / s['hit']:.2f}x", f"{e['tok_s'] / s['tok_s']:.2f}x",
                     f"{e['errors']}/{s['errors']}", " ".join(f"{x['p90']:.0f}" for x in runs[EDGE]),
                     " ".join(f"{x['p90']:.0f}" for x in runs[CACHE_AWARE])])
        print(table(rows[:1] + rows[-1:]), flush=True)  # each level as it ends
    if args.only_edge:
        return
    print("\n" + table(rows))
    print("targets (issue 19): p90 ratio <= 0.5x, hit ratio >= 1.0x, no errors where sglang-router has none")


def compare(args, fleet, keys, edge_tenants) -> None:
    urls = [s.url for s in fleet]
    warm_up(args, fleet)
    runs = alternate(args, fleet, keys, edge_tenants)
    if args.only_edge:
        print(runs[EDGE])
        return
    anonymous = tenants(args.tenants, args.prefix_words, args.seed, [None] * args.tenants)
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
