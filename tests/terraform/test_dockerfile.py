"""The one container image: its Dockerfile and the entrypoint that picks the role."""

from __future__ import annotations

import ast
import os
import re
import stat
import subprocess
import sys
import tomllib

import pytest

from tests.terraform import hcl

DOCKER_DIR = hcl.TERRAFORM_ROOT / "docker"
DOCKERFILE = (DOCKER_DIR / "Dockerfile").read_text()
ENTRYPOINT = DOCKER_DIR / "entrypoint.sh"
ROLES = ("api", "migrate", "worker", "batch-worker", "beat", "edge", "agent")
CELERY_APP = hcl.REPO_ROOT / "controlplane" / "tasks" / "app.py"


def _instructions():
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def test_base_images_are_pinned_and_the_runtime_user_is_unprivileged():
    instructions = _instructions()
    base = [i for i in instructions if i.startswith("ARG PYTHON_IMAGE=")]
    assert base and re.fullmatch(r"ARG PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+", base[0])
    assert all("latest" not in i for i in instructions if i.startswith("FROM"))
    users = [i for i in instructions if i.startswith("USER ")]
    assert users and users[-1] == "USER 10001:10001"
    assert instructions[-2:] == ['ENTRYPOINT ["/usr/local/bin/nimbus-entrypoint"]', 'CMD ["api"]']


def test_the_image_ships_every_package_and_the_entrypoint():
    for package in ("controlplane", "infra", "dataplane", "migrations"):
        assert f"COPY {package} ./{package}" in DOCKERFILE
    assert "COPY terraform/docker/entrypoint.sh /usr/local/bin/nimbus-entrypoint" in DOCKERFILE
    assert ENTRYPOINT.stat().st_mode & stat.S_IXUSR


def test_every_role_runs_a_command_the_distribution_installs():
    scripts = tomllib.loads((hcl.REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    text = ENTRYPOINT.read_text()
    for script in ("nimbus", "nimbus-edge", "nimbus-agent"):
        assert script in scripts
        assert re.search(rf"exec {script} ", text)


@pytest.fixture
def stub_path(tmp_path):
    """Stand-ins for the real commands that print how they were called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nimbus", "nimbus-edge", "nimbus-agent", "celery"):
        stub = bin_dir / name
        stub.write_text(
            '#!/bin/sh\necho "$(basename "$0") $* | edge=${NIMBUS_EDGE_HOST:-}:${NIMBUS_EDGE_PORT:-}"\n'
        )
        stub.chmod(0o755)
    return bin_dir


def _run(stub_path, *args, **env):
    environ = {"PATH": f"{stub_path}:/usr/bin:/bin", **env}
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *args], capture_output=True, text=True, env=environ, timeout=10
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, "nimbus api --host 0.0.0.0 --port 8000"),
        (("api",), {"PORT": "9000"}, "nimbus api --host 0.0.0.0 --port 9000"),
        (("migrate",), {}, "nimbus db upgrade"),
        (
            ("worker", "--concurrency", "4"),
            {},
            "celery --app controlplane.tasks.app:app worker -Q celery --loglevel INFO --concurrency 4",
        ),
        (
            ("batch-worker",),
            {},
            "celery --app controlplane.tasks.app:app worker -Q batches --loglevel INFO --concurrency 2",
        ),
        (
            ("batch-worker", "--hostname", "b@%h"),
            {"NIMBUS_BATCH_WORKER_CONCURRENCY": "6"},
            "celery --app controlplane.tasks.app:app worker -Q batches --loglevel INFO --concurrency 6 --hostname b@%h",
        ),
        (
            ("beat",),
            {"NIMBUS_CELERY_APP": "x.y"},
            "celery --app x.y beat --loglevel INFO --schedule /tmp/celerybeat-schedule",
        ),
        (("edge",), {}, "nimbus-edge  | edge=0.0.0.0:8080"),
        (("edge",), {"PORT": "8081"}, "nimbus-edge  | edge=0.0.0.0:8081"),
        (("agent",), {}, "nimbus-agent"),
    ],
)
def test_entrypoint_dispatches_each_role(stub_path, args, env, expected):
    result = _run(stub_path, *args, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(expected.strip())


def test_entrypoint_refuses_an_unknown_role(stub_path):
    result = _run(stub_path, "bash")
    assert result.returncode == 64
    assert "unknown role" in result.stderr
    listed = re.search(r"\((.*)\)", result.stderr).group(1)
    assert tuple(listed.split(", ")) == ROLES


def test_the_entrypoint_knows_exactly_the_roles_listed():
    branches = re.findall(r"^  ([a-z][\w-]*)\)$", ENTRYPOINT.read_text(), re.MULTILINE)
    assert tuple(branches) == ROLES


def _celery_routes():
    """TASK_ROUTES of the Celery app, read without importing it (the import builds the app)."""
    tree = ast.parse(CELERY_APP.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["TASK_ROUTES"]:
            return ast.literal_eval(node.value)
    raise AssertionError("controlplane/tasks/app.py defines no TASK_ROUTES")


def _queues(stub_path, role):
    result = _run(stub_path, role)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words.count("-Q") == 1, result.stdout
    return set(words[words.index("-Q") + 1].split(","))


def test_worker_and_batch_worker_consume_disjoint_queues_that_cover_every_route(stub_path):
    """The worker takes the default queue only, the batch worker the batches queue only:
    a batch run (hours) never holds a worker slot the fleet's ticks need, and no routed task
    lands on a queue nobody consumes."""
    worker, batch_worker = _queues(stub_path, "worker"), _queues(stub_path, "batch-worker")
    assert worker == {"celery"}
    assert batch_worker == {"batches"}
    assert not worker & batch_worker
    routed = {route["queue"] for route in _celery_routes().values()}
    assert routed == {"batches"}
    assert routed <= worker | batch_worker
    assert _celery_routes()["nimbus.run_batches"] == {"queue": "batches"}


def test_entrypoint_writes_the_redis_ca_for_clients(stub_path, tmp_path):
    ca_path = tmp_path / "ca.pem"
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    result = _run(stub_path, "worker", NIMBUS_REDIS_CA_PEM=pem, NIMBUS_REDIS_CA_PATH=str(ca_path))
    assert result.returncode == 0, result.stderr
    assert ca_path.read_text() == pem + "\n"


def test_services_start_each_role_the_entrypoint_knows():
    """Terraform starts roles by name; each one must be a role of the entrypoint."""
    started = set()
    for directory in hcl.module_dirs():
        text = "\n".join(p.read_text() for p in hcl.tf_files(directory))
        started |= set(re.findall(r'(?:command|args)\s*=\s*\["([\w-]+)"\]', text))
    assert started == {"api", "worker", "batch-worker", "beat", "edge"}
    assert started <= set(ROLES)
    assert os.access(ENTRYPOINT, os.R_OK)


def test_the_commands_the_entrypoint_runs_exist_in_the_code(tmp_path):
    """`nimbus api`, `nimbus db upgrade`, the Celery app and the edge/agent mains resolve."""
    probe = (
        "from celery import Celery\n"
        "from controlplane.tasks.app import app\n"
        "assert isinstance(app, Celery)\n"
        "from controlplane.cli import main\n"
        "assert {'api', 'db'} <= set(main.commands) and 'upgrade' in main.commands['db'].commands\n"
        "from dataplane.edge.cli import main as edge_main\n"
        "from dataplane.agent.cli import main as agent_main\n"
    )
    env = {**os.environ, "NIMBUS_STATE_DIR": str(tmp_path)}
    env.pop("NIMBUS_BROKER_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=hcl.REPO_ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
