"""The bench's figure: per trace, GPU-hours against SLO attainment (SkyServe's sweep as a curve,
ours as points, the clairvoyant bounds as lines) and the replicas over the day."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

MARKS = {"ours": ("*", "tab:red"), "ours+schedule": ("P", "tab:orange"), "ours-unweighted": ("D", "tab:purple"),
         "static": ("s", "tab:blue")}
LABELS = {"ours-unweighted": "ours-unweighted (diagnostic)"}


def miss(result) -> float:
    return max(0.01, 100 * (1 - result.slo_attainment))


def plot(path: str, cases: dict, results: dict) -> None:
    fig, axes = plt.subplots(2, len(cases), figsize=(6.5 * len(cases), 9), squeeze=False)
    for col, (name, case) in enumerate(cases.items()):
        ax = axes[0][col]
        sky = sorted(((j, r) for j, r in results.items() if j.case == name and j.kind == "skyserve"),
                     key=lambda jr: jr[0].factor)
        ax.plot([miss(r) for _, r in sky], [r.gpu_hours for _, r in sky], "o-", color="tab:gray",
                label="SkyServe, target QPS x factor of the calibrated")
        for j, r in sky:
            ax.annotate(f"x{j.factor:g}", (miss(r), r.gpu_hours), textcoords="offset points",
                        xytext=(4, 4), fontsize=8, color="tab:gray")
        for kind, (marker, color) in MARKS.items():
            r = next((r for j, r in results.items() if j.case == name and j.kind == kind), None)
            if r is not None:
                ax.plot([miss(r)], [r.gpu_hours], marker, color=color, markersize=12, label=LABELS.get(kind, kind))
        styles = iter(["--", ":"])
        for label, gpu_hours in case.bounds.items():
            ax.axhline(gpu_hours, linestyle=next(styles), color="tab:green", label=label)
        ax.set_xscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("requests missing the TTFT SLO (client-side), % (log; better to the right)")
        ax.set_ylabel("GPU-hours")
        ax.set_title(f"{name} trace: GPU-hours vs SLO attainment")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")

        ax = axes[1][col]
        ours = next((r for j, r in results.items() if j.case == name and j.kind == "ours"), None)
        if ours is not None:
            level = ours.slo_attainment
            match = min(sky, key=lambda jr: (jr[1].slo_attainment < level, abs(jr[1].slo_attainment - level)),
                        default=None)
            hours = [t / 3600 for t, *_ in ours.timeline]
            ax.step(hours, [a for _, a, _, _ in ours.timeline], where="post", color="tab:red", label="ours")
            cost = next((r for j, r in results.items() if j.case == name and j.kind == "ours-unweighted"), None)
            if cost is not None:
                ax.step([t / 3600 for t, *_ in cost.timeline], [a for _, a, _, _ in cost.timeline], where="post",
                        color="tab:purple", linestyle="--", label=LABELS["ours-unweighted"])
            if match is not None:
                j, r = match
                ax.step([t / 3600 for t, *_ in r.timeline], [a for _, a, _, _ in r.timeline], where="post",
                        color="tab:gray", label=f"SkyServe x{j.factor:g} ({100 * r.slo_attainment:.1f}% SLO)")
            need = case.pooled_need
            minutes = range(0, len(need), 60)
            ax.plot([m / 3600 for m in minutes], [int(need[m:m + 60].max()) for m in minutes], color="tab:green",
                    alpha=0.6, label="clairvoyant need (pooled)")
            ax2 = ax.twinx()
            ax2.plot(hours, [rps for *_, rps in ours.timeline], color="tab:blue", alpha=0.25, linewidth=0.8)
            ax2.set_ylabel("req/s", color="tab:blue")
        ax.set_xlabel("hour of the day")
        ax.set_ylabel("replicas")
        ax.set_title(f"{name} trace: replicas over the day")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
