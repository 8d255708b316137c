"""A redis-server of a run's own, on a free port, so a bench or a test can stop and start it
(an edge's Redis going away) without touching the shared one."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis as redis_sync

from dataplane.sim.process import free_port


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis_sync.Redis(port=self.port).ping():
                    return self
            except redis_sync.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def client(self) -> redis_sync.Redis:
        return redis_sync.Redis(port=self.port)
