"""The fleet tick bench (``bench.controlplane.reconcile``) on two source trees side by side, in
alternating runs: a before/after comparison that a shared, noisy machine does not skew one way.

    git worktree add /tmp/reconcile-before <commit>
    .venv/bin/python -m bench.controlplane.reconcile_compare --before /tmp/reconcile-before \\
        --sizes 100,1000,3000 --rounds 3 --repeat 3

Each run is a fresh process with one tree's code first on ``sys.path`` (``controlplane`` and the
rest come from it) and this tree's bench harness, so both trees are measured by the same
harness, on the same seeded fleets. Rounds alternate which tree goes first; each run measures
``--repeat`` steady and churn ticks per size (see the harness) and reports their medians. The
table gives, per size, the median over rounds of those medians for each tree, and the ratio
before / after (above 1: the after tree is faster), for wall time and for the process's CPU
time (the tick's Python side, less disturbed by other work on the machine than wall time).
The load average is printed before and after: compare numbers taken under similar load only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HARNESS = Path(__file__).with_name("reconcile.py")
BOOT = ("import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; sys.argv[0] = 'reconcile_harness'; "
        "import reconcile_harness; reconcile_harness.main()")


def run_tree(tree: Path, harness_dir: str, sizes: str, args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, "-c", BOOT, str(tree), harness_dir, "--sizes", sizes, "--repeat", str(args.repeat),
           "--replicas-per-pool", str(args.replicas_per_pool), "--gpus-per-node", str(args.gpus_per_node),
           "--churn", str(args.churn), "--json"]
    out = subprocess.run(cmd, cwd=tree, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, type=Path, help="source tree measured as 'before'")
    parser.add_argument("--after", type=Path, default=Path.cwd(), help="source tree measured as 'after' (default: .)")
    parser.add_argument("--sizes", default="100,1000,3000", help="comma-separated pool counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="ticks of each kind per run and size")
    parser.add_argument("--replicas-per-pool", type=int, default=10)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--churn", type=float, default=0.05)
    parser.add_argument("--json", type=Path, help="also write every run's results here")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    load_start = os.getloadavg()
    runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as harness_dir:
        shutil.copy(HARNESS, Path(harness_dir) / "reconcile_harness.py")
        for i in range(args.rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for name in order:
                runs[name].append(run_tree(trees[name], harness_dir, args.sizes, args))
                print(f"round {i + 1}/{args.rounds}: {name} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    load_end = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "runs": runs}, indent=2))

    def med(name: str, size_index: int, kind: str, field: str) -> float:
        return statistics.median(run[size_index][kind][field] for run in runs[name])

    print(f"load average (1/5/15 min): start {load_start[0]:.1f}/{load_start[1]:.1f}/{load_start[2]:.1f}, "
          f"end {load_end[0]:.1f}/{load_end[1]:.1f}/{load_end[2]:.1f}; {args.rounds} rounds × {args.repeat} ticks")
    print(f"{'pools':>6} {'replicas':>8} {'tick':>6} | {'before s':>8} {'after s':>8} {'ratio':>6} | "
          f"{'before cpu':>10} {'after cpu':>9} {'ratio':>6} | {'stmts b/a':>9} {'orm b/a':>12}")
    for k, size in enumerate(runs["after"][0]):
        for kind in ("steady", "churn"):
            wb, wa = med("before", k, kind, "median_seconds"), med("after", k, kind, "median_seconds")
            cb, ca = med("before", k, kind, "median_cpu_seconds"), med("after", k, kind, "median_cpu_seconds")
            sb = max(max(run[k][kind]["statements"]) for run in runs["before"])
            sa = max(max(run[k][kind]["statements"]) for run in runs["after"])
            ob = max(run[k][kind]["orm_objects"] for run in runs["before"])
            oa = max(run[k][kind]["orm_objects"] for run in runs["after"])
            print(f"{size['pools']:>6} {size['replicas']:>8} {kind:>6} | {wb:>8.3f} {wa:>8.3f} {wb / wa:>5.1f}x | "
                  f"{cb:>10.3f} {ca:>9.3f} {cb / ca:>5.1f}x | {f'{sb}/{sa}':>9} {f'{ob}/{oa}':>12}")


if __name__ == "__main__":
    main()
