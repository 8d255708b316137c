"""The ``local`` cloud: each "VM" is a detached process on this machine.

Used by ``make run`` and the tests, it plays the parts a real cloud plays: it keeps an
inventory (a JSON registry under ``state_dir``, shared by every process that points at
the same directory, guarded by ``flock``), it is idempotent on the launch token, and
it runs cloud-init's part by reading the agent config out of the Nimbus user data and
handing it to the command it starts.

The command is a template (``DEFAULT_COMMAND`` starts the node agent); these
placeholders are filled in: ``{node_id}``, ``{instance_id}``, ``{instance_dir}``,
``{config_path}``, ``{python}``. The bootstrap token and the other settings arrive as
environment variables (``NIMBUS_*``), never on the command line, where ``ps`` would
show them to every local user.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.bootstrap import AgentConfig, parse_user_data
from infra.errors import ConfigError
from infra.provider import Instance, InstanceState, LaunchRequest

DEFAULT_COMMAND: tuple[str, ...] = ("{python}", "-m", "dataplane.agent", "--config", "{config_path}")

# Popen objects of children started by *this* process, kept so they can be reaped
# (a dead child that is never waited for stays a zombie and looks alive to kill(0)).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces; the fields after ")" are fixed.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _alive(pid: int, started: int | None) -> bool:
    if (child := _children.get(pid)) is not None and child.poll() is not None:
        _children.pop(pid, None)
        return False
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    # Same pid but a different start time: the pid was reused by another process.
    return started is None or stat[1] == started


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _fill(part: str, fields: Mapping[str, str]) -> str:
    """Replace ``{name}`` placeholders only, so inline code with dict literals survives."""

    def one(match: re.Match[str]) -> str:
        if match[1] not in fields:
            raise ConfigError(f"unknown placeholder {match[0]} in local command", code="BadCommandTemplate")
        return fields[match[1]]

    return _PLACEHOLDER.sub(one, part)


class LocalProvider:
    """Processes as instances; see the module docstring."""

    cloud = "local"

    def __init__(
        self,
        state_dir: str | Path,
        command: Sequence[str] = DEFAULT_COMMAND,
        *,
        env: Mapping[str, str] | None = None,
        stop_grace: float = 5.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.command = tuple(command)
        self.env = dict(env or {})
        self.stop_grace = stop_grace
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._registry = self.state_dir / "instances.json"
        self._lock_path = self.state_dir / "instances.lock"

    # -- registry ----------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Exclusive read-modify-write of the registry across processes."""
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = json.loads(self._registry.read_text()) if self._registry.exists() else {}
                data.setdefault("instances", {})
                data.setdefault("tokens", {})
                yield data
                tmp = self._registry.with_suffix(".tmp")
                tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
                tmp.replace(self._registry)  # atomic: readers never see half a file
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- Provider ------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Instance:
        with self._locked() as data:
            if (existing := data["tokens"].get(req.idempotency_token)) is not None:
                return self._instance(data["instances"][existing])
            instance_id = f"local-{uuid.uuid4().hex[:12]}"
            record = self._start(instance_id, req)
            data["instances"][instance_id] = record
            data["tokens"][req.idempotency_token] = instance_id
            return self._instance(record)

    def describe(self, region: str, instance_id: str) -> Instance | None:
        with self._locked() as data:
            record = data["instances"].get(instance_id)
            return self._instance(record) if record and record["region"] == region else None

    def terminate(self, region: str, instance_id: str) -> None:
        with self._locked() as data:
            record = data["instances"].get(instance_id)
            if record is None or record["state"] == "terminated":
                return
            self._stop(record["pid"], record.get("pid_started"))
            record["state"] = "terminated"
            record["terminated_at"] = datetime.now(UTC).isoformat()

    def list_by_tag(self, region: str, tags: Mapping[str, str]) -> list[Instance]:
        with self._locked() as data:
            found = [self._instance(r) for r in data["instances"].values() if r["region"] == region]
        return [
            i
            for i in found
            if i.state != InstanceState.TERMINATED and all(i.tags.get(k) == v for k, v in tags.items())
        ]

    # -- processes -----------------------------------------------------------------
    def _start(self, instance_id: str, req: LaunchRequest) -> dict[str, Any]:
        instance_dir = self.state_dir / "instances" / instance_id
        instance_dir.mkdir(parents=True, exist_ok=True)
        (instance_dir / "user-data").write_text(req.user_data)
        config = parse_user_data(req.user_data)
        config_path = instance_dir / "agent.json"
        env = {**os.environ, **self.env, **self._env(instance_id, req, config, config_path)}
        if config is not None:
            config_path.write_text(config.to_json())
            config_path.chmod(0o600)
        fields = {
            "node_id": req.node_id,
            "instance_id": instance_id,
            "instance_dir": str(instance_dir),
            "config_path": str(config_path),
            "python": sys.executable,
        }
        argv = [_fill(part, fields) for part in self.command]
        # The child keeps its own copy of the log descriptor; ours closes with the block.
        with open(instance_dir / "agent.log", "ab") as log:
            proc = self._spawn(argv, instance_dir, env, log)
        _children[proc.pid] = proc
        stat = _proc_stat(proc.pid)
        return {
            "instance_id": instance_id,
            "node_id": req.node_id,
            "region": req.region,
            "zone": req.zone,
            "instance_type": req.instance_type,
            "spot": req.spot,
            "tags": req.all_tags(),
            "pid": proc.pid,
            "pid_started": stat[1] if stat else None,
            "instance_dir": str(instance_dir),
            "launched_at": datetime.now(UTC).isoformat(),
            "state": "running",
        }

    @staticmethod
    def _spawn(argv: list[str], cwd: Path, env: Mapping[str, str], log: Any) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: terminate kills the whole tree
            )
        except OSError as exc:
            raise ConfigError(f"cannot start {argv[0]}: {exc}", code="CommandNotStartable") from exc

    @staticmethod
    def _env(instance_id: str, req: LaunchRequest, config: AgentConfig | None, path: Path) -> dict[str, str]:
        env = {
            "NIMBUS_NODE_ID": req.node_id,
            "NIMBUS_INSTANCE_ID": instance_id,
            "NIMBUS_CLOUD": "local",
            "NIMBUS_REGION": req.region,
            "NIMBUS_ZONE": req.zone,
        }
        if config is not None:
            env |= {
                "NIMBUS_AGENT_CONFIG": str(path),
                "NIMBUS_CONTROL_PLANE_URL": config.control_plane_url,
                "NIMBUS_BOOTSTRAP_TOKEN": config.bootstrap_token,
            }
        return env

    def _stop(self, pid: int, started: int | None) -> None:
        """SIGTERM the process group, wait ``stop_grace``, then SIGKILL what is left."""
        if not _alive(pid, started):
            self._reap(pid)
            return
        for sig, wait in ((signal.SIGTERM, self.stop_grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _alive(pid, started):
                time.sleep(0.05)
            if not _alive(pid, started):
                break
        self._reap(pid)

    @staticmethod
    def _reap(pid: int) -> None:
        child = _children.pop(pid, None)
        if child is not None:
            try:
                child.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

    @staticmethod
    def _instance(record: Mapping[str, Any]) -> Instance:
        running = record["state"] != "terminated" and _alive(record["pid"], record.get("pid_started"))
        return Instance(
            cloud="local",
            region=record["region"],
            zone=record["zone"],
            instance_id=record["instance_id"],
            instance_type=record["instance_type"],
            state=InstanceState.RUNNING if running else InstanceState.TERMINATED,
            spot=record["spot"],
            private_ip="127.0.0.1",
            public_ip=None,
            tags=dict(record["tags"]),
            launched_at=datetime.fromisoformat(record["launched_at"]),
        )
