"""The embedded platform as a subprocess (API, Celery worker and beat, edge, private Redis, local
cloud) on a brand-new Postgres database of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import PG_ADMIN_DSN, _sqlalchemy_url

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Running:
    api_url: str
    edge_url: str
    state_dir: Path
    admin_token: str
    proc: subprocess.Popen

    @property
    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.api_url + "/admin/v1", timeout=30,
                            headers={"Authorization": f"Bearer {self.admin_token}"})


def processes_with_env(marker: str) -> list[tuple[int, str]]:
    """Live processes whose environment contains ``marker`` (every process the platform starts
    inherits its NIMBUS_STATE_DIR): what must be gone after a stop."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            stat = (entry / "stat").read_text()
            if stat[stat.rindex(")") + 2] in "ZX":
                continue
            found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start time) of a live process, else None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every process below ``root`` → its start time (a pid reused later is not mistaken for it)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents.setdefault(st[0], []).append(int(entry.name))
            starts[int(entry.name)] = st[2]
    found, todo = {}, [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def still_alive(snapshot: dict[int, int]) -> list[int]:
    return [pid for pid, start in snapshot.items()
            if (st := _stat(pid)) is not None and st[2] == start and st[1] not in "ZX"]


@pytest.fixture(scope="module")
def fresh_database() -> Iterator[str]:
    name = f"nimbus_e2e_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _sqlalchemy_url(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}")
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                     "AND pid <> pg_backend_pid()", (name,))
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(scope="module")
def platform(fresh_database: str, tmp_path_factory, request) -> Iterator[Running]:
    """``python -m controlplane.embedded --no-demo`` on Postgres: the tests seed it through the admin API."""
    state = tmp_path_factory.mktemp("platform")
    status = state / "status.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIMBUS_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(getattr(request.module, "PLATFORM_ENV", {}))  # a module's own platform settings
    with open(state / "runner.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.embedded", "--no-demo", "--state-dir", str(state / "nimbus"),
             "--api-port", "0", "--edge-port", "0", "--database-url", fresh_database, "--status-file", str(status)],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    tree: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 90
        while not status.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"platform did not start:\n{(state / 'runner.log').read_text()[-4000:]}")
            time.sleep(0.2)
        info = json.loads(status.read_text())
        running = Running(info["api_url"], info["edge_url"], Path(info["state_dir"]), info["admin_token"], proc)
        yield running
    finally:
        tree.update(descendants(proc.pid))  # everything it runs now, agents and engines included
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        left = sorted(set(still_alive(tree)) | {pid for pid, _ in processes_with_env(
            f"NIMBUS_STATE_DIR={state / 'nimbus'}")})
        for pid in left:  # never leave strays behind, even when the assertion below fails
            os.kill(pid, signal.SIGKILL)
        # The tree snapshot must have seen what the module left running: 5 services (API, worker, beat,
        # edge, Redis), then per live node its agent and one engine per replica on it (replicas share
        # nodes: count nodes and replicas, not pools). The default, 9, is two nodes of one replica each;
        # a module that leaves something else running says so in PLATFORM_MIN_PROCESSES.
        expected = getattr(request.module, "PLATFORM_MIN_PROCESSES", 9)
        assert len(tree) >= expected and left == [], f"processes left behind: {left} (of {len(tree)})"
