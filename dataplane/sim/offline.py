"""Drive the engine on a virtual clock: no sleeping, no sockets.

The same :meth:`SimEngine.plan` / :meth:`SimEngine.complete` pair the real-time server uses,
so benchmarks and behaviour tests exercise the real scheduler at thousands of simulated
seconds per wall second.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from . import timing
from .config import SimConfig, parse_config
from .engine import SimEngine, SimRequest


@dataclass
class Arrival:
    at: float  # simulated seconds
    prompt_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = True
    stop: tuple[str, ...] = ()


class VirtualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def offline_engine(argv: list[str] | None = None, config: SimConfig | None = None) -> tuple[SimEngine, VirtualClock]:
    """An engine built from simulator CLI flags, on its own virtual clock."""
    if config is None:
        config, _ = parse_config(list(argv or []), warn=lambda msg: None)
    clock = VirtualClock()
    return SimEngine(config, clock=clock), clock


def simulate(engine: SimEngine, clock: VirtualClock, arrivals: Iterable[Arrival],
             jitter: bool = False) -> list[SimRequest]:
    """Run until every arrival has finished; returns the requests in arrival order."""
    pending = sorted(arrivals, key=lambda a: a.at)
    done: list[SimRequest] = []
    rng = random.Random(engine.config.seed)
    i = 0
    while i < len(pending) or engine.has_work():
        while i < len(pending) and pending[i].at <= clock.t:
            a = pending[i]
            req = engine.new_request(a.prompt_ids, a.max_new_tokens, stop=a.stop, ignore_eos=a.ignore_eos)
            req.arrival = a.at
            done.append(req)
            i += 1
        step = engine.plan()
        if step is None:
            if i < len(pending):
                clock.t = max(clock.t, pending[i].at)
                continue
            break
        factor = timing.jitter_factor(rng, engine.config.jitter) if jitter else 1.0
        clock.t += step.duration * factor * engine.faults.slowdown
        engine.complete(step, clock.t)
    return done
