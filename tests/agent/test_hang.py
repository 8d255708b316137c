"""A hung engine (its process alive, its HTTP server and scheduler stuck: the simulator's ``hang``
fault) is found by the agent's ``/health_generate`` probes and restarted within the documented
bound, and the restart's reason reaches the control plane (the node's ``metrics.agent.last_restart``
through the admin API; the replica report's ``last_restart_reason``)."""

from __future__ import annotations

import time

import httpx

from dataplane.agent.engine import SupervisorOptions
from dataplane.agent.process import AgentProcess
from tests.agent.conftest import FAST_AGENT_ENV, ControlPlane, agent_config, make_node, make_pool
from tests.agent.test_agent_process import all_ready, wait_cp

PROBE = {"probe_interval_s": 0.3, "probe_timeout_s": 0.5, "probe_failures": 2}
HANG_ENV = {**FAST_AGENT_ENV, **{f"NIMBUS_AGENT_{k.upper()}": str(v) for k, v in PROBE.items()}}
BOUND_S = SupervisorOptions(**PROBE).unresponsive_within_s()  # failures × (interval + timeout) + kill + 5 s


def test_a_hung_engine_is_restarted_within_the_bound_and_the_reason_is_reported(cp: ControlPlane, tmp_path):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool, gpus=1)
    with AgentProcess(agent_config(cp, node_id, token), tmp_path / "node", env=HANG_ENV) as agent:
        agent.wait_url()
        wait_cp(cp, node_id, all_ready(1), what="a ready replica")
        time.sleep(1.0)  # several probe rounds on a healthy engine: nothing happens
        before = agent.status()["replicas"][0]
        assert before["restarts"] == 0, before

        assert httpx.post(before["url"] + "/_sim/faults", json={"hang": True}, timeout=5).status_code == 200
        hung_at = time.monotonic()
        after = agent.wait(lambda s: s["replicas"][0]["restarts"] == 1 and s["replicas"][0]["state"] == "ready",
                           timeout=BOUND_S + 15, what="the hung engine restarted and ready")
        restarted_s = time.monotonic() - hung_at
        replica = after["replicas"][0]
        assert replica["pid"] != before["pid"]
        assert replica["last_restart_reason"].startswith("unresponsive: /health_generate failed 2 times in a row")
        # Restarted (killed) within the bound; "ready again" adds the new engine's start.
        assert restarted_s < BOUND_S + 10, (restarted_s, BOUND_S)
        reply = httpx.post(replica["url"] + "/generate", timeout=10,
                           json={"text": "back?", "sampling_params": {"max_new_tokens": 2}})
        assert reply.status_code == 200

        def reported() -> dict | None:
            node = cp.get_admin(f"/admin/v1/nodes/{node_id}")
            last = node["metrics"].get("agent", {}).get("last_restart") or {}
            return node if (last.get("reason") or "").startswith("unresponsive") else None

        deadline = time.monotonic() + 10
        while (node := reported()) is None:
            assert time.monotonic() < deadline, cp.get_admin(f"/admin/v1/nodes/{node_id}")["metrics"]
            time.sleep(0.1)
        last = node["metrics"]["agent"]["last_restart"]
        assert last["replica_id"] == replica["id"] and last["slot"] == 0
        assert node["metrics"]["health"]["restarts"] == 1 and node["state"] == "ready"
        assert "nimbus_agent_engine_unresponsive_restarts_total" in httpx.get(agent.url + "/metrics").text
    print(f"hung engine restarted and ready again {restarted_s:.1f} s after the fault (bound {BOUND_S:.1f} s)")
