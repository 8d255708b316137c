"""The agent's own Prometheus metrics (a private registry: nothing else in the process leaks in)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.replicas = Gauge("nimbus_agent_replicas", "Engine replicas on this node by state.", ["state"],
                              registry=self.registry)
        self.restarts = Counter("nimbus_agent_engine_restarts", "Engine restarts after a crash or a hang.", ["slot"],
                                registry=self.registry)
        self.hangs = Counter("nimbus_agent_engine_unresponsive_restarts",
                             "Engine restarts because /health_generate kept failing while the process lived.",
                             ["slot"], registry=self.registry)
        self.cp_unreachable = Gauge("nimbus_agent_control_plane_unreachable",
                                    "1 while heartbeats fail (the engines keep serving).", registry=self.registry)
        self.heartbeats = Counter("nimbus_agent_heartbeats", "Heartbeats sent, by result.", ["result"],
                                  registry=self.registry)
        self.model_ready = Histogram(
            "nimbus_agent_model_ready_seconds", "Model-ready time of a replica start, by phase.", ["phase"],
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800), registry=self.registry)
        self.draining = Gauge("nimbus_agent_draining", "1 while the node drains.", registry=self.registry)
        self.in_flight = Gauge("nimbus_agent_in_flight_requests", "Running plus queued requests on this node's engines.",
                               registry=self.registry)

    def observe_replicas(self, states: list[str]) -> None:
        for state in ("starting", "ready", "draining", "stopped", "failed"):
            self.replicas.labels(state).set(states.count(state))
