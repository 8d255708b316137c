"""``make run``'s platform: its demo tunables are defaults the operator's environment overrides, and
stray agent settings from the operator's shell never reach the local nodes."""

from __future__ import annotations

from controlplane.embedded import AGENT_ENV, PLATFORM_ENV, Platform


def test_environment_overrides_the_demo_tunables(tmp_path, monkeypatch):
    monkeypatch.setenv("NIMBUS_AUTOSCALE_INTERVAL_S", "7")
    monkeypatch.setenv("NIMBUS_DRAIN_TIMEOUT_S", "120")
    monkeypatch.setenv("NIMBUS_AGENT_HEARTBEAT_S", "3")
    monkeypatch.setenv("NIMBUS_AGENT_CONFIG", "/etc/somewhere-else.json")
    monkeypatch.delenv("NIMBUS_RECONCILE_INTERVAL_S", raising=False)
    env = Platform(state_dir=tmp_path, api_port=1, edge_port=2).env()
    assert env["NIMBUS_AUTOSCALE_INTERVAL_S"] == "7"
    assert env["NIMBUS_DRAIN_TIMEOUT_S"] == "120"
    assert env["NIMBUS_AGENT_HEARTBEAT_S"] == "3"
    assert "NIMBUS_AGENT_CONFIG" not in env  # not one of the demo's own agent tunables
    assert env["NIMBUS_RECONCILE_INTERVAL_S"] == PLATFORM_ENV["NIMBUS_RECONCILE_INTERVAL_S"]
    assert env["NIMBUS_AGENT_SIM_ARGS"] == AGENT_ENV["NIMBUS_AGENT_SIM_ARGS"]
