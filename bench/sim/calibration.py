"""Calibration table: the simulator's timing model against published measurements.

    .venv/bin/python -m bench.sim.calibration

Each row replays a published benchmark's workload through the real scheduler on a virtual
clock (``dataplane.sim.offline``) and prints the published figure, the simulated one and the
relative error. Sources and the workload assumptions are in ``dataplane/sim/CALIBRATION.md``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dataplane.sim.offline import Arrival, offline_engine, simulate


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    flags: tuple[str, ...]
    published: float
    unit: str
    kind: str  # "batch_latency_ms" | "offline_output_tps"
    batch: int = 8
    input_len: int = 32
    output_len: int = 128


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10_000, 120_000) for _ in range(n)]


def run_case(case: Case) -> float:
    engine, clock = offline_engine(["--jitter", "0", *case.flags])
    rng = random.Random(0)
    if case.kind == "batch_latency_ms":
        arrivals = [Arrival(0.0, _tokens(rng, case.input_len), case.output_len) for _ in range(case.batch)]
        simulate(engine, clock, arrivals)
        return clock.t * 1000
    # Offline run: all prompts at t=0. The source publishes no per-request lengths, so every
    # request gets ShareGPT's mean lengths (see CALIBRATION.md for why a long tail would not fit).
    arrivals = [Arrival(0.0, _tokens(rng, case.input_len), case.output_len) for _ in range(case.batch)]
    reqs = simulate(engine, clock, arrivals)
    return sum(len(r.output_ids) for r in reqs) / clock.t


VLLM_CI = "vLLM nightly CI latency test (buildkite vllm/performance-benchmark)"
CASES = [
    Case("Llama-3.1-8B bf16, 1xH100, 1000 ShareGPT prompts offline", "AIMultiple inference-engine benchmark (SGLang)",
         ("--model-profile", "llama-3.1-8b", "--gpu", "h100", "--mem-fraction-static", "0.8"), 16215, "output tok/s",
         "offline_output_tps", batch=1000, input_len=230, output_len=200),
    Case("Llama-3.1-8B bf16, 1xH100, batch 8, 32 in / 128 out", VLLM_CI,
         ("--model-profile", "llama-3.1-8b", "--gpu", "h100"), 997.5, "ms", "batch_latency_ms"),
    Case("Llama-3.1-8B bf16, 1xH200, batch 8, 32 in / 128 out", VLLM_CI,
         ("--model-profile", "llama-3.1-8b", "--gpu", "h200"), 833.4, "ms", "batch_latency_ms"),
    Case("Llama-3.1-8B bf16, 1xA100-80GB, batch 8, 32 in / 128 out", VLLM_CI,
         ("--model-profile", "llama-3.1-8b", "--gpu", "a100"), 1585.4, "ms", "batch_latency_ms"),
    Case("Llama-3-70B bf16, 4xH100 TP, batch 8, 32 in / 128 out", VLLM_CI,
         ("--model-profile", "llama-3.1-70b", "--gpu", "h100", "--tp-size", "4"), 2444.5, "ms", "batch_latency_ms"),
    Case("Llama-3-70B bf16, 4xH200 TP, batch 8, 32 in / 128 out", VLLM_CI,
         ("--model-profile", "llama-3.1-70b", "--gpu", "h200", "--tp-size", "4"), 2077.5, "ms", "batch_latency_ms"),
    Case("Mixtral-8x7B bf16, 2xH100 TP, batch 8, 32 in / 128 out", VLLM_CI,
         ("--model-profile", "mixtral-8x7b", "--gpu", "h100", "--tp-size", "2"), 2327.0, "ms", "batch_latency_ms"),
    Case("Mixtral-8x7B bf16, 2xH200 TP, batch 8, 32 in / 128 out", VLLM_CI,
         ("--model-profile", "mixtral-8x7b", "--gpu", "h200", "--tp-size", "2"), 1917.4, "ms", "batch_latency_ms"),
]


def table() -> list[tuple[Case, float, float]]:
    rows = []
    for case in CASES:
        simulated = run_case(case)
        rows.append((case, simulated, (simulated - case.published) / case.published))
    return rows


def main() -> None:
    rows = table()
    print("| case | source | published | simulated | error |")
    print("|---|---|---|---|---|")
    for case, simulated, error in rows:
        print(f"| {case.name} | {case.source} | {case.published:,.1f} {case.unit} | {simulated:,.1f} {case.unit} "
              f"| {error:+.1%} |")
    mean_abs = sum(abs(e) for _, _, e in rows) / len(rows)
    print(f"\nmean absolute error {mean_abs:.1%}, worst {max(abs(e) for _, _, e in rows):.1%}")


if __name__ == "__main__":
    main()
