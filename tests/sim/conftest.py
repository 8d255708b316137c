"""Fixtures for the simulator tests: real simulator processes on free ports, stopped after use."""

from __future__ import annotations

import httpx
import pytest

from dataplane.sim.process import SimProcess

FAST = ["--time-scale", "50", "--enable-metrics"]


@pytest.fixture
def start_sim():
    """Factory: ``start_sim(*args, **kwargs)`` starts a fresh simulator; all are stopped at teardown."""
    started: list[SimProcess] = []

    def start(*extra_args: str, served_model_name: str = "sim-model", ready_delay: float | None = 0.0,
              wait: bool = True, **kwargs) -> SimProcess:
        sim = SimProcess(served_model_name=served_model_name, extra_args=list(extra_args),
                         ready_delay=ready_delay, **kwargs)
        started.append(sim)
        return sim.start() if wait else sim.launch()

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def shared_sim():
    """One simulator per test module, for tests that do not depend on cache or fault state."""
    with SimProcess(served_model_name="sim-model", extra_args=FAST) as sim:
        yield sim


@pytest.fixture
def http(shared_sim):
    with httpx.Client(base_url=shared_sim.url, timeout=30) as client:
        yield client
