"""Run a node agent as a subprocess (tests, local runs), the way the local provider starts one::

    with AgentProcess(config, workdir) as agent:
        agent.wait_url(); agent.status()
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dataplane.processes import stop_gracefully
from infra.bootstrap import AgentConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


class AgentProcess:
    def __init__(self, config: AgentConfig, workdir: str | os.PathLike, env: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "agent.json"
        self.config_path.write_text(config.to_json())
        self.config_path.chmod(0o600)
        self.state_dir = self.workdir / "agent-state"
        self.log_path = self.workdir / "agent.log"
        self.env = {"NIMBUS_CLOUD": "local", **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> AgentProcess:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dataplane.agent", "--config", str(self.config_path)], cwd=self.workdir,
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def url(self) -> str:
        return (self.state_dir / "agent.url").read_text().strip()

    def wait_url(self, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.state_dir / "agent.url").exists():
                return self.url
            self._check_alive()
            time.sleep(0.05)
        raise TimeoutError(f"agent never listened; log:\n{self.log()}")

    def status(self) -> dict:
        with urllib.request.urlopen(self.url + "/status", timeout=5) as resp:
            return json.loads(resp.read())

    def wait(self, predicate, timeout: float = 30.0, what: str = "condition") -> dict:
        """Poll ``/status`` until ``predicate(status)`` holds; returns that status."""
        deadline = time.monotonic() + timeout
        last: dict = {}
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                last = self.status()
                if predicate(last):
                    return last
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"agent: {what} not reached in {timeout}s; last status {last}; log:\n{self.log()}")

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"agent exited with {self.proc.returncode}; log:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-6000:]
        except FileNotFoundError:
            return ""

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (the agent drains), then SIGKILL the whole group if it does not exit in time."""
        return stop_gracefully(self.proc, timeout, kill_group=True)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
