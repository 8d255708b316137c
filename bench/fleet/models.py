"""The fleet's model variants (one pool each) and their load shapes.

Main pools are ``warm`` (a floor of one replica); the long tail is ``scale_to_zero`` with sparse
bursts: minutes of traffic separated by idle hours. Every pool has a TTFT SLO of 2 s and the
request mix of ``bench/autoscale`` (lognormal prompts, median 1200 tokens; outputs, median 220).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Load:
    peak_rps: float = 0.0
    trough_rps: float = 0.0
    peak_hour: float = 16.0  # hour of the diurnal peak (the trough is 12 h earlier)
    bursts: int = 0  # bench.autoscale-style bursts: 1.8-3x for 2-15 min
    # Long-tail pools: this many episodes of ``episode_rps`` (drawn in the range) lasting
    # ``episode_min`` minutes (drawn in the range), nothing in between.
    episodes: tuple[int, int] = (0, 0)
    episode_rps: tuple[float, float] = (0.3, 3.0)
    episode_min: tuple[float, float] = (3.0, 20.0)

    @property
    def sparse(self) -> bool:
        return self.episodes[1] > 0


@dataclass(frozen=True)
class Variant:
    pool_id: str
    model: str  # dataplane.sim.timing profile name
    quantization: str | None
    gpus: int  # tensor-parallel GPUs per replica
    gpu_types: tuple[str, ...]
    gpu_memory_gb: float  # per GPU
    kind: str  # "warm" | "scale_to_zero"
    load: Load
    slo_s: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 64

    @property
    def tail(self) -> bool:
        return self.kind == "scale_to_zero"


def _tail(pool_id: str, model: str, quantization: str | None, gpu_types: tuple[str, ...], memory: float) -> Variant:
    return Variant(pool_id, model, quantization, 1, gpu_types, memory, "scale_to_zero",
                   Load(episodes=(2, 5)))


VARIANTS: tuple[Variant, ...] = (
    Variant("chat-8b", "llama-3.1-8b", None, 1, ("h100", "l40s"), 40, "warm",
            Load(peak_rps=80, trough_rps=12, peak_hour=15, bursts=6)),
    Variant("chat-8b-fp8", "llama-3.1-8b", "fp8", 1, ("h100", "l40s"), 40, "warm",
            Load(peak_rps=120, trough_rps=15, peak_hour=20, bursts=6)),
    Variant("llama-70b-fp8", "llama-3.1-70b", "fp8", 2, ("h100",), 80, "warm",
            Load(peak_rps=28, trough_rps=4, peak_hour=16, bursts=8)),
    Variant("llama-70b", "llama-3.3-70b", None, 4, ("h100",), 80, "warm",
            Load(peak_rps=14, trough_rps=2, peak_hour=10, bursts=4)),
    Variant("small-3b", "llama-3.2-3b", None, 1, ("l4", "a10g", "l40s"), 24, "warm",
            Load(peak_rps=16, trough_rps=2, peak_hour=13, bursts=4)),
    _tail("tail-qwen7b", "qwen2.5-7b", None, ("h100", "l40s"), 40),
    _tail("tail-mistral7b", "mistral-7b", None, ("l40s", "h100"), 40),
    _tail("tail-gemma9b-fp8", "gemma-2-9b", "fp8", ("l4", "l40s"), 24),
    _tail("tail-llama1b", "llama-3.2-1b", None, ("l4", "a10g"), 24),
    _tail("tail-qwen05b", "qwen2.5-0.5b", None, ("l4", "a10g", "l40s"), 24),
    _tail("tail-qwen14b-fp8", "qwen2.5-14b", "fp8", ("h100", "l40s"), 40),
    _tail("tail-qwen32b-fp8", "qwen2.5-32b", "fp8", ("h100",), 80),
    _tail("tail-mixtral-awq", "mixtral-8x7b", "awq", ("h100", "l40s"), 40),
    _tail("tail-llama3b-fp8", "llama-3.2-3b", "fp8", ("l4", "l40s"), 24),
    _tail("tail-qwen7b-fp8", "qwen2.5-7b", "fp8", ("l4", "l40s"), 24),
    _tail("tail-llama8b-awq", "llama-3.1-8b", "awq", ("l40s", "h100"), 40),
    _tail("tail-gemma9b", "gemma-2-9b", None, ("h100",), 80),
)


FLEETS = ("default", "h100")


def fleet_variants(fleet: str = "default") -> tuple[Variant, ...]:
    """``default``: the pools above. ``h100``: every pool that accepts an H100 accepts only H100s
    (the fleet shape where a VM-per-replica fleet must buy 8-GPU VMs for 1-GPU models)."""
    if fleet == "default":
        return VARIANTS
    if fleet == "h100":
        return tuple(replace(v, gpu_types=("h100",), gpu_memory_gb=80) if "h100" in v.gpu_types else v
                     for v in VARIANTS)
    raise ValueError(f"unknown fleet {fleet!r} ({', '.join(FLEETS)})")
