"""One command template for every engine: the exact ``sglang.launch_server`` command line on a
GPU node, the same flags to ``dataplane.sim`` elsewhere (the simulator accepts SGLang's flags).

Pure functions: no processes, no I/O, so the command a GPU node runs is tested here verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ENGINE_MODULES = {"sglang": "sglang.launch_server", "sim": "dataplane.sim"}
# SGLang's defaults suit a single-tenant box; a shared replica wants the prefix-aware scheduler.
DEFAULT_ENGINE_ARGS: Mapping[str, Any] = {"schedule_policy": "lpm"}


@dataclass(frozen=True)
class EngineSpec:
    """What one replica serves: comes from the replica's entry in the control plane's list."""

    model_path: str
    served_model_name: str
    tp_size: int = 1
    quantization: str | None = None
    context_length: int | None = None
    engine_args: Mapping[str, Any] = field(default_factory=dict)  # the variant's, as flag name → value
    extra_args: tuple[str, ...] = ()  # raw flags from the node config (appended last)


def flag(name: str) -> str:
    return "--" + name.lstrip("-").replace("_", "-")


def args_to_flags(args: Mapping[str, Any]) -> list[str]:
    """``{"mem_fraction_static": 0.85, "enable_torch_compile": True}`` →
    ``["--mem-fraction-static", "0.85", "--enable-torch-compile"]``. ``False``/``None`` drop the
    flag; a list repeats its values after one flag (SGLang's ``nargs="+"`` style)."""
    out: list[str] = []
    for name, value in args.items():
        if value is None or value is False:
            continue
        out.append(flag(name))
        if value is True:
            continue
        if isinstance(value, list | tuple):
            out.extend(str(v) for v in value)
        else:
            out.append(str(value))
    return out


# Flags the template sets from the replica's entry in the control plane's list; copies in a node config lose.
OWNED_FLAGS = frozenset({"--model-path", "--model", "--served-model-name", "--host", "--port", "--tp-size", "--tp",
                         "--quantization", "--context-length", "--enable-metrics",
                         "--enable-cache-report"})


def group_flags(raw: Sequence[str]) -> list[list[str]]:
    """``["--a", "1", "--b", "--c=2"]`` → ``[["--a", "1"], ["--b"], ["--c=2"]]``."""
    groups: list[list[str]] = []
    for token in raw:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def extra_flags(raw: Sequence[str], engine_args: Mapping[str, Any]) -> tuple[str, ...]:
    """Node-config flags minus those the template or the variant's ``engine_args`` already set, so
    the command line carries each flag once and the control plane's entry wins."""
    taken = OWNED_FLAGS | {flag(name) for name in engine_args}
    kept = [g for g in group_flags(raw) if g[0].split("=", 1)[0] not in taken]
    return tuple(token for group in kept for token in group)


def engine_command(spec: EngineSpec, *, engine: str, python: str, host: str, port: int) -> list[str]:
    """The argv that starts one replica. ``engine`` is ``sglang`` or ``sim``."""
    if engine not in ENGINE_MODULES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {sorted(ENGINE_MODULES)}")
    argv = [
        python, "-m", ENGINE_MODULES[engine],
        "--model-path", spec.model_path,
        "--served-model-name", spec.served_model_name,
        "--host", host,
        "--port", str(port),
        "--tp-size", str(spec.tp_size),
    ]
    if spec.quantization:
        argv += ["--quantization", spec.quantization]
    if spec.context_length:
        argv += ["--context-length", str(spec.context_length)]
    argv.append("--enable-metrics")  # the agent's heartbeats are built from /metrics
    # SGLang puts usage.prompt_tokens_details.cached_tokens in OpenAI answers only with this flag; the
    # edge corrects its prefix index from it (dataplane/sim/CONFORMANCE.md, "cached_tokens").
    argv.append("--enable-cache-report")
    argv += args_to_flags({**DEFAULT_ENGINE_ARGS, **spec.engine_args})
    argv += list(extra_flags(spec.extra_args, {**DEFAULT_ENGINE_ARGS, **spec.engine_args}))
    return argv


def choose_engine(requested: str, gpus: Sequence[int]) -> str:
    """SGLang where there are GPUs, the simulator elsewhere: ``sim`` is never silently upgraded, and
    ``sglang``/``auto`` on a machine without GPUs runs the simulator (a CPU dev box, the local cloud)."""
    if requested == "sim":
        return "sim"
    if requested in ("sglang", "auto"):
        return "sglang" if gpus else "sim"
    raise ValueError(f"unknown engine {requested!r}")


def engine_env(engine: str, gpu_ids: Sequence[int]) -> dict[str, str]:
    """Environment additions for one replica: it sees only its own GPUs, by index. The simulator
    gets the same variable (it stands in for SGLang and reports what it was given)."""
    if engine not in ENGINE_MODULES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {sorted(ENGINE_MODULES)}")
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids)}
