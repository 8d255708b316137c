"""The node's replica list, as the control plane sends it, and the agent's decisions about it.

Every answer of ``/register``, ``/resume`` and ``/heartbeat`` carries ``replicas``: what this node
should run, one entry per replica, each with its control-plane id, its variant and its GPU
indices. The list can change on every answer (placement and consolidation move replicas between
nodes). Pure functions only: what to start, drain, wait for, refuse and forget is decided here and
tested without processes; ``agent.py`` carries the decisions out.

Rules:

- an entry ``running`` that the agent does not run yet is started, unless a local replica that is
  not stopped yet still holds one of its GPUs (it *waits*, and starts once that one has stopped),
  or, on a machine with real GPUs, it names an index the node does not have (*refused*: reported
  ``failed``, never started);
- a local replica whose entry says ``stopped``, or that the list no longer holds, is *drained*
  (that replica only);
- a local replica that is stopped (or failed) and whose last state the control plane has been
  told is *forgotten* once the list no longer names it;
- an entry ``stopped`` the agent never ran is *acknowledged*: reported ``stopped`` so the control
  plane can close it;
- a malformed entry is skipped (and logged by the caller); if it still carries an id, the local
  replica of that id is left as it is, so one bad field never drains a serving replica.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RUNNING, STOPPED = "running", "stopped"
DESIRED_STATES = (RUNNING, STOPPED)


@dataclass(frozen=True)
class ReplicaEntry:
    """One ``replicas[]`` entry of a control-plane answer (unknown fields are ignored)."""

    id: str
    gpu_ids: tuple[int, ...]
    desired_state: str = RUNNING
    model_path: str = ""
    served_model_name: str = ""
    pool_id: str | None = None
    variant_id: str | None = None
    model: str | None = None
    tier: str | None = None
    quantization: str | None = None
    context_length: int | None = None
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    port: int | None = None
    drain_deadline_s: float | None = None
    artifact_source: str | None = None

    @property
    def slot(self) -> int:
        """A small, stable number for this replica on its node: its lowest GPU index."""
        return min(self.gpu_ids)

    @property
    def tp_size(self) -> int:
        return len(self.gpu_ids)

    @classmethod
    def from_dict(cls, raw: Any) -> ReplicaEntry:
        """Parse one entry; ``ValueError`` says what is wrong with it."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a replica entry must be an object, not {type(raw).__name__}")
        rid = raw.get("id")
        if not isinstance(rid, str) or not rid:
            raise ValueError("id must be a non-empty string")
        desired = raw.get("desired_state", RUNNING)
        if desired not in DESIRED_STATES:
            raise ValueError(f"desired_state must be one of {DESIRED_STATES}, not {desired!r}")
        gpu_ids = raw.get("gpu_ids")
        if desired == RUNNING or gpu_ids is not None:
            if not isinstance(gpu_ids, list | tuple) or not gpu_ids:
                raise ValueError("gpu_ids must be a non-empty list of GPU indices")
            if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpu_ids):
                raise ValueError(f"gpu_ids must be non-negative integers, not {gpu_ids!r}")
            if len(set(gpu_ids)) != len(gpu_ids):
                raise ValueError(f"gpu_ids name a GPU twice: {gpu_ids!r}")
        gpus = tuple(sorted(gpu_ids or ()))
        model_path, served = raw.get("model_path"), raw.get("served_model_name")
        if desired == RUNNING:
            if not isinstance(model_path, str) or not model_path:
                raise ValueError("model_path must be a non-empty string")
            if not isinstance(served, str) or not served:
                raise ValueError("served_model_name must be a non-empty string")
        engine_args = raw.get("engine_args") or {}
        if not isinstance(engine_args, Mapping):
            raise ValueError("engine_args must be an object")
        return cls(
            id=rid, gpu_ids=gpus, desired_state=desired, model_path=model_path or "", served_model_name=served or "",
            pool_id=_opt_str(raw, "pool_id"), variant_id=_opt_str(raw, "variant_id"), model=_opt_str(raw, "model"),
            tier=_opt_str(raw, "tier"), quantization=_opt_str(raw, "quantization"),
            context_length=_opt_int(raw, "context_length", minimum=1), engine_args=dict(engine_args),
            port=_opt_int(raw, "port", minimum=1, maximum=65535),
            drain_deadline_s=_opt_seconds(raw, "drain_deadline_s"), artifact_source=_opt_str(raw, "artifact_source"))


