"""First-principles timing model of an SGLang engine on a GPU, as pure functions.

Nothing here touches a clock or a socket: the scheduler, the autoscaler benchmark and the
calibration bench all call the same functions.

The model (one replica = one engine process on ``tp`` GPUs of one node):

* **Weights.** ``weight_bytes = params × bytes_per_weight(quantization)`` (bf16 2, fp8/int8 1,
  awq/gptq/int4 ~0.53 with scales). With tensor parallelism every GPU holds ``1/tp`` of them.
* **KV cache.** Per token and GPU: ``2 (K and V) × layers × ceil(kv_heads / tp) × head_dim ×
  kv_bytes``; heads are replicated when ``tp > kv_heads``. The pool is what
  ``mem_fraction_static`` of GPU memory leaves after the weights, as in SGLang's memory
  profiler, so ``kv_capacity_tokens = (mem × fraction − weights/tp) / kv_bytes_per_token_per_gpu``.
* **Prefill (extend).** Compute bound for real batches: FLOPs = ``2 × active_params × new_tokens``
  (the GEMMs) + ``4 × layers × q_heads × head_dim × new_tokens × (cached + new/2)`` (attention
  of each new token over the cached prefix and half of its own chunk). Time = FLOPs /
  (tp × peak × PREFILL_MFU), but never less than one read of the weights (the roofline), plus
  tensor-parallel all-reduces and a fixed step overhead. Cached prefix tokens cost only their
  attention reads, which is why a radix-cache hit cuts TTFT.
* **Decode step.** Memory bound: every step reads the weights once (for MoE only the experts
  the batch touches, ``1 − (1 − k/E)^batch`` of them) and every running request's KV cache,
  at ``HBM bandwidth × decode_bw_eff`` per GPU (``DECODE_BW_EFF`` except where a GPU's own
  measurements differ: H200); compute (``2 × active × batch``) takes over only
  at very large batches. Plus all-reduces and the step overhead.
* **Tensor parallel.** Work divides by ``tp``; each layer adds two all-reduces of
  ``tokens × hidden × 2`` bytes over the interconnect (ring: ``2 (tp−1)/tp`` of the bytes) plus
  a fixed latency per all-reduce, so the speed-up is real but below ``tp``.
* **Jitter.** The scheduler multiplies each step by ``1 + N(0, cv)`` from a seeded generator
  (see :func:`jitter_factor`); the functions here are deterministic.
* **Model-ready time.** Download ``weight_bytes`` at ``download_gbps`` (skipped when cached
  on local disk), then load them into GPU memory at ``load_gbytes_per_s`` per GPU, plus the
  engine's fixed start-up (CUDA graphs capture, warm-up).

Calibration constants below were fitted once against the published figures listed in
``dataplane/sim/CALIBRATION.md``; ``bench/sim/calibration.py`` regenerates the table.

Public functions (all times in seconds of simulated, unscaled time)::

    get_gpu(name: str) -> GpuProfile
    get_model(name: str) -> ModelProfile
    infer_model_profile(model_path: str | None, explicit: str | None = None) -> ModelProfile
    weight_bytes(model, quantization=None) -> float
    kv_bytes_per_token(model, tp=1, kv_cache_dtype=None) -> float          # per GPU
    kv_capacity_tokens(model, gpu, tp=1, mem_fraction_static=0.88,
                       quantization=None, kv_cache_dtype=None) -> int
    prefill_seconds(model, gpu, new_tokens, cached_tokens=0, tp=1, quantization=None) -> float
    prefill_batch_seconds(model, gpu, chunks: [(new, cached), ...], tp=1, quantization=None) -> float
    decode_step_seconds(model, gpu, batch_size, context_tokens, tp=1,
                        quantization=None, kv_cache_dtype=None) -> float
    model_ready_seconds(model, gpu, tp=1, quantization=None,
                        download_gbps=10.0, cached_on_disk=False) -> float
    jitter_factor(rng: random.Random, cv: float) -> float
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

# Fraction of peak tensor FLOPs a prefill batch reaches (FlashInfer/cuBLAS on Hopper reach
# roughly 60% of the datasheet dense peak on 8k-token chunks).
PREFILL_MFU = 0.60
# Fraction of datasheet HBM bandwidth a decode step reaches (weights + KV streaming).
DECODE_BW_EFF = 0.80
# Fixed cost per scheduler step: Python scheduling, sampling, CUDA-graph launch, detokenize.
STEP_OVERHEAD_S = 0.0012
# Extra cost per transformer layer per step (kernel boundaries that graphs cannot hide).
PER_LAYER_OVERHEAD_S = 18e-6
# Latency of one small all-reduce across the tensor-parallel group (custom all-reduce, NVLink).
ALLREDUCE_LATENCY_S = 12e-6
# Engine start-up after weights are in GPU memory: CUDA graph capture and warm-up.
ENGINE_WARMUP_S = 25.0


@dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_gb: float  # usable HBM, decimal GB
    bf16_tflops: float  # dense tensor-core peak
    fp8_tflops: float  # 0 where the GPU has no FP8 tensor cores
    hbm_gbps: float  # GB/s
    interconnect_gbps: float  # per-GPU all-reduce bandwidth (NVLink or PCIe)
    load_gbytes_per_s: float = 2.0  # disk/host -> GPU weight loading per GPU
    # Share of hbm_gbps a decode step streams. DECODE_BW_EFF unless measurements of this GPU say
    # otherwise (H200: fitted to measured vLLM decode latencies, see CALIBRATION.md).
    decode_bw_eff: float = DECODE_BW_EFF


@dataclass(frozen=True)
class ModelProfile:
    name: str
    hf_id: str
    params_b: float  # total parameters, billions
    active_params_b: float  # parameters used per token (MoE < total)
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    context_length: int
    experts: int = 0
    experts_per_token: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


# Datasheet numbers (SXM variants where there is a choice).
GPUS: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        GpuProfile("h100", 80, 989, 1979, 3350, 450, 2.5),
        GpuProfile("h200", 141, 989, 1979, 4800, 450, 2.5, decode_bw_eff=0.70),
        GpuProfile("b200", 180, 2250, 4500, 8000, 900, 3.0),
        GpuProfile("a100", 80, 312, 0, 2039, 300, 2.0),
        GpuProfile("a100-40gb", 40, 312, 0, 1555, 300, 2.0),
        GpuProfile("l40s", 48, 362, 733, 864, 32, 1.5),
        GpuProfile("l4", 24, 121, 242, 300, 32, 1.0),
        GpuProfile("a10g", 24, 70, 0, 600, 32, 1.0),
    )
}

MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", 1.24, 1.24, 16, 2048, 32, 8, 64, 131072),
        ModelProfile("llama-3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", 3.21, 3.21, 28, 3072, 24, 8, 128, 131072),
        ModelProfile("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 8.03, 8.03, 32, 4096, 32, 8, 128, 131072),
        ModelProfile("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 70.6, 70.6, 80, 8192, 64, 8, 128, 131072),
        ModelProfile("llama-3.3-70b", "meta-llama/Llama-3.3-70B-Instruct", 70.6, 70.6, 80, 8192, 64, 8, 128, 131072),
        ModelProfile(
            "llama-3.1-405b", "meta-llama/Llama-3.1-405B-Instruct", 405.9, 405.9, 126, 16384, 128, 8, 128, 131072
        ),
        ModelProfile("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", 0.49, 0.49, 24, 896, 14, 2, 64, 32768),
        ModelProfile("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 7.62, 7.62, 28, 3584, 28, 4, 128, 32768),
        ModelProfile("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", 14.7, 14.7, 48, 5120, 40, 8, 128, 32768),
        ModelProfile("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", 32.8, 32.8, 64, 5120, 40, 8, 128, 32768),
        ModelProfile("qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", 72.7, 72.7, 80, 8192, 64, 8, 128, 32768),
        ModelProfile("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", 7.25, 7.25, 32, 4096, 32, 8, 128, 32768),
        ModelProfile(
            "mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7, 12.9, 32, 4096, 32, 8, 128, 32768, 8, 2
        ),
        ModelProfile("gemma-2-9b", "google/gemma-2-9b-it", 9.24, 9.24, 42, 3584, 16, 8, 256, 8192),
    )
}

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100"

# Bytes per weight at each quantization tier (SGLang --quantization values and aliases).
_WEIGHT_BYTES = {
    None: 2.0, "bf16": 2.0, "fp16": 2.0, "float16": 2.0, "bfloat16": 2.0,
    "fp8": 1.0, "w8a8_fp8": 1.0, "modelopt_fp8": 1.0, "w8a8_int8": 1.0, "int8": 1.0,
    "awq": 0.53, "awq_marlin": 0.53, "gptq": 0.53, "gptq_marlin": 0.53, "int4": 0.53,
    "bitsandbytes": 0.53, "gguf": 0.6, "modelopt_fp4": 0.56, "w4afp8": 0.53, "marlin": 0.53, "qoq": 0.53,
    "mxfp4": 0.53, "compressed-tensors": 1.0, "fbgemm_fp8": 1.0, "blockwise_int8": 1.0,
}
# Tiers whose GEMMs run on FP8/INT8 tensor cores (weight-only int4 dequantizes to bf16).
_FP8_COMPUTE = {"fp8", "w8a8_fp8", "modelopt_fp8", "w8a8_int8", "int8", "w4afp8", "modelopt_fp4", "fbgemm_fp8",
                "compressed-tensors", "blockwise_int8"}


def get_gpu(name: str) -> GpuProfile:
    key = name.lower().replace("_", "-")
    if key not in GPUS:
        raise KeyError(f"unknown GPU profile {name!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]


def get_model(name: str) -> ModelProfile:
    key = name.lower()
    if key not in MODELS:
        raise KeyError(f"unknown model profile {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[key]


def _normalise(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def infer_model_profile(model_path: str | None, explicit: str | None = None) -> ModelProfile:
    """Pick the profile named explicitly, else one whose name or HF id matches the path's
    basename (``meta-llama/Llama-3.1-70B-Instruct`` -> llama-3.1-70b), else the 8B default."""
    if explicit:
        return get_model(explicit)
    if model_path:
        base = _normalise(os.path.basename(model_path.rstrip("/")))
        for profile in MODELS.values():
            if base == _normalise(os.path.basename(profile.hf_id)):
                return profile
        # Longest profile name first so "llama-3.1-70b" wins over a shorter accidental match.
        for profile in sorted(MODELS.values(), key=lambda p: -len(p.name)):
            if _normalise(profile.name) in base:
                return profile
    return MODELS[DEFAULT_MODEL]


def bytes_per_weight(quantization: str | None) -> float:
    key = quantization.lower() if quantization else None
    if key not in _WEIGHT_BYTES:
        raise KeyError(f"unknown quantization {quantization!r}")
    return _WEIGHT_BYTES[key]


def weight_bytes(model: ModelProfile, quantization: str | None = None) -> float:
    return model.params_b * 1e9 * bytes_per_weight(quantization)


def _kv_dtype_bytes(kv_cache_dtype: str | None) -> float:
    return 1.0 if kv_cache_dtype and kv_cache_dtype.startswith("fp8") else 2.0


def kv_bytes_per_token(model: ModelProfile, tp: int = 1, kv_cache_dtype: str | None = None) -> float:
    """KV cache bytes one token occupies on each GPU of the tensor-parallel group."""
    heads_per_gpu = math.ceil(model.kv_heads / tp)
    return 2 * model.layers * heads_per_gpu * model.head_dim * _kv_dtype_bytes(kv_cache_dtype)


def kv_capacity_tokens(
    model: ModelProfile,
    gpu: GpuProfile,
    tp: int = 1,
    mem_fraction_static: float = 0.88,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
) -> int:
    """Tokens the KV pool holds (SGLang's ``max_total_num_tokens``); 0 if weights do not fit."""
    pool = gpu.memory_gb * 1e9 * mem_fraction_static - weight_bytes(model, quantization) / tp
    if pool <= 0:
        return 0
    return int(pool // kv_bytes_per_token(model, tp, kv_cache_dtype))


def _compute_tflops(gpu: GpuProfile, quantization: str | None) -> float:
    if quantization and quantization.lower() in _FP8_COMPUTE and gpu.fp8_tflops:
        return gpu.fp8_tflops
    return gpu.bf16_tflops


def _allreduce_seconds(model: ModelProfile, gpu: GpuProfile, tp: int, tokens: int) -> float:
    if tp <= 1:
        return 0.0
    message = tokens * model.hidden * 2  # bf16 activations
    per_allreduce = ALLREDUCE_LATENCY_S + 2 * (tp - 1) / tp * message / (gpu.interconnect_gbps * 1e9)
    return 2 * model.layers * per_allreduce


def _step_overhead(model: ModelProfile) -> float:
    return STEP_OVERHEAD_S + PER_LAYER_OVERHEAD_S * model.layers


def _weights_read_seconds(model: ModelProfile, gpu: GpuProfile, tp: int, quantization: str | None,
                          batch_size: int) -> float:
    total = weight_bytes(model, quantization)
    if model.is_moe:
        # Dense part (attention, embeddings) is always read; experts only when some token routes there.
        expert_share = (model.params_b - model.active_params_b) / (1 - model.experts_per_token / model.experts)
        expert_bytes = expert_share * 1e9 * bytes_per_weight(quantization)
        touched = 1 - (1 - model.experts_per_token / model.experts) ** max(batch_size, 1)
        total = total - expert_bytes + expert_bytes * touched
    return total / tp / (gpu.hbm_gbps * 1e9 * gpu.decode_bw_eff)


def prefill_seconds(
    model: ModelProfile,
    gpu: GpuProfile,
    new_tokens: int,
    cached_tokens: int = 0,
    tp: int = 1,
    quantization: str | None = None,
) -> float:
    """One extend step computing ``new_tokens`` of one request on top of ``cached_tokens``."""
    return prefill_batch_seconds(model, gpu, [(new_tokens, cached_tokens)], tp, quantization)


def prefill_batch_seconds(
    model: ModelProfile,
    gpu: GpuProfile,
    chunks: Sequence[tuple[int, int]],
    tp: int = 1,
    quantization: str | None = None,
) -> float:
    """One extend step over several requests, each given as (new tokens, cached tokens)."""
    new_total = sum(new for new, _ in chunks)
    if new_total <= 0:
        return 0.0
    gemm_flops = 2 * model.active_params_b * 1e9 * new_total
    attn_per_pair = 4 * model.layers * model.q_heads * model.head_dim
    attn_flops = attn_per_pair * sum(new * (cached + new / 2) for new, cached in chunks)
    compute = (gemm_flops + attn_flops) / (tp * _compute_tflops(gpu, quantization) * 1e12 * PREFILL_MFU)
    floor = _weights_read_seconds(model, gpu, tp, quantization, new_total)
    return max(compute, floor) + _allreduce_seconds(model, gpu, tp, new_total) + _step_overhead(model)


def decode_step_seconds(
    model: ModelProfile,
    gpu: GpuProfile,
    batch_size: int,
    context_tokens: int,
    tp: int = 1,
    quantization: str | None = None,
    kv_cache_dtype: str | None = None,
) -> float:
    """One decode step producing one token for each of ``batch_size`` requests whose KV
    caches hold ``context_tokens`` tokens in total."""
    if batch_size <= 0:
        return 0.0
    kv_read = context_tokens * kv_bytes_per_token(model, tp, kv_cache_dtype) / (gpu.hbm_gbps * 1e9 * gpu.decode_bw_eff)
    memory = _weights_read_seconds(model, gpu, tp, quantization, batch_size) + kv_read
    compute = 2 * model.active_params_b * 1e9 * batch_size / (
        tp * _compute_tflops(gpu, quantization) * 1e12 * PREFILL_MFU
    )
    return max(memory, compute) + _allreduce_seconds(model, gpu, tp, batch_size) + _step_overhead(model)


def model_ready_seconds(
    model: ModelProfile,
    gpu: GpuProfile,
    tp: int = 1,
    quantization: str | None = None,
    download_gbps: float = 10.0,
    cached_on_disk: bool = False,
) -> float:
    """Cold start: download the checkpoint (gigabits/s), load it into the GPUs (in parallel,
    one shard per GPU), then warm up."""
    size = weight_bytes(model, quantization)
    download = 0.0 if cached_on_disk else size * 8 / (download_gbps * 1e9)
    load = size / tp / (gpu.load_gbytes_per_s * 1e9)
    return download + load + ENGINE_WARMUP_S


def jitter_factor(rng: random.Random, cv: float) -> float:
    """Multiplicative noise for one step, clipped so a step never gets shorter than half."""
    if cv <= 0:
        return 1.0
    return max(0.5, 1.0 + rng.gauss(0.0, cv))
