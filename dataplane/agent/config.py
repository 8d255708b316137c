"""What the agent reads at start: the bootstrap config cloud-init wrote (``infra.bootstrap``'s
``AgentConfig``, the one format both sides share) plus node-local tunables.

Tunables come from ``NIMBUS_AGENT_*`` environment variables or flags. Defaults suit a GPU VM;
on the ``local`` cloud (many "nodes" on one machine) ports are ephemeral and state lives next
to the config file.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from infra.bootstrap import AGENT_CONFIG_PATH, AgentConfig


@dataclass(frozen=True)
class AgentOptions:
    state_dir: Path = Path("/var/lib/nimbus/agent")
    host: str = "0.0.0.0"  # where the agent and its engines listen
    advertise_host: str | None = None  # how the edge and control plane reach them; None: detect
    port: int = 8479  # the agent's own HTTP; 0 = ephemeral
    engine_port_base: int = 30000  # a replica listens on base + its lowest GPU index; 0 = ephemeral
    heartbeat_s: float = 5.0
    drain_grace_s: float = 5.0  # keep serving at least this long after a drain so edges see it first
    drain_deadline_s: float = 300.0  # SIGTERM drain: in-flight requests get this long
    ready_timeout_s: float = 1800.0
    backoff_base_s: float = 1.0  # engine restarts after a crash (or a hang): 1 s, 2 s, 4 s … capped
    backoff_cap_s: float = 60.0
    # Calls to the control plane (register, resume, heartbeats, reports): each waits this long for an
    # answer; after failures in a row the next try waits min(cap, base * 2**(n-1)), minus up to
    # ``cp_retry_jitter`` of it at random. The engines keep serving meanwhile.
    cp_timeout_s: float = 10.0
    cp_retry_base_s: float = 1.0
    cp_retry_cap_s: float = 30.0
    cp_retry_jitter: float = 0.5
    # Hung engines: a ready engine is probed with /health_generate every ``probe_interval_s`` (each
    # probe waits up to ``probe_timeout_s``); after ``probe_failures`` failed probes in a row it is
    # restarted although its process lives. 0 failures turns the probe off.
    probe_interval_s: float = 10.0
    probe_timeout_s: float = 25.0
    probe_failures: int = 3
    shared_cache_dir: Path | None = None  # the region's shared artifact cache (EFS/Filestore mount)
    # The node-local model cache's share of its file system: past it, the least recently used
    # checkpoints no replica of the node runs are deleted after each new fetch.
    model_cache_max_fraction: float = 0.8
    sim_args: tuple[str, ...] = ()  # extra flags for the simulator only (e.g. --time-scale 10)
    engine: str | None = None  # overrides the config's engine: sglang | sim | auto
    log_level: str = "info"
    python: str = field(default_factory=lambda: os.environ.get("NIMBUS_AGENT_PYTHON") or _python())

    @classmethod
    def from_env(cls, config: AgentConfig, config_path: Path, environ: dict[str, str] | None = None,
                 **overrides) -> AgentOptions:
        env = dict(os.environ if environ is None else environ)
        opts = cls()
        if config.cloud == "local" or env.get("NIMBUS_CLOUD") == "local":
            # Many nodes share this machine: no fixed ports, state beside the config file.
            opts = replace(opts, host="127.0.0.1", advertise_host="127.0.0.1", port=0, engine_port_base=0)
        if config_path != Path(AGENT_CONFIG_PATH):
            opts = replace(opts, state_dir=config_path.parent / "agent-state")
        found: dict = {}
        for f in fields(cls):
            raw = env.get(f"NIMBUS_AGENT_{f.name.upper()}")
            if raw is not None and f.name != "python":
                found[f.name] = _coerce(f.name, raw)
        found |= {k: v for k, v in overrides.items() if v is not None}
        return replace(opts, **found)


def _python() -> str:
    import sys

    return sys.executable


def _coerce(name: str, raw: str):
    if name in ("state_dir", "shared_cache_dir"):
        return Path(raw) if raw else None
    if name == "sim_args":
        return tuple(shlex.split(raw))
    if name in ("port", "engine_port_base", "probe_failures"):
        return int(raw)
    if name in ("host", "advertise_host", "log_level", "engine"):
        return raw
    return float(raw)


def load_config(path: Path | None, environ: dict[str, str] | None = None) -> tuple[AgentConfig, Path]:
    """The config file (``--config``, else ``NIMBUS_AGENT_CONFIG``, else cloud-init's path), with
    a bootstrap token from ``NIMBUS_BOOTSTRAP_TOKEN`` taking precedence (the local provider
    passes it that way)."""
    env = dict(os.environ if environ is None else environ)
    path = Path(path or env.get("NIMBUS_AGENT_CONFIG") or AGENT_CONFIG_PATH)
    config = AgentConfig.from_json(path.read_text())
    if token := env.get("NIMBUS_BOOTSTRAP_TOKEN"):
        config = replace(config, bootstrap_token=token)
    if url := env.get("NIMBUS_CONTROL_PLANE_URL"):
        config = replace(config, control_plane_url=url)
    return config, path
