"""Peer policies with the same ``decide`` shape as ours, for the benchmark and the tests.

* ``skyserve_decide``: SkyServe's ``RequestRateAutoscaler`` rule: target =
  ceil(requests in the last 60 s / 60 / target_qps_per_replica), clamped to [min, max],
  evaluated every 20 s, applied only after 300 s (up) or 1200 s (down) of consecutive
  agreeing evaluations; from a target of zero it scales up at once.
* ``static_decide``: a fixed pool provisioned for the peak.

Like ours they answer a target replica count only; the benchmark's fleet stand-in
(``bench.autoscale.simulate.follow_target``) turns every policy's target into launches and
stops the same way, so the comparison is about the sizing rule alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from controlplane.autoscaler.decision import Decision
from controlplane.autoscaler.forecast import window_values
from controlplane.autoscaler.signals import PoolObservation, PoolSpec


@dataclass(frozen=True)
class SkyServeConfig:
    target_qps_per_replica: float
    qps_window_s: float = 60.0
    decision_interval_s: float = 20.0
    upscale_delay_s: float = 300.0
    downscale_delay_s: float = 1200.0


@dataclass(frozen=True)
class SkyServeState:
    target: int | None = None
    upscale_counter: int = 0
    downscale_counter: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> SkyServeState:
        return cls(**json.loads(text)) if text else cls()


def qps_target(spec: PoolSpec, obs: PoolObservation, config: SkyServeConfig) -> tuple[int, float]:
    points = window_values(obs.request_rate_history, obs.now - config.qps_window_s, obs.now)
    # The history holds per-interval rates on a regular step; their mean is requests / window.
    qps = sum(v for _, v in points) / len(points) if points else 0.0
    raw = math.ceil(qps / config.target_qps_per_replica - 1e-9)
    return max(spec.min_replicas, min(spec.max_replicas, raw)), qps


def skyserve_step(current: int, wanted: int, state: SkyServeState, config: SkyServeConfig) -> SkyServeState:
    up_periods = int(config.upscale_delay_s / config.decision_interval_s)
    down_periods = int(config.downscale_delay_s / config.decision_interval_s)
    if current == 0:
        return SkyServeState(wanted, 0, 0)
    if wanted > current:
        counter = state.upscale_counter + 1
        if counter >= up_periods:
            return SkyServeState(wanted, 0, 0)
        return SkyServeState(current, counter, 0)
    if wanted < current:
        counter = state.downscale_counter + 1
        if counter >= down_periods:
            return SkyServeState(wanted, 0, 0)
        return SkyServeState(current, 0, counter)
    return SkyServeState(current, 0, 0)


def skyserve_decide(spec: PoolSpec, obs: PoolObservation, state: SkyServeState,
                    config: SkyServeConfig) -> tuple[Decision, SkyServeState]:
    wanted, qps = qps_target(spec, obs, config)
    current = state.target if state.target is not None else spec.min_replicas
    new_state = skyserve_step(current, wanted, state, config)
    reason = f"qps {qps:.2f} -> {wanted} wanted; target {new_state.target}"
    signals = {"qps": qps, "wanted": wanted, "upscale_counter": new_state.upscale_counter,
               "downscale_counter": new_state.downscale_counter}
    return Decision(new_state.target, (reason,), signals), new_state


@dataclass(frozen=True)
class StaticConfig:
    replicas: int


def static_decide(spec: PoolSpec, obs: PoolObservation, state: None,
                  config: StaticConfig) -> tuple[Decision, None]:
    target = config.replicas
    return Decision(target, (f"static pool of {target}",), {}), state
