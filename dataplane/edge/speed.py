"""Each replica's own speed beside its peers, learned from what it streams back.

A variant served on mixed GPU types runs at different speeds on each: an L40S has 3.9x less
memory bandwidth than an H100 (every decode step reads the weights: ~4x slower) and 2.7x less
compute (prefill). The edge's TTFT model has one fleet-wide per-token prefill cost and one
per-running-request decode share; a replica's *pace* scales them, so a slow replica's predicted
TTFT is its own and not the fleet's average.

* **decode pace** from the mean inter-token time of each stream the replica finishes (one sample
  per request of at least ``MIN_DECODE_TOKENS`` tokens, taken at its end: nothing on the per-chunk
  path). Engine queueing never enters it: a queued request has not started streaming.
* **prefill pace** from the TTFT of dispatches the edge can judge: nothing else of this edge was
  still prefilling there and at least ``MIN_PREFILL_TOKENS`` were to be computed, over what the
  fleet-wide cost predicts.

Both are kept as EWMAs of log samples and reported *relative to the geometric mean of the
variant's replicas that have enough samples*, so they say which replicas are slower than their
peers and never how fast the whole fleet is (the fleet-wide model learns that). Relative and
clamped, because absolute per-replica costs collapsed a saturated fleet (bench/edge/README.md,
2026-12-02): engine queueing inflated a busy replica's samples, the edge steered away, the others
saturated in turn. A busy replica still looks somewhat slower here (a bigger batch takes longer
per step), which spreads load rather than concentrating it; a fleet that is busy everywhere moves
every replica's samples alike and leaves every pace near 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MIN_DECODE_TOKENS = 8  # fewer inter-token gaps say more about network jitter than about the GPU
MIN_PREFILL_TOKENS = 256  # a shorter prefill is dominated by the step it waits for, not by its compute
MIN_SAMPLES = 8  # a replica's pace counts once it has this many samples of that kind
ALPHA = 0.1  # EWMA weight of one sample
# A sample's ratio to the prediction is clipped to this factor each way (one stalled request must
# not move a pace far); a pace is clamped to it as well: past 8x the replica is broken, not slow,
# and health and the breaker deal with it.
MAX_RATIO = 8.0


@dataclass(frozen=True, slots=True)
class Pace:
    """How much longer than its variant's typical replica this one takes (1.0: as fast; 2.0: twice as slow)."""

    prefill: float = 1.0
    decode: float = 1.0


SAME = Pace()


@dataclass(slots=True)
class _Ewma:
    value: float = 0.0  # of log(sample)
    samples: int = 0

    def add(self, log_sample: float) -> None:
        self.samples += 1
        # the first samples are averaged plainly, so the start value does not linger
        self.value += max(ALPHA, 1.0 / self.samples) * (log_sample - self.value)


@dataclass(slots=True)
class _Learned:
    variant_id: str
    prefill: _Ewma = field(default_factory=_Ewma)
    decode: _Ewma = field(default_factory=_Ewma)


class ReplicaSpeeds:
    """Per replica, its learned pace; the Router owns one and forgets replicas that leave."""

    def __init__(self) -> None:
        self._learned: dict[str, _Learned] = {}
        self._paces: dict[str, Pace] = {}

    def pace(self, replica_id: str) -> Pace:
        return self._paces.get(replica_id, SAME)

    def observe_prefill(self, replica_id: str, variant_id: str, uncached_tokens: int, model_ms: float,
                        observed_ms: float) -> None:
        """One judged TTFT: ``observed_ms`` beyond the RTT against ``model_ms``, what the fleet-wide
        cost predicts for the same work."""
        if uncached_tokens < MIN_PREFILL_TOKENS or model_ms <= 0 or observed_ms <= 0:
            return
        self._add(replica_id, variant_id, "prefill", observed_ms / model_ms)

    def observe_decode(self, replica_id: str, variant_id: str, tokens: int, decode_s: float) -> None:
        """One finished stream: ``tokens`` generated, ``decode_s`` from its first to its last."""
        if tokens < MIN_DECODE_TOKENS or decode_s <= 0:
            return
        self._add(replica_id, variant_id, "decode", decode_s * 1000 / (tokens - 1))

    def retain(self, live: set[str]) -> None:
        gone = [rid for rid in self._learned if rid not in live]
        for rid in gone:
            variant = self._learned.pop(rid).variant_id
            self._paces.pop(rid, None)
            self._renormalise(variant)

    def _add(self, replica_id: str, variant_id: str, kind: str, sample: float) -> None:
        learned = self._learned.get(replica_id)
        if learned is None or learned.variant_id != variant_id:
            learned = self._learned[replica_id] = _Learned(variant_id)
        ewma: _Ewma = getattr(learned, kind)
        if kind == "prefill":
            sample = min(MAX_RATIO, max(1 / MAX_RATIO, sample))
        ewma.add(math.log(sample))
        if ewma.samples >= MIN_SAMPLES:
            self._renormalise(variant_id)

    def _renormalise(self, variant_id: str) -> None:
        """Every pace of the variant against the geometric mean of its replicas' learned values: one
        sample moves the reference, so all of the variant's paces are recomputed (a handful)."""
        peers = {rid: x for rid, x in self._learned.items() if x.variant_id == variant_id}
        prefill = _relative({rid: x.prefill for rid, x in peers.items()})
        decode = _relative({rid: x.decode for rid, x in peers.items()})
        for rid in peers:
            pace = Pace(prefill.get(rid, 1.0), decode.get(rid, 1.0))
            if pace == SAME:
                self._paces.pop(rid, None)
            else:
                self._paces[rid] = pace


def _relative(learned: dict[str, _Ewma]) -> dict[str, float]:
    """Each replica's value over the geometric mean of those with enough samples (none below two)."""
    ready = {rid: e.value for rid, e in learned.items() if e.samples >= MIN_SAMPLES}
    if len(ready) < 2:
        return {}
    mean = sum(ready.values()) / len(ready)
    return {rid: min(MAX_RATIO, max(1 / MAX_RATIO, math.exp(v - mean))) for rid, v in ready.items()}
