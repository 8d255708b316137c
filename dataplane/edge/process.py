"""Run an edge as a subprocess (tests, benchmarks, local runs)::

    with EdgeProcess(config=cfg_dict, state_dir=tmp) as edge:
        openai.OpenAI(base_url=edge.url + "/v1", api_key=key)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataplane.processes import stop_gracefully
from dataplane.sim.process import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


class EdgeProcess:
    def __init__(self, config: dict[str, Any] | None = None, *, control_plane_url: str | None = None,
                 state_dir: str | os.PathLike | None = None, redis_url: str | None = None,
                 settings: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 port: int | None = None, host: str = "127.0.0.1", extra_args: Sequence[str] = (),
                 log_path: str | os.PathLike | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._tmp = tempfile.TemporaryDirectory(prefix="nimbus-edge-") if state_dir is None else None
        self.state_dir = Path(state_dir) if state_dir is not None else Path(self._tmp.name)  # type: ignore[union-attr]
        self.args = [sys.executable, "-m", "dataplane.edge", "--host", host, "--port", str(self.port),
                     "--state-dir", str(self.state_dir)]
        if config is not None:
            self.config_path = self.state_dir / "edge-config.json"
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(json.dumps(config))
            self.args += ["--config", str(self.config_path)]
        if control_plane_url:
            self.args += ["--control-plane-url", control_plane_url]
        if redis_url is not None:
            self.args += ["--redis-url", redis_url]
        for name, value in (settings or {}).items():
            self.args += ["--set", f"{name}={value}"]
        self.args += list(extra_args)
        self.env = env or {}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0, wait_ready: bool = True) -> EdgeProcess:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.args, cwd=REPO_ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.wait(timeout, "/ready" if wait_ready else "/health")
        return self

    def wait(self, timeout: float, path: str = "/ready") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge exited with code {self.proc.returncode}: {' '.join(self.args)}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"edge at {self.url} not answering {path} after {timeout}s")

    def stop(self, timeout: float = 5.0) -> None:
        stop_gracefully(self.proc, timeout)
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        self._log = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EdgeProcess:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
