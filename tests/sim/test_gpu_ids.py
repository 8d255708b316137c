"""The GPUs a simulator is given (``CUDA_VISIBLE_DEVICES``, or ``--gpu-ids`` which wins) are what
``/get_server_info`` reports: the agent's per-replica GPU placement is checkable end to end."""

from __future__ import annotations

import httpx

from dataplane.sim.config import parse_config, parse_gpu_ids


def gpu_ids(sim) -> tuple[list[int], list[int]]:
    info = httpx.get(sim.url + "/get_server_info", timeout=10).json()
    alias = httpx.get(sim.url + "/server_info", timeout=10).json()
    return info["gpu_ids"], alias["gpu_ids"]


def test_cuda_visible_devices_is_reported(start_sim):
    sim = start_sim("--tp-size", "2", env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert gpu_ids(sim) == ([2, 3], [2, 3])


def test_gpu_ids_flag_overrides_the_environment(start_sim):
    sim = start_sim("--gpu-ids", "5", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert gpu_ids(sim) == ([5], [5])


def test_no_gpus_given_is_an_empty_list(start_sim):
    sim = start_sim(env={"CUDA_VISIBLE_DEVICES": ""})
    assert gpu_ids(sim) == ([], [])


def test_parsing_skips_what_is_not_an_index_and_warns():
    warnings: list[str] = []
    assert parse_gpu_ids("0, 2,GPU-8f3a,,7", warnings.append, "CUDA_VISIBLE_DEVICES") == [0, 2, 7]
    assert len(warnings) == 1 and "GPU-8f3a" in warnings[0]
    assert parse_gpu_ids(None, warnings.append, "x") == [] and parse_gpu_ids("", warnings.append, "x") == []


def test_tp_size_beyond_the_given_gpus_is_warned_about():
    warnings: list[str] = []
    config, _ = parse_config(["--tp-size", "4"], warn=warnings.append, environ={"CUDA_VISIBLE_DEVICES": "1,2"})
    assert config.gpu_ids == [1, 2] and any("--tp-size 4" in w for w in warnings)
    config, _ = parse_config([], warn=warnings.append, environ={})
    assert config.gpu_ids == [] and config.server_args()["gpu_ids"] == []
