"""A differential check of the fleet tick: two source trees' ``fleet_tick`` on the same random
fleets must write the same database.

    git worktree add /tmp/reconcile-before <commit>
    .venv/bin/python -m bench.controlplane.reconcile_diff --before /tmp/reconcile-before --cases 200
    .venv/bin/python -m bench.controlplane.reconcile_diff --before /tmp/reconcile-before --db sqlite

Each case is a small random fleet written straight into a fresh schema: a two-cloud catalog
(1/4/8-GPU shapes, spot and on-demand), sometimes capacity blocks; pools of three variants
(1 and 2 GPUs, one pinned to L4) with random sizes, markets, placement lists, dedication and
pauses; nodes in every state (launched or not, with or without agent, with partial launch
specs as migration 0004 left them, underused or empty for a while, some with a consolidation
record); replicas in every state on disjoint GPUs, some of them a move's copy. Then two ticks
(at ``now`` and 30 s later) with random settings (consolidation on or off, TTLs, settle).

Each tree runs in its own process, with its code first on ``sys.path``; ``uuid.uuid4`` is made
deterministic there, so new rows get the same ids in both. What is compared: every row of
pools, nodes, replicas, operations, audit events and autoscaler decisions, less what the wall
clock decides (``updated_at``, ``state_times`` values, audit ``created_at``) and the ids of rows
that take a default id at flush (operations, audit events, decisions: compared as sorted
multisets), and each tick's result.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

BOOT = ("import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; sys.argv[0] = 'reconcile_diff_worker'; "
        "import reconcile_diff_worker; reconcile_diff_worker.worker()")
NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)

CATALOG = {"version": 1, "generated_by": "diff", "clouds": [
    {"name": "aws", "regions": [{
        "name": "us-east-1", "template": {"kind": "aws_launch_template", "id": "lt-diff"},
        "zones": [{"name": "us-east-1a"}, {"name": "us-east-1b"}],
        "instance_types": [
            {"name": "p5.48xlarge", "gpu_type": "h100", "gpu_count": 8, "gpu_memory_gb": 80,
             "on_demand_price": 55.04, "spot_price": 22.0},
            {"name": "p5.4x", "gpu_type": "h100", "gpu_count": 4, "gpu_memory_gb": 80,
             "on_demand_price": 28.0, "spot_price": None},
            {"name": "g6.xlarge", "gpu_type": "l4", "gpu_count": 1, "gpu_memory_gb": 24,
             "on_demand_price": 0.8, "spot_price": 0.3}]}]},
    {"name": "gcp", "project": "diff", "regions": [{
        "name": "us-central1", "template": {"kind": "gcp_instance_template", "id": "it-diff"},
        "zones": [{"name": "us-central1-a"}],
        "instance_types": [
            {"name": "a3-highgpu-8g", "gpu_type": "h100", "gpu_count": 8, "gpu_memory_gb": 80,
             "on_demand_price": 60.0, "spot_price": 25.0}]}]}]}
SHAPES = [("aws", "us-east-1", "p5.48xlarge", 8, "h100", 55.04, 22.0, ["us-east-1a", "us-east-1b"]),
          ("aws", "us-east-1", "p5.4x", 4, "h100", 28.0, None, ["us-east-1a", "us-east-1b"]),
          ("aws", "us-east-1", "g6.xlarge", 1, "l4", 0.8, 0.3, ["us-east-1a", "us-east-1b"]),
          ("gcp", "us-central1", "a3-highgpu-8g", 8, "h100", 60.0, 25.0, ["us-central1-a"])]
PLACEMENTS = [[{"cloud": "aws", "region": "us-east-1"}],
              [{"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1b"]}],
              [{"cloud": "gcp", "region": "us-central1"}, {"cloud": "aws", "region": "us-east-1"}],
              [{"cloud": "aws"}], []]


# ---------------------------------------------------------------- worker side (one tree)
def _ids(rng: random.Random):
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4)


def seed_case(s, rng: random.Random) -> dict:
    """Write one random fleet; returns the settings overrides for its ticks."""
    from sqlalchemy import insert, update

    from controlplane.models import (
        CapacityBlock,
        Model,
        ModelVariant,
        Node,
        Pool,
        Replica,
        Tenant,
    )
    from controlplane.services.catalog import import_catalog

    new_id = _ids(rng)
    import_catalog(s, CATALOG)
    tenant = new_id()
    s.execute(insert(Tenant), [{"id": tenant, "name": f"t{tenant.hex[:8]}", "created_at": NOW, "updated_at": NOW}])
    model = new_id()
    s.execute(insert(Model), [{"id": model, "name": f"m{model.hex[:8]}", "created_at": NOW, "updated_at": NOW}])
    variants = []
    for tier, gpus, mem, types in (("bf16", 1, 20.0, None), ("fp8", 2, 40.0, None), ("int4", 1, 16.0, ["l4"])):
        vid = new_id()
        variants.append((vid, gpus))
        s.execute(insert(ModelVariant), [{
            "id": vid, "model_id": model, "tier": tier, "model_path": "diff/model", "gpu_count": gpus,
            "gpu_memory_gb": mem, "gpu_types": types, "context_length": 8192, "engine_args": {},
            "profiled_tokens_per_s": rng.choice([{}, {"h100": 9000.0, "l4": 1500.0}]),
            "created_at": NOW, "updated_at": NOW}])
    pools = []
    for i in range(rng.randint(1, 7)):
        pid = new_id()
        vid, gpus = rng.choice(variants)
        pools.append((pid, vid, gpus))
        s.execute(insert(Pool), [{
            "id": pid, "name": f"p{i}-{pid.hex[:6]}", "variant_id": vid, "min_replicas": 0, "max_replicas": 50,
            "desired_replicas": rng.choice([0, 1, 2, 3, 4, 6]), "placement": rng.choice(PLACEMENTS),
            "spot_policy": rng.choice(["on_demand", "on_demand", "spot", "spot_with_fallback"]),
            "spot_base_on_demand": rng.choice([0, 0, 1]), "paused": rng.random() < 0.1,
            "dedicated_tenant_id": tenant if rng.random() < 0.15 else None,
            "capacity_status": rng.choice([None, None, "capacity_unavailable"]),
            "created_at": NOW, "updated_at": NOW}])
    if rng.random() < 0.3:
        s.execute(insert(CapacityBlock), [{
            "id": new_id(), "scope": rng.choice(["zone", "region"]), "cloud": "aws", "region": "us-east-1",
            "zone": rng.choice(["us-east-1a", "us-east-1b"]), "reason": "diff",
            "expires_at": NOW + dt.timedelta(minutes=rng.choice([-1, 5, 30]))}])
    states = ["pending", "provisioning", "booting", "ready", "ready", "ready", "draining", "terminated", "failed"]
    # A calm fleet (ready nodes a few replicas each, underused for long): where consolidation moves.
    calm = rng.random() < 0.4
    all_replicas: list[dict] = []
    for n in range(rng.randint(0, 7)):
        cloud, region, itype, gpus_total, gpu_type, od, spot_price, zones = rng.choice(SHAPES[:1] if calm else SHAPES)
        spot = spot_price is not None and rng.random() < 0.3
        state = "ready" if calm and rng.random() < 0.9 else rng.choice(states)
        launched = state not in ("pending",) and (state != "provisioning" or rng.random() < 0.5)
        spec = {"cloud": cloud, "region": region, "instance_type": itype, "spot": spot, "zones": zones[:rng.randint(1, 2)]}
        if rng.random() < 0.8:  # placement-written specs; the rest as migration 0004 carried them
            spec.update(gpu_type=gpu_type, gpu_count=gpus_total, gpu_memory_gb=80 if gpu_type == "h100" else 24,
                        price_per_hour=spot_price if spot else od, reason="diff")
        consolidated = rng.random() < 0.2
        node_id = new_id()
        s.execute(insert(Node), [{
            "id": node_id, "state": state, "spot": spot, "gpus_total": gpus_total, "launch_spec": spec,
            "cloud": cloud if launched or rng.random() < 0.5 else None,
            "region": region if launched or rng.random() < 0.5 else None,
            "zone": zones[0] if launched else None, "instance_type": itype if launched else None,
            "dedicated_tenant_id": tenant if rng.random() < 0.1 else None,
            "launch_token": new_id().hex, "instance_id": f"i-{n}" if launched else None,
            "agent_url": f"http://10.0.0.{n}:8081" if launched and rng.random() < 0.8 else None,
            "empty_since": rng.choice([None, NOW - dt.timedelta(seconds=rng.choice([5, 100, 1000]))]),
            "underused_since": (NOW - dt.timedelta(hours=2)) if calm else rng.choice(
                [None, None, NOW - dt.timedelta(seconds=rng.choice([5, 400, 4000]))]),
            "drain_deadline_at": (NOW + dt.timedelta(seconds=rng.choice([-10, 60]))) if state == "draining" or
            rng.random() < 0.1 else None,
            "state_times": {state: (NOW - dt.timedelta(hours=1)).isoformat()},
            "cached_models": [f"org/model-{k}" for k in range(n % 3)],  # no draw: the seeds' fleets stay as they were
            "metrics": ({"consolidation": {"at": (NOW - dt.timedelta(seconds=rng.choice([50, 200, 5000]))).isoformat(),
                                           "kind": "delete"}} if consolidated else {}),
            "created_at": NOW - dt.timedelta(hours=1, seconds=n), "updated_at": NOW}])
        free = list(range(gpus_total))
        rng.shuffle(free)
        for _ in range(rng.randint(1, 3) if calm else rng.randint(0, gpus_total)):
            pid, vid, gpus = rng.choice(pools)
            if len(free) < gpus:
                break
            gpu_ids = sorted(free.pop() for _ in range(gpus))
            rstate = "ready" if calm and rng.random() < 0.9 else rng.choice(
                ["pending", "starting", "ready", "ready", "ready", "draining", "stopped", "failed"])
            desired = "running" if calm or rng.random() < 0.8 else "stopped"
            row = {
                "id": new_id(), "node_id": node_id, "pool_id": pid, "variant_id": vid, "state": rstate,
                "desired_state": desired, "gpu_ids": gpu_ids, "port": 30000 + gpu_ids[0],
                "model_ready_seconds": rng.choice([None, 30.0, 90.0]),
                "created_at": NOW - dt.timedelta(seconds=rng.choice([10, 300, 700, 3000])), "updated_at": NOW,
                "drain_deadline_at": (NOW + dt.timedelta(seconds=rng.choice([-5, 100]))) if desired == "stopped"
                else None, "replaces_id": None, "metrics": {}, "ready_breakdown": {}, "restarts": 0}
            all_replicas.append(row)
    for row in all_replicas:  # some replicas are a move's copy of another of the same pool
        twins = [o for o in all_replicas if o["pool_id"] == row["pool_id"] and o is not row]
        if twins and rng.random() < 0.2:
            row["replaces_id"] = rng.choice(twins)["id"]
    if all_replicas:
        s.execute(insert(Replica), all_replicas)
    if calm:  # mostly at size, so that no pool is scaling up
        for pid, _, _ in pools:
            if rng.random() < 0.8:
                size = sum(1 for r in all_replicas if r["pool_id"] == pid and r["state"] not in ("stopped", "failed"))
                s.execute(update(Pool).where(Pool.id == pid).values(desired_replicas=size))
    return {"consolidation_enabled": calm or rng.random() < 0.6,
            "consolidation_settle_s": 0 if calm else rng.choice([0, 300]),
            "empty_node_ttl_s": rng.choice([0, 60, 600]), "drain_timeout_s": 300, "replica_start_deadline_s": 600}


def dump(s) -> dict:
    from sqlalchemy import select

    from controlplane.models import AuditEvent, AutoscalerDecision, Node, Operation, Pool, Replica

    def rows(model, drop=(), sort=True) -> list:
        table = model.__table__
        out = []
        for row in s.execute(select(table)).mappings():
            item = {k: v for k, v in row.items() if k not in drop and k != "updated_at"}
            if "state_times" in item:
                item["state_times"] = sorted((item["state_times"] or {}).keys())
            out.append(json.loads(json.dumps(item, default=str, sort_keys=True)))
        return sorted(out, key=lambda r: json.dumps(r, sort_keys=True)) if sort else out

    return {
        "pools": rows(Pool),
        "nodes": rows(Node, drop=("created_at",)),
        "replicas": rows(Replica),
        "operations": rows(Operation, drop=("id", "created_at")),
        "audit": rows(AuditEvent, drop=("id", "at", "created_at")),
        "decisions": rows(AutoscalerDecision, drop=("id",)),
    }


def worker() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from sqlalchemy import text

    from controlplane.config import Settings
    from controlplane.db.engine import session_scope, sync_sessionmaker
    from controlplane.db.migrate import upgrade
    from controlplane.fleet import reconcile

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.db == "sqlite":
            url = f"sqlite:///{tmp}/diff.db"
            upgrade(url)
            ctx = None
        else:
            from reconcile_harness import fresh_database

            ctx = fresh_database()
            url = ctx.__enter__()
        try:
            base = Settings(database_url=url, state_dir=Path(tmp))
            tables = ("autoscaler_decisions", "audit_events", "operations", "replicas", "nodes", "pools",
                      "model_variants", "models", "tenants", "capacity_blocks", "zones", "instance_types",
                      "regions", "clouds")
            for case in range(args.cases):
                rng = random.Random(f"{args.seed}:{case}")
                with session_scope(base) as s:
                    for t in tables:
                        s.execute(text(f"DELETE FROM {t}"))
                with session_scope(base) as s:
                    overrides = seed_case(s, rng)
                settings = base.model_copy(update=overrides)
                ids = random.Random(f"ids:{args.seed}:{case}")
                uuid.uuid4 = _ids(ids)  # the tick's new rows get the same ids in both trees
                ticks = []
                for k in range(2):
                    try:
                        with session_scope(settings) as s:
                            r = reconcile.fleet_tick(s, settings, NOW + dt.timedelta(seconds=30 * k))
                        ticks.append({"placed": r.placed, "launched": r.launched, "stopped": r.stopped,
                                      "terminated": r.terminated, "moves": r.moves, "unplaced": r.unplaced,
                                      "operations": sorted(kind.value for _, kind in r.operations)})
                    except Exception as e:  # an error is a result too: both trees must raise it
                        ticks.append({"error": type(e).__name__, "message": str(e).splitlines()[0][:300]})
                with session_scope(base) as s:
                    results.append({"case": case, "settings": overrides, "ticks": ticks, "db": dump(s)})
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
            sync_sessionmaker(Settings(database_url=url)).kw["bind"].dispose()
    Path(args.out).write_text(json.dumps(results))


# ---------------------------------------------------------------- parent side
ONE_SIDED: set[str] = set()  # columns one tree's schema has and the other's lacks (not compared)


def first_difference(a, b, path="") -> str | None:
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                if path.startswith(".db."):  # a row: a column only one schema has
                    ONE_SIDED.add(f"{path.split('[')[0][4:]}.{k} ({'after' if k in b else 'before'} only)")
                    continue
                return f"{path}.{k}: only in {'after' if k in b else 'before'}"
            if (d := first_difference(a[k], b[k], f"{path}.{k}")) is not None:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} rows != {len(b)} rows"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if (d := first_difference(x, y, f"{path}[{i}]")) is not None:
                return d
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, type=Path)
    parser.add_argument("--after", type=Path, default=Path.cwd())
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    args = parser.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(Path(__file__), Path(tmp) / "reconcile_diff_worker.py")
        shutil.copy(Path(__file__).with_name("reconcile.py"), Path(tmp) / "reconcile_harness.py")
        for name, tree in (("before", args.before), ("after", args.after)):
            path = Path(tmp) / f"{name}.json"
            subprocess.run([sys.executable, "-c", BOOT, str(tree.resolve()), tmp, "--cases", str(args.cases),
                            "--seed", str(args.seed), "--db", args.db, "--out", str(path)],
                           cwd=tree, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            out[name] = json.loads(path.read_text())
    differ = 0
    activity = {"placed": 0, "launched": 0, "stopped": 0, "terminated": 0, "moves": 0, "errors": 0}
    for before, after in zip(out["before"], out["after"], strict=True):
        for name, run in (("before", before), ("after", after)):
            for i, t in enumerate(run["ticks"]):
                if "error" in t:
                    print(f"case {run['case']} tick {i + 1} raised ({name} tree): {t['error']}: {t['message']}")
        for t in (*before["ticks"], *after["ticks"]):
            t.pop("message", None)  # the statement in it may differ; the error's type must not
        for t in after["ticks"]:
            for k in activity:
                activity[k] += 1 if k == "errors" and "error" in t else t.get(k, 0) if k != "errors" else 0
        if (d := first_difference(before, after)) is not None:
            differ += 1
            print(f"case {before['case']}: {d}")
    print(f"{args.cases} cases ({args.db}), 2 ticks each; differing: {differ}; what the after tree's ticks did: "
          f"{activity}")
    if ONE_SIDED:
        print(f"not compared (in one schema only): {', '.join(sorted(ONE_SIDED))}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
