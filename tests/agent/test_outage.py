"""Static stability: the real agent process, its simulator engine, and a control plane behind a
test proxy (``cp_proxy``) that the test pauses.

- The control plane answers 503, then hangs every request: the engine keeps serving, heartbeats are
  retried with a backoff whose spacing grows and is capped, replica changes made meanwhile (an
  engine crash and restart) are not queued; when the control plane comes back it gets one heartbeat
  with the latest state, then the normal pace, no burst.
- A register whose answer is lost (forwarded, handled, never answered) and a register answered
  with 503 are retried with the same bootstrap token and succeed; the node does not die.

The stand-in (``standin.py``) plays the control plane: its register always answers, as an
idempotent server does. The real control plane's side (a repeated token gets the same credential,
a real agent behind a proxy that drops the answer comes up) is tested in
``tests/controlplane/test_idempotent_bootstrap.py``."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import time

import httpx
import pytest

from dataplane.agent.process import AgentProcess
from infra.bootstrap import AgentConfig
from tests.agent.conftest import FAST_AGENT_ENV
from tests.agent.cp_proxy import FAIL, FORWARD, HANG, proxy_to
from tests.agent.standin import entry, stand_in

HEARTBEAT_S = 0.3
RETRY_BASE_S, RETRY_CAP_S = 0.2, 1.0
OUTAGE_ENV = {**FAST_AGENT_ENV, "NIMBUS_AGENT_HEARTBEAT_S": str(HEARTBEAT_S),
              "NIMBUS_AGENT_CP_RETRY_BASE_S": str(RETRY_BASE_S), "NIMBUS_AGENT_CP_RETRY_CAP_S": str(RETRY_CAP_S),
              "NIMBUS_AGENT_CP_TIMEOUT_S": "0.5"}


def config_for(url: str, node_id: str) -> AgentConfig:
    return AgentConfig(control_plane_url=url, node_id=node_id, bootstrap_token="one-time",
                       bootstrap_token_expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10),
                       variant="tiny:bf16", engine="sim", cloud="local", region="local", zone="local-a")


@pytest.fixture
def behind_proxy(tmp_path):
    """(stand-in, proxy, agent) with the agent talking to the stand-in through the proxy."""
    with stand_in() as (cp, cp_url), proxy_to(cp_url) as (proxy, url):
        agent = AgentProcess(config_for(url, cp.node_id), tmp_path / "node", env=OUTAGE_ENV)
        try:
            yield cp, proxy, agent
        finally:
            agent.stop()


def generate(url: str) -> int:
    return httpx.post(url + "/generate", timeout=10,
                      json={"text": "still there?", "sampling_params": {"max_new_tokens": 2}}).status_code


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


def test_an_unreachable_control_plane_takes_nothing_away_and_gets_no_stampede_when_it_returns(behind_proxy):
    cp, proxy, agent = behind_proxy
    rid = "r-outage"
    cp.set_replicas([entry([0], rid=rid)])
    agent.start()
    cp.wait(lambda: cp.state(rid) == "ready", what="replica ready")
    engine = agent.status()["replicas"][0]
    assert generate(engine["url"]) == 200

    # 1. The API answers 503 (overloaded, restarting): heartbeats back off, the gaps grow to the cap.
    failing_since = proxy.set_mode(FAIL)
    time.sleep(4.0)
    failed = [s.at for s in proxy.requests("/heartbeat", since=failing_since, outcome="failed")]
    spacing = gaps(failed)
    assert len(failed) >= 5, spacing
    # Equal jitter: the n-th wait is in [0.5, 1] × min(cap, base · 2^(n-1)) (plus a scrape and a request).
    assert spacing[0] <= RETRY_BASE_S + 0.4 and spacing[2] > spacing[0], spacing
    assert max(spacing) <= RETRY_CAP_S + 0.5 and max(spacing[2:]) >= 0.5 * RETRY_CAP_S, spacing
    assert all(s >= 0.5 * RETRY_BASE_S for s in spacing), spacing  # never a tight loop

    # 2. Then it hangs (SIGSTOP, a stuck database): every heartbeat waits out its timeout. Meanwhile the
    # engine crashes and the agent restarts it: the changes are not queued for later.
    proxy.set_mode(HANG)
    status = agent.status()
    assert status["control_plane"]["reachable"] is False and status["control_plane"]["failed_heartbeats"] >= 5
    os.kill(engine["pid"], signal.SIGKILL)
    restarted = agent.wait(lambda s: s["replicas"][0]["state"] == "ready" and s["replicas"][0]["restarts"] == 1
                           and s["replicas"][0]["pid"] not in (None, engine["pid"]), timeout=20, what="engine back")
    assert generate(restarted["replicas"][0]["url"]) == 200  # it serves, whatever the control plane does
    # The restart can be quicker than the next try (a backoff of up to the cap): wait for one.
    cp.wait(lambda: proxy.requests(since=failing_since, outcome="hung"), timeout=RETRY_CAP_S + 5,
            what="a heartbeat held by the hung control plane")
    hung = proxy.requests(since=failing_since, outcome="hung")
    assert hung and all(s.path.endswith("/heartbeat") for s in hung)  # no report sent on its own meanwhile

    # 3. It comes back: one heartbeat, carrying the latest state, then the normal pace.
    back_at = proxy.set_mode(FORWARD)
    cp.wait(lambda: proxy.requests(since=back_at, outcome="forwarded"), timeout=RETRY_CAP_S + 2, what="first beat")
    time.sleep(1.5)
    after = proxy.requests(since=back_at, outcome="forwarded")
    first = after[0]
    assert first.path.endswith("/heartbeat") and first.at - back_at <= RETRY_CAP_S + 1.0, after
    assert cp.report(rid)["restarts"] == 1 and cp.state(rid) == "ready"  # the latest state, in one beat
    burst = [s for s in after if s.at - first.at < HEARTBEAT_S * 0.8]
    assert len(burst) <= 2, after  # the first beat (and at most one report racing it), not a backlog
    beats = [s.at for s in after if s.path.endswith("/heartbeat")]
    assert len(after) <= (after[-1].at - first.at) / HEARTBEAT_S + 3, after
    assert all(g >= HEARTBEAT_S * 0.8 for g in gaps(beats)), gaps(beats)
    status = agent.status()
    assert status["control_plane"] == {"reachable": True, "failed_heartbeats": 0, "down_s": None}
    assert status["replicas"][0]["pid"] == restarted["replicas"][0]["pid"]  # nothing restarted on the way back
    assert cp.registered == 1  # and no re-register


def test_a_register_whose_answer_is_lost_is_retried_with_the_same_token(behind_proxy):
    cp, proxy, agent = behind_proxy
    rid = "r-register"
    cp.set_replicas([entry([0], rid=rid)])
    proxy.drop_answers["/register"] = 1  # handled upstream, the answer never comes back
    agent.start()
    cp.wait(lambda: cp.state(rid) == "ready", what="replica ready after a lost register answer")
    registers = proxy.requests("/register")
    assert [s.outcome for s in registers] == ["dropped", "forwarded"] and cp.registered == 2
    assert agent.proc.poll() is None
    assert (agent.state_dir / "credential").read_text() == "stand-in-credential"
    assert "one-time" not in agent.log()  # the bootstrap token is never logged


def test_a_register_answered_with_503_is_retried_then_succeeds(behind_proxy):
    cp, proxy, agent = behind_proxy
    proxy.set_mode(FAIL)
    agent.start()
    cp.wait(lambda: len(proxy.requests("/register", outcome="failed")) >= 2, timeout=10, what="retried registers")
    assert agent.proc.poll() is None and cp.registered == 0
    proxy.set_mode(FORWARD)
    cp.wait(lambda: cp.heartbeats >= 1, timeout=10, what="registered and heartbeating")
    assert cp.registered == 1 and agent.proc.poll() is None

