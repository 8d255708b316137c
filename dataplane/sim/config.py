"""Command line -> :class:`SimConfig`, with SGLang's flag names and defaults where they exist.

Unknown flags are accepted with a warning so one launch template can start either engine.

The GPUs a replica runs on come the way SGLang gets them: ``CUDA_VISIBLE_DEVICES`` (the agent
sets it per replica), or the simulator's own ``--gpu-ids``, which wins. They change nothing in
the timing model; ``/get_server_info`` reports them as ``gpu_ids`` so tests and operators can
see which indices a replica was given.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from . import timing

SCHEDULE_POLICIES = ("fcfs", "lpm")
# SGLang's other policies (schedule_policy.py: CacheAwarePolicy / CacheAgnosticPolicy); "priority" was
# a policy name in older releases before --enable-priority-scheduling.
OTHER_SGLANG_POLICIES = ("random", "dfs-weight", "lof", "priority", "hrrn", "shortest-prefill-first", "routing-key")


@dataclass
class SimConfig:
    model_path: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float = 0.88
    max_running_requests: int = 2048  # effective cap (SGLang's scheduler computes it when not given)
    max_total_tokens: int = 0  # effective KV pool size in tokens (SGLang's max_total_num_tokens)
    max_queued_requests: int | None = None  # SGLang: None = unbounded queue
    enable_priority_scheduling: bool = False  # SGLang: the ``priority`` field is ignored without it
    is_embedding: bool = False  # SGLang's --is-embedding: /v1/embeddings only, no generation
    schedule_low_priority_values_first: bool = False
    # SGLang: with priority scheduling a waiting request whose priority beats a running one's by
    # more than this preempts it when the batch is full (the victim is re-queued, its output kept).
    priority_scheduling_preemption_threshold: int = 10
    disable_priority_preemption: bool = False
    schedule_policy: str = "fcfs"
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    disable_radix_cache: bool = False
    page_size: int = 1
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    context_length: int = 131072
    api_key: str | None = None
    enable_metrics: bool = False
    enable_cache_report: bool = False
    stream_interval: int = 1
    log_level: str = "info"
    # Simulator-only
    model: timing.ModelProfile = field(default_factory=lambda: timing.get_model(timing.DEFAULT_MODEL))
    gpu: timing.GpuProfile = field(default_factory=lambda: timing.get_gpu(timing.DEFAULT_GPU))
    time_scale: float = 1.0
    seed: int = 0
    ready_delay: float = 0.0
    jitter: float = 0.03
    eos_min_tokens: int = 128
    eos_max_tokens: int = 1024
    fault_health_fail: bool = False
    fault_hang: bool = False
    fault_crash_after_tokens: int | None = None
    fault_slowdown: float = 1.0
    fault_refuse: bool = False
    gpu_ids: list[int] = field(default_factory=list)  # physical indices: --gpu-ids, else CUDA_VISIBLE_DEVICES
    ignored_flags: list[str] = field(default_factory=list)
    # The values as passed on the command line: SGLang's /get_server_info reports server args as
    # given (None when not set); the effective caps appear elsewhere (see server_args()).
    max_running_requests_arg: int | None = None
    max_total_tokens_arg: int | None = None

    def server_args(self) -> dict:
        """What ``/get_server_info`` reports: SGLang's server-args keys, plus ``sim_*`` extras."""
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_name,
            "host": self.host,
            "port": self.port,
            "tp_size": self.tp_size,
            "dp_size": self.dp_size,
            "mem_fraction_static": self.mem_fraction_static,
            "max_running_requests": self.max_running_requests_arg,
            "max_queued_requests": self.max_queued_requests,
            "max_total_tokens": self.max_total_tokens_arg,
            "schedule_policy": self.schedule_policy,
            "enable_priority_scheduling": self.enable_priority_scheduling,
            "schedule_low_priority_values_first": self.schedule_low_priority_values_first,
            "priority_scheduling_preemption_threshold": self.priority_scheduling_preemption_threshold,
            "disable_priority_preemption": self.disable_priority_preemption,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "disable_radix_cache": self.disable_radix_cache,
            "page_size": self.page_size,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype or "auto",
            "context_length": self.context_length,
            "enable_metrics": self.enable_metrics,
            "enable_cache_report": self.enable_cache_report,
            "stream_interval": self.stream_interval,
            "log_level": self.log_level,
            "api_key": None if self.api_key is None else "***",
            "load_balance_method": "round_robin",
            "disaggregation_mode": "null",
            "sim_gpu": self.gpu.name,
            "sim_model_profile": self.model.name,
            "sim_time_scale": self.time_scale,
            "sim_seed": self.seed,
            "gpu_ids": list(self.gpu_ids),
        }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nimbus-sim",
        description="SGLang-compatible engine simulator (no GPU, no real tokens).",
        allow_abbrev=False,
    )
    s = p.add_argument_group("SGLang flags")
    s.add_argument("--model-path", "--model", dest="model_path")
    s.add_argument("--tokenizer-path")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    s.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    s.add_argument("--mem-fraction-static", type=float)
    s.add_argument("--max-running-requests", type=int)
    s.add_argument("--max-queued-requests", type=int)
    s.add_argument("--max-total-tokens", type=int)
    s.add_argument("--schedule-policy", default="fcfs")
    s.add_argument("--enable-priority-scheduling", action="store_true")
    s.add_argument("--is-embedding", action="store_true", help="serve /v1/embeddings instead of generating")
    s.add_argument("--schedule-low-priority-values-first", action="store_true")
    s.add_argument("--priority-scheduling-preemption-threshold", type=int, default=10)
    s.add_argument("--disable-priority-preemption", action="store_true")
    s.add_argument("--chunked-prefill-size", type=int)
    s.add_argument("--max-prefill-tokens", type=int, default=16384)
    s.add_argument("--disable-radix-cache", action="store_true")
    s.add_argument("--page-size", type=int, default=1)
    s.add_argument("--quantization")
    s.add_argument("--kv-cache-dtype", default="auto")
    s.add_argument("--context-length", type=int)
    s.add_argument("--served-model-name")
    s.add_argument("--api-key")
    s.add_argument("--enable-metrics", action="store_true")
    s.add_argument("--enable-cache-report", action="store_true")
    s.add_argument("--stream-interval", type=int, default=1)
    s.add_argument("--log-level", default="info")
    s.add_argument("--trust-remote-code", action="store_true")
    s.add_argument("--log-requests", action="store_true")
    own = p.add_argument_group("simulator flags")
    own.add_argument("--gpu", default=timing.DEFAULT_GPU, help=f"one of {', '.join(sorted(timing.GPUS))}")
    own.add_argument("--model-profile", help=f"one of {', '.join(sorted(timing.MODELS))}")
    own.add_argument("--time-scale", type=float, default=1.0, help="X>1 runs X times faster than real time")
    own.add_argument("--seed", type=int, default=0)
    own.add_argument("--ready-delay", type=float,
                     help="wall seconds until /health is 200, not divided by --time-scale "
                          "(default: modelled download + load + warm-up, divided by --time-scale)")
    own.add_argument("--download-gbps", type=float, default=10.0, help="checkpoint download speed for readiness")
    own.add_argument("--weights-cached", action="store_true", help="checkpoint already on local disk")
    own.add_argument("--jitter", type=float, default=0.03, help="coefficient of variation of step times")
    own.add_argument("--eos-min-tokens", type=int, default=128, help="shortest natural (EOS) answer")
    own.add_argument("--eos-max-tokens", type=int, default=1024, help="longest natural (EOS) answer")
    own.add_argument("--gpu-ids", help="GPU indices this engine runs on, e.g. 2,3 (default: CUDA_VISIBLE_DEVICES; "
                                       "reported by /get_server_info)")
    f = p.add_argument_group("fault injection")
    f.add_argument("--fault-health-fail", action="store_true")
    f.add_argument("--fault-hang", action="store_true")
    f.add_argument("--fault-crash-after-tokens", type=int)
    f.add_argument("--fault-slowdown", type=float, default=1.0)
    f.add_argument("--fault-refuse", action="store_true")
    return p


