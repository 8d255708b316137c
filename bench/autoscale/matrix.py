"""The restated bench across seeds and load levels: does the comparison hold off seed 1?

    .venv/bin/python -m bench.autoscale.matrix --seeds 1,2,3 --loads 1
    .venv/bin/python -m bench.autoscale.matrix --seeds 1 --loads 0.5,2

Runs ``bench.autoscale.run`` (24 h, no multi-day ramp runs, no plot) once per (seed, load) and
prints one row per trace and policy: GPU-hours against SkyServe's at equal SLO attainment, the
clairvoyant bound, flaps against SkyServe's and the ramps of that day, with the targets' verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from bench.autoscale import run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--loads", default="1")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", help="write every run's verdicts here")
    args, rest = p.parse_known_args(argv)
    rows, everything = [], []
    for load in [float(x) for x in args.loads.split(",")]:
        for seed in [int(x) for x in args.seeds.split(",")]:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "run.json")
                run.main(["--seed", str(seed), "--load", f"{load:g}", "--ramp-days", "0", "--png", "",
                          "--jobs", str(args.jobs), "--json", path, *rest])
                with open(path) as fh:
                    data = json.load(fh)
            everything.append({"seed": seed, "load": load, **data})
            for v in data["verdicts"]:
                rows.append(f"| {load:g} | {seed} | {v['name']} | {'PASS' if v['ok'] else 'FAIL'} | {v['detail']} |")
    print("\n| load | seed | target | verdict | detail |\n|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(everything, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
