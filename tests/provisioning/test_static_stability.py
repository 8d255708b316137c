"""Static stability in the sweeper, on the real Postgres and moto EC2: silence is no evidence when
heartbeats stop arriving from everyone at once (the API is down); a single silent node goes only
on the cloud's word, or after a long silence of a running VM; evictions are rate-limited; the
pause is audited, shown in the operator console and exported on the API's /metrics."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from types import SimpleNamespace
from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import select

from controlplane.api.app import create_app
from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import sweeper
from controlplane.fleet.nodes import transition
from controlplane.models import (
    AuditEvent,
    Model,
    ModelVariant,
    Node,
    NodeState,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)
from controlplane.models.audit import EVICTIONS_PAUSED, EVICTIONS_RESUMED, NODE_EVICTED
from tests.console.conftest import sign_in_operator
from tests.infra.conftest import AWS_REGION
from tests.provisioning.conftest import Clouds, aws_catalog, setup_pool
from tests.provisioning.test_sweeps_and_leases import live, run_tagged

S = NodeState


async def import_catalog(client, admin, aws_template: str) -> None:
    r = await client.post("/admin/v1/catalog/import", json=aws_catalog(aws_template), headers=admin)
    assert r.status_code == 200, r.text


def make_fleet(settings, ec2: Any, image: str, n: int, heartbeat_at: dt.datetime) -> list[uuid.UUID]:
    """``n`` ready nodes with a running moto VM each (tagged as the launcher tags them), last heard at ``heartbeat_at``."""
    ids = []
    with session_scope(settings) as s:
        for _ in range(n):
            node = Node(cloud="aws", region=AWS_REGION, zone="us-east-1a", instance_type="g5.xlarge", gpus_total=1,
                        launch_token=uuid.uuid4().hex)
            s.add(node)
            s.flush()
            node.instance_id = run_tagged(ec2, image, **{"managed-by": "nimbus", "nimbus-cluster": settings.cluster_name,
                                                         "nimbus-node-id": str(node.id)})
            for state in (S.provisioning, S.booting, S.ready):
                transition(s, node, state, reason="test")
            node.last_heartbeat_at = heartbeat_at
            ids.append(node.id)
    return ids


def heartbeat(settings, ids, at: dt.datetime) -> None:
    with session_scope(settings) as s:
        for node in s.scalars(select(Node).where(Node.id.in_(ids))):
            node.last_heartbeat_at = at


def states(settings, ids) -> dict[uuid.UUID, NodeState]:
    with session_scope(settings) as s:
        return {n.id: n.state for n in s.scalars(select(Node).where(Node.id.in_(ids)))}


def audit(settings, *actions: str) -> list[AuditEvent]:
    with session_scope(settings) as s:
        return list(s.scalars(select(AuditEvent).where(AuditEvent.action.in_(actions)).order_by(AuditEvent.at)))


def at(clock: dt.datetime):
    return lambda: clock


async def test_api_down_no_node_is_evicted_the_pause_is_audited_shown_and_exported(
    client, admin, settings, aws, ec2, aws_template, moto_ami
):
    await import_catalog(client, admin, aws_template)
    t0 = utcnow()
    ids = make_fleet(settings, ec2, moto_ami, 4, t0)
    vms = live(ec2, **{"nimbus-cluster": settings.cluster_name})
    # The API is down: no heartbeat arrives from anyone, for far longer than every timeout.
    for later in (settings.heartbeat_timeout_s + 1, settings.silent_running_evict_s + 60, settings.boot_timeout_s + 60):
        result = sweeper.sweep(settings, Clouds(aws=aws), clock=at(t0 + dt.timedelta(seconds=later)))
        assert not result.stale and not result.lost and not result.operations
        assert result.paused == ["aws/us-east-1", "fleet"]
        assert set(result.held) == set(ids) and all("evictions paused" in w for w in result.held.values())
    assert set(states(settings, ids).values()) == {S.ready}
    assert live(ec2, **{"nimbus-cluster": settings.cluster_name}) == vms  # every VM still runs
    paused = audit(settings, EVICTIONS_PAUSED)
    assert sorted(e.target_id for e in paused) == ["aws/us-east-1", "fleet"]  # once per scope, not per sweep
    assert paused[0].after["silent"] == 4 and paused[0].after["nodes"] == 4 and paused[0].after["threshold"] == 0.55

    async with AsyncTestClient(app=create_app(settings), base_url="https://testserver.local") as web:
        assert (await sign_in_operator(web)).status_code == 303
        for path in ("/console/admin/fleet", "/console/admin/nodes"):
            page = (await web.get(path)).text
            assert 'id="evictions-paused"' in page and "Evictions paused" in page, path
            assert "the whole fleet: 4 of 4 nodes silent (100%, threshold 55%)" in page
            assert "aws/us-east-1: 4 of 4 nodes silent" in page
        metrics = (await web.get("/metrics")).text
        assert 'nimbus_fleet_evictions_paused{scope="fleet"} 1.0' in metrics
        assert 'nimbus_fleet_evictions_paused{scope="aws/us-east-1"} 1.0' in metrics

        # The API is back: every node but one reports again. The scopes resume, and the one still
        # silent (its heartbeat backlog not yet through) gets a fresh timeout from the resume on.
        t1 = t0 + dt.timedelta(seconds=settings.boot_timeout_s + 120)
        heartbeat(settings, ids[1:], t1)
        result = sweeper.sweep(settings, Clouds(aws=aws), clock=at(t1 + dt.timedelta(seconds=5)))
        assert result.paused == [] and not result.stale and not result.lost
        assert sorted(e.target_id for e in audit(settings, EVICTIONS_RESUMED)) == ["aws/us-east-1", "fleet"]
        assert set(states(settings, ids).values()) == {S.ready}
        page = (await web.get("/console/admin/fleet")).text
        assert 'id="evictions-paused"' not in page
        sweeper_view = await web.get("/console/admin/nodes")
        assert 'id="evictions-paused"' not in sweeper_view.text


class DiesAfterListing:
    """Moto as it is, except that one VM is terminated right after the sweep's listing: its
    describe, just before the verdict, is what tells the sweeper."""

    def __init__(self, inner, victim: str) -> None:
        self.inner, self.cloud, self.victim = inner, inner.cloud, victim
        self.described: list[str] = []

    def list_by_tag(self, region, tags):
        found = self.inner.list_by_tag(region, tags)
        self.inner.terminate(region, self.victim)
        return found

    def describe(self, region, instance_id):
        self.described.append(instance_id)
        return self.inner.describe(region, instance_id)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_a_single_silent_node_goes_on_the_clouds_word_or_after_a_long_silence(
    client, admin, settings, aws, ec2, aws_template, moto_ami
):
    await import_catalog(client, admin, aws_template)
    t0 = utcnow()
    ids = make_fleet(settings, ec2, moto_ami, 4, t0)
    silent, others = ids[0], ids[1:]
    with session_scope(settings) as s:
        instance = {n.id: n.instance_id for n in s.scalars(select(Node).where(Node.id.in_(ids)))}

    # No sweep ran for a long while (the worker or the database was down); then the first one sees
    # it silent while the others report, but the cloud says its VM runs: kept, and its silence is
    # timed from now (a sweep that did not run saw nothing).
    t = t0 + dt.timedelta(seconds=settings.boot_timeout_s + 5)
    heartbeat(settings, others, t)
    result = sweeper.sweep(settings, Clouds(aws=aws), clock=at(t))
    assert result.paused == [] and not result.stale and not result.lost
    assert "reports instance" in result.held[silent] and "running" in result.held[silent]
    assert states(settings, [silent])[silent] == S.ready
    t = t + dt.timedelta(seconds=settings.silent_running_evict_s - 5)
    heartbeat(settings, others, t)
    result = sweeper.sweep(settings, Clouds(aws=aws), clock=at(t))
    assert not result.stale and "so far" in result.held[silent]

    # Seen silent for long with its VM still running: the agent is wedged; evicted, evidence audited.
    t = t + dt.timedelta(seconds=10)
    heartbeat(settings, others, t)
    result = sweeper.sweep(settings, Clouds(aws=aws), clock=at(t))
    assert result.stale == [silent] and not result.held
    [event] = audit(settings, NODE_EVICTED)
    assert event.target_id == str(silent) and "seen silent for 605 s" in event.after["evidence"]
    assert "running but its agent does not report" in event.after["evidence"]
    assert event.after["scopes"]["fleet"] == {"silent": 1, "nodes": 4, "share": 0.25, "threshold": 0.55,
                                              "min_nodes": 3}
    assert states(settings, ids) == {silent: S.terminating, **{i: S.ready for i in others}}  # failed, its VM going

    # Another one goes silent and its VM dies between the listing and the verdict: the describe
    # says so, and it goes at once as lost.
    victim = others[0]
    t = t + dt.timedelta(seconds=settings.heartbeat_timeout_s + 5)
    heartbeat(settings, others[1:], t)
    cloud = DiesAfterListing(aws, instance[victim])
    result = sweeper.sweep(settings, Clouds(aws=cloud), clock=at(t))
    assert result.lost == [victim] and not result.stale and cloud.described == [instance[victim]]
    with session_scope(settings) as s:
        node = s.get(Node, victim)
        assert node.state == S.terminating and "the cloud reports instance" in node.error and "terminated" in node.error


async def test_evictions_are_rate_limited_fleet_wide(client, admin, settings, aws, ec2, aws_template, moto_ami):
    settings = settings.model_copy(update={"evictions_per_sweep": 2, "evictions_per_minute": 3})
    await import_catalog(client, admin, aws_template)
    t0 = utcnow()
    ids = make_fleet(settings, ec2, moto_ami, 10, t0)
    # Four silent for long (their VMs run), at different times; six report: 40% silent, under 55%.
    silent = ids[:4]
    for i, node_id in enumerate(silent):
        heartbeat(settings, [node_id], t0 + dt.timedelta(seconds=i))
    first = t0 + dt.timedelta(seconds=settings.heartbeat_timeout_s + 10)
    heartbeat(settings, ids[4:], first)
    assert set(sweeper.sweep(settings, Clouds(aws=aws), clock=at(first)).held) == set(silent)  # first seen silent
    evicted: list[list[uuid.UUID]] = []
    for offset in (0, 5, 10, 65):
        t = first + dt.timedelta(seconds=settings.silent_running_evict_s + offset)
        heartbeat(settings, ids[4:], t)
        result = sweeper.sweep(settings, Clouds(aws=aws), clock=at(t))
        assert result.paused == []
        evicted.append(result.stale)
        assert all(result.held[n] == "eviction rate limit" for n in set(silent) - {x for e in evicted for x in e})
    # 2 in a sweep, 3 in a minute; the oldest silence first; the fourth after the minute.
    assert evicted == [silent[:2], silent[2:3], [], silent[3:]]
    assert len(audit(settings, NODE_EVICTED)) == 4
    assert set(states(settings, ids[4:]).values()) == {S.ready}


def test_a_scope_is_disrupted_as_kubernetes_judges_a_zone():
    settings = Settings()  # the documented defaults: 0.55, 3 nodes
    now = utcnow()
    old, fresh = now - dt.timedelta(seconds=settings.heartbeat_timeout_s + 1), now

    def rows(region: str, silent: int, reporting: int, never: int = 0):
        made = [SimpleNamespace(state=S.ready, cloud="aws", region=region, last_heartbeat_at=old)] * silent
        made += [SimpleNamespace(state=S.ready, cloud="aws", region=region, last_heartbeat_at=fresh)] * reporting
        return made + [SimpleNamespace(state=S.booting, cloud="aws", region=region, last_heartbeat_at=None)] * never

    def disrupted(*groups) -> dict[str, bool]:
        scopes = sweeper.scope_health([r for g in groups for r in g], settings, now)
        return {name: h.disrupted(settings) for name, h in scopes.items()}

    assert disrupted(rows("a", 2, 1)) == {"fleet": False, "aws/a": False}  # 67%, but only 2 silent
    assert disrupted(rows("a", 3, 2)) == {"fleet": True, "aws/a": True}  # 60% and 3 silent
    assert disrupted(rows("a", 3, 3)) == {"fleet": False, "aws/a": False}  # 50%
    assert disrupted(rows("a", 1, 0, never=5)) == {"fleet": True, "aws/a": True}  # all that ever reported
    assert disrupted(rows("a", 0, 0, never=3)) == {"fleet": False}  # none ever reported: no evidence either way
    # A region whose every node is silent pauses there; the fleet, mostly reporting, does not.
    assert disrupted(rows("a", 2, 0), rows("b", 0, 8)) == {"fleet": False, "aws/a": True, "aws/b": False}


async def test_a_silent_node_is_kept_while_the_edges_report_first_tokens_only_it_can_have_served(
    client, admin, settings, aws, ec2, aws_template, moto_ami, redis_client, celery_keys_cleanup
):
    settings = settings.model_copy(update={"edge_signals_prefix": f"{settings.cluster_name}:"})
    pool = await setup_pool(client, admin, aws_catalog(aws_template), [{"cloud": "aws", "region": AWS_REGION}],
                            min_replicas=1, max_replicas=1)
    with session_scope(settings) as s:
        variant = s.get(ModelVariant, uuid.UUID(pool["variant_id"]))
        served = f"{s.get(Model, variant.model_id).name}-{variant.tier}"
    t0 = utcnow()
    ids = make_fleet(settings, ec2, moto_ami, 6, t0)
    serving, idle, others = ids[0], ids[1], ids[2:]  # two silent of six: the scope still reports
    with session_scope(settings) as s:  # the model's only ready replica is on the silent node
        s.add(Replica(node_id=serving, pool_id=uuid.UUID(pool["id"]), variant_id=variant.id, state=ReplicaState.ready,
                      desired_state=ReplicaDesiredState.running, gpu_ids=[0], metrics={}, ready_breakdown={},
                      restarts=0))
    # An edge reports first tokens of that model over its last window.
    payload = {"v": 1, "ts": time.time(), "ttl_s": 300, "window_s": 5, "queue_depth": 0, "activation_waiting": 0,
               "inflight": 1, "queue_wait": {"le": [0.1, 1.0], "counts": [0, 0, 0]},
               "ttft": {"le": [0.1, 1.0], "counts": [3, 1, 0]}, "rejections": {}}
    redis_client.hset(f"{settings.edge_signals_prefix}edge-signals:edge-1", served, json.dumps(payload))
    redis_client.zadd(f"{settings.edge_signals_prefix}edge-signals", {"edge-1": time.time()})

    first = t0 + dt.timedelta(seconds=settings.heartbeat_timeout_s + 5)
    heartbeat(settings, others, first)
    sweeper.sweep(settings, Clouds(aws=aws), clock=at(first))  # both first seen silent
    t = first + dt.timedelta(seconds=settings.silent_running_evict_s + 5)
    heartbeat(settings, others, t)
    result = sweeper.sweep(settings, Clouds(aws=aws), clock=at(t))
    assert result.stale == [idle]
    assert result.held[serving] == f"the edges report first tokens of {served}, served only by silent nodes"
    # The edges stop reporting it (their hash expired): nothing speaks for the node any more.
    redis_client.delete(f"{settings.edge_signals_prefix}edge-signals:edge-1")
    t = t + dt.timedelta(seconds=5)
    heartbeat(settings, others, t)
    assert sweeper.sweep(settings, Clouds(aws=aws), clock=at(t)).stale == [serving]