def _default_chunked_prefill(gpu: timing.GpuProfile) -> int:
    # SGLang picks the chunk size from GPU memory in the same steps.
    if gpu.memory_gb < 35:
        return 2048
    if gpu.memory_gb < 60:
        return 4096
    return 8192 if gpu.memory_gb < 90 else 16384


def _default_mem_fraction(tp: int) -> float:
    # SGLang leaves more room for activations on a single GPU than on a TP group.
    return 0.88 if tp == 1 else 0.85


def parse_gpu_ids(raw: str | None, warn: Callable[[str], None], source: str) -> list[int]:
    """``"2,3"`` → ``[2, 3]``; ``None``/``""`` → ``[]``. Entries that are not indices (GPU UUIDs,
    MIG names) are skipped with a warning: the simulator reports indices only."""
    ids: list[int] = []
    for token in (raw or "").split(","):
        token = token.strip()
        if not token:
            continue
        if token.isdigit():
            ids.append(int(token))
        else:
            warn(f"{source}: ignoring {token!r} (not a GPU index)")
    return ids


def parse_config(argv: list[str] | None = None, warn=None,
                 environ: Mapping[str, str] | None = None) -> tuple[SimConfig, float]:
    """Returns the config and the model-ready delay in wall seconds. ``environ`` (default: the
    process environment) supplies ``CUDA_VISIBLE_DEVICES`` when ``--gpu-ids`` is not given."""
    warn = warn or (lambda msg: print(f"[nimbus-sim] warning: {msg}", file=sys.stderr))
    args, unknown = build_parser().parse_known_args(argv)
    env = os.environ if environ is None else environ
    if args.gpu_ids is not None:
        gpu_ids = parse_gpu_ids(args.gpu_ids, warn, "--gpu-ids")
    else:
        gpu_ids = parse_gpu_ids(env.get("CUDA_VISIBLE_DEVICES"), warn, "CUDA_VISIBLE_DEVICES")
    if gpu_ids and args.tp_size > len(gpu_ids):
        warn(f"--tp-size {args.tp_size} needs more GPUs than the {len(gpu_ids)} given ({gpu_ids}): "
             "SGLang would not start like this")
    if unknown:
        warn(f"ignoring SGLang flags the simulator does not model: {' '.join(unknown)}")
    try:
        model = timing.infer_model_profile(args.model_path, args.model_profile)
        gpu = timing.get_gpu(args.gpu)
        timing.bytes_per_weight(args.quantization)
    except KeyError as exc:  # an unknown profile or tier is a usage error, not a crash
        raise SystemExit(f"nimbus-sim: {exc.args[0]}") from None
    policy = args.schedule_policy
    if policy not in SCHEDULE_POLICIES:
        if policy not in OTHER_SGLANG_POLICIES:
            raise SystemExit(f"invalid --schedule-policy {policy!r}")
        warn(f"--schedule-policy {policy} is simulated as fcfs")
        policy = "fcfs"
    quantization = args.quantization
    kv_dtype = None if args.kv_cache_dtype in (None, "auto") else args.kv_cache_dtype
    mem_fraction = args.mem_fraction_static or _default_mem_fraction(args.tp_size)
    capacity = timing.kv_capacity_tokens(model, gpu, args.tp_size, mem_fraction, quantization, kv_dtype)
    if args.max_total_tokens:
        capacity = min(capacity, args.max_total_tokens) if capacity else args.max_total_tokens
    if capacity <= 0:
        raise SystemExit(
            f"Not enough memory: {model.name} at {quantization or 'bf16'} does not fit {args.tp_size}x{gpu.name} "
            f"with --mem-fraction-static {mem_fraction}"
        )
    if args.dp_size > 1:
        warn("--dp-size > 1 is simulated as a single data-parallel rank (run one simulator per rank)")
        args.dp_size = 1
    context = args.context_length or model.context_length
    # SGLang sizes its request pool from capacity and context, then caps running requests by it.
    pool = min(max(int(capacity / context * 512), 2048), 4096)
    max_running = args.max_running_requests or min(capacity // 2, pool)
    model_path = args.model_path or model.hf_id
    config = SimConfig(
        model_path=model_path,
        served_model_name=args.served_model_name or model_path,
        host=args.host,
        port=args.port,
        tp_size=args.tp_size,
        dp_size=args.dp_size,
        mem_fraction_static=mem_fraction,
        max_running_requests=max(1, max_running),
        max_total_tokens=capacity,
        max_queued_requests=args.max_queued_requests if args.max_queued_requests else None,
        enable_priority_scheduling=args.enable_priority_scheduling,
        is_embedding=args.is_embedding,
        schedule_low_priority_values_first=args.schedule_low_priority_values_first,
        priority_scheduling_preemption_threshold=args.priority_scheduling_preemption_threshold,
        disable_priority_preemption=args.disable_priority_preemption,
        max_running_requests_arg=args.max_running_requests,
        max_total_tokens_arg=args.max_total_tokens,
        schedule_policy=policy,
        chunked_prefill_size=args.chunked_prefill_size or _default_chunked_prefill(gpu),
        max_prefill_tokens=args.max_prefill_tokens,
        disable_radix_cache=args.disable_radix_cache,
        page_size=max(1, args.page_size),
        quantization=quantization,
        kv_cache_dtype=kv_dtype,
        context_length=context,
        api_key=args.api_key,
        enable_metrics=args.enable_metrics,
        enable_cache_report=args.enable_cache_report,
        stream_interval=max(1, args.stream_interval),
        log_level=args.log_level,
        model=model,
        gpu=gpu,
        time_scale=args.time_scale if args.time_scale > 0 else 1.0,
        seed=args.seed,
        jitter=max(0.0, args.jitter),
        eos_min_tokens=args.eos_min_tokens,
        eos_max_tokens=max(args.eos_min_tokens, args.eos_max_tokens),
        fault_health_fail=args.fault_health_fail,
        fault_hang=args.fault_hang,
        fault_crash_after_tokens=args.fault_crash_after_tokens,
        fault_slowdown=args.fault_slowdown,
        fault_refuse=args.fault_refuse,
        gpu_ids=gpu_ids,
        ignored_flags=unknown,
    )
    if args.ready_delay is not None:
        ready = max(0.0, args.ready_delay)
    else:
        ready = timing.model_ready_seconds(
            model, gpu, args.tp_size, quantization, args.download_gbps, args.weights_cached
        ) / config.time_scale
    return config, ready
