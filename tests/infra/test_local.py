"""The local provider: real detached processes, a registry shared across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra.bootstrap import AgentConfig, render_user_data
from infra.errors import ConfigError
from infra.local import LocalProvider, _proc_stat
from infra.provider import InstanceState, LaunchRequest, ownership_tags
from tests.infra.conftest import SLEEPER


def request(n: int, *, user_data: str = "", region: str = "local", token: str | None = None) -> LaunchRequest:
    return LaunchRequest(
        node_id=f"node-{n}",
        cluster="dev",
        region=region,
        zone=f"{region}-a",
        instance_type="sim-1gpu",
        spot=False,
        template_id="local",
        user_data=user_data,
        tags=ownership_tags("dev", f"node-{n}", "pool-1"),
        idempotency_token=token or f"op-{n}",
    )


def started(provider: LocalProvider, instance_id: str, timeout: float = 10.0) -> dict:
    path = provider.state_dir / "instances" / instance_id / "started.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass  # still being written
        time.sleep(0.05)
    raise AssertionError(f"{instance_id} never started")


def pid_of(provider: LocalProvider, instance_id: str) -> int:
    data = json.loads((provider.state_dir / "instances.json").read_text())
    return data["instances"][instance_id]["pid"]


def gone(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def test_launch_passes_agent_config_from_user_data(local: LocalProvider):
    now = datetime.now(UTC)
    config = AgentConfig(
        control_plane_url="http://127.0.0.1:8000",
        node_id="node-1",
        bootstrap_token="one-time-abc",
        bootstrap_token_expires_at=now + timedelta(minutes=15),
        variant="llama-3.1-8b-instruct:fp8",
        engine="sim",
    )
    inst = local.launch(request(1, user_data=render_user_data(config, cloud="local", now=now)))

    assert inst.state == InstanceState.RUNNING and inst.cloud == "local"
    assert inst.tags["nimbus-node-id"] == "node-1" and inst.tags["managed-by"] == "nimbus"
    seen = started(local, inst.instance_id)
    config_path = seen["argv"][1]
    assert seen["argv"][0] == "node-1"
    assert AgentConfig.from_json(Path(config_path).read_text()) == config
    assert oct(Path(config_path).stat().st_mode & 0o777) == "0o600"
    assert seen["env"]["NIMBUS_CONTROL_PLANE_URL"] == "http://127.0.0.1:8000"
    assert seen["env"]["NIMBUS_BOOTSTRAP_TOKEN"] == "one-time-abc"
    assert seen["env"]["NIMBUS_NODE_ID"] == "node-1"
    assert "one-time-abc" not in " ".join(seen["argv"])  # not visible in ps


def test_launch_is_idempotent_on_token(local: LocalProvider):
    a = local.launch(request(1))
    b = local.launch(request(1))
    assert a.instance_id == b.instance_id
    c = local.launch(request(1, token="another-attempt"))
    assert c.instance_id != a.instance_id
    assert len(local.list_by_tag("local", {"nimbus-node-id": "node-1"})) == 2


def test_list_by_tag_and_regions(local: LocalProvider):
    a = local.launch(request(1))
    b = local.launch(request(2))
    c = local.launch(request(3, region="local-2"))
    assert {i.instance_id for i in local.list_by_tag("local", {"managed-by": "nimbus"})} == {a.instance_id, b.instance_id}
    assert [i.instance_id for i in local.list_by_tag("local-2", {})] == [c.instance_id]
    assert [i.instance_id for i in local.list_by_tag("local", {"nimbus-node-id": "node-2"})] == [b.instance_id]
    assert local.describe("local-2", a.instance_id) is None  # wrong region


def test_terminate_kills_the_process_tree_and_is_idempotent(local: LocalProvider):
    inst = local.launch(request(1))
    started(local, inst.instance_id)
    pid = pid_of(local, inst.instance_id)
    assert not gone(pid)

    local.terminate("local", inst.instance_id)
    assert gone(pid)
    assert local.describe("local", inst.instance_id).state == InstanceState.TERMINATED
    assert local.list_by_tag("local", {}) == []
    local.terminate("local", inst.instance_id)
    local.terminate("local", "local-doesnotexist")


def test_grandchildren_die_with_the_instance(tmp_path: Path):
    # The agent will start engines as children; terminating the node must stop them too.
    script = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); open('child.pid', 'w').write(str(p.pid)); time.sleep(60)"
    provider = LocalProvider(tmp_path / "cloud", ("{python}", "-c", script), stop_grace=2.0)
    inst = provider.launch(request(1))
    pid_file = provider.state_dir / "instances" / inst.instance_id / "child.pid"
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert not gone(child)
    provider.terminate("local", inst.instance_id)
    deadline = time.monotonic() + 5
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child)


def test_an_exited_process_is_a_terminated_instance(tmp_path: Path):
    provider = LocalProvider(tmp_path / "cloud", ("{python}", "-c", "pass"))
    inst = provider.launch(request(1))
    deadline = time.monotonic() + 10
    while provider.describe("local", inst.instance_id).state != InstanceState.TERMINATED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert provider.list_by_tag("local", {}) == []


def test_registry_is_shared_with_other_processes(local: LocalProvider):
    inst = local.launch(request(1))
    started(local, inst.instance_id)
    code = (
        "import sys; from infra.local import LocalProvider; "
        "p = LocalProvider(sys.argv[1]); "
        "print(','.join(i.instance_id for i in p.list_by_tag('local', {'nimbus-cluster': 'dev'}))); "
        "p.terminate('local', sys.argv[2])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(local.state_dir), inst.instance_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.stdout.strip() == inst.instance_id
    assert local.describe("local", inst.instance_id).state == InstanceState.TERMINATED


def test_bad_command_template_is_a_config_error(tmp_path: Path):
    provider = LocalProvider(tmp_path / "cloud", ("{python}", "{no_such_field}"))
    with pytest.raises(ConfigError):
        provider.launch(request(1))
    missing = LocalProvider(tmp_path / "cloud2", ("/nonexistent/binary",))
    with pytest.raises(ConfigError):
        missing.launch(request(1))


def test_fixture_leaves_no_process_behind(tmp_path: Path):
    provider = LocalProvider(tmp_path / "cloud", SLEEPER, stop_grace=1.0)
    pids = []
    for n in range(3):
        inst = provider.launch(request(n))
        started(provider, inst.instance_id)
        pids.append(pid_of(provider, inst.instance_id))
    for inst in provider.list_by_tag("local", {}):
        provider.terminate("local", inst.instance_id)
    assert all(gone(p) for p in pids)
