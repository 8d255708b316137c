"""The timing model's relations: the physics the platform's decisions rely on."""

import random

import pytest

from dataplane.sim import config, timing

LLAMA8 = timing.get_model("llama-3.1-8b")
LLAMA70 = timing.get_model("llama-3.1-70b")
MIXTRAL = timing.get_model("mixtral-8x7b")
H100, H200, A100, L4 = (timing.get_gpu(n) for n in ("h100", "h200", "a100", "l4"))


def test_kv_capacity_follows_memory_weights_and_dtypes():
    base = timing.kv_capacity_tokens(LLAMA8, H100)
    # bytes per token for Llama-3.1-8B: 2 * 32 layers * 8 heads * 128 dims * 2 bytes
    assert timing.kv_bytes_per_token(LLAMA8) == 131072
    assert timing.kv_capacity_tokens(LLAMA8, H200) > base  # more HBM
    assert timing.kv_capacity_tokens(LLAMA8, H100, quantization="fp8") > base  # smaller weights
    assert timing.kv_capacity_tokens(LLAMA8, H100, kv_cache_dtype="fp8_e4m3") == pytest.approx(2 * base, rel=0.01)
    assert timing.kv_capacity_tokens(LLAMA8, H100, mem_fraction_static=0.5) < base
    assert timing.kv_capacity_tokens(LLAMA70, H100) == 0  # 141 GB of bf16 weights do not fit 80 GB
    assert timing.kv_capacity_tokens(LLAMA70, H100, tp=4) > 0


def test_quantized_variant_decodes_faster_than_bf16():
    for batch in (1, 32, 256):
        bf16 = timing.decode_step_seconds(LLAMA8, H100, batch, batch * 1000)
        fp8 = timing.decode_step_seconds(LLAMA8, H100, batch, batch * 1000, quantization="fp8")
        awq = timing.decode_step_seconds(LLAMA8, H100, batch, batch * 1000, quantization="awq")
        assert awq < fp8 < bf16


def test_tensor_parallel_shortens_steps_but_below_linear():
    one = timing.decode_step_seconds(LLAMA70, H200, 16, 16 * 2000, tp=1)
    two = timing.decode_step_seconds(LLAMA70, H200, 16, 16 * 2000, tp=2)
    four = timing.decode_step_seconds(LLAMA70, H200, 16, 16 * 2000, tp=4)
    assert four < two < one
    assert one / four < 4  # all-reduces and fixed overheads keep the speed-up sub-linear
    p1 = timing.prefill_seconds(LLAMA70, H200, 4096, tp=1)
    p4 = timing.prefill_seconds(LLAMA70, H200, 4096, tp=4)
    assert p1 / 4 < p4 < p1


def test_prefill_scales_with_uncached_tokens_and_cache_hits_cut_it():
    cold = timing.prefill_seconds(LLAMA8, H100, 4000)
    warm = timing.prefill_seconds(LLAMA8, H100, 100, cached_tokens=3900)
    assert warm < cold / 5
    assert timing.prefill_seconds(LLAMA8, H100, 8000) > 1.8 * cold * 0.9


def test_decode_step_grows_with_batch_context_and_slower_gpus():
    small = timing.decode_step_seconds(LLAMA8, H100, 1, 100)
    long_context = timing.decode_step_seconds(LLAMA8, H100, 64, 64 * 8000)
    assert long_context > small
    assert timing.decode_step_seconds(LLAMA8, A100, 1, 100) > small
    assert timing.decode_step_seconds(LLAMA8, H200, 1, 100) < small
    assert timing.decode_step_seconds(LLAMA8, L4, 1, 100) > 5 * small


def test_moe_reads_only_touched_experts_at_small_batch():
    single = timing.decode_step_seconds(MIXTRAL, H100, 1, 100, tp=2)
    full = timing.decode_step_seconds(MIXTRAL, H100, 64, 64 * 100, tp=2)
    assert single < 0.6 * full


def test_model_ready_time_from_size_and_bandwidth():
    small = timing.model_ready_seconds(LLAMA8, H100)
    big = timing.model_ready_seconds(LLAMA70, H100, tp=4)
    cached = timing.model_ready_seconds(LLAMA70, H100, tp=4, cached_on_disk=True)
    assert timing.ENGINE_WARMUP_S < small < big
    assert cached < big
    assert timing.model_ready_seconds(LLAMA70, H100, tp=4, download_gbps=1) > big


def test_weights_on_the_node_skip_the_modelled_download():
    """What the agent passes when the node's cache holds the checkpoint: the cold start is the
    load and warm-up only, shorter by exactly the download at ``--download-gbps``."""
    argv = ["--model-path", "meta-llama/Llama-3.1-70B-Instruct", "--tp-size", "4", "--download-gbps", "10"]
    _, cold = config.parse_config(argv, warn=lambda msg: None)
    _, cached = config.parse_config([*argv, "--weights-cached"], warn=lambda msg: None)
    model = timing.get_model("llama-3.1-70b")
    assert cold - cached == pytest.approx(timing.weight_bytes(model) * 8 / 10e9, rel=1e-6)
    assert cached > 0


def test_profiles_inferred_from_model_path():
    assert timing.infer_model_profile("meta-llama/Llama-3.1-70B-Instruct").name == "llama-3.1-70b"
    assert timing.infer_model_profile("/models/Qwen2.5-7B-Instruct").name == "qwen2.5-7b"
    assert timing.infer_model_profile("org/something-else").name == timing.DEFAULT_MODEL
    assert timing.infer_model_profile("whatever", explicit="mixtral-8x7b").name == "mixtral-8x7b"
    with pytest.raises(KeyError):
        timing.get_gpu("tpu-v9")


def test_jitter_is_seeded_and_bounded():
    a = [timing.jitter_factor(random.Random(7), 0.05) for _ in range(3)]
    b = [timing.jitter_factor(random.Random(7), 0.05) for _ in range(3)]
    assert a == b
    rng = random.Random(1)
    samples = [timing.jitter_factor(rng, 0.05) for _ in range(2000)]
    assert min(samples) >= 0.5
    assert 0.99 < sum(samples) / len(samples) < 1.01
    assert timing.jitter_factor(rng, 0) == 1.0
