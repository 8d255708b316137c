"""Admission rules read from SGLang's scheduler (dataplane/sim/CONFORMANCE.md §8) that a real engine
only shows under flags an operator may not have set, so the conformance suite cannot check them
from outside: --max-prefill-tokens, --max-queued-requests, --enable-priority-scheduling, health
probes that stay out of the scheduler while it is busy, and the metrics a retraction moves."""

from __future__ import annotations

import asyncio
import random

import pytest

from dataplane.sim.engine import RequestError
from dataplane.sim.offline import offline_engine


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10_000, 100_000) for _ in range(n)]


def test_max_prefill_tokens_bounds_a_batch_but_always_admits_its_first_request():
    engine, _ = offline_engine(["--max-prefill-tokens", "300", "--chunked-prefill-size", "4096"])
    for i in range(4):
        engine.new_request(prompt(i, 200), 4, ignore_eos=True)
    assert [t for _, t in engine.plan().chunks] == [200]  # 400 > 300: the second waits
    engine2, _ = offline_engine(["--max-prefill-tokens", "100", "--chunked-prefill-size", "4096"])
    engine2.new_request(prompt(9, 500), 4, ignore_eos=True)
    assert [t for _, t in engine2.plan().chunks] == [500]  # alone it goes in whole


def test_max_queued_requests_rejects_with_503():
    engine, _ = offline_engine(["--max-queued-requests", "2"])
    engine.new_request(prompt(1, 10), 4)
    engine.new_request(prompt(2, 10), 4)
    with pytest.raises(RequestError) as err:
        engine.new_request(prompt(3, 10), 4)
    assert err.value.status == 503


def test_priority_orders_the_queue_only_when_enabled():
    for flags, expected in (([], [0, 1, 2]), (["--enable-priority-scheduling"], [2, 1, 0]),
                            (["--enable-priority-scheduling", "--schedule-low-priority-values-first"], [0, 1, 2])):
        engine, _ = offline_engine(["--max-running-requests", "1", *flags])
        reqs = [engine.new_request(prompt(i, 20), 2, priority=i) for i in range(3)]
        order = [reqs.index(r) for r in engine._ordered_waiting()]
        assert order == expected, flags


def test_a_busy_engine_answers_progress_waiters_at_its_next_step_and_probes_count_nowhere():
    async def run() -> None:
        engine, clock = offline_engine(["--jitter", "0"])
        probe = engine.new_request([0], 1, ignore_eos=True, log_metrics=False)
        waiter = engine.wait_progress()
        step = engine.plan()
        clock.t += step.duration
        engine.complete(step, clock.t)
        assert waiter.done() and probe.done
        m = engine.metrics
        assert (m.num_requests, m.prompt_tokens, m.generation_tokens, m.ttft.count, m.e2e.count) == (0, 0, 0, 0, 0)

    asyncio.run(run())


def test_retraction_moves_the_retraction_metrics():
    engine, clock = offline_engine(["--max-total-tokens", "2000", "--jitter", "0"])
    for i in range(8):
        engine.new_request(prompt(i, 100), 400, ignore_eos=True)
    while engine.has_work():
        step = engine.plan()
        clock.t += step.duration
        engine.complete(step, clock.t)
    assert engine.retractions > 0
    gauges = engine.gauges()
    assert gauges["num_retracted_reqs"][1] > 0
    text = engine.metrics.render(gauges)
    assert f'sglang:num_retracted_requests_total{{model_name="{engine.config.served_model_name}"}} ' \
           f'{float(engine.retractions)}' in text


def run_until(engine, clock, done) -> None:
    for _ in range(10_000):
        if done():
            return
        step = engine.plan()
        clock.t += step.duration
        engine.complete(step, clock.t)
    raise AssertionError("the engine never got there")


@pytest.mark.parametrize("flags, high, low", [
    (["--enable-priority-scheduling"], 100, 0),
    (["--enable-priority-scheduling", "--schedule-low-priority-values-first"], 0, 100),
])
def test_a_full_batch_is_preempted_for_a_request_that_outranks_it_by_more_than_the_threshold(flags, high, low):
    """SGLang's priority preemption: the newest of the least important running requests goes back to
    the queue (its output kept), the important one takes its slot at the next prefill."""
    engine, clock = offline_engine(["--max-running-requests", "2", "--jitter", "0", *flags])
    batch = []
    for i in range(2):
        batch.append(engine.new_request(prompt(i, 50), 200, ignore_eos=True, priority=low))
        clock.t += 0.001  # the second arrives later: it is the one to go
    run_until(engine, clock, lambda: all(len(r.output_ids) >= 5 for r in batch))
    urgent = engine.new_request(prompt(7, 50), 4, ignore_eos=True, priority=high)
    step = engine.plan()
    assert [req for req, _ in step.chunks] == [urgent]
    assert engine.preemptions == 1 and batch[1] in engine.waiting and batch[0] in engine.running
    kept = len(batch[1].output_ids)
    assert kept >= 5  # its output survives the preemption
    clock.t += step.duration
    engine.complete(step, clock.t)
    run_until(engine, clock, lambda: all(r.done for r in [*batch, urgent]))
    assert len(batch[1].output_ids) == 200 and urgent.done


@pytest.mark.parametrize("flags, high, low", [
    (["--enable-priority-scheduling"], 5, 0),  # a gap of 5 is not above SGLang's threshold of 10
    (["--enable-priority-scheduling", "--disable-priority-preemption"], 100, 0),
    ([], 100, 0),  # without priority scheduling the field is ignored
])
def test_no_preemption_below_the_threshold_when_disabled_or_without_priority_scheduling(flags, high, low):
    engine, clock = offline_engine(["--max-running-requests", "2", "--jitter", "0", *flags])
    batch = [engine.new_request(prompt(i, 50), 200, ignore_eos=True, priority=low) for i in range(2)]
    run_until(engine, clock, lambda: all(len(r.output_ids) >= 5 for r in batch))
    engine.new_request(prompt(7, 50), 4, ignore_eos=True, priority=high)
    assert engine.plan().kind == "decode" and engine.preemptions == 0
