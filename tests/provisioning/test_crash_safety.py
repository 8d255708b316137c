"""SIGKILL a real `celery worker` process in the middle of a launch; a new worker finishes the job
with exactly one VM for the node, and a sweep removes anything untracked."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.fleet import launcher
from controlplane.models import NodeState, Operation, OperationKind, Replica
from controlplane.services import agents
from controlplane.tasks.app import app
from infra.bootstrap import parse_user_data
from tests.provisioning.celery_harness import use_broker
from tests.provisioning.conftest import Clouds, aws_catalog, setup_pool
from tests.provisioning.helpers import nodes, operations, run_due, tick, wait_for
from tests.provisioning.slow_proxy import SlowProxy

ROOT = Path(__file__).resolve().parents[2]


def worker_env(settings: Settings, aws_endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIMBUS_", "AWS_"))}
    env.update({
        "NIMBUS_DATABASE_URL": settings.database_url,
        "NIMBUS_BROKER_URL": settings.broker_url,
        "NIMBUS_CELERY_KEY_PREFIX": settings.celery_key_prefix,
        "NIMBUS_CLUSTER_NAME": settings.cluster_name,
        "NIMBUS_STATE_DIR": str(settings.state_dir),
        "NIMBUS_AWS_ENDPOINT_URL": aws_endpoint,
        "NIMBUS_LEASE_SECONDS": str(settings.lease_seconds),
        "NIMBUS_RETRY_DELAY_S": str(settings.retry_delay_s),
        "NIMBUS_DB_POOL_SIZE": "2",
        # moto accepts any credentials; these are its documented dummies, not secrets.
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    })
    return env


@contextmanager
def celery_worker(settings: Settings, aws_endpoint: str, log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane.tasks.app", "worker", "--pool=solo",
             "--loglevel=INFO", "--without-heartbeat", "--without-mingle", "--without-gossip",
             f"--hostname=w{uuid.uuid4().hex[:6]}@localhost"],
            cwd=ROOT, env=worker_env(settings, aws_endpoint), stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def pool_replicas(settings: Settings, pool_id: str) -> list[Replica]:
    with session_scope(settings) as s:
        return list(s.scalars(select(Replica).where(Replica.pool_id == uuid.UUID(pool_id))))


def live_instances(ec2: Any, **tags: str) -> list[dict]:
    filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
    filters.append({"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]})
    res = ec2.describe_instances(Filters=filters)
    return [i for r in res["Reservations"] for i in r["Instances"]]


@pytest.fixture
def sender(settings: Settings, celery_keys_cleanup) -> Iterator[Any]:
    """This process only sends tasks (to the same Redis prefix the subprocess workers read)."""
    use_broker(settings)
    yield app
    app.close()


async def test_sigkill_mid_launch_leaves_exactly_one_vm(
    client, admin, settings, aws_template, ec2, moto_endpoint, sender, tmp_path
):
    settings = settings.model_copy(update={"lease_seconds": 4.0})
    pool = await setup_pool(client, admin, aws_catalog(aws_template), [{"cloud": "aws", "region": "us-east-1"}],
                            min_replicas=1, max_replicas=1)
    proxy = SlowProxy(moto_endpoint, hold_when=b"Action=RunInstances").start()
    try:
        with celery_worker(settings, proxy.url, tmp_path / "worker-1.log") as first:
            sender.send_task("nimbus.reconcile")
            assert proxy.forwarded.wait(timeout=60), (tmp_path / "worker-1.log").read_text()[-3000:]
            # moto has created the VM; the worker is still waiting for the answer. Kill it.
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
        proxy.holding = False
        proxy.release.set()
        [node] = nodes(settings, pool["id"])
        assert node.state == NodeState.provisioning and node.instance_id is None
        assert len(live_instances(ec2, **{"nimbus-node-id": str(node.id)})) == 1
        # Written before the cloud was asked: the node, its launch operation and the replica placed on it.
        assert [r.node_id for r in pool_replicas(settings, pool["id"])] == [node.id]

        with celery_worker(settings, moto_endpoint, tmp_path / "worker-2.log"):
            def booted():
                sender.send_task("nimbus.dispatch_operations")  # what beat does every few seconds
                return nodes(settings, pool["id"], NodeState.booting)

            [node] = wait_for(booted, timeout=60, interval=1.0)
            vms = live_instances(ec2, **{"nimbus-node-id": str(node.id)})
            assert [v["InstanceId"] for v in vms] == [node.instance_id]
            [op] = operations(settings, pool["id"], OperationKind.launch)
            assert op.attempts == 2 and op.history[-1]["adopted"] is True
            assert [r.node_id for r in pool_replicas(settings, pool["id"])] == [node.id]  # nothing placed twice

            # Something untracked carrying our tags (a row lost with a restored backup, say).
            leaked = ec2.run_instances(
                ImageId=ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"],
                MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
                TagSpecifications=[{"ResourceType": "instance", "Tags": [
                    {"Key": "managed-by", "Value": "nimbus"},
                    {"Key": "nimbus-cluster", "Value": settings.cluster_name},
                    {"Key": "nimbus-node-id", "Value": str(uuid.uuid4())},
                ]}],
            )["Instances"][0]["InstanceId"]
            sender.send_task("nimbus.sweep")
            wait_for(lambda: leaked not in {v["InstanceId"] for v in live_instances(
                ec2, **{"nimbus-cluster": settings.cluster_name})}, timeout=60, interval=0.5)
        after = live_instances(ec2, **{"nimbus-cluster": settings.cluster_name})
        assert [v["InstanceId"] for v in after] == [node.instance_id]
    finally:
        proxy.stop()


class DiesAfterLaunch:
    """Test double around a real provider: the VM is created, then the worker "dies" before recording it."""

    def __init__(self, inner) -> None:
        self.inner, self.cloud = inner, inner.cloud

    def launch(self, req):
        self.inner.launch(req)
        raise RuntimeError("worker died after the cloud accepted the launch")

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_agent_registering_before_the_launch_is_recorded_keeps_its_vm(
    client, admin, settings, aws, ec2, aws_template
):
    pool = await setup_pool(client, admin, aws_catalog(aws_template), [{"cloud": "aws", "region": "us-east-1"}],
                            min_replicas=1, max_replicas=1)
    [(op_id, _)] = tick(settings).operations
    assert launcher.execute(settings, Clouds(aws=DiesAfterLaunch(aws)), op_id) == "retry"
    [node] = nodes(settings, pool["id"])
    [vm] = live_instances(ec2, **{"nimbus-node-id": str(node.id)})
    assert node.instance_id is None and node.state == NodeState.provisioning
    # The VM boots and its agent exchanges the bootstrap token from its user data (the real agent path).
    raw = ec2.describe_instance_attribute(InstanceId=vm["InstanceId"], Attribute="userData")
    token = parse_user_data(base64.b64decode(raw["UserData"]["Value"]).decode()).bootstrap_token
    with session_scope(settings) as s:
        _, answer = agents.register(s, agents.RegisterRequest(node_id=node.id, bootstrap_token=token))
    assert nodes(settings, pool["id"])[0].state == NodeState.booting
    # Its answer already names the replica placement wrote for it, which it can start now.
    [replica] = pool_replicas(settings, pool["id"])
    assert [(e["id"], e["desired_state"]) for e in answer["replicas"]] == [(str(replica.id), "running")]
    with session_scope(settings) as s:  # the retry is due after retry_delay_s
        s.get(Operation, op_id).next_attempt_at = None
    assert run_due(settings, Clouds(aws=aws)) == ["launched"]
    [node] = nodes(settings, pool["id"])
    assert node.state == NodeState.booting and node.instance_id == vm["InstanceId"]
    assert len(live_instances(ec2, **{"nimbus-node-id": str(node.id)})) == 1