def _opt_str(raw: Mapping, key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string or null")
    return value


def _opt_int(raw: Mapping, key: str, minimum: int, maximum: int | None = None) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum or (maximum and value > maximum):
        raise ValueError(f"{key} must be an integer in [{minimum}, {maximum or '…'}] or null, not {value!r}")
    return value


def _opt_seconds(raw: Mapping, key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{key} must be a non-negative number or null, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class ParsedList:
    entries: tuple[ReplicaEntry, ...]
    unparsed_ids: frozenset[str]  # ids of malformed entries: their local replicas are left alone
    errors: tuple[str, ...]  # one line per skipped entry, for the log


def parse_replica_list(raw: Any) -> ParsedList | None:
    """The answer's ``replicas`` value → entries. ``None`` when it is not a list at all (a missing
    or garbled list says nothing about what should run: the caller keeps what it has)."""
    if not isinstance(raw, list | tuple):
        return None
    entries: list[ReplicaEntry] = []
    unparsed: set[str] = set()
    errors: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        rid = item.get("id") if isinstance(item, Mapping) else None
        try:
            entry = ReplicaEntry.from_dict(item)
        except ValueError as exc:
            errors.append(f"replicas[{i}] (id {rid!r}) skipped: {exc}")
            if isinstance(rid, str) and rid:
                unparsed.add(rid)
            continue
        if entry.id in seen:
            errors.append(f"replicas[{i}] (id {entry.id!r}) skipped: the id is listed twice")
            continue
        seen.add(entry.id)
        entries.append(entry)
    return ParsedList(tuple(entries), frozenset(unparsed - seen), tuple(errors))


@dataclass(frozen=True)
class LocalView:
    """What the planner needs to know about one replica the agent has."""

    id: str
    gpu_ids: tuple[int, ...]
    stopping: bool = False  # a drain or stop is under way, or done
    holds_gpus: bool = True  # its engine may still be on its GPUs (not stopped, not a dead failure)
    final_reported: bool = False  # stopped/failed, and the control plane has been told so


@dataclass
class ReplicaPlan:
    start: list[ReplicaEntry] = field(default_factory=list)
    drain: list[tuple[str, float | None]] = field(default_factory=list)  # (local id, the entry's drain deadline)
    wait: list[ReplicaEntry] = field(default_factory=list)  # wanted, but a GPU is still held
    refuse: list[tuple[ReplicaEntry, str]] = field(default_factory=list)  # (entry, why): reported failed
    acknowledge: list[ReplicaEntry] = field(default_factory=list)  # "stopped" entries never run here
    forget: list[str] = field(default_factory=list)
    deadlines: list[tuple[str, float]] = field(default_factory=list)  # draining already: a stricter deadline?

    def __bool__(self) -> bool:
        return bool(self.start or self.drain or self.refuse or self.acknowledge or self.forget)


def plan_replica_changes(local: Iterable[LocalView], entries: Sequence[ReplicaEntry],
                         node_gpus: Sequence[int] = (), unparsed_ids: Iterable[str] = ()) -> ReplicaPlan:
    """What to do so the node runs what ``entries`` asks for. ``node_gpus`` are the GPU indices
    the machine really has (empty on a CPU machine: any index is a nominal one, accepted)."""
    local = list(local)
    wanted = {e.id: e for e in entries}
    untouchable = set(unparsed_ids)
    known = {v.id for v in local}
    plan = ReplicaPlan()
    for v in local:
        if v.id in untouchable:
            continue
        entry = wanted.get(v.id)
        if entry is None:
            if v.final_reported:
                plan.forget.append(v.id)
            elif not v.stopping:
                plan.drain.append((v.id, None))
        elif entry.desired_state == STOPPED:
            if not v.stopping:
                plan.drain.append((v.id, entry.drain_deadline_s))
            elif entry.drain_deadline_s is not None:
                plan.deadlines.append((v.id, entry.drain_deadline_s))
    held = {g for v in local if v.holds_gpus for g in v.gpu_ids}
    have = set(node_gpus)
    for entry in entries:
        if entry.id in known:
            continue
        if entry.desired_state == STOPPED:
            plan.acknowledge.append(entry)
            continue
        if have and (missing := sorted(set(entry.gpu_ids) - have)):
            plan.refuse.append((entry, f"GPU index(es) {missing} not on this node (it has {sorted(have)})"))
            continue
        if held & set(entry.gpu_ids):
            plan.wait.append(entry)
            continue
        plan.start.append(entry)
        held |= set(entry.gpu_ids)  # two new entries on one GPU: the first starts, the second waits
    return plan


def engine_port(entry: ReplicaEntry, port_base: int) -> int | None:
    """The entry's port if the control plane chose one, else ``port_base`` + its lowest GPU index
    when a base is configured; ``None``: pick a free port."""
    if entry.port:
        return entry.port
    if port_base:
        return port_base + entry.slot
    return None
