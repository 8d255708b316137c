"""Bursts: when one begins, when it is over, and which samples the scale-down hold then forgets.

A burst is a step in load the stable window did not see coming (the panic rule fires). Its
replicas are wanted while it lasts and not a moment after: once the need is back near where it
was before it, the pool shrinks to what is left in one step, without holding the burst's level
for a hold window, cooling down the replicas it added, or forecasting from its rate.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.autoscaler.signals import AutoscalerState


def not_held(need_samples: Sequence[tuple[float, float]], now: float, state: AutoscalerState,
             config: AutoscalerConfig) -> Sequence[tuple[float, float]]:
    """The need samples the scale-down hold remembers: all but those of a burst that is over.

    A panic is a step in load the stable window had not seen coming: a burst. While it lasts,
    nothing scales down (``panic_hold_s`` past its last signal, by which time the backlog is
    worked off). Holding its level for another hold window once it is over only keeps the
    burst's replicas for a load that has gone, and shrinking through that window's sliding
    peak takes a staircase of scale-downs (bench/fleet: 9 → 4 → 3 → 2 replicas over five
    minutes after a two-minute burst), each one a chance of a flap. So:

    * the samples of a panic episode that has ended, and of the stable window's minute after
      it (that window still averages the burst in), leave the hold;
    * a burst that outlasts its panic (the replicas arrived, the load stayed up) is held like
      any load until it is over: until the need is back near where it was before it
      (``track_burst``). Then all of its samples leave the hold, and the pool shrinks to the
      load after it in one step. Before, the hold kept the burst's level for a whole hold
      window after its end, and the fleet its nodes (bench/fleet: 12 H100 nodes for five
      minutes after a burst where 6 served, a fifth of the day's cost above the bound in the
      quarter hours after bursts).

    The current need is always part of the hold (``apply_hysteresis``): a load that stays up
    keeps its replicas."""
    dropped: list[tuple[float, float]] = []
    since, until = state.panic_since, state.panic_until
    if since is not None and until is not None and now >= until:
        dropped.append((since, until + config.stable_window_s))
    if state.burst_since is not None and state.burst_ended_at is not None:
        dropped.append((state.burst_since, state.burst_ended_at))
    if not dropped:
        return need_samples
    return [(t, v) for t, v in need_samples if not any(a <= t <= b for a, b in dropped)]


def track_burst(state: AutoscalerState, now: float, panic_began: bool, in_panic: bool, held_need: float,
                need_samples: Sequence[tuple[float, float]],
                config: AutoscalerConfig) -> tuple[float | None, float | None, float | None]:
    """(burst_since, burst_base, burst_ended_at) after this tick.

    A burst begins with the first panic of an episode; its base is the hold's peak need just
    before it. It is over once the panic is and the need is back within
    ``1 - burst_end_fraction`` of the way from the base to the burst's level (the peak of the
    need samples kept since it began). A burst that has not ended within ``burst_max_s`` was
    a new level of load: forgotten, so its samples are held as any others."""
    since, base, ended = state.burst_since, state.burst_base, state.burst_ended_at
    if panic_began and (since is None or ended is not None):
        before = [v for t, v in state.need_samples if t > now - config.scale_down_hold_s]
        return now, max(before, default=0.0), None
    if since is None or ended is not None:
        return since, base, ended
    if now - since > config.burst_max_s:
        return None, None, None
    if in_panic or base is None:
        return since, base, None
    level = max((v for t, v in need_samples if t >= since), default=held_need)
    if held_need <= base + (1 - config.burst_end_fraction) * max(0.0, level - base):
        return since, base, now
    return since, base, None


def added_for_a_burst_now_over(state: AutoscalerState) -> bool:
    """The last scale-up came before the end of a burst that is now over: it was for the burst."""
    return (state.burst_ended_at is not None and state.last_scale_up_at is not None
            and state.burst_ended_at >= state.last_scale_up_at)
