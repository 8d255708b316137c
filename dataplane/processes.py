"""Stopping child processes the same way everywhere (simulators, edges, agents)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_gracefully(proc: subprocess.Popen | None, timeout: float, *, kill_group: bool = False) -> int | None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``. With ``kill_group`` the
    SIGKILL goes to the whole process group (an agent's engines die with it). Returns the exit code."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            if kill_group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()
    return proc.returncode
