"""Run simulators as subprocesses: for tests and benchmarks of other packages.

    with SimProcess(served_model_name="demo", extra_args=["--time-scale", "20"]) as sim:
        httpx.get(sim.url + "/health")

    with sim_fleet(3, extra_args=["--time-scale", "20"]) as sims:
        urls = [s.url for s in sims]
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from dataplane.processes import stop_gracefully

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class SimProcess:
    def __init__(
        self,
        served_model_name: str = "sim-model",
        extra_args: Sequence[str] = (),
        ready_delay: float | None = 0.0,
        model_path: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
    ):
        self.host = host
        # A port we picked can be taken by another process before the simulator binds it: then
        # the simulator exits at once and ``wait_healthy`` starts it again on another free port.
        self._picked_port = port is None
        self.port = port or free_port(host)
        self.served_model_name = served_model_name
        self.args = [sys.executable, "-m", "dataplane.sim", "--host", host, "--port", str(self.port),
                     "--served-model-name", served_model_name]
        if model_path:
            self.args += ["--model-path", model_path]
        if ready_delay is not None:
            self.args += ["--ready-delay", str(ready_delay)]
        self.args += list(extra_args)
        self.log_path = log_path
        self.env = dict(env or {})  # added to this process's environment (e.g. CUDA_VISIBLE_DEVICES)
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def launch(self) -> SimProcess:
        """Start the process without waiting for readiness."""
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        self._log_file = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.args, cwd=REPO_ROOT, env=env, stdout=self._log_file,
                                     stderr=subprocess.STDOUT)
        return self

    def start(self, timeout: float = 30.0) -> SimProcess:
        """Start (if needed) and wait until ``/health`` answers 200."""
        if self.proc is None:
            self.launch()
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        port_retries = 2
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                if self._picked_port and port_retries > 0:
                    port_retries -= 1
                    self._move_to_a_new_port()
                    continue
                raise RuntimeError(f"simulator exited with code {self.proc.returncode}: {' '.join(self.args)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"simulator at {self.url} not healthy after {timeout}s")

    def _move_to_a_new_port(self) -> None:
        self._close_log()
        self.port = free_port(self.host)
        self.args[self.args.index("--port") + 1] = str(self.port)
        self.launch()

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
        if self.proc is None:
            return None
        code = stop_gracefully(self.proc, timeout)
        self._close_log()
        return code

    def kill(self) -> None:
        """SIGKILL at once (a node dying)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file not in (None, subprocess.DEVNULL):
            self._log_file.close()
        self._log_file = None

    def __enter__(self) -> SimProcess:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def sim_fleet(n: int, timeout: float = 30.0, each: Sequence[Sequence[str]] = (), **kwargs) -> Iterator[list[SimProcess]]:
    """``n`` simulators started in parallel (each on its own free port), stopped on exit.
    ``each``: arguments for the i-th simulator (cycled), after ``extra_args`` (e.g. its ``--gpu``)."""
    extra = list(kwargs.pop("extra_args", ()))
    sims = [SimProcess(extra_args=extra + list(each[i % len(each)] if each else ()), **kwargs) for i in range(n)]
    try:
        for sim in sims:
            sim.launch()
        for sim in sims:
            sim.wait_healthy(timeout)
        yield sims
    finally:
        for sim in sims:
            sim.stop()
