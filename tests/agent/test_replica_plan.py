"""The agent's decisions about the control plane's replica list (``dataplane.agent.replicas``),
pure: what to start, drain, wait for, refuse, acknowledge and forget; parsing; ports."""

from __future__ import annotations

import pytest

from dataplane.agent.replicas import (
    LocalView,
    ReplicaEntry,
    engine_port,
    parse_replica_list,
    plan_replica_changes,
)


def raw(rid: str, gpu_ids=(0,), desired: str = "running", **extra) -> dict:
    return {"id": rid, "pool_id": "p", "variant_id": "v", "model": "llama-3.1-8b", "tier": "fp8",
            "served_model_name": "llama-3.1-8b-fp8", "model_path": "meta-llama/Llama-3.1-8B-Instruct-FP8",
            "quantization": "fp8", "context_length": 8192, "engine_args": {"mem_fraction_static": 0.8},
            "gpu_ids": list(gpu_ids), "port": None, "desired_state": desired, "drain_deadline_s": 30.0,
            "artifact_source": None, **extra}


def entry(rid: str, gpu_ids=(0,), desired: str = "running", **extra) -> ReplicaEntry:
    return ReplicaEntry.from_dict(raw(rid, gpu_ids, desired, **extra))


def running(rid: str, gpu_ids=(0,)) -> LocalView:
    return LocalView(rid, tuple(gpu_ids))


def stopped(rid: str, gpu_ids=(0,), reported: bool = True) -> LocalView:
    return LocalView(rid, tuple(gpu_ids), stopping=True, holds_gpus=False, final_reported=reported)


def draining(rid: str, gpu_ids=(0,)) -> LocalView:
    return LocalView(rid, tuple(gpu_ids), stopping=True, holds_gpus=True)


def test_entry_fields_and_unknown_fields_are_ignored():
    e = entry("a", [3, 2], some_future_field={"x": 1})
    assert e.gpu_ids == (2, 3) and e.slot == 2 and e.tp_size == 2
    assert (e.served_model_name, e.quantization, e.context_length) == ("llama-3.1-8b-fp8", "fp8", 8192)
    assert e.engine_args == {"mem_fraction_static": 0.8} and e.drain_deadline_s == 30.0


@pytest.mark.parametrize("bad", [
    "not an object", {"gpu_ids": [0]}, {"id": "", "gpu_ids": [0]}, raw("x", []), raw("x", [0, 0]),
    raw("x", [-1]), raw("x", ["0"]), raw("x", [True]), raw("x", desired="paused"), raw("x", model_path=""),
    raw("x", served_model_name=None), raw("x", port="30000"), raw("x", port=70000), raw("x", engine_args=[1]),
    raw("x", drain_deadline_s=-1), raw("x", context_length=0),
])
def test_malformed_entries_are_refused_with_a_reason(bad):
    with pytest.raises(ValueError):
        ReplicaEntry.from_dict(bad)


def test_a_stopped_entry_needs_no_model_fields():
    e = ReplicaEntry.from_dict({"id": "a", "desired_state": "stopped"})
    assert e.desired_state == "stopped" and e.gpu_ids == ()


def test_list_parsing_skips_bad_entries_and_remembers_their_ids():
    parsed = parse_replica_list([raw("a"), {"id": "b", "gpu_ids": "zero"}, 7, raw("a", [1]), raw("c", [1])])
    assert [e.id for e in parsed.entries] == ["a", "c"]
    assert parsed.unparsed_ids == {"b"} and len(parsed.errors) == 3
    assert any("listed twice" in line for line in parsed.errors)
    assert parse_replica_list(None) is None and parse_replica_list({"a": 1}) is None
    assert parse_replica_list([]).entries == ()


def test_new_entries_start_on_free_gpus():
    plan = plan_replica_changes([], [entry("a", [0]), entry("b", [2, 3])])
    assert [e.id for e in plan.start] == ["a", "b"] and not plan.drain and not plan.wait


def test_entries_already_running_are_left_alone():
    plan = plan_replica_changes([running("a", [0])], [entry("a", [0])])
    assert not plan and plan.start == [] and plan.drain == []


def test_absent_or_stopped_replicas_drain_alone():
    local = [running("a", [0]), running("b", [1]), running("c", [2])]
    plan = plan_replica_changes(local, [entry("b", [1]), entry("c", [2], "stopped", drain_deadline_s=12.0)])
    assert plan.drain == [("a", None), ("c", 12.0)] and plan.start == []


def test_a_draining_replica_is_not_drained_twice_but_gets_a_stricter_deadline():
    plan = plan_replica_changes([draining("a")], [entry("a", desired="stopped", drain_deadline_s=5.0)])
    assert plan.drain == [] and plan.deadlines == [("a", 5.0)]
    assert plan_replica_changes([draining("a")], []).drain == []


def test_an_entry_waits_while_a_replica_not_yet_stopped_holds_one_of_its_gpus():
    local = [draining("old", [0, 1])]
    plan = plan_replica_changes(local, [entry("old", [0, 1], "stopped"), entry("new", [1, 2])])
    assert [e.id for e in plan.wait] == ["new"] and plan.start == []
    # Once the old one has stopped, the same list starts the new one.
    plan = plan_replica_changes([stopped("old", [0, 1])], [entry("old", [0, 1], "stopped"), entry("new", [1, 2])])
    assert [e.id for e in plan.start] == ["new"] and plan.forget == []  # still listed: kept, reported stopped


def test_a_running_replica_being_drained_in_the_same_plan_still_holds_its_gpus():
    plan = plan_replica_changes([running("old", [0])], [entry("new", [0])])
    assert plan.drain == [("old", None)] and [e.id for e in plan.wait] == ["new"]


def test_two_new_entries_on_one_gpu_the_first_starts():
    plan = plan_replica_changes([], [entry("a", [0, 1]), entry("b", [1])])
    assert [e.id for e in plan.start] == ["a"] and [e.id for e in plan.wait] == ["b"]


def test_gpus_the_machine_does_not_have_are_refused_on_a_gpu_machine_only():
    plan = plan_replica_changes([], [entry("a", [0]), entry("b", [6, 7])], node_gpus=[0, 1, 2, 3])
    assert [e.id for e in plan.start] == ["a"]
    assert [(e.id, "[6, 7]" in why) for e, why in plan.refuse] == [("b", True)]
    # A CPU machine (the simulator): indices are nominal, any is accepted.
    assert [e.id for e in plan_replica_changes([], [entry("b", [6, 7])]).start] == ["b"]


def test_stopped_replicas_are_forgotten_once_unlisted_and_reported():
    assert plan_replica_changes([stopped("a")], []).forget == ["a"]
    assert plan_replica_changes([stopped("a", reported=False)], []).forget == []  # its stop is not told yet
    assert plan_replica_changes([stopped("a")], [entry("a", desired="stopped")]).forget == []


def test_stopped_entries_never_run_here_are_acknowledged():
    plan = plan_replica_changes([], [entry("a", desired="stopped")])
    assert [e.id for e in plan.acknowledge] == ["a"] and plan.start == []


def test_a_malformed_entry_leaves_its_local_replica_alone():
    parsed = parse_replica_list([{"id": "a", "gpu_ids": "garbled"}])
    plan = plan_replica_changes([running("a")], parsed.entries, unparsed_ids=parsed.unparsed_ids)
    assert not plan


def test_ports():
    assert engine_port(entry("a", [2, 3], port=31000), 30000) == 31000
    assert engine_port(entry("a", [2, 3]), 30000) == 30002
    assert engine_port(entry("a", [2, 3]), 0) is None
