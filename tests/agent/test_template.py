"""The one command template: the exact SGLang command line a GPU node runs, and the simulator's."""

from __future__ import annotations

import pytest

from dataplane.agent.template import (
    EngineSpec,
    args_to_flags,
    choose_engine,
    engine_command,
    engine_env,
    extra_flags,
)
from dataplane.sim.config import parse_config

FP8 = EngineSpec(
    model_path="/var/lib/nimbus/models/meta-llama--Llama-3.1-70B-Instruct-FP8-1a2b3c4d5e",
    served_model_name="llama-3.1-70b-instruct-fp8",
    tp_size=4,
    quantization="fp8",
    context_length=32768,
    engine_args={"mem_fraction_static": 0.85, "enable_torch_compile": True, "disable_radix_cache": False},
)


def test_sglang_command_line_for_an_fp8_variant_is_exact():
    argv = engine_command(FP8, engine="sglang", python="/opt/nimbus/venv/bin/python", host="0.0.0.0", port=30001)
    assert argv == [
        "/opt/nimbus/venv/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/var/lib/nimbus/models/meta-llama--Llama-3.1-70B-Instruct-FP8-1a2b3c4d5e",
        "--served-model-name", "llama-3.1-70b-instruct-fp8",
        "--host", "0.0.0.0", "--port", "30001",
        "--tp-size", "4",
        "--quantization", "fp8",
        "--context-length", "32768",
        "--enable-metrics",
        "--enable-cache-report",
        "--schedule-policy", "lpm",
        "--mem-fraction-static", "0.85",
        "--enable-torch-compile",
    ]


def test_bf16_variant_has_no_quantization_and_variant_args_override_defaults():
    spec = EngineSpec(model_path="Qwen/Qwen2.5-7B-Instruct", served_model_name="qwen-bf16",
                      engine_args={"schedule_policy": "fcfs"})
    argv = engine_command(spec, engine="sglang", python="python", host="127.0.0.1", port=30000)
    assert "--quantization" not in argv and "--context-length" not in argv
    assert argv[argv.index("--schedule-policy") + 1] == "fcfs" and argv.count("--schedule-policy") == 1


def test_node_config_flags_never_override_the_control_planes_entry():
    # The provisioning pipeline's user data repeats model flags (with its own served name); the
    # control plane's values win and every flag appears once; flags only the node knows are kept.
    spec = EngineSpec(model_path="m", served_model_name="m-bf16", engine_args={"mem_fraction_static": 0.8},
                      extra_args=("--model-path", "m", "--served-model-name", "m:bf16", "--tp-size", "1",
                                  "--enable-metrics", "--mem-fraction-static", "0.8", "--log-level", "warning"))
    argv = engine_command(spec, engine="sglang", python="python", host="h", port=1)
    assert argv.count("--served-model-name") == 1 and argv[argv.index("--served-model-name") + 1] == "m-bf16"
    assert argv.count("--mem-fraction-static") == 1 and argv.count("--enable-metrics") == 1
    assert argv[-2:] == ["--log-level", "warning"]
    assert extra_flags(["--port=9", "--a", "1", "2"], {}) == ("--a", "1", "2")


def test_the_simulator_accepts_the_same_command_line():
    argv = engine_command(FP8, engine="sim", python="python", host="127.0.0.1", port=30001)
    assert argv[:3] == ["python", "-m", "dataplane.sim"]
    config, _ready = parse_config(argv[3:], warn=lambda msg: None)
    assert (config.served_model_name, config.port, config.tp_size) == ("llama-3.1-70b-instruct-fp8", 30001, 4)
    assert (config.quantization, config.context_length, config.schedule_policy) == ("fp8", 32768, "lpm")
    assert config.enable_metrics and config.mem_fraction_static == 0.85


def test_flags_gpus_and_engine_choice():
    assert args_to_flags({"a_b": 1, "off": False, "none": None, "on": True, "many": [1, 2]}) == [
        "--a-b", "1", "--on", "--many", "1", "2"]
    # Every engine sees only its replica's GPUs, the simulator too (it reports what it was given).
    assert engine_env("sglang", [2, 3]) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert engine_env("sim", [0]) == {"CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(ValueError):
        engine_env("vllm", [0])
    assert choose_engine("sglang", [0]) == "sglang" and choose_engine("sglang", []) == "sim"
    assert choose_engine("auto", []) == "sim" and choose_engine("sim", [0, 1]) == "sim"
    with pytest.raises(ValueError):
        engine_command(FP8, engine="vllm", python="p", host="h", port=1)


def test_restart_backoff_doubles_up_to_a_cap():
    from dataplane.agent.engine import restart_delay

    assert [restart_delay(n) for n in range(0, 9)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert restart_delay(3, base_s=0.5, cap_s=1.5) == 1.5


def test_logs_are_one_json_object_per_line():
    import json
    import logging

    from dataplane.agent.logs import JsonFormatter

    record = logging.LogRecord("nimbus.agent", logging.WARNING, __file__, 1, "engine exited", None, None)
    record.replica, record.exit_code = "r-1", -9
    line = json.loads(JsonFormatter({"node": "n-1"}).format(record))
    assert line | {"ts": None} == {"ts": None, "level": "warning", "logger": "nimbus.agent", "msg": "engine exited",
                                   "node": "n-1", "replica": "r-1", "exit_code": -9}


def test_a_variants_tool_reasoning_embedding_and_priority_flags_reach_both_engines():
    # SGLang's own names (python/sglang/srt/server_args.py): --tool-call-parser, --reasoning-parser,
    # --is-embedding, --enable-priority-scheduling, --schedule-low-priority-values-first.
    chat = EngineSpec(model_path="Qwen/Qwen3-8B", served_model_name="qwen3-bf16",
                      engine_args={"tool_call_parser": "qwen25", "reasoning_parser": "qwen3",
                                   "enable_priority_scheduling": True, "schedule_low_priority_values_first": True})
    argv = engine_command(chat, engine="sglang", python="python", host="h", port=1)
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen25"
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert "--enable-priority-scheduling" in argv and "--schedule-low-priority-values-first" in argv
    config, _ = parse_config(engine_command(chat, engine="sim", python="python", host="h", port=1)[3:],
                             warn=lambda msg: None)
    assert config.enable_priority_scheduling and config.schedule_low_priority_values_first
    embed = EngineSpec(model_path="Qwen/Qwen2.5-0.5B-Instruct", served_model_name="embed-bf16",
                       engine_args={"is_embedding": True})
    argv = engine_command(embed, engine="sim", python="python", host="h", port=1)
    assert "--is-embedding" in argv
    config, _ = parse_config(argv[3:], warn=lambda msg: None)
    assert config.is_embedding
