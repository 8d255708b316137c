"""The engine under test: a real SGLang server (``NIMBUS_ENGINE_URL``) or, by default, a simulator
this suite starts itself, small enough that saturating it takes seconds.

    NIMBUS_ENGINE_URL=http://gpu-node:30000 make conformance      # a real SGLang node
    .venv/bin/pytest tests/conformance                             # the simulator (CI)

The same assertions run against both; ``dataplane/sim/CONFORMANCE.md`` lists what each test
checks and where in SGLang's source the behaviour was read. Against a real engine the workloads
are sized from what the engine reports (``/get_server_info``), so the load tests take longer on
a large GPU (an estimate, not measured here: a few minutes for an 8B model on one H100, since the
workload is three KV pools' worth of tokens). Optional: ``NIMBUS_ENGINE_API_KEY``
(sent as a bearer token), ``NIMBUS_CONFORMANCE_TOKEN_RANGE`` (``lo,hi``: token ids safe to send
as ``input_ids``, default ``1000,20000``).

The engine should be launched the way the node agent launches it (``--enable-metrics
--enable-cache-report``, see ``dataplane/agent/template.py``); tests that depend on a flag say so
when they fail.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dataplane.sim.process import SimProcess

ENGINE_URL = os.environ.get("NIMBUS_ENGINE_URL", "").rstrip("/")
API_KEY = os.environ.get("NIMBUS_ENGINE_API_KEY")
TOKEN_LO, TOKEN_HI = (int(x) for x in os.environ.get("NIMBUS_CONFORMANCE_TOKEN_RANGE", "1000,20000").split(","))

# The simulator the suite starts by default: a 0.5B model on an L4 profile with a 6,000-token KV
# pool and 16 running slots, so that a few dozen requests saturate it (queue, KV pressure,
# retraction) within seconds, in real time (a decode step is ~6 ms: long enough for the probes to
# land while the engine is saturated, even on a loaded CI machine).
SIM_ARGS = ["--model-profile", "qwen2.5-0.5b", "--gpu", "l4", "--max-total-tokens", "6000",
            "--max-running-requests", "16", "--chunked-prefill-size", "1024", "--schedule-policy", "lpm",
            "--time-scale", "1", "--jitter", "0", "--enable-metrics", "--enable-cache-report"]


@dataclass
class Metrics:
    """One ``/metrics`` scrape: families by name (``sglang:`` prefix kept)."""

    families: dict = field(default_factory=dict)

    def family(self, name: str):
        return self.families.get(name)

    def value(self, name: str, default: float | None = None) -> float | None:
        """Sum of a gauge's or counter's samples (``name`` without ``_total`` for counters)."""
        fam = self.families.get(name)
        if fam is None:
            return default
        return sum(s.value for s in fam.samples if not s.name.endswith("_created"))


@dataclass
class Engine:
    url: str
    simulated: bool
    model: str
    info: dict
    headers: dict
    card: dict  # this engine's /v1/models entry

    def client(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, headers=self.headers)

    def metrics(self) -> Metrics:
        r = httpx.get(self.url + "/metrics", timeout=10, headers=self.headers)
        assert r.status_code == 200, "the engine must be launched with --enable-metrics (the agent always does)"
        return Metrics({f.name: f for f in text_string_to_metric_families(r.text)})

    def load(self) -> list[dict]:
        r = httpx.get(self.url + "/get_load", timeout=10, headers=self.headers)
        assert r.status_code == 200, r.text
        return r.json()

    def in_flight(self) -> int:
        return sum(int(entry.get("num_reqs", 0)) for entry in self.load())

    # -- sizes derived from what the engine reports ------------------------------------------
    @property
    def capacity(self) -> int:
        return int(self.info["max_total_num_tokens"])

    @property
    def max_running(self) -> int:
        states = self.info.get("internal_states") or [{}]
        return int(self.info.get("max_running_requests")
                   or states[0].get("effective_max_running_requests_per_dp") or 0)

    @property
    def context_length(self) -> int:
        return int(self.info.get("context_length") or self.card.get("max_model_len") or 4096)

    @property
    def chunked_prefill_size(self) -> int:
        return int(self.info.get("chunked_prefill_size") or 0)


def prompt_ids(n: int, seed: int | None = None) -> list[int]:
    """``n`` token ids no request has sent before (random unless seeded): no prefix-cache hits."""
    rng = random.Random(seed)
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def _wait_healthy(url: str, headers: dict, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"engine at {url} not healthy within {timeout}s")


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    headers = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}
    sim: SimProcess | None = None
    if ENGINE_URL:
        url = ENGINE_URL
        _wait_healthy(url, headers, 60)
    else:
        sim = SimProcess(served_model_name="conformance-model", extra_args=SIM_ARGS, ready_delay=0.0).start()
        url = sim.url
    try:
        info = httpx.get(url + "/get_server_info", timeout=10, headers=headers).json()
        card = httpx.get(url + "/v1/models", timeout=10, headers=headers).json()["data"][0]
        yield Engine(url=url, simulated=sim is not None, model=card["id"], info=info, headers=headers, card=card)
    finally:
        if sim is not None:
            sim.stop()


@pytest.fixture
def client(engine: Engine) -> Iterator[httpx.Client]:
    with engine.client() as c:
        yield c


def idle(engine: Engine, timeout: float = 120.0) -> None:
    """Wait until the engine has no request in flight (earlier tests' work finished)."""
    import time

    deadline = time.monotonic() + timeout
    while engine.in_flight() > 0:
        assert time.monotonic() < deadline, f"engine still busy after {timeout}s: {engine.load()}"
        time.sleep(0.1)
