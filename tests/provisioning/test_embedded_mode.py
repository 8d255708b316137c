"""Embedded mode: SQLite, Celery on kombu's filesystem transport under state_dir, the local cloud."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sqlalchemy import select, update

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.migrate import upgrade
from controlplane.fleet.clouds import SettingsProviders
from controlplane.models import Model, ModelVariant, NodeState, Pool, Replica
from controlplane.services.catalog import import_catalog
from controlplane.tasks.app import broker_settings
from tests.infra.conftest import SLEEPER
from tests.provisioning.celery_harness import celery_running
from tests.provisioning.helpers import nodes, wait_for

LOCAL_CATALOG = {
    "version": 1,
    "generated_by": "tests",
    "clouds": [{"name": "local", "regions": [{
        "name": "local",
        "template": {"kind": "local", "id": "local"},
        "zones": [{"name": "local-a"}],
        "instance_types": [{"name": "sim-1", "gpu_type": "sim", "gpu_count": 1, "gpu_memory_gb": 80,
                            "on_demand_price": 0.0}],
    }]}],
}


def test_without_a_broker_url_celery_uses_files_under_state_dir(tmp_path: Path):
    conf = broker_settings(Settings(state_dir=tmp_path))
    assert conf["broker_url"] == "filesystem://"
    assert Path(conf["broker_transport_options"]["data_folder_in"]).is_relative_to(tmp_path.resolve())
    assert Path(conf["broker_transport_options"]["data_folder_in"]).is_dir()
    redis_conf = broker_settings(Settings(broker_url="redis://127.0.0.1:6379/3", celery_key_prefix="a:"))
    assert redis_conf == {"broker_url": "redis://127.0.0.1:6379/3",
                          "broker_transport_options": {"global_keyprefix": "a:"}}


def test_local_pool_runs_on_sqlite_and_the_filesystem_broker(tmp_path: Path):
    cluster = f"e{uuid.uuid4().hex[:8]}"
    settings = Settings(
        state_dir=tmp_path / "state", cluster_name=cluster, local_agent_command=list(SLEEPER),
        # Beat also runs the usage rollup: its own stream, not the shared Redis's default one (whose
        # events name tenants this SQLite database has never seen).
        usage_stream=f"{cluster}:usage",
        reconcile_interval_s=0.5, retry_delay_s=0.5, drain_timeout_s=0, lease_seconds=30,
        autoscaler_enabled=False,  # desired_replicas is set by hand below
        empty_node_ttl_s=0,  # scaled to zero, the emptied nodes go at once
    )
    assert settings.is_sqlite and settings.broker_url is None
    settings.state_dir.mkdir(parents=True)
    upgrade(settings.resolved_database_url)
    with session_scope(settings) as s:
        import_catalog(s, LOCAL_CATALOG)
        variant = ModelVariant(tier="bf16", model_path="sim/model", gpu_memory_gb=20, context_length=4096)
        s.add(Model(name="sim-model", variants=[variant]))
        s.flush()
        pool = Pool(name="local-pool", variant_id=variant.id, min_replicas=0, max_replicas=2, desired_replicas=2,
                    placement=[{"cloud": "local", "region": "local"}])
        s.add(pool)
        s.flush()
        pool_id = pool.id
    providers = SettingsProviders(settings)  # what a worker builds from configuration
    local = providers("local")
    try:
        with celery_running(settings, providers, tmp_path):
            booted = wait_for(lambda: (n := nodes(settings, pool_id, NodeState.booting)) and len(n) == 2 and n,
                              timeout=60)
            with session_scope(settings) as s:  # one 1-GPU replica of the pool on each local node
                placed = s.execute(select(Replica.node_id, Replica.gpu_ids).where(Replica.pool_id == pool_id)).all()
            assert sorted(placed) == sorted((n.id, [0]) for n in booted)
            for node in booted:
                inst = local.describe("local", node.instance_id)
                assert inst is not None and inst.state.value == "running"
                started = Path(local.state_dir, "instances", node.instance_id, "agent.json")
                assert json.loads(started.read_text())["node_id"] == str(node.id)
            with session_scope(settings) as s:
                s.execute(update(Pool).where(Pool.id == pool_id).values(desired_replicas=0))
            # Scale to zero stops both replicas (never started: at once); the emptied nodes are released.
            wait_for(lambda: len(nodes(settings, pool_id, NodeState.terminated)) == 2, timeout=60)
        assert local.list_by_tag("local", {"nimbus-cluster": settings.cluster_name}) == []
    finally:
        for inst in local.list_by_tag("local", {}):
            local.terminate("local", inst.instance_id)
