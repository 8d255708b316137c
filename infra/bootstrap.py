"""Node bootstrap: the cloud-init user data that turns a fresh VM into a Nimbus node.

The user data writes the agent's config file and a systemd unit, installs the agent
if the image lacks it, and starts it. It carries exactly one credential: a
**one-time bootstrap token** with a short TTL, which the agent exchanges with the
control plane for its node credential on first contact. User data is readable from
the instance metadata service for the VM's whole life, so nothing long-lived (API
keys, cloud credentials, engine ``--api-key``) may ever appear in it; the renderer
refuses to produce user data that would contain one.

Limits: EC2 accepts 16 KB of raw user data; a GCE metadata value may be 256 KB.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

AGENT_CONFIG_PATH = "/etc/nimbus/agent.json"
AGENT_UNIT_PATH = "/etc/systemd/system/nimbus-agent.service"
AGENT_UNIT = "nimbus-agent.service"
MAX_BOOTSTRAP_TTL = timedelta(hours=1)
USER_DATA_LIMITS = {"aws": 16 * 1024, "gcp": 256 * 1024, "local": 1024 * 1024}

# Engine flags that carry credentials. The agent fetches such values from the control
# plane after it has exchanged its bootstrap token; they never travel in user data.
_SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key", "--hf-token", "--token"})
_SECRET_WORDS = frozenset({"secret", "password", "passwd", "token", "credential", "credentials", "apikey"})
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key")})


def looks_secret(name: str) -> bool:
    """Word-wise, so ``--max-total-tokens`` is fine and ``--hf-token`` is not."""
    words = [w for w in re.split(r"[-_.\s]+", name.lower()) if w]
    return bool(_SECRET_WORDS.intersection(words)) or any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


class UserDataError(ValueError):
    """The user data would be unsafe (a long-lived secret) or too large for the cloud."""


@dataclass(frozen=True)
class AgentConfig:
    """Everything the node agent needs to find its control plane and start engines."""

    control_plane_url: str
    node_id: str
    bootstrap_token: str
    bootstrap_token_expires_at: datetime
    variant: str
    engine: str = "sglang"
    engine_args: tuple[str, ...] = ()
    cluster: str = ""
    pool_id: str | None = None
    cloud: str = ""
    region: str = ""
    zone: str = ""
    artifact_source: str | None = None  # s3://… / gs://… bucket holding model weights
    artifact_cache_dir: str = "/var/lib/nimbus/artifacts"
    model_cache_dir: str = "/var/lib/nimbus/models"
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        data["bootstrap_token_expires_at"] = self.bootstrap_token_expires_at.isoformat()
        data["engine_args"] = list(self.engine_args)
        data["labels"] = dict(self.labels)
        return json.dumps(data, sort_keys=True, indent=2)

    @classmethod
    def from_json(cls, text: str) -> AgentConfig:
        data = json.loads(text)
        data["bootstrap_token_expires_at"] = datetime.fromisoformat(data["bootstrap_token_expires_at"])
        data["engine_args"] = tuple(data.get("engine_args", ()))
        return cls(**data)


@dataclass(frozen=True)
class AgentInstall:
    """How to get the agent onto an image that does not ship it yet."""

    venv: str = "/opt/nimbus/venv"
    package: str = "nimbus"  # pip requirement, or a wheel path/URL from the artifact bucket

    @property
    def agent_bin(self) -> str:
        return f"{self.venv}/bin/nimbus-agent"


def find_secret_args(args: Iterable[str]) -> list[str]:
    """Engine arguments that look like credentials (flag names only, values never echoed)."""
    found = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("-") and (flag in _SECRET_FLAGS or looks_secret(flag)):
            found.append(flag)
    return found


def check_config(config: AgentConfig, now: datetime) -> None:
    """Refuse configs that would put a long-lived secret into user data."""
    if not config.bootstrap_token:
        raise UserDataError("a bootstrap token is required")
    ttl = config.bootstrap_token_expires_at - now
    if ttl <= timedelta(0) or ttl > MAX_BOOTSTRAP_TTL:
        raise UserDataError(f"bootstrap token TTL must be within (0, {MAX_BOOTSTRAP_TTL}], got {ttl}")
    if secrets := find_secret_args(config.engine_args):
        raise UserDataError(f"engine args carry credentials {secrets}; deliver them after bootstrap")
    if secret_labels := [k for k in config.labels if looks_secret(k)]:
        raise UserDataError(f"labels look like credentials: {secret_labels}")


def systemd_unit(install: AgentInstall) -> str:
    return "\n".join(
        [
            "[Unit]",
            "Description=Nimbus node agent",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            f"ExecStart={install.agent_bin} --config {AGENT_CONFIG_PATH}",
            "Restart=always",
            "RestartSec=5",
            # The agent drains engines on SIGTERM; give in-flight requests time to finish.
            "TimeoutStopSec=120",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def render_user_data(
    config: AgentConfig,
    *,
    cloud: str,
    now: datetime | None = None,
    install: AgentInstall = AgentInstall(),
) -> str:
    """The ``#cloud-config`` document for one node, checked for secrets and size."""
    check_config(config, now or datetime.now(UTC))
    install_cmd = (
        f"test -x {shlex.quote(install.agent_bin)} || "
        f"{{ python3 -m venv {shlex.quote(install.venv)} && "
        f"{shlex.quote(install.venv)}/bin/pip install --quiet {shlex.quote(install.package)}; }}"
    )
    document: dict[str, Any] = {
        "write_files": [
            # 0600: the bootstrap token is still a credential until it is exchanged.
            {"path": AGENT_CONFIG_PATH, "permissions": "0600", "owner": "root:root", "content": config.to_json()},
            {"path": AGENT_UNIT_PATH, "permissions": "0644", "owner": "root:root", "content": systemd_unit(install)},
        ],
        "runcmd": [
            ["mkdir", "-p", config.artifact_cache_dir, config.model_cache_dir],
            ["sh", "-c", install_cmd],
            ["systemctl", "daemon-reload"],
            ["systemctl", "enable", "--now", AGENT_UNIT],
        ],
    }
    text = "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, width=1_000_000)
    limit = USER_DATA_LIMITS.get(cloud)
    if limit is None:
        raise UserDataError(f"unknown cloud {cloud!r}")
    size = len(text.encode())
    if size > limit:
        raise UserDataError(f"user data is {size} bytes; {cloud} accepts at most {limit}")
    return text


def parse_user_data(text: str) -> AgentConfig | None:
    """The agent config inside Nimbus user data, or ``None`` for any other user data.

    Used by the local provider, which plays cloud-init's part on this machine.
    """
    if not text.startswith("#cloud-config"):
        return None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    for item in (document or {}).get("write_files", []):
        if item.get("path") == AGENT_CONFIG_PATH:
            return AgentConfig.from_json(item["content"])
    return None
